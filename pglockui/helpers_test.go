package pglockui_test

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/pgfence/pglock"
	"github.com/pgfence/pglock/pglocktest"
	"github.com/pgfence/pglock/pglockui"
)

// TestMain checks that nothing leaves a goroutine behind, once the browser that the
// browser tests share is stopped.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(stoppingBrowser{m})
}

// quiet discards logs, for the tests that do not read them.
var quiet = slog.New(slog.DiscardHandler)

// newClient returns a quiet client on pool named instance, closed when the test ends.
func newClient(t testing.TB, pool *pgxpool.Pool, instance string, opts ...pglock.ClientOption) *pglock.Client {
	t.Helper()
	c, err := pglock.New(pool, append([]pglock.ClientOption{pglock.WithLogger(quiet), pglock.WithInstanceName(instance)}, opts...)...)
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, c.Close(context.WithoutCancel(t.Context()))) })
	return c
}

// serve mounts the console for client under /admin/pglock/ on a test server, as an
// application would, and returns the console's root URL.
func serve(t testing.TB, client *pglock.Client, opts ...pglockui.Option) string {
	t.Helper()
	h, err := pglockui.New(client, append([]pglockui.Option{pglockui.WithLogger(quiet)}, opts...)...)
	require.NoError(t, err)
	mux := http.NewServeMux()
	mux.Handle("/admin/pglock/", http.StripPrefix("/admin/pglock", h))
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	return srv.URL + "/admin/pglock/"
}

// get fetches root+path and returns its status and body.
func get(t testing.TB, root, path string) (int, string) {
	t.Helper()
	res, err := http.Get(root + path)
	require.NoError(t, err)
	defer res.Body.Close()
	body, err := io.ReadAll(res.Body)
	require.NoError(t, err)
	return res.StatusCode, string(body)
}

// post sends form to root+path as a same-origin browser would (Sec-Fetch-Site), with
// header set on top, and returns its status and body.
func post(t testing.TB, root, path string, form url.Values, header http.Header) (int, string) {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, root+path, strings.NewReader(form.Encode()))
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.Header.Set("Sec-Fetch-Site", "same-origin")
	for k, v := range header {
		req.Header[k] = v
	}
	res, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer res.Body.Close()
	body, err := io.ReadAll(res.Body)
	require.NoError(t, err)
	return res.StatusCode, string(body)
}

// holder is a lock taken for the test, released when it ends.
func holder(t testing.TB, c *pglock.Client, key string, ttl time.Duration) *pglock.Lock {
	t.Helper()
	l, err := c.TryAcquire(t.Context(), key, pglock.TTL(ttl))
	require.NoError(t, err)
	t.Cleanup(func() { _ = l.Release(context.WithoutCancel(t.Context())) })
	return l
}

// newDatabase returns a pool on a fresh database with the pglock schema.
func newDatabase(t testing.TB) *pgxpool.Pool {
	t.Helper()
	return pglocktest.Postgres(t)
}
