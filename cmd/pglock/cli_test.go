package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"github.com/pgfence/pglock"
	"github.com/pgfence/pglock/internal/devdb"
	"github.com/pgfence/pglock/pglocktest"
)

// TestCommandsShowWhatAnotherProcessDoes runs the read commands against a database in
// which a holder process holds locks, and ran, failed and skipped jobs.
func TestCommandsShowWhatAnotherProcessDoes(t *testing.T) {
	t.Parallel()
	url := pglocktest.PostgresURL(t)
	p := keyPrefix(t)
	h := startHolder(t, url, p)

	t.Run("LocksListsTheHolderLocksAsATable", func(t *testing.T) {
		t.Parallel()
		r := pglockCmd(t, []string{"COLUMNS=200"}, "locks", "-url", url, "-prefix", p) // the test's long keys whole
		require.Equal(t, 0, r.code, r.stderr)
		lines := strings.Split(strings.TrimSpace(afterReached(t, r.stdout, url, "-url")), "\n")
		require.Regexp(t, `^KEY\s+PERMIT\s+OWNER\s+TOKEN\s+HELD\s+EXPIRES\s+WAITING$`, lines[0])
		row := func(key, permit string) string {
			for _, l := range lines {
				if f := strings.Fields(l); len(f) > 1 && f[0] == key && f[1] == permit {
					return l
				}
			}
			t.Fatalf("no row for %s %s in\n%s", key, permit, r.stdout)
			return ""
		}
		for _, key := range []string{p + "orders:1", p + "orders:2", p + "stuck:1"} {
			require.Regexp(t, `^\S+\s+-\s+worker-1/\S+\s+`+itoa(h.tokens[key])+`\s+yes\s+in [0-9.]+m?s`, row(key, "-"))
		}
		for _, permit := range []string{"1", "2"} { // a semaphore's permits under its key, each with its token
			require.Regexp(t, `^\S+\s+`+permit+`\s+worker-1/\S+\s+`+itoa(h.tokens[p+"feed#"+permit])+`\s+yes\s+in [0-9.]+m?s$`, row(p+"feed", permit))
		}
		require.Regexp(t, `\s+yes$`, row(p+"orders:2", "-"), "orders:2 is waited for")
		require.Regexp(t, `\s+yes\s+in [0-9.]+m?s$`, row(p+"orders:1", "-"), "nobody waits for orders:1")
		require.Regexp(t, `^\S+\s+-\s+worker-1/\S+\s+\d+\s+yes\s`, row(p+"reconcile:owner", "-"), "worker-1 owns the job reconcile")
		require.Regexp(t, `^\S+\s+-\s+-\s+\d+\s+no\s+released \S+ ago$`, row(p+"export", "-"), "the run lock of export was released")

		// 100 columns by default, or COLUMNS: the owners give way first, then the keys.
		r = pglockCmd(t, nil, "locks", "-url", url, "-prefix", p)
		require.Equal(t, 0, r.code, r.stderr)
		requireFits(t, r.stdout, defaultWidth)
		r = pglockCmd(t, []string{"COLUMNS=80"}, "locks", "-url", url, "-prefix", p)
		require.Equal(t, 0, r.code, r.stderr)
		requireFits(t, r.stdout, 80)
		require.Contains(t, r.stdout, "…")
		require.Equal(t, "6 locks, 2 permits of 1 semaphore, 6 held, 1 waited for", lines[len(lines)-1])
	})

	t.Run("LocksJSONGivesEveryField", func(t *testing.T) {
		t.Parallel()
		r := pglockCmd(t, nil, "locks", "-json", "-url", url, "-prefix", p+"orders:")
		require.Equal(t, 0, r.code, r.stderr)
		var locks []map[string]any
		require.NoError(t, json.Unmarshal([]byte(r.stdout), &locks), r.stdout)
		require.Len(t, locks, 2)
		l := locks[1]
		require.Equal(t, p+"orders:2", l["key"])
		require.Equal(t, "worker-1", l["instance"])
		require.Regexp(t, `^worker-1/.+`, l["owner"])
		require.Equal(t, float64(h.tokens[p+"orders:2"]), l["token"])
		require.Equal(t, true, l["held"])
		require.Equal(t, true, l["waiting"])
		require.Greater(t, l["expires_in_seconds"], 0.0)
		require.LessOrEqual(t, l["expires_in_seconds"], holderTTL.Seconds())
		expires, err := time.Parse(time.RFC3339Nano, l["expires_at"].(string))
		require.NoError(t, err)
		require.WithinDuration(t, time.Now(), expires, time.Minute)
		require.Equal(t, false, locks[0]["waiting"])
		require.Equal(t, 0.0, locks[0]["permit"], "a lock's permit is 0")

		r = pglockCmd(t, nil, "locks", "-json", "-url", url, "-prefix", p+"feed")
		require.Equal(t, 0, r.code, r.stderr)
		var permits []lockJSON
		require.NoError(t, json.Unmarshal([]byte(r.stdout), &permits), r.stdout)
		require.Len(t, permits, 2)
		for i, l := range permits {
			require.Equal(t, p+"feed", l.Key, "a permit is listed under its semaphore's key")
			require.Equal(t, i+1, l.Permit)
			require.Equal(t, h.tokens[fmt.Sprintf("%sfeed#%d", p, i+1)], l.Token)
			require.True(t, l.Held)
		}
	})

	t.Run("LocksWithAPrefixThatMatchesNothingSaysSo", func(t *testing.T) {
		t.Parallel()
		r := pglockCmd(t, nil, "locks", "-url", url, "-prefix", p+"nothing%")
		require.Equal(t, 0, r.code, r.stderr)
		require.Equal(t, "no locks with prefix \""+p+"nothing%\"\n", afterReached(t, r.stdout, url, "-url"))
	})

	t.Run("LocksConnectsWithDatabaseURL", func(t *testing.T) {
		t.Parallel()
		r := pglockCmd(t, []string{"DATABASE_URL=" + url}, "locks", "-prefix", p+"stuck:", "-json")
		require.Equal(t, 0, r.code, r.stderr)
		require.Contains(t, r.stdout, `"key": "`+p+`stuck:1"`)
	})

	t.Run("JobsShowsLastRunLastFailureAndSkips", func(t *testing.T) {
		t.Parallel()
		r := pglockCmd(t, []string{"COLUMNS=200"}, "jobs", "-url", url)
		require.Equal(t, 0, r.code, r.stderr)
		lines := strings.Split(strings.TrimSpace(afterReached(t, r.stdout, url, "-url")), "\n")
		require.Regexp(t, `^JOB\s+LAST RUN\s+ON\s+TOOK\s+OUTCOME\s+LAST FAILURE\s+SKIPPED$`, lines[0])
		require.Len(t, lines, 3, r.stdout)
		require.Regexp(t, `^`+regexp.QuoteMeta(p)+`export\s+\S+ ago\s+worker-1\s+\S+s\s+error\s+\S+ ago on worker-1, error: export: the warehouse answered 503\s+-$`, lines[1])
		require.Regexp(t, `^`+regexp.QuoteMeta(p)+`reconcile\s+\S+ ago\s+worker-1\s+\S+s\s+ok\s+-\s+other-instance 1$`, lines[2])

		r = pglockCmd(t, nil, "jobs", "-url", url)
		require.Equal(t, 0, r.code, r.stderr)
		requireFits(t, r.stdout, defaultWidth)
		// How much of the error is left depends on how long ago the run was ("4.1s ago" or "12s ago").
		require.Regexp(t, `ago on worker-1,( \S*)?…`, r.stdout, "the failure gives way first")
	})

	t.Run("JobsJSONGivesEveryField", func(t *testing.T) {
		t.Parallel()
		r := pglockCmd(t, nil, "jobs", "-json", "-url", url)
		require.Equal(t, 0, r.code, r.stderr)
		var jobs []struct {
			Job         string
			LastRun     *runJSON   `json:"last_run"`
			LastFailure *runJSON   `json:"last_failure"`
			Skips       []skipJSON `json:"skips"`
		}
		require.NoError(t, json.Unmarshal([]byte(r.stdout), &jobs), r.stdout)
		require.Len(t, jobs, 2)
		export, reconcile := jobs[0], jobs[1]
		require.Equal(t, p+"export", export.Job)
		require.Equal(t, "error", export.LastFailure.Outcome)
		require.Equal(t, "export: the warehouse answered 503", export.LastFailure.Error)
		require.Equal(t, p+"reconcile", reconcile.Job)
		require.Nil(t, reconcile.LastFailure)
		run := reconcile.LastRun
		require.Equal(t, "ok", run.Outcome)
		require.Equal(t, "worker-1", run.Instance)
		require.Regexp(t, `^worker-1/`, run.Owner)
		require.Positive(t, run.Token)
		require.False(t, run.Ended.Before(run.Started))
		require.InDelta(t, run.Ended.Sub(run.Started).Seconds(), run.DurationSeconds, 1e-6)
		require.Equal(t, []skipJSON{{Instance: "worker-2", Reason: "other-instance", Count: 1, Last: reconcile.Skips[0].Last}}, reconcile.Skips)
	})

	t.Run("JobsOfOneJobListsItsRunsNewestFirst", func(t *testing.T) {
		t.Parallel()
		r := pglockCmd(t, nil, "jobs", "-url", url, "-n", "5", p+"reconcile")
		require.Equal(t, 0, r.code, r.stderr)
		lines := strings.Split(strings.TrimSpace(afterReached(t, r.stdout, url, "-url")), "\n")
		require.Regexp(t, `^STARTED \(UTC\)\s+ON\s+TOKEN\s+TOOK\s+OUTCOME\s+ERROR$`, lines[0])
		require.Regexp(t, `^\S+Z\s+worker-1\s+\d+\s+\S+s\s+ok\s+-$`, lines[1])
		require.Regexp(t, `^\S+Z\s+worker-1\s+\d+\s+\S+s\s+ok\s+-$`, lines[2])
		require.Equal(t, "", lines[3])
		require.Regexp(t, `^SKIPPED ON\s+REASON\s+TICKS\s+LAST$`, lines[4])
		require.Regexp(t, `^worker-2\s+other-instance\s+1\s+\S+ ago$`, lines[5])
		require.Equal(t, "", lines[6])
		require.Regexp(t, `^REGISTERED ON\s+STATE\s+REGISTERED\s+LAST SEEN$`, lines[7])
		require.Regexp(t, `^worker-1\s+live\s+\S+ ago\s+\S+ ago$`, lines[8], "its client is open")
		require.Regexp(t, `^worker-2\s+closed\s+\S+ ago\s+\S+ ago$`, lines[9], "its client was closed")
		requireFits(t, r.stdout, defaultWidth)

		r = pglockCmd(t, nil, "jobs", "-url", url, "-n", "1", "-json", p+"reconcile")
		require.Equal(t, 0, r.code, r.stderr)
		var runs jobRunsJSON
		require.NoError(t, json.Unmarshal([]byte(r.stdout), &runs), r.stdout)
		require.Len(t, runs.Runs, 1, "-n 1")
	})

	t.Run("JobsOfAJobNeitherRegisteredNorRecordedIsNotFound", func(t *testing.T) {
		t.Parallel()
		r := pglockCmd(t, nil, "jobs", "-url", url, p+"never-ran")
		require.Equal(t, exitNotFound, r.code)
		require.Equal(t, `pglock: jobs: no job "`+p+`never-ran" registered or recorded (within the retention): pglock jobs lists them`+"\n", r.stderr)
	})

	t.Run("JobsOfANameThatEndsAJobKeySaysWhichOne", func(t *testing.T) {
		t.Parallel()
		r := pglockCmd(t, nil, "jobs", "-url", url, "reconcile")
		require.Equal(t, exitNotFound, r.code)
		require.Equal(t, `pglock: jobs: no job "reconcile" registered or recorded (within the retention): did you mean "`+p+`reconcile"? (a job is named by its key)`+"\n", r.stderr)
	})

	t.Run("ReleaseWithoutForceSaysWhatItWouldBreakAndBreaksNothing", func(t *testing.T) {
		t.Parallel()
		key := p + "orders:1"
		before := locksJSONOf(t, url, key)
		r := pglockCmd(t, nil, "release", "-url", url, key)
		require.Equal(t, exitUsage, r.code)
		requireFits(t, r.stdout, defaultWidth)
		require.Regexp(t, `^would release "`+regexp.QuoteMeta(key)+`": owner worker-1/\S+, token `+itoa(h.tokens[key])+`, its lease due to end \S+Z \(in \S+\)$`, unwrap(afterReached(t, r.stdout, url, "-url")))
		require.Equal(t, `pglock: release: -force is required to break "`+key+`": nothing changed`+"\n", r.stderr)
		after := locksJSONOf(t, url, key)
		require.True(t, after[0].Held)
		require.Equal(t, before[0].Owner, after[0].Owner)
		require.Equal(t, before[0].Token, after[0].Token)
	})

	t.Run("ReleaseOfAPermitWithoutForceSaysWhatItWouldBreakAndBreaksNothing", func(t *testing.T) {
		t.Parallel()
		key := p + "feed"
		before := locksJSONOf(t, url, key)
		r := pglockCmd(t, nil, "release", "-url", url, key, "-permit", "2")
		require.Equal(t, exitUsage, r.code)
		require.Regexp(t, `^would release permit 2 of "`+regexp.QuoteMeta(key)+`": owner worker-1/\S+, token `+itoa(h.tokens[key+"#2"])+`, its lease due to end \S+Z \(in \S+\)$`, unwrap(afterReached(t, r.stdout, url, "-url")))
		require.Equal(t, `pglock: release: -force is required to break permit 2 of "`+key+`": nothing changed`+"\n", r.stderr)
		require.Equal(t, holders(before), holders(locksJSONOf(t, url, key)))
	})

	t.Run("MigrateStatusSaysEverythingIsApplied", func(t *testing.T) {
		t.Parallel()
		available, err := migrations()
		require.NoError(t, err)
		latest := available[len(available)-1]
		r := pglockCmd(t, nil, "migrate", "status", "-url", url)
		require.Equal(t, 0, r.code, r.stderr)
		require.Contains(t, afterReached(t, r.stdout, url, "-url"), "schema pglock at version "+itoa(int64(latest.Version))+" of "+itoa(int64(latest.Version))+", 0 migrations pending\n")
		require.Regexp(t, `(?m)^1\s+locks\s+applied$`, r.stdout)
		require.Regexp(t, `(?m)^`+itoa(int64(latest.Version))+`\s+`+latest.Name+`\s+applied$`, r.stdout)
		require.NotRegexp(t, `(?m)^\d+\s+\S+\s+pending$`, r.stdout)
	})

	t.Run("SQLPrintsTheSchemaScript", func(t *testing.T) {
		t.Parallel()
		r := pglockCmd(t, nil, "sql")
		require.Equal(t, 0, r.code, r.stderr)
		require.Equal(t, pglock.SQL(), r.stdout)
	})
}

