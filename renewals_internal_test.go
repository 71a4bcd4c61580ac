package pglock

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
)

// firstConn takes the connection that comes back first, from either pool, and puts the
// other pool's back when it comes: nothing stays acquired, whichever side wins. With
// both pools closed, it returns an error.
func TestFirstConnTakesWhicheverPoolHandsOneOutFirst(t *testing.T) {
	t.Parallel()
	base := fenceTestDB(t)
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
			ctx := t.Context()
			own, app := onePool(t), onePool(t)
			heldOwn, err := own.Acquire(ctx)
			require.NoError(t, err)
			heldApp, err := app.Acquire(ctx)
			require.NoError(t, err)
			got := make(chan *pgxpool.Conn, 1)
			go func() {
				c, err := firstConn(ctx, own, app)
				if err != nil {
					t.Error(err)
				}
				got <- c
			}()
			free, kept := heldOwn, heldApp
			if freed == "app" {
				free, kept = heldApp, heldOwn
			}
			want := free.Conn()
			free.Release()
			var c *pgxpool.Conn
			select {
			case c = <-got:
			case <-time.After(10 * time.Second):
				t.Fatal("firstConn took no connection from the pool that had one")
			}
			require.Same(t, want, c.Conn(), "the connection handed back first")
			c.Release()
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
		_, err := firstConn(context.Background(), own, app)
		require.Error(t, err)
	})
}
