package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/stretchr/testify/require"

	"github.com/pgfence/pglock/example/shop"
	"github.com/pgfence/pglock/pglocktest"
)

// syncBuffer is the demo's output, read by the test.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// freePorts returns a port p such that p, p+1 and p+2 were free a moment ago.
func freePorts(t *testing.T) int {
	t.Helper()
	for range 100 {
		p := 20000 + rand.IntN(40000)
		var ls []net.Listener
		for i := range 3 {
			l, err := net.Listen("tcp", fmt.Sprintf(":%d", p+i))
			if err != nil {
				break
			}
			ls = append(ls, l)
		}
		for _, l := range ls {
			_ = l.Close()
		}
		if len(ls) == 3 {
			return p
		}
	}
	t.Fatal("no three free ports in a row")
	return 0
}

// The whole "Try it" story, with a short ttl: three shop processes built from
// cmd/shop, on the test's database; then -keep's instances, ready for the tutorial's
// steps by hand: one runs the feed and the job, and two exports give 3 and 0.
func TestTryItWalksTheStory(t *testing.T) {
	t.Parallel()
	dbURL := pglocktest.PostgresURL(t)
	u, err := url.Parse(dbURL)
	require.NoError(t, err)
	var out syncBuffer
	o := options{serverURL: dbURL, database: strings.TrimPrefix(u.Path, "/"), ttl: 3 * time.Second, every: 2 * time.Second,
		basePort: freePorts(t), keep: true, buildFlags: raceFlags}
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	kept := make(chan string, 1) // what the kept instances answered, then Ctrl+C
	go func() {
		defer cancel()
		for !strings.Contains(out.String(), "Ctrl+C stops them.") {
			if sleep(ctx, 100*time.Millisecond) != nil {
				return
			}
		}
		kept <- keptInstances(ctx, o.basePort)
	}()
	ok, err := run(ctx, o, &out)
	t.Log("\n" + out.String())
	require.NoError(t, err)
	require.True(t, ok, "a step did not behave")
	require.Contains(t, out.String(), "Every step behaved.")
	require.NotContains(t, out.String(), "   ✘ ")
	// 13 steps when the job was on the instance SIGTERMed, 12 when it was on the last one.
	require.GreaterOrEqual(t, strings.Count(out.String(), "   ✔ "), 12)
	for _, line := range strings.Split(out.String(), "\n") {
		require.LessOrEqual(t, utf8.RuneCountInString(line), width, line)
	}
	require.Regexp(t, fmt.Sprintf(`port %d +pid \d+ +leads the warehouse feed, owns the stock reconciliation`, o.basePort),
		out.String())
	require.Equal(t, "3 and 0", <-kept)

	// No instance outlived the demo.
	for i := range 3 {
		conn, err := net.DialTimeout("tcp", fmt.Sprintf("127.0.0.1:%d", o.basePort+i), time.Second)
		if err == nil {
			_ = conn.Close()
		}
		require.Error(t, err, "port %d still answers", o.basePort+i)
	}
}

// keptInstances sends the tutorial's two exports to the second and third of -keep's
// instances, one after the other, and returns how many invoices each exported.
func keptInstances(ctx context.Context, basePort int) string {
	var exported []string
	for _, port := range []int{basePort + 1, basePort + 2} {
		i := &instance{port: port}
		status, body, err := i.request(ctx, http.MethodPost, "/admin/invoice-exports", adminToken)
		var res shop.ExportResult
		if err != nil || status != http.StatusOK || json.Unmarshal([]byte(body), &res) != nil {
			return fmt.Sprintf("%d %s %v", status, body, err)
		}
		exported = append(exported, fmt.Sprint(res.Exported))
	}
	return strings.Join(exported, " and ")
}

func TestTryItRefusesBadFlagsBeforeDoingAnything(t *testing.T) {
	t.Parallel()
	for _, o := range []options{
		{ttl: 30 * time.Second, every: 1500 * time.Millisecond},
		{ttl: 30 * time.Second, every: time.Minute},
		{ttl: 30 * time.Second, every: 0},
		{ttl: time.Millisecond, every: 10 * time.Second},
	} {
		var out syncBuffer
		ok, err := run(t.Context(), o, &out)
		require.Error(t, err, "%+v", o)
		require.False(t, ok)
		require.Empty(t, out.String(), "it printed, so it started")
	}
}