// TestReleaseForceBreaksTheHolderLock breaks a lock that another process holds: the
// holder's lock ctx is cancelled, a new acquisition gets a greater token, and the
// holder's other locks are untouched.
func TestReleaseForceBreaksTheHolderLock(t *testing.T) {
	t.Parallel()
	url := pglocktest.PostgresURL(t)
	p := keyPrefix(t)
	h := startHolder(t, url, p)
	key := p + "stuck:1"
	broken := h.tokens[key]
	other := locksJSONOf(t, url, p+"orders:1")

	r := pglockCmd(t, nil, "release", "-force", "-url", url, key)
	require.Equal(t, 0, r.code, r.stderr)
	requireFits(t, r.stdout, defaultWidth)
	require.Regexp(t, `^released "`+regexp.QuoteMeta(key)+`" by force: owner worker-1/\S+, token `+itoa(broken)+`, its lease due to end \S+Z \(in \S+\)\. `+
		`Its holder's next renewal is refused and the context under the lock cancelled; the next acquisition gets a token greater than `+itoa(broken)+`, so the old holder's fenced writes are refused\.$`, unwrap(afterReached(t, r.stdout, url, "-url")))
	require.Empty(t, r.stderr)

	// The holder renews every second: its next renewal is refused.
	require.Equal(t, "lost "+key, h.next(t, 3*holderTTL))

	client := newClient(t, url)
	l, err := client.TryAcquire(context.Background(), key)
	require.NoError(t, err, "the key is free")
	require.Greater(t, l.Token(), broken)
	require.NoError(t, l.Release(context.Background()))

	after := locksJSONOf(t, url, p+"orders:1")
	require.True(t, after[0].Held, "the holder's other locks are untouched")
	require.Equal(t, other[0].Owner, after[0].Owner)
	require.Equal(t, other[0].Token, after[0].Token)

	r = pglockCmd(t, nil, "release", "-force", "-json", "-url", url, key)
	require.Equal(t, exitNotFound, r.code, "broken twice")
	require.Equal(t, `pglock: release: "`+key+`" has no live holder: nothing to break`+"\n", r.stderr)
	require.Empty(t, r.stdout)
}

