//go:build unix

package pglock_test

import (
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/pgfence/pglock"
	"github.com/pgfence/pglock/internal/failover"
	"github.com/pgfence/pglock/pglocktest"
)

// BenchmarkAcquireReleaseSyncStandby times TryAcquire + Release on a primary whose
// standby is synchronous (ns/op) against the same on a primary whose standby is
// asynchronous (vs-async: the price of synchronous replication) and on a primary with
// no standby (vs-none), each goroutine on its own key, in alternating turns.
// synchronous_standby_names is server-wide, so each side is a pair of its own
// (internal/failover), alike but for its replication: the standby of "none" is
// detached and idle. "async" is the fairer baseline on one machine: its standby
// streams, flushes and replays the same WAL on the same cores and disk as the
// synchronous one, so only the commits' wait for the standby's flush differs. The floor
// on each pair, two durable UPDATEs (update2), is timed in the same turns:
// vs-update2-sync is what pglock costs over it where every commit waits for the
// standby, and update2-sync/async and update2-sync/none are what synchronous
// replication does to two commits that both wait (pglock's release does not: it
// commits without waiting for any flush). Skipped unless PGLOCK_FAILOVER=1.
func BenchmarkAcquireReleaseSyncStandby(b *testing.B) {
	type side struct {
		name   string
		client *pglock.Client
		pool   *pgxpool.Pool
	}
	var sides []side
	for _, s := range []struct {
		name  string
		mode  failover.Mode
		state string // the standby's sync_state on the primary; none when detached
	}{{"sync", failover.Synchronous, "sync"}, {"async", failover.Asynchronous, "async"}, {"none", failover.Asynchronous, ""}} {
		p := failoverPair(b, s.mode)
		if s.state == "" {
			p.Detach()
		}
		pool := pglocktest.Pool(b, p.URL(), 20)
		var states []string
		require.NoError(b, pool.QueryRow(b.Context(), "SELECT coalesce(array_agg(sync_state), '{}') FROM pg_stat_replication").Scan(&states))
		require.Equal(b, strings.Fields(s.state), states, "standbys of %s", s.name)
		createBenchRows(b, pool, 16)
		sides = append(sides, side{s.name, newClient(b, pglock.NewPostgresStore(pool), pglock.TTL(time.Minute)), pool})
	}
	for _, goroutines := range []int{1, 16} {
		b.Run("goroutines="+strconv.Itoa(goroutines), func(b *testing.B) {
			var ops []benchOp
			for _, s := range sides {
				op := acquireRelease(s.client, goroutines)
				op.name = s.name
				ops = append(ops, op)
			}
			for _, s := range sides {
				op := update2(s.pool, goroutines)
				op.name = "update2-" + s.name
				ops = append(ops, op)
			}
			warmUp(b, ops...)
			total := interleave(b, ops...)
			reportVs(b, ops, total)
			for i := 1; i < len(sides); i++ {
				b.ReportMetric(float64(total[len(sides)])/float64(total[len(sides)+i]), "update2-sync/"+sides[i].name)
			}
		})
	}
}
