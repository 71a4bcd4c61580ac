package pglockui_test

import (
	"net"
	"net/http"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/pgfence/pglock"
	"github.com/pgfence/pglock/internal/tcpproxy"
	"github.com/pgfence/pglock/pglocktest"
)

// proxiedPool returns a pool on the test's database whose connections go through a
// TCP proxy, and the proxy.
func proxiedPool(t *testing.T, databaseURL string) (*pgxpool.Pool, *tcpproxy.Proxy) {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(databaseURL)
	require.NoError(t, err)
	p, err := tcpproxy.New(tcpproxy.To(cfg.ConnConfig.Host, cfg.ConnConfig.Port))
	require.NoError(t, err)
	t.Cleanup(p.Close)
	host, port, err := net.SplitHostPort(p.Addr())
	require.NoError(t, err)
	n, err := strconv.Atoi(port)
	require.NoError(t, err)
	cfg.ConnConfig.Host, cfg.ConnConfig.Port, cfg.ConnConfig.Fallbacks = host, uint16(n), nil
	cfg.ConnConfig.ConnectTimeout = 2 * time.Second
	pool, err := pgxpool.NewWithConfig(t.Context(), cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	return pool, p
}

func TestDatabaseDownShowsTheBannerAndRecovers(t *testing.T) {
	t.Parallel()
	dbURL := pglocktest.PostgresURL(t)
	pool, proxy := proxiedPool(t, dbURL)
	c := newClient(t, pool, "web-1", pglock.WithoutListener())
	root := serve(t, c)
	holder(t, newClient(t, pglocktest.Pool(t, dbURL, 2), "web-2"), "inventory:feed", time.Minute)

	status, body := get(t, root, "")
	require.Equal(t, http.StatusOK, status)
	require.Contains(t, body, `<tr data-key="inventory:feed"`)

	proxy.Blackhole()
	for _, path := range []string{"", "jobs", "jobs/inventory:reconcile"} {
		start := time.Now()
		status, body = get(t, root, path)
		t.Logf("%q answered %d after %v", path, status, time.Since(start).Round(time.Millisecond))
		require.Equal(t, http.StatusServiceUnavailable, status, path)
		require.Contains(t, body, `<div id="error" role="alert">`, path)
		require.Contains(t, body, "context deadline exceeded", path)
		require.NotContains(t, body, "<tbody>", "%s: a banner, not an empty table", path)
	}
	require.Contains(t, body, `<span id="health" class="unready"`)

	proxy.Restore()
	require.Eventually(t, func() bool {
		status, body = get(t, root, "")
		return status == http.StatusOK
	}, 10*time.Second, 100*time.Millisecond, "the page recovers with the database")
	require.NotContains(t, body, `id="error"`)
	require.Contains(t, body, `<tr data-key="inventory:feed"`)
}