// TestReleaseForceBreaksAPermit breaks permit 2 of a semaphore that another process
// holds permits 1 and 2 of: that holder's permit ctx is cancelled, the permit's next
// acquisition gets a greater token, and permit 1 is untouched.
func TestReleaseForceBreaksAPermit(t *testing.T) {
	t.Parallel()
	url := pglocktest.PostgresURL(t)
	p := keyPrefix(t)
	h := startHolder(t, url, p)
	key := p + "feed"
	broken := h.tokens[key+"#2"]

	r := pglockCmd(t, nil, "release", "-force", "-url", url, key, "-permit", "2")
	require.Equal(t, 0, r.code, r.stderr)
	requireFits(t, r.stdout, defaultWidth)
	require.Regexp(t, `^released permit 2 of "`+regexp.QuoteMeta(key)+`" by force: owner worker-1/\S+, token `+itoa(broken)+`, its lease due to end \S+Z \(in \S+\)\. `+
		`The semaphore has one more free permit at once; its other permits are untouched\. Its holder's next renewal is refused and the context under the permit cancelled; `+
		`the permit's next acquisition gets a token greater than `+itoa(broken)+`, so the old holder's fenced writes are refused\.$`, unwrap(afterReached(t, r.stdout, url, "-url")))
	require.Equal(t, "lost "+key+"#2", h.next(t, 3*holderTTL))

	locks := locksJSONOf(t, url, key)
	require.Len(t, locks, 2)
	require.Equal(t, 1, locks[0].Permit)
	require.True(t, locks[0].Held, "permit 1 is untouched")
	require.Equal(t, h.tokens[key+"#1"], locks[0].Token)
	require.False(t, locks[1].Held, "permit 2 is free")

	sem, err := newClient(t, url).Semaphore(key, 3)
	require.NoError(t, err)
	l, err := sem.TryAcquire(context.Background())
	require.NoError(t, err)
	require.Equal(t, 2, l.Permit(), "the lowest free permit")
	require.Greater(t, l.Token(), broken)
	require.NoError(t, l.Release(context.Background()))

	r = pglockCmd(t, nil, "release", "-force", "-json", "-url", url, key, "-permit", "2")
	require.Equal(t, exitNotFound, r.code, "broken twice")
	require.Equal(t, `pglock: release: permit 2 of "`+key+`" has no live holder: nothing to break`+"\n", r.stderr)
	r = pglockCmd(t, nil, "release", "-force", "-json", "-url", url, "-permit", "1", key)
	require.Equal(t, 0, r.code, r.stderr)
	var out releaseJSON
	require.NoError(t, json.Unmarshal([]byte(r.stdout), &out), r.stdout)
	require.True(t, out.Released)
	require.Equal(t, lockJSON{Key: key, Permit: 1, Owner: out.Lock.Owner, Instance: "worker-1", Token: h.tokens[key+"#1"], Held: true,
		ExpiresAt: out.Lock.ExpiresAt, ExpiresInSeconds: out.Lock.ExpiresInSeconds}, out.Lock)
}

