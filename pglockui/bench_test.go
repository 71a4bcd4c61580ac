package pglockui_test

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgfence/pglock/pglockui"
)

// BenchmarkLocksPage10000 compares, on one table of 10,000 locks (half held), the
// console's locks page (first page, and sorted by expiry) with a plain Client.Locks
// call: the server's side of the page, rendering included, without a network.
func BenchmarkLocksPage10000(b *testing.B) {
	pool := newDatabase(b)
	c := newClient(b, pool, "web-1")
	_, err := pool.Exec(b.Context(), `
		INSERT INTO pglock.locks (key, owner, fencing_token, expires_at)
		SELECT 'bench:' || lpad(i::text, 6, '0'), CASE WHEN i % 2 = 0 THEN 'web-' || (i % 7) || '/x' END, i,
		       clock_timestamp() + interval '1 hour'
		FROM generate_series(1, 10000) i`)
	require.NoError(b, err)
	h, err := pglockui.New(c, pglockui.WithLogger(quiet))
	require.NoError(b, err)

	b.Run("Locks", func(b *testing.B) {
		for b.Loop() {
			locks, err := c.Locks(b.Context(), "")
			if err != nil || len(locks) != 10000 {
				b.Fatal(len(locks), err)
			}
		}
	})
	for _, path := range []string{"/", "/?sort=-expires&page=50"} {
		b.Run("page "+path, func(b *testing.B) {
			for b.Loop() {
				w := httptest.NewRecorder()
				h.ServeHTTP(w, httptest.NewRequest(http.MethodGet, path, nil))
				if w.Code != http.StatusOK || !strings.Contains(w.Body.String(), `data-key="bench:`) {
					b.Fatal(w.Code)
				}
				b.ReportMetric(float64(w.Body.Len()), "bytes/page")
			}
		})
	}
}

// TestLiveDelay measures what a page's poll loop gives: the time from a lock's
// acquisition to the first answer of the console that shows it, polling every second
// as the page's script does (acquisitions at random moments of the poll cycle).
func TestLiveDelay(t *testing.T) {
	if testing.Short() {
		t.Skip("takes about 10 s")
	}
	t.Parallel()
	pool := newDatabase(t)
	c := newClient(t, pool, "web-1")
	root := serve(t, c)
	var worst, total time.Duration
	const rounds = 8
	for i := range rounds {
		key := fmt.Sprintf("live:%d", i)
		found := make(chan time.Time, 1)
		stop := make(chan struct{})
		go func() {
			tick := time.NewTicker(time.Second)
			defer tick.Stop()
			for {
				res, err := http.Get(root + "?prefix=live:")
				if err == nil {
					body, _ := io.ReadAll(res.Body)
					_ = res.Body.Close()
					if strings.Contains(string(body), `data-key="`+key+`"`) {
						found <- time.Now()
						return
					}
				}
				select {
				case <-stop:
					return
				case <-tick.C:
				}
			}
		}()
		time.Sleep(time.Duration(i) * time.Second / rounds) // the acquisition's phase in the poll cycle
		holder(t, c, key, time.Minute)
		acquired := time.Now()
		select {
		case at := <-found:
			d := at.Sub(acquired)
			total += d
			worst = max(worst, d)
		case <-time.After(3 * time.Second):
			close(stop)
			t.Fatalf("%s not shown within 3 s", key)
		}
	}
	t.Logf("acquisition to the console's answer showing it, polling every 1 s: mean %v, worst %v over %d rounds",
		(total / rounds).Round(time.Millisecond), worst.Round(time.Millisecond), rounds)
	require.Less(t, worst, 1500*time.Millisecond)
}
