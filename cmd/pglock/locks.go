package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"strconv"
	"time"

	"github.com/pgfence/pglock"
)

var locksCommand = &command{
	name:    "locks",
	args:    "[-prefix P] [-watch] [-json]",
	summary: "list the locks, held or not, with owner, token, expiry and waiters",
	help: `
Locks lists pglock's locks as the database sees them, on its clock, sorted by key:
the key, its owner (the instance name comes first), the fencing token of its last
acquisition, whether a live holder has it, when its lease expires (or ended), and
whether someone waits for it. A key stays listed after its release, with no owner,
until 'pglock prune' deletes it. A job's lease is the lock "<job>:owner"; its run
lock (WithoutOverlapping) is "<job>"; an election's leader holds "<election>".

Locks only reads, and takes no row lock: it is safe to run against production,
and cheap enough to run every second.`,
	example: `
pglock locks -prefix orders:
pglock locks -watch
pglock locks -json | jq -r '.[] | select(.held) | .key'`,
	connects: true,
	run:      runLocks,
}

func runLocks(ctx context.Context, e *env, fs *flag.FlagSet, args []string) error {
	prefix := fs.String("prefix", "", "list only the keys that start with `P` (% and _ are no wildcards)")
	watch := fs.Bool("watch", false, "redraw every second until Ctrl+C or SIGTERM")
	asJSON := fs.Bool("json", false, "print a JSON array (with -watch: one array per line, every second)")
	rest, err := e.parse(fs, args)
	if err != nil {
		return err
	}
	if len(rest) > 0 {
		return usageError("locks: unexpected argument %q: give a prefix with -prefix", rest[0])
	}
	c, err := e.connect(ctx)
	if err != nil {
		return err
	}
	defer c.close()
	if !*watch {
		locks, err := c.locks(ctx, *prefix)
		if err != nil {
			return err
		}
		if *asJSON {
			return writeJSON(e.stdout, locksJSON(locks), false)
		}
		printLocks(e.stdout, locks, *prefix, e.width)
		return nil
	}
	return c.watchLocks(ctx, *prefix, *asJSON)
}

// locks reads the locks under prefix within -timeout.
func (c *conn) locks(ctx context.Context, prefix string) ([]pglock.LockInfo, error) {
	sctx, cancel := c.statementContext(ctx)
	defer cancel()
	locks, err := c.client.Locks(sctx, prefix)
	if err != nil {
		return nil, c.explain(ctx, "list locks", err)
	}
	return locks, nil
}

// watchLocks redraws the locks every second until ctx ends (Ctrl+C, SIGTERM), which
// is a success. A failed read is shown in its frame and the next one tries again: a
// failover or a restart must not end the watch.
func (c *conn) watchLocks(ctx context.Context, prefix string, asJSON bool) error {
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for {
		locks, err := c.locks(ctx, prefix)
		if ctx.Err() != nil {
			return nil
		}
		var frame bytes.Buffer
		switch {
		case asJSON && err != nil:
			_ = writeJSON(&frame, map[string]string{"error": err.Error()}, true)
		case asJSON:
			_ = writeJSON(&frame, locksJSON(locks), true)
		default:
			if c.e.terminal {
				frame.WriteString("\x1b[H\x1b[2J") // home, clear the screen
			}
			fmt.Fprintf(&frame, "pglock locks%s at %s: every 1s, Ctrl+C to stop\n\n", prefixNote(prefix), stamp(time.Now()))
			if err != nil {
				fmt.Fprintln(&frame, err)
			} else {
				printLocks(&frame, locks, prefix, c.e.width)
			}
			if !c.e.terminal {
				frame.WriteString("\n")
			}
		}
		if _, err := c.e.stdout.Write(frame.Bytes()); err != nil {
			return err // stdout closed: nobody is watching
		}
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
		}
	}
}

func prefixNote(prefix string) string {
	if prefix == "" {
		return ""
	}
	return " -prefix " + strconv.Quote(prefix)
}

// printLocks writes locks as an aligned table in width columns, and a count.
func printLocks(w io.Writer, locks []pglock.LockInfo, prefix string, width int) {
	if len(locks) == 0 {
		if prefix != "" {
			fmt.Fprintf(w, "no locks with prefix %s\n", strconv.Quote(prefix))
		} else {
			fmt.Fprintln(w, "no locks")
		}
		return
	}
	t := newTable(w, width, "KEY", "OWNER", "TOKEN", "HELD", "EXPIRES", "WAITING").clip(1, 12).clip(0, 16)
	held, waiting := 0, 0
	for _, l := range locks {
		h, wt := "no", ""
		if l.Held {
			h = "yes"
			held++
		}
		if l.Waiting {
			wt = "yes"
			waiting++
		}
		t.row(text(l.Key), text(l.Owner), strconv.FormatInt(l.Token, 10), h, expiry(l), wt)
	}
	t.flush()
	fmt.Fprintf(w, "%s, %d held, %d waited for\n", plural(len(locks), "lock"), held, waiting)
}