// TestPruneDeletesOnlyOldEndedLocks prunes released locks and keeps a held one.
func TestPruneDeletesOnlyOldEndedLocks(t *testing.T) {
	t.Parallel()
	url := pglocktest.PostgresURL(t)
	p := keyPrefix(t)
	client := newClient(t, url)
	ctx := context.Background()
	for _, k := range []string{"a", "b", "c"} {
		l, err := client.TryAcquire(ctx, p+k)
		require.NoError(t, err)
		require.NoError(t, l.Release(ctx))
	}
	held, err := client.TryAcquire(ctx, p+"held")
	require.NoError(t, err)
	defer held.Release(ctx)

	r := pglockCmd(t, nil, "prune", "-older-than", "1d", "-url", url)
	require.Equal(t, 0, r.code, r.stderr)
	require.Equal(t, "deleted 0 locks released or expired more than 1d ago\n", afterReached(t, r.stdout, url, "-url"))

	r = pglockCmd(t, nil, "prune", "-older-than", "0s", "-json", "-url", url)
	require.Equal(t, 0, r.code, r.stderr)
	require.JSONEq(t, `{"deleted": 3, "older_than_seconds": 0}`, r.stdout)

	locks := locksJSONOf(t, url, p)
	require.Len(t, locks, 1)
	require.Equal(t, p+"held", locks[0].Key)
	require.True(t, locks[0].Held)
}

// TestMigrateAppliesTheSchemaToAnEmptyDatabase migrates a fresh database, then finds
// nothing more to do.
func TestMigrateAppliesTheSchemaToAnEmptyDatabase(t *testing.T) {
	t.Parallel()
	url := unmigratedDatabase(t)
	available, err := migrations()
	require.NoError(t, err)
	latest := itoa(int64(available[len(available)-1].Version))

	r := pglockCmd(t, nil, "migrate", "status", "-url", url)
	require.Equal(t, exitFailure, r.code, "no schema: exit 1")
	status := afterReached(t, r.stdout, url, "-url")
	require.True(t, strings.HasPrefix(status, "schema pglock not found: "+itoa(int64(len(available)))+" migrations pending\n"), r.stdout)
	require.Regexp(t, `(?m)^1\s+locks\s+pending$`, status)
	require.Regexp(t, "^pglock: database \"\\w+\" at \\S+: schema pglock not found: run `pglock migrate`\n$", r.stderr)
	require.False(t, schemaExists(t, url), "status changes nothing")

	r = pglockCmd(t, []string{"DATABASE_URL=" + url}, "migrate")
	require.Equal(t, 0, r.code, r.stderr)
	require.Equal(t, "migrated schema pglock from version 0 to "+latest+"\n", afterReached(t, r.stdout, url, "DATABASE_URL"))

	r = pglockCmd(t, nil, "-url", url, "migrate", "up")
	require.Equal(t, 0, r.code, r.stderr)
	require.Equal(t, "schema pglock is up to date: version "+latest+"\n", afterReached(t, r.stdout, url, "-url"))

	r = pglockCmd(t, nil, "migrate", "status", "-json", "-url", url)
	require.Equal(t, 0, r.code, r.stderr)
	var st struct {
		SchemaExists bool `json:"schema_exists"`
		Version      uint
		Pending      int
		Migrations   []struct{ Applied bool }
	}
	require.NoError(t, json.Unmarshal([]byte(r.stdout), &st), r.stdout)
	require.True(t, st.SchemaExists)
	require.Equal(t, available[len(available)-1].Version, st.Version)
	require.Zero(t, st.Pending)
	for _, m := range st.Migrations {
		require.True(t, m.Applied)
	}

	r = pglockCmd(t, nil, "locks", "-url", url)
	require.Equal(t, 0, r.code, r.stderr)
	require.Equal(t, "no locks\n", afterReached(t, r.stdout, url, "-url"))
}

