package main

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/stretchr/testify/require"

	"github.com/pgfence/pglock/example/shop"
	"github.com/pgfence/pglock/pglocktest"
)

// outBuffer is what run writes, read back while it runs: safe for concurrent use.
type outBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (o *outBuffer) Write(p []byte) (int, error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.b.Write(p)
}

func (o *outBuffer) String() string {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.b.String()
}

// freePorts returns a port p such that p, p+1 and p+2 were free a moment ago. They are
// below the kernel's ephemeral range, from which outgoing connections (every test's
// database connections) and listeners on port 0 (other packages' tests, running at the
// same time) take their ports: those could take one between this probe and the shop's
// listen.
func freePorts(t *testing.T) int {
	t.Helper()
	low := 32768 // Linux's default
	if b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range"); err == nil {
		if f := strings.Fields(string(b)); len(f) == 2 {
			if n, err := strconv.Atoi(f[0]); err == nil {
				low = n
			}
		}
	}
	const from = 10000
	require.Greater(t, low, from+100, "the ephemeral range starts at %d", low)
	for range 100 {
		p := from + rand.IntN(low-from-3)
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
// steps by hand: one runs the feed and the job, and two exports one after the other give
// 3 and 0.
func TestTryItWalksTheStory(t *testing.T) {
	t.Parallel()
	var (
		o    options
		out  *outBuffer
		kept string
		ok   bool
		err  error
	)
	// Another process may still take a port between freePorts and the shop's listen:
	// then the story is walked again, on other ports and a fresh database.
	for attempt := 1; ; attempt++ {
		o, out, kept, ok, err = walk(t)
		if err == nil || !strings.Contains(out.String(), "address already in use") || attempt == 3 {
			break
		}
		t.Logf("attempt %d: a port was taken (%v), walking the story again on other ports", attempt, err)
	}
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
	require.Equal(t, "3 and 0", kept)

	// No instance outlived the demo.
	for i := range 3 {
		conn, err := net.DialTimeout("tcp", fmt.Sprintf("127.0.0.1:%d", o.basePort+i), time.Second)
		if err == nil {
			_ = conn.Close()
		}
		require.Error(t, err, "port %d still answers", o.basePort+i)
	}
}

// walk runs the story with -keep on free ports and a database of its own, and returns
// its options, its output, what the kept instances answered, and run's results.
func walk(t *testing.T) (o options, out *outBuffer, kept string, ok bool, err error) {
	t.Helper()
	dbURL := pglocktest.PostgresURL(t)
	u, err := url.Parse(dbURL)
	require.NoError(t, err)
	out = &outBuffer{}
	o = options{serverURL: dbURL, database: strings.TrimPrefix(u.Path, "/"), ttl: 3 * time.Second, every: 2 * time.Second,
		basePort: freePorts(t), keep: true, buildFlags: raceFlags}
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	keptCh := make(chan string, 1) // what the kept instances answered, then Ctrl+C
	done := make(chan struct{})
	go func() {
		defer close(done)
		defer cancel()
		for !strings.Contains(out.String(), "Ctrl+C stops them.") {
			if sleep(ctx, 100*time.Millisecond) != nil {
				return
			}
		}
		keptCh <- keptInstances(ctx, o.basePort)
	}()
	ok, err = run(ctx, o, out)
	cancel()
	<-done
	select {
	case kept = <-keptCh:
	default:
	}
	return o, out, kept, ok, err
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
		var out outBuffer
		ok, err := run(t.Context(), o, &out)
		require.Error(t, err, "%+v", o)
		require.False(t, ok)
		require.Empty(t, out.String(), "it printed, so it started")
	}
}
