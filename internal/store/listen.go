package store

import (
	"context"
	"log/slog"
	"math/rand/v2"
	"time"

	"github.com/jackc/pgx/v5"
)

// The PostgreSQL stores' LISTEN connection, which wakes a Client's waiters (pglock's
// listener.go): one dedicated connection, reconnecting with backoff.

// releasedChannel is what pglock.lock_release notifies, with the key as the payload,
// when a waiter marked the key (migrations/000003_notify.up.sql).
const releasedChannel = "pglock_released"

// grantedChannel is what a release that hands its key to the head of the fair queue
// notifies, with the head's owner as the payload (migrations/000014_queue.up.sql), so
// that the one waiter granted the key is woken, on whichever client it waits.
const grantedChannel = "pglock_granted"

// The listener's reconnection backoff. It runs on the real clock, not the client's:
// it waits for a server to come back, not for a lease.
const (
	listenerMinBackoff = 100 * time.Millisecond
	listenerMaxBackoff = 10 * time.Second
)

// Listening is what Listen tells its client of the connection, from Listen's goroutine.
type Listening struct {
	Logger *slog.Logger
	Retry  <-chan struct{} // a value cuts a reconnection's backoff short
	// Tried is called after each attempt to connect, whether it succeeded or not.
	Tried func()
	// Up is called when the connection LISTENs, Down when it is lost.
	Up, Down func()
	// Back is called when the connection comes back after it was cut.
	Back func()
	// Released is called with the key of each release notified, Granted with the owner
	// of each grant.
	Released, Granted func(string)
}

// Listen keeps a connection of config LISTENing on the channels of the releases and the
// grants until ctx ends, reconnecting with backoff, and tells l what it hears.
func Listen(ctx context.Context, config *pgx.ConnConfig, l Listening) {
	backoff, down := listenerMinBackoff, false
	for {
		conn, err := connect(ctx, config)
		l.Tried()
		if err == nil {
			if down {
				l.Logger.Info("pglock: listener reconnected")
				l.Back() // perhaps to another server: a failover
			} else {
				l.Logger.Debug("pglock: listening for releases")
			}
			select {
			case <-l.Retry: // for the connection that just came up
			default:
			}
			backoff, down = listenerMinBackoff, false
			err = receive(ctx, conn, l)
		}
		if ctx.Err() != nil {
			return
		}
		if !down {
			l.Logger.Warn("pglock: listener not connected; waiters poll until it is", slog.Any("err", err))
			down = true
		}
		t := time.NewTimer(jitter(backoff))
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		case <-l.Retry:
			t.Stop()
		}
		backoff = min(2*backoff, listenerMaxBackoff)
	}
}

func connect(ctx context.Context, config *pgx.ConnConfig) (*pgx.Conn, error) {
	conn, err := pgx.ConnectConfig(ctx, config)
	if err != nil {
		return nil, err
	}
	if _, err := conn.Exec(ctx, "LISTEN "+releasedChannel+"; LISTEN "+grantedChannel); err != nil {
		closeConn(ctx, conn)
		return nil, err
	}
	return conn, nil
}

// receive tells l of every release and grant notified on conn until conn fails or ctx
// ends, then closes conn.
func receive(ctx context.Context, conn *pgx.Conn, l Listening) error {
	l.Up()
	defer func() {
		l.Down()
		closeConn(ctx, conn)
	}()
	for {
		n, err := conn.WaitForNotification(ctx)
		if err != nil {
			return err
		}
		if n != nil {
			if n.Channel == grantedChannel {
				l.Granted(n.Payload)
			} else {
				l.Released(n.Payload)
			}
		}
	}
}

func closeConn(ctx context.Context, conn *pgx.Conn) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), Timeout)
	defer cancel()
	_ = conn.Close(ctx)
}

// jitter returns a duration between d/2 and d, so that listeners that failed together
// retry apart.
func jitter(d time.Duration) time.Duration { return d/2 + rand.N(d/2+1) }