// TestBadInputSaysWhatIsWrongAndTouchesNothing runs pglock wrongly: each run prints
// one clear message, exits non-zero, and leaves the database as it was.
func TestBadInputSaysWhatIsWrongAndTouchesNothing(t *testing.T) {
	t.Parallel()
	url := pglocktest.PostgresURL(t)
	empty := unmigratedDatabase(t)
	p := keyPrefix(t)
	client := newClient(t, url)
	held, err := client.TryAcquire(context.Background(), p+"held")
	require.NoError(t, err)
	defer held.Release(context.Background())
	sem, err := client.Semaphore(p+"sem", 2)
	require.NoError(t, err)
	permit, err := sem.TryAcquire(context.Background())
	require.NoError(t, err)
	defer permit.Release(context.Background())
	before := locksJSONOf(t, url, "")
	missing, err := devdb.WithDatabase(url, "pglock_cli_no_such_database")
	require.NoError(t, err)

	const unreachable = "postgres://postgres@127.0.0.1:1/postgres?sslmode=disable"
	const noSchema = "schema pglock not found: run `pglock migrate`\n"
	for _, tc := range []struct {
		name   string
		args   []string
		code   int
		stderr string // a regexp, matched against the whole of stderr
	}{
		{"UnknownCommand", []string{"frobnicate"}, exitUsage,
			`^pglock: unknown command "frobnicate": want one of locks, jobs, release, migrate, sql, prune, ui, version \(pglock -h\)\n$`},
		{"UnknownFlagBeforeTheCommand", []string{"-bogus", "locks"}, exitUsage,
			`^pglock: flag provided but not defined: -bogus \(pglock -h\)\n$`},
		{"NoCommand", nil, exitUsage, `^pglock shows and steers(.|\n)*Exit codes:(.|\n)*`},
		{"UnknownFlag", []string{"locks", "-url", url, "-colour"}, exitUsage,
			`^pglock: locks: flag provided but not defined: -colour \(pglock locks -h\)\n$`},
		{"ReleaseWithoutForce", []string{"release", "-url", url, p + "held"}, exitUsage,
			`^pglock: release: -force is required to break "` + regexp.QuoteMeta(p) + `held": nothing changed\n$`},
		{"ReleaseWithoutKey", []string{"release", "-force", "-url", url}, exitUsage,
			`^pglock: release: want one KEY, got 0 arguments \(pglock release -h\)\n$`},
		{"ReleaseOfAFreeKey", []string{"release", "-force", "-url", url, p + "free"}, exitNotFound,
			`^pglock: release: "` + regexp.QuoteMeta(p) + `free" has no live holder: nothing to break\n$`},
		{"ReleaseOfAnInvalidKey", []string{"release", "-force", "-url", url, strings.Repeat("k", pglock.MaxKeyLength+1)}, exitUsage,
			`^pglock: invalid key: .*\n$`},
		{"ReleaseOfPermitZero", []string{"release", "-force", "-url", url, p + "sem", "-permit", "0"}, exitUsage,
			`^pglock: release: -permit 0: want 1 to 1000, a permit's number as pglock locks lists it\n$`},
		{"ReleaseOfANegativePermit", []string{"release", "-force", "-url", url, "-permit", "-1", p + "sem"}, exitUsage,
			`^pglock: release: -permit -1: want 1 to 1000, `},
		{"ReleaseOfAPermitAboveMaxPermits", []string{"release", "-force", "-url", url, p + "sem", "-permit", "1001"}, exitUsage,
			`^pglock: release: -permit 1001: want 1 to 1000, `},
		{"ReleaseOfAPermitThatIsNoNumber", []string{"release", "-force", "-url", url, p + "sem", "-permit", "two"}, exitUsage,
			`^pglock: release: invalid value "two" for flag -permit: parse error \(pglock release -h\)\n$`},
		{"ReleaseOfAPermitOfALock", []string{"release", "-force", "-url", url, p + "held", "-permit", "1"}, exitUsage,
			`^pglock: release: "` + regexp.QuoteMeta(p) + `held" is a lock, not a semaphore: drop -permit; nothing changed\n$`},
		{"ReleaseOfAPermitOfALockWithoutForce", []string{"release", "-url", url, p + "held", "-permit", "1"}, exitUsage,
			`^pglock: release: "` + regexp.QuoteMeta(p) + `held" is a lock, not a semaphore: drop -permit; nothing changed\n$`},
		{"ReleaseOfASemaphoreWithoutPermit", []string{"release", "-force", "-url", url, p + "sem"}, exitUsage,
			`^pglock: release: "` + regexp.QuoteMeta(p) + `sem" is a semaphore \(permits 1 held\): give -permit N; nothing changed\n$`},
		{"ReleaseOfAFreePermit", []string{"release", "-force", "-url", url, p + "sem", "-permit", "2"}, exitNotFound,
			`^pglock: release: permit 2 of "` + regexp.QuoteMeta(p) + `sem" has no live holder: nothing to break\n$`},
		{"ReleaseOfAPermitOfAKeyTooLongForASemaphore", []string{"release", "-force", "-url", url, strings.Repeat("k", pglock.MaxKeyLength-4), "-permit", "1"}, exitUsage,
			`^pglock: invalid key: .*\n$`},
		{"PruneWithoutOlderThan", []string{"prune", "-url", url}, exitUsage,
			`^pglock: prune: -older-than is required, for example -older-than 24h\n$`},
		{"PruneWithABadDuration", []string{"prune", "-url", url, "-older-than", "a week"}, exitUsage,
			`^pglock: prune: invalid value "a week" for flag -older-than: want a duration such as 90m, 24h or 7d \(pglock prune -h\)\n$`},
		{"PruneWithANegativeDuration", []string{"prune", "-url", url, "-older-than", "-1h"}, exitUsage,
			`^pglock: prune: invalid value "-1h" for flag -older-than: negative \(pglock prune -h\)\n$`},
		{"JobsWithTooManyRuns", []string{"jobs", "-url", url, "-n", "1001", "x"}, exitUsage, `^pglock: jobs: -n 1001: want 1 to 1000\n$`},
		{"MigrateSideways", []string{"migrate", "-url", url, "sideways"}, exitUsage,
			`^pglock: migrate: unknown action "sideways": want up or status\n$`},
		{"ZeroTimeout", []string{"locks", "-url", url, "-timeout", "0s"}, exitUsage,
			`^pglock: locks: -timeout 0s: want a positive duration such as 5s\n$`},
		{"BadConnectionString", []string{"locks", "-url", "postgres://%zz"}, exitUsage,
			`^pglock: the connection string \(-url or DATABASE_URL\) is not valid: .*\n$`},
		{"NoSuchDatabase", []string{"locks", "-url", missing}, exitFailure,
			`^pglock: database "pglock_cli_no_such_database" does not exist at \S+: name another with -url or DATABASE_URL\n$`},
		{"UnreachableLocks", []string{"locks", "-url", unreachable}, exitFailure, `^pglock: PostgreSQL unreachable at 127\.0\.0\.1:1: connect: connection refused\n$`},
		{"UnreachableJobs", []string{"-url", unreachable, "jobs"}, exitFailure, `^pglock: PostgreSQL unreachable at 127\.0\.0\.1:1: `},
		{"UnreachableRelease", []string{"release", "-force", "-url", unreachable, "k"}, exitFailure, `^pglock: PostgreSQL unreachable at 127\.0\.0\.1:1: `},
		{"UnreachableMigrate", []string{"migrate", "-url", unreachable}, exitFailure, `^pglock: PostgreSQL unreachable at 127\.0\.0\.1:1: `},
		{"UnreachablePrune", []string{"prune", "-older-than", "1h", "-url", unreachable}, exitFailure, `^pglock: PostgreSQL unreachable at 127\.0\.0\.1:1: `},
		{"UnmigratedLocks", []string{"locks", "-url", empty}, exitFailure, `^pglock: database "pglock_cli_empty_\w+" at \S+: ` + regexp.QuoteMeta(noSchema) + `$`},
		{"UnmigratedJobs", []string{"jobs", "-url", empty}, exitFailure, `^pglock: database "\w+" at \S+: ` + regexp.QuoteMeta(noSchema) + `$`},
		{"UnmigratedRelease", []string{"release", "-force", "-url", empty, "k"}, exitFailure, `^pglock: database "\w+" at \S+: ` + regexp.QuoteMeta(noSchema) + `$`},
		{"UnmigratedReleaseWithoutForce", []string{"release", "-url", empty, "k"}, exitFailure, `^pglock: database "\w+" at \S+: ` + regexp.QuoteMeta(noSchema) + `$`},
		{"UnmigratedPrune", []string{"prune", "-older-than", "1h", "-url", empty}, exitFailure, `^pglock: database "\w+" at \S+: ` + regexp.QuoteMeta(noSchema) + `$`},
		{"UnmigratedUI", []string{"ui", "-addr", "127.0.0.1:0", "-url", empty}, exitFailure, `^pglock: database "\w+" at \S+: ` + regexp.QuoteMeta(noSchema) + `$`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := pglockCmd(t, nil, tc.args...)
			require.Equal(t, tc.code, r.code, "stdout: %s\nstderr: %s", r.stdout, r.stderr)
			require.Regexp(t, tc.stderr, r.stderr)
			if tc.name != "ReleaseWithoutForce" {
				require.Empty(t, r.stdout)
			}
		})
	}
	require.Equal(t, holders(before), holders(locksJSONOf(t, url, "")), "nothing changed")
	require.False(t, schemaExists(t, empty), "nothing created in the unmigrated database")
}

