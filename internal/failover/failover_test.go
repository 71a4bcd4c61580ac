//go:build unix

package failover_test

import (
	"context"
	"errors"
	"os"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/pgfence/pglock/internal/failover"
)

// TestPair fails over twice in each mode: what the primary committed and the standby
// confirmed is on the new primary, on a new timeline, and the multi-host URL reaches it.
func TestPair(t *testing.T) {
	for _, mode := range []failover.Mode{failover.Synchronous, failover.Asynchronous} {
		t.Run(mode.String(), func(t *testing.T) {
			start := time.Now()
			p := failover.Start(t, mode)
			t.Logf("pair started in %v", time.Since(start))
			require.Equal(t, 1, p.Timeline())
			exec(t, p.URL(), "CREATE TABLE t (n int)")
			for n := 1; n <= 2; n++ {
				exec(t, p.URL(), "INSERT INTO t VALUES ($1)", n)
				waitReplayed(t, p)
				start := time.Now()
				p.Failover()
				t.Logf("failover %d (kill and promote) took %v", n, time.Since(start))
				require.Equal(t, n+1, p.Timeline())
				var count int
				queryRow(t, p.URL(), "SELECT count(*) FROM t", &count)
				require.Equal(t, n, count, "the rows committed before failover %d", n)
				start = time.Now()
				p.Rebuild()
				t.Logf("rebuild %d took %v", n, time.Since(start))
			}
		})
	}
}

// TestDetach loses what the primary commits after Detach.
func TestDetach(t *testing.T) {
	p := failover.Start(t, failover.Asynchronous)
	exec(t, p.URL(), "CREATE TABLE t (n int)")
	waitReplayed(t, p)
	p.Detach()
	exec(t, p.URL(), "INSERT INTO t VALUES (1)")
	p.Failover()
	var count int
	queryRow(t, p.URL(), "SELECT count(*) FROM t", &count)
	require.Equal(t, 0, count, "the row committed after Detach")
}

// waitReplayed waits until the standby has replayed everything the primary wrote.
func waitReplayed(t *testing.T, p *failover.Pair) {
	t.Helper()
	var lsn string
	queryRow(t, p.PrimaryURL(), "SELECT pg_current_wal_lsn()::text", &lsn)
	require.Eventually(t, func() bool {
		var ok bool
		queryRow(t, p.StandbyURL(), "SELECT pg_last_wal_replay_lsn() >= $1::pg_lsn", &ok, lsn)
		return ok
	}, 30*time.Second, 10*time.Millisecond)
}

func exec(t *testing.T, url, sql string, args ...any) {
	t.Helper()
	conn, err := pgx.Connect(t.Context(), url)
	require.NoError(t, err)
	defer conn.Close(context.WithoutCancel(t.Context()))
	_, err = conn.Exec(t.Context(), sql, args...)
	require.NoError(t, err)
}

func queryRow(t *testing.T, url, sql string, dest any, args ...any) {
	t.Helper()
	conn, err := pgx.Connect(t.Context(), url)
	require.NoError(t, err)
	defer conn.Close(context.WithoutCancel(t.Context()))
	require.NoError(t, conn.QueryRow(t.Context(), sql, args...).Scan(dest))
}

// TestClusterBranch: the new timeline branches at or after the last commit the standby
// had replayed, and Primary names the promoted server.
func TestClusterBranch(t *testing.T) {
	if os.Getenv(failover.EnableEnv) != "1" {
		t.Skipf("set %s=1", failover.EnableEnv)
	}
	c, err := failover.StartCluster(failover.Asynchronous)
	if errors.Is(err, failover.ErrUnavailable) && os.Getenv("CI") == "" {
		t.Skip(err)
	}
	require.NoError(t, err)
	defer func() { require.NoError(t, c.Close()) }()
	require.Equal(t, "a", c.Primary())
	exec(t, c.URL(), "CREATE TABLE t (n int)")
	var replayed string
	require.Eventually(t, func() bool {
		var lsn string
		queryRow(t, c.PrimaryURL(), "SELECT pg_current_wal_flush_lsn()::text", &lsn)
		var ok bool
		queryRow(t, c.StandbyURL(), "SELECT pg_last_wal_replay_lsn() >= $1::pg_lsn", &ok, lsn)
		replayed = lsn
		return ok
	}, 30*time.Second, 10*time.Millisecond)
	_, err = c.Branch()
	require.Error(t, err, "timeline 1 has no history")
	require.NoError(t, c.Failover())
	require.Equal(t, "b", c.Primary())
	branch, err := c.Branch()
	require.NoError(t, err)
	var after bool
	queryRow(t, c.PrimaryURL(), "SELECT $1::pg_lsn >= $2::pg_lsn", &after, branch, replayed)
	require.True(t, after, "branch %s, replayed %s", branch, replayed)
}
