package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"

	"github.com/pgfence/pglock"
)

var locksCommand = &command{
	name:    "locks",
	args:    "[-prefix P] [-watch] [-json]",
	summary: "list the locks and semaphores' permits, with owner, token, expiry and waiters",
	help: `
Locks lists pglock's locks as the database sees them, on its clock, sorted by key:
the key, its owner (the instance name comes first), the fencing token of its last
acquisition, whether a live holder has it, when its lease expires (or ended), and
whether someone waits for it. A semaphore's permits are listed under its key, one
row each, with the permit's number in PERMIT ("-" for a lock); each permit has a
token of its own. A key stays listed after its release, with no owner, until
'pglock prune' deletes it. A job's lease is the lock "<job>:owner"; its run lock
(WithoutOverlapping) is "<job>", and a job with AtMost(n) holds permits of the
semaphore "<job>"; an election's leader holds "<election>".

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
		fmt.Fprintln(e.stdout, c.reached())
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
			fmt.Fprintf(&frame, "pglock locks%s at %s: every 1s, Ctrl+C to stop\n%s\n\n", prefixNote(prefix),
				stamp(time.Now()), c.reached())
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
	t := newTable(w, width, "KEY", "PERMIT", "OWNER", "TOKEN", "HELD", "EXPIRES", "WAITING").clip(2, 12).clip(0, 16)
	held, waiting, permits := 0, 0, 0
	semaphores := map[string]bool{}
	for _, l := range locks {
		permit := "-"
		if l.Permit > 0 {
			permit = strconv.Itoa(l.Permit)
			permits++
			semaphores[l.Key] = true
		}
		h, wt := "no", ""
		if l.Held {
			h = "yes"
			held++
		}
		if l.Waiting {
			wt = "yes"
			waiting++
		}
		t.row(text(l.Key), permit, text(l.Owner), strconv.FormatInt(l.Token, 10), h, expiry(l), wt)
	}
	t.flush()
	count := plural(len(locks)-permits, "lock")
	if permits > 0 {
		count += fmt.Sprintf(", %s of %s", plural(permits, "permit"), plural(len(semaphores), "semaphore"))
	}
	fmt.Fprintf(w, "%s, %d held, %d waited for\n", count, held, waiting)
}

// lockJSON is a lock in -json output.
type lockJSON struct {
	Key              string    `json:"key"`    // for a permit, its semaphore's
	Permit           int       `json:"permit"` // a permit's number; 0 for a lock
	Owner            string    `json:"owner"`
	Instance         string    `json:"instance"`
	Token            int64     `json:"token"`
	Held             bool      `json:"held"`
	ExpiresAt        time.Time `json:"expires_at"`
	ExpiresInSeconds float64   `json:"expires_in_seconds"` // negative once the lease ended
	Waiting          bool      `json:"waiting"`
}

func toLockJSON(l pglock.LockInfo) lockJSON {
	return lockJSON{Key: l.Key, Permit: l.Permit, Owner: l.Owner, Instance: l.Instance, Token: l.Token, Held: l.Held,
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
	args:    "-force [-json] KEY [-permit N]",
	summary: "break a stuck lock or permit (-force required; without it, say what it would break)",
	help: `
Release breaks the lock on KEY, or with -permit N the permit N of the semaphore
KEY (its number as 'pglock locks' lists it), whoever holds it, on any instance:
for a holder an operator knows is stuck. What it guarantees:

  - the key (the permit) is free at once: the next acquisition (a waiter is
    woken) gets a fencing token greater than the broken one;
  - the holder's next renewal is refused (within a third of its ttl): its lock is
    lost and the context of the code under it is cancelled;
  - the holder's fenced writes are refused: a FenceHeld write at once, a
    FenceUpdate or ExecFenced write once the new holder has written its token.

Until its next renewal the old holder still believes it holds the key: only the
fence stops a write it makes in between. The break waits for an open fenced
transaction of the holder (bounded by -timeout). The other permits of a
semaphore are untouched.

Without -force it only says what it would break, changes nothing and exits 2.
A key (a permit) that no live holder has exits 3.`,
	example: `
pglock release orders:42                    # what would be broken
pglock release -force orders:42             # break it
pglock release -force invoices:export -permit 2`,
	connects: true,
	run:      runRelease,
}

func runRelease(ctx context.Context, e *env, fs *flag.FlagSet, args []string) error {
	force := fs.Bool("force", false, "break the lock; without it, print what would be broken and change nothing")
	asJSON := fs.Bool("json", false, "print what was broken (or would be) as JSON")
	permit := fs.Int("permit", 0, "break permit `N` of the semaphore KEY (1 to "+strconv.Itoa(pglock.MaxPermits)+"), not a lock")
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
	permitSet := false
	fs.Visit(func(f *flag.Flag) { permitSet = permitSet || f.Name == "permit" })
	if permitSet && (*permit < 1 || *permit > pglock.MaxPermits) {
		return usageError("release: -permit %d: want 1 to %d, a permit's number as pglock locks lists it", *permit, pglock.MaxPermits)
	}
	c, err := e.connect(ctx)
	if err != nil {
		return err
	}
	defer c.close()
	t := releaseTarget{key: key, permit: *permit}
	if !*force {
		return c.wouldRelease(ctx, t, *asJSON)
	}
	sctx, cancel := c.statementContext(ctx)
	defer cancel()
	info, err := c.forceRelease(sctx, t)
	if errors.Is(err, pglock.ErrNotHeld) {
		return c.notHeld(ctx, t)
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
	fmt.Fprintln(e.stdout, c.reached())
	fmt.Fprintln(e.stdout, wrap(fmt.Sprintf("released %s by force: owner %s, token %d, its lease due to end %s (%s).",
		t, text(info.Owner), info.Token, stamp(info.ExpiresAt), relative(info.ExpiresIn)), e.width))
	if t.permit > 0 {
		fmt.Fprintln(e.stdout, wrap(fmt.Sprintf("The semaphore has one more free permit at once; its other permits are untouched. Its holder's next renewal is refused and the context under the permit cancelled; the permit's next acquisition gets a token greater than %d, so the old holder's fenced writes are refused.", info.Token), e.width))
		return nil
	}
	fmt.Fprintln(e.stdout, wrap(fmt.Sprintf("Its holder's next renewal is refused and the context under the lock cancelled; the next acquisition gets a token greater than %d, so the old holder's fenced writes are refused.", info.Token), e.width))
	return nil
}

// releaseTarget is what release breaks: the lock key, or permit of the semaphore key.
type releaseTarget struct {
	key    string
	permit int // 0 for a lock
}

// String names t in release's messages: "orders:42", `permit 2 of "exports"`.
func (t releaseTarget) String() string {
	if t.permit > 0 {
		return fmt.Sprintf("permit %d of %q", t.permit, t.key)
	}
	return strconv.Quote(t.key)
}

func (c *conn) forceRelease(ctx context.Context, t releaseTarget) (pglock.LockInfo, error) {
	if t.permit == 0 {
		return c.client.ForceRelease(ctx, t.key)
	}
	// The semaphore's number of permits matters only to an acquisition: any will do.
	s, err := c.client.Semaphore(t.key, pglock.MaxPermits)
	if err != nil {
		return pglock.LockInfo{}, err
	}
	return s.ForceRelease(ctx, t.permit)
}

// rowsOf returns the rows listed under exactly key: its lock, or its permits.
func (c *conn) rowsOf(ctx context.Context, key string) ([]pglock.LockInfo, error) {
	locks, err := c.locks(ctx, key)
	if err != nil {
		return nil, err
	}
	var out []pglock.LockInfo
	for _, l := range locks {
		if l.Key == key {
			out = append(out, l)
		}
	}
	return out, nil
}

// notHeld returns the error for t that no live holder has: a usage error (exit 2) when
// t names a lock that is a semaphore or a permit of a lock, so that the operator sees
// the right form; else not found (exit 3).
func (c *conn) notHeld(ctx context.Context, t releaseTarget) error {
	rows, err := c.rowsOf(ctx, t.key)
	if err != nil {
		return err
	}
	if err := mismatch(t, rows); err != nil {
		return err
	}
	return notFoundError("release: %s has no live holder: nothing to break", t)
}

// mismatch says, as a usage error, that t names a semaphore's key without -permit (and
// which permits are held), or a permit of a key that is a lock; nil otherwise.
func mismatch(t releaseTarget, rows []pglock.LockInfo) error {
	var lock bool
	var held []string
	for _, l := range rows {
		switch {
		case l.Permit == 0:
			lock = true
		case l.Held:
			held = append(held, strconv.Itoa(l.Permit))
		}
	}
	switch {
	case t.permit == 0 && !lock && len(held) > 0:
		return usageError("release: %q is a semaphore (permits %s held): give -permit N; nothing changed",
			t.key, strings.Join(held, ", "))
	case t.permit > 0 && lock && len(held) == 0:
		return usageError("release: %q is a lock, not a semaphore: drop -permit; nothing changed", t.key)
	}
	return nil
}

// wouldRelease prints what release -force would break, and returns the error that
// says -force is missing (exit 2), or that nobody holds t (exit 3).
func (c *conn) wouldRelease(ctx context.Context, t releaseTarget, asJSON bool) error {
	rows, err := c.rowsOf(ctx, t.key)
	if err != nil {
		return err
	}
	for _, l := range rows {
		if l.Permit != t.permit || !l.Held {
			continue
		}
		if asJSON {
			if err := writeJSON(c.e.stdout, releaseJSON{Released: false, Lock: toLockJSON(l)}, false); err != nil {
				return err
			}
		} else {
			fmt.Fprintln(c.e.stdout, c.reached())
			fmt.Fprintln(c.e.stdout, wrap(fmt.Sprintf("would release %s: owner %s, token %d, its lease due to end %s (%s)",
				t, text(l.Owner), l.Token, stamp(l.ExpiresAt), relative(l.ExpiresIn)), c.e.width))
		}
		return usageError("release: -force is required to break %s: nothing changed", t)
	}
	if err := mismatch(t, rows); err != nil {
		return err
	}
	return notFoundError("release: %s has no live holder: nothing to break", t)
}

// releaseJSON is release's -json output.
type releaseJSON struct {
	Released bool     `json:"released"` // false without -force
	Lock     lockJSON `json:"lock"`     // as it was before the break
}