// TestHelpShowsUsageAndAnExample runs -h on pglock and each command.
func TestHelpShowsUsageAndAnExample(t *testing.T) {
	t.Parallel()
	r := pglockCmd(t, nil, "-h")
	require.Equal(t, 0, r.code, r.stderr)
	require.Contains(t, r.stdout, "Exit codes:\n  0  ok\n  1  failure")
	require.Contains(t, r.stdout, "Examples:\n  pglock locks -prefix orders:\n")
	for _, c := range commands {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			for _, args := range [][]string{{c.name, "-h"}, {"help", c.name}} {
				r := pglockCmd(t, nil, args...)
				require.Equal(t, 0, r.code, r.stderr)
				require.Regexp(t, `^Usage: pglock `+c.name+`( |\n)`, r.stdout)
				require.Regexp(t, `\nExample:\n  pglock `+c.name+`\b`, r.stdout)
				require.Empty(t, r.stderr)
			}
		})
	}
}

// TestLocksWatchRedrawsUntilInterrupted watches a lock, sees at least two frames, and
// stops on SIGINT with exit code 0: for people, and with -json.
func TestLocksWatchRedrawsUntilInterrupted(t *testing.T) {
	t.Parallel()
	url := pglocktest.PostgresURL(t)
	p := keyPrefix(t)
	client := newClient(t, url)
	l, err := client.TryAcquire(context.Background(), p+"watched")
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, l.Release(context.Background())) }) // after the parallel subtests

	for _, tc := range []struct {
		name  string
		args  []string
		frame func(line string) bool // whether line starts a frame showing the lock
	}{
		{"Table", nil, func() func(string) bool {
			header, named := false, false
			db := reachedLine(t, url, "-url")
			return func(line string) bool {
				switch {
				case strings.HasPrefix(line, `pglock locks -prefix "`+p+`" at `):
					header, named = true, false
				case header && line == db: // each frame says which database
					named = true
				case header && named && strings.HasPrefix(line, p+"watched "):
					header = false
					return true
				}
				return false
			}
		}()},
		{"JSON", []string{"-json"}, func(line string) bool {
			var locks []lockJSON
			return json.Unmarshal([]byte(line), &locks) == nil && len(locks) == 1 && locks[0].Key == p+"watched" && locks[0].Held
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			cmd := exec.CommandContext(ctx, binary, append([]string{"locks", "-watch", "-url", url, "-prefix", p}, tc.args...)...)
			cmd.Env = withoutDatabaseURL(os.Environ())
			stdout, err := cmd.StdoutPipe()
			require.NoError(t, err)
			require.NoError(t, cmd.Start())
			sc := bufio.NewScanner(stdout)
			frames := 0
			for frames < 2 && sc.Scan() {
				if tc.frame(sc.Text()) {
					frames++
				}
			}
			require.Equal(t, 2, frames, "two frames before the deadline")
			require.NoError(t, cmd.Process.Signal(syscall.SIGINT))
			for sc.Scan() { // until it exits
			}
			require.NoError(t, cmd.Wait(), "exit 0 on SIGINT")
		})
	}
}