// lockJSON is a lock in -json output.
type lockJSON struct {
	Key              string    `json:"key"`
	Owner            string    `json:"owner"`
	Instance         string    `json:"instance"`
	Token            int64     `json:"token"`
	Held             bool      `json:"held"`
	ExpiresAt        time.Time `json:"expires_at"`
	ExpiresInSeconds float64   `json:"expires_in_seconds"` // negative once the lease ended
	Waiting          bool      `json:"waiting"`
}

func toLockJSON(l pglock.LockInfo) lockJSON {
	return lockJSON{Key: l.Key, Owner: l.Owner, Instance: l.Instance, Token: l.Token, Held: l.Held,
		ExpiresAt: l.ExpiresAt.UTC(), ExpiresInSeconds: l.ExpiresIn.Seconds(), Waiting: l.Waiting}
}

func locksJSON(locks []pglock.LockInfo) []lockJSON {
	out := make([]lockJSON, len(locks))
	for i, l := range locks {
		out[i] = toLockJSON(l)
	}
	return out
}

var releaseCommand = &command{
	name:    "release",
	args:    "-force [-json] KEY",
	summary: "break a stuck lock (-force required; without it, say what it would break)",
	help: `
Release breaks the lock on KEY, whoever holds it, on any instance: for a holder an
operator knows is stuck. What it guarantees:

  - the key is free at once: the next acquisition (a waiter is woken) gets a
    fencing token greater than the broken one;
  - the holder's next renewal is refused (within a third of its ttl): its lock is
    lost and the context of the code under it is cancelled;
  - the holder's fenced writes are refused: a FenceHeld write at once, a
    FenceUpdate or ExecFenced write once the new holder has written its token.

Until its next renewal the old holder still believes it holds the key: only the
fence stops a write it makes in between. The break waits for an open fenced
transaction of the holder (bounded by -timeout).

Without -force it only says what it would break, changes nothing and exits 2.
A key that no live holder has exits 3.`,
	example: `
pglock release orders:42          # what would be broken
pglock release -force orders:42   # break it`,
	connects: true,
	run:      runRelease,
}

func runRelease(ctx context.Context, e *env, fs *flag.FlagSet, args []string) error {
	force := fs.Bool("force", false, "break the lock; without it, print what would be broken and change nothing")
	asJSON := fs.Bool("json", false, "print what was broken (or would be) as JSON")
	rest, err := e.parse(fs, args)
	if err != nil {
		return err
	}
	if len(rest) != 1 {
		return usageError("release: want one KEY, got %d arguments (pglock release -h)", len(rest))
	}
	key := rest[0]
	if key == "" {
		return usageError("release: the key is empty")
	}
	c, err := e.connect(ctx)
	if err != nil {
		return err
	}
	defer c.close()
	if !*force {
		return c.wouldRelease(ctx, key, *asJSON)
	}
	sctx, cancel := c.statementContext(ctx)
	defer cancel()
	info, err := c.client.ForceRelease(sctx, key)
	if errors.Is(err, pglock.ErrNotHeld) {
		return notFoundError("release: %q has no live holder: nothing to break", key)
	}
	if err != nil {
		err = c.explain(ctx, "release", err)
		if errors.Is(err, context.DeadlineExceeded) {
			err = fmt.Errorf("%w (an open fenced transaction of the holder may hold the row: give a longer -timeout); nothing was broken", err)
		}
		return err
	}
	if *asJSON {
		return writeJSON(e.stdout, releaseJSON{Released: true, Lock: toLockJSON(info)}, false)
	}
	fmt.Fprintln(e.stdout, wrap(fmt.Sprintf("released %q by force: owner %s, token %d, its lease due to end %s (%s).",
		info.Key, text(info.Owner), info.Token, stamp(info.ExpiresAt), relative(info.ExpiresIn)), e.width))
	fmt.Fprintln(e.stdout, wrap(fmt.Sprintf("Its holder's next renewal is refused and the context under the lock cancelled; the next acquisition gets a token greater than %d, so the old holder's fenced writes are refused.", info.Token), e.width))
	return nil
}

// wouldRelease prints what release -force would break, and returns the error that
// says -force is missing (exit 2), or that nobody holds key (exit 3).
func (c *conn) wouldRelease(ctx context.Context, key string, asJSON bool) error {
	locks, err := c.locks(ctx, key)
	if err != nil {
		return err
	}
	for _, l := range locks {
		if l.Key != key || !l.Held {
			continue
		}
		if asJSON {
			if err := writeJSON(c.e.stdout, releaseJSON{Released: false, Lock: toLockJSON(l)}, false); err != nil {
				return err
			}
		} else {
			fmt.Fprintln(c.e.stdout, wrap(fmt.Sprintf("would release %q: owner %s, token %d, its lease due to end %s (%s)",
				l.Key, text(l.Owner), l.Token, stamp(l.ExpiresAt), relative(l.ExpiresIn)), c.e.width))
		}
		return usageError("release: -force is required to break %q: nothing changed", key)
	}
	return notFoundError("release: %q has no live holder: nothing to break", key)
}

// releaseJSON is release's -json output.
type releaseJSON struct {
	Released bool     `json:"released"` // false without -force
	Lock     lockJSON `json:"lock"`     // as it was before the break
}
