package store_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/pgfence/pglock/internal/store"
	"github.com/pgfence/pglock/pglocktest"
)

// firstConn takes the connection that comes back first, from either pool, and puts the
// other pool's back when it comes: nothing stays acquired, whichever side wins. With
// both pools closed, it returns an error.
func TestFirstConnTakesWhicheverPoolHandsOneOutFirst(t *testing.T) {
	t.Parallel()
	base := pglocktest.Postgres(t)
	onePool := func(t *testing.T) *pgxpool.Pool {
		cfg := base.Config()
		cfg.MaxConns, cfg.MinConns = 1, 0
		p, err := pgxpool.NewWithConfig(t.Context(), cfg)
		require.NoError(t, err)
		t.Cleanup(p.Close)
		return p
	}
	for _, freed := range []string{"own", "app"} {
		t.Run(freed, func(t *testing.T) {
			t.Parallel()
			own, app := onePool(t), onePool(t)
			heldOwn, err := own.Acquire(t.Context())
			require.NoError(t, err)
			t.Cleanup(heldOwn.Release) // before the pools close, whatever fails
			heldApp, err := app.Acquire(t.Context())
			require.NoError(t, err)
			t.Cleanup(heldApp.Release)
			ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
			defer cancel()
			type result struct {
				conn *pgxpool.Conn
				err  error
			}
			got := make(chan result, 1)
			go func() {
				c, err := store.FirstConn(ctx, own, app)
				got <- result{c, err}
			}()
			free, kept := heldOwn, heldApp
			if freed == "app" {
				free, kept = heldApp, heldOwn
			}
			want := free.Conn()
			free.Release()
			r := <-got
			require.NoError(t, r.err, "firstConn took no connection from the pool that had one")
			defer r.conn.Release()
			require.Same(t, want, r.conn.Conn(), "the connection handed back first")
			r.conn.Release()
			kept.Release()
			require.Eventually(t, func() bool { return own.Stat().AcquiredConns() == 0 && app.Stat().AcquiredConns() == 0 },
				5*time.Second, time.Millisecond, "a connection taken and not put back")
		})
	}
	t.Run("Closed", func(t *testing.T) {
		t.Parallel()
		own, app := onePool(t), onePool(t)
		own.Close()
		app.Close()
		_, err := store.FirstConn(context.Background(), own, app)
		require.Error(t, err)
	})
}