// locksJSONOf runs pglock locks -json -prefix prefix.
func locksJSONOf(t *testing.T, url, prefix string) []lockJSON {
	t.Helper()
	r := pglockCmd(t, nil, "locks", "-json", "-url", url, "-prefix", prefix)
	require.Equal(t, 0, r.code, r.stderr)
	var locks []lockJSON
	require.NoError(t, json.Unmarshal([]byte(r.stdout), &locks), r.stdout)
	for i := range locks {
		locks[i].ExpiresInSeconds = 0 // it changes with every reading
	}
	return locks
}

// holders returns who holds each lock, without the expiry that renewals move.
func holders(locks []lockJSON) []string {
	out := make([]string, len(locks))
	for i, l := range locks {
		out[i] = fmt.Sprintf("%s %s %d %v", l.Key, l.Owner, l.Token, l.Held)
	}
	return out
}

// newClient returns a pglock client on url, closed when the test ends.
func newClient(t *testing.T, url string) *pglock.Client {
	t.Helper()
	client, err := pglock.New(pglocktest.Pool(t, url, 4), pglock.WithoutListener(), pglock.WithInstanceName("test"))
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, client.Close(context.Background())) })
	return client
}

// schemaExists reports whether the database at url has a schema pglock.
func schemaExists(t *testing.T, url string) bool {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, url)
	require.NoError(t, err)
	defer conn.Close(ctx)
	var exists bool
	require.NoError(t, conn.QueryRow(ctx, `SELECT to_regnamespace('pglock') IS NOT NULL`).Scan(&exists))
	return exists
}

func itoa(n int64) string { return strconv.FormatInt(n, 10) }

func TestUIServesTheConsoleUntilInterrupted(t *testing.T) {
	t.Parallel()
	url := pglocktest.PostgresURL(t)
	p := keyPrefix(t)
	l, err := newClient(t, url).TryAcquire(context.Background(), p+"shown")
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, l.Release(context.Background())) })

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, binary, "ui", "-addr", "127.0.0.1:0")
	cmd.Env = append(withoutDatabaseURL(os.Environ()), "DATABASE_URL="+url, "COLUMNS=300") // its first line unwrapped
	stdout, err := cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	sc := bufio.NewScanner(stdout)
	require.True(t, sc.Scan())
	require.Equal(t, reachedLine(t, url, "DATABASE_URL"), sc.Text(), "it says which database it serves first")
	require.True(t, sc.Scan())
	m := regexp.MustCompile(`^pglock ui: serving it on (http://127\.0\.0\.1:\d+/) \(Ctrl\+C stops\)$`).FindStringSubmatch(sc.Text())
	require.NotNil(t, m, sc.Text())

	res, err := http.Get(m[1] + "?prefix=" + p)
	require.NoError(t, err)
	body, err := io.ReadAll(res.Body)
	require.NoError(t, err)
	require.NoError(t, res.Body.Close())
	require.Equal(t, http.StatusOK, res.StatusCode)
	require.Contains(t, string(body), `<tr data-key="`+p+`shown" class="held">`)
	require.NotContains(t, string(body), "force-release", "actions off without -actions")

	require.NoError(t, cmd.Process.Signal(syscall.SIGINT))
	for sc.Scan() {
	}
	require.NoError(t, cmd.Wait(), "exit 0 on SIGINT")
}

// requireFits checks that every line of out has at most width characters.
func requireFits(t *testing.T, out string, width int) {
	t.Helper()
	for l := range strings.Lines(out) {
		require.LessOrEqual(t, utf8.RuneCountInString(strings.TrimSuffix(l, "\n")), width, "%q", l)
	}
}

// unwrap joins wrapped lines back into one.
func unwrap(out string) string {
	return strings.ReplaceAll(strings.TrimSuffix(out, "\n"), "\n", " ")
}

// TestVersionSaysWhatItNeedsAndWhatTheDatabaseHas: the module, the schema version of
// its migrations, and the database's; a database that does not answer is reported,
// with exit 0.
func TestVersionSaysWhatItNeedsAndWhatTheDatabaseHas(t *testing.T) {
	t.Parallel()
	url := pglocktest.PostgresURL(t)
	available, err := migrations()
	require.NoError(t, err)
	latest := itoa(int64(available[len(available)-1].Version))

	r := pglockCmd(t, nil, "version", "-url", url)
	require.Equal(t, 0, r.code, r.stderr)
	require.Regexp(t, `^pglock \S+ \(go\S+\)\nschema: version `+latest+`\ndatabase: `+regexp.QuoteMeta(strings.TrimPrefix(reachedLine(t, url, "-url"), "database "))+
		`: schema pglock at version `+latest+`\n$`, r.stdout)

	r = pglockCmd(t, nil, "version", "-json", "-url", url)
	require.Equal(t, 0, r.code, r.stderr)
	var v versionJSON
	require.NoError(t, json.Unmarshal([]byte(r.stdout), &v), r.stdout)
	require.Equal(t, available[len(available)-1].Version, v.Schema)
	require.Equal(t, v.Schema, *v.DatabaseSchema)

	r = pglockCmd(t, nil, "version", "-url", "postgres://postgres@127.0.0.1:1/postgres?sslmode=disable")
	require.Equal(t, 0, r.code, r.stderr)
	require.Regexp(t, `\ndatabase: PostgreSQL unreachable at 127\.0\.0\.1:1: connect: connection refused\n$`, r.stdout)

	empty := unmigratedDatabase(t)
	r = pglockCmd(t, nil, "version", "-url", empty)
	require.Equal(t, exitFailure, r.code, "no schema: exit 1")
	require.Regexp(t, `\ndatabase: `+regexp.QuoteMeta(strings.TrimPrefix(reachedLine(t, empty, "-url"), "database "))+`\n$`, r.stdout)
	require.Regexp(t, "^pglock: database \"\\w+\" at \\S+: schema pglock not found: run `pglock migrate`\n$", r.stderr)
}

// TestLibpqDefaultsNameTheDatabaseTheyChose: without -url nor DATABASE_URL nor
// PGDATABASE, the database is the user's name, as libpq and the server default it, and
// an error names it.
func TestLibpqDefaultsNameTheDatabaseTheyChose(t *testing.T) {
	t.Parallel()
	url := pglocktest.PostgresURL(t)
	cfg, err := pgx.ParseConfig(url)
	require.NoError(t, err)
	admin, err := pgx.Connect(t.Context(), url)
	require.NoError(t, err)
	defer admin.Close(context.Background())
	role := "pglock_cli_nodb_" + strconv.Itoa(os.Getpid())
	_, err = admin.Exec(t.Context(), "CREATE ROLE "+role+" LOGIN")
	require.NoError(t, err)
	t.Cleanup(func() { _, _ = admin.Exec(context.Background(), "DROP ROLE IF EXISTS "+role) })

	r := pglockCmd(t, []string{"PGHOST=" + cfg.Host, "PGPORT=" + strconv.Itoa(int(cfg.Port)), "PGUSER=" + role,
		"PGDATABASE=", "PGSSLMODE=disable", "PGPASSWORD=" + cfg.Password}, "locks")
	require.Equal(t, exitFailure, r.code, r.stderr)
	require.Regexp(t, `^pglock: database "`+role+`" does not exist at \S+: name another with -url or DATABASE_URL\n$`, r.stderr)
}

// TestReadmeMigrateOutputIsTheLatestVersion: README's `pglock migrate` output names the
// version the migrations reach, so it stays true as migrations are added.
func TestReadmeMigrateOutputIsTheLatestVersion(t *testing.T) {
	t.Parallel()
	readme, err := os.ReadFile("../../README.md")
	require.NoError(t, err)
	available, err := migrations()
	require.NoError(t, err)
	got := regexp.MustCompile(`migrated schema pglock from version 0 to (\d+)`).FindAllStringSubmatch(string(readme), -1)
	require.NotEmpty(t, got)
	for _, m := range got {
		require.Equal(t, itoa(int64(available[len(available)-1].Version)), m[1])
	}
}

// TestReadmeTablesFitTheDefaultWidth: the command output README shows fits 100 columns.
func TestReadmeTablesFitTheDefaultWidth(t *testing.T) {
	t.Parallel()
	readme, err := os.ReadFile("../../README.md")
	require.NoError(t, err)
	for _, block := range regexp.MustCompile("(?s)```text\n(\\$ pglock (?:locks|jobs|release)[^`]*)```").FindAllStringSubmatch(string(readme), -1) {
		requireFits(t, block[1], defaultWidth)
	}
}

// reachedLine is the line that starts a command's output for people: the database at
// url, reached from from (-url, DATABASE_URL or the libpq defaults), never its password.
func reachedLine(t *testing.T, url, from string) string {
	t.Helper()
	cfg, err := pgconn.ParseConfig(url)
	require.NoError(t, err)
	if from == "" {
		from = "the libpq defaults: no -url, no DATABASE_URL"
	}
	return fmt.Sprintf("database %q at %s, user %q (from %s)", cfg.Database, where(cfg.Host, cfg.Port), cfg.User, from)
}

// afterReached checks that out starts with the line naming the database at url,
// reached from from (wrapped to the width or not), and returns the rest.
func afterReached(t *testing.T, out, url, from string) string {
	t.Helper()
	want := reachedLine(t, url, from)
	n := min(len(want), len(out))
	require.Equal(t, want, strings.ReplaceAll(out[:n], "\n", " "), "the start of %q", out)
	require.True(t, strings.HasPrefix(out[n:], "\n"), "the line naming the database ends: %q", out)
	return out[n+1:]
}
