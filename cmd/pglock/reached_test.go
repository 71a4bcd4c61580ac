package main

import (
	"bufio"
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/pgfence/pglock"
	"github.com/pgfence/pglock/pglocktest"
)

// libpqDefaults is the environment that makes the libpq defaults reach the database at
// url, with neither -url nor DATABASE_URL.
func libpqDefaults(t *testing.T, url string) []string {
	t.Helper()
	cfg, err := pgx.ParseConfig(url)
	require.NoError(t, err)
	return []string{"PGHOST=" + cfg.Host, "PGPORT=" + strconv.Itoa(int(cfg.Port)), "PGUSER=" + cfg.User,
		"PGDATABASE=" + cfg.Database, "PGSSLMODE=disable", "PGPASSWORD=" + cfg.Password}
}

// Without -url nor DATABASE_URL, the command says which database the libpq defaults
// reached, as the first line of its output for people (never in -json's); a database
// without schema pglock fails every command that reads it, version and migrate status
// included, with exit 1 and a message that says to run pglock migrate.
func TestTheDatabaseReachedIsNamedAndOneWithoutSchemaFails(t *testing.T) {
	t.Parallel()
	url := pglocktest.PostgresURL(t)
	empty := unmigratedDatabase(t)

	r := pglockCmd(t, libpqDefaults(t, url), "locks")
	require.Equal(t, 0, r.code, r.stderr)
	require.Equal(t, "no locks\n", afterReached(t, r.stdout, url, ""))
	require.NotContains(t, r.stdout, "password")
	r = pglockCmd(t, libpqDefaults(t, url), "locks", "-json")
	require.Equal(t, 0, r.code, r.stderr)
	require.Equal(t, "[]\n", r.stdout, "-json prints its data alone")

	names := regexp.QuoteMeta(strings.TrimPrefix(reachedLine(t, empty, ""), "database "))
	noSchema := "^pglock: database \"\\w+\" at \\S+: " + regexp.QuoteMeta("schema pglock not found: run `pglock migrate`") + "\n$"
	r = pglockCmd(t, libpqDefaults(t, empty), "version")
	require.Equal(t, exitFailure, r.code, "no schema: exit 1")
	require.Regexp(t, `^pglock \S+ \(go\S+\)\nschema: version \d+\ndatabase: `+names+`\n$`, r.stdout)
	require.Regexp(t, noSchema, r.stderr)

	r = pglockCmd(t, libpqDefaults(t, empty), "version", "-json")
	require.Equal(t, exitFailure, r.code)
	var v versionJSON
	require.NoError(t, json.Unmarshal([]byte(r.stdout), &v), r.stdout)
	require.Nil(t, v.DatabaseSchema)
	require.Regexp(t, strings.TrimSuffix(noSchema[1:], "\n$"), v.DatabaseError)

	for _, args := range [][]string{{"locks"}, {"jobs"}, {"ui", "-addr", "127.0.0.1:0"}} {
		r = pglockCmd(t, libpqDefaults(t, empty), args...)
		require.Equal(t, exitFailure, r.code, "%v", args)
		require.Regexp(t, noSchema, r.stderr, "%v", args)
		require.Empty(t, r.stdout, "%v", args)
	}
	require.False(t, schemaExists(t, empty), "nothing created")
}

// A schema older than this pglock fails version and migrate status (exit 1), saying
// how many migrations it is behind and to run pglock migrate.
func TestASchemaBehindFailsVersionAndMigrateStatus(t *testing.T) {
	t.Parallel()
	url := pglocktest.PostgresURL(t)
	available, err := migrations()
	require.NoError(t, err)
	conn, err := pgx.Connect(t.Context(), url)
	require.NoError(t, err)
	defer conn.Close(context.Background())
	// The bookkeeping of a database that lacks the latest migration (which is
	// idempotent: migrate runs it again).
	_, err = conn.Exec(t.Context(), `UPDATE pglock.schema_migrations SET version = $1`, available[len(available)-2].Version)
	require.NoError(t, err)

	behind := "^pglock: database \"\\w+\" at \\S+: schema pglock is 1 migration behind this pglock: run `pglock migrate`\n$"
	r := pglockCmd(t, nil, "version", "-url", url)
	require.Equal(t, exitFailure, r.code)
	require.Regexp(t, behind, r.stderr)
	r = pglockCmd(t, nil, "migrate", "status", "-url", url)
	require.Equal(t, exitFailure, r.code)
	require.Regexp(t, `(?m)^`+itoa(int64(available[len(available)-1].Version))+`\s+\S+\s+pending$`, r.stdout)
	require.Regexp(t, behind, r.stderr)
	r = pglockCmd(t, nil, "migrate", "-url", url)
	require.Equal(t, 0, r.code, r.stderr)
	r = pglockCmd(t, nil, "migrate", "status", "-url", url)
	require.Equal(t, 0, r.code, r.stderr)
}

// jobs JOB tells a live instance from one that was closed and one that was killed: the
// killed one is live while its registration is within the refresh period (a client
// refreshes every 5 minutes, and nothing tells a kill from a pause), gone once it is
// not (the test moves its registration back 6 minutes on the database rather than
// wait), and the closed one is closed at once. Table and -json say the same.
func TestJobsTellLiveClosedAndKilledInstances(t *testing.T) {
	t.Parallel()
	url := pglocktest.PostgresURL(t)
	p := keyPrefix(t)
	job := p + "reconcile"
	register := func(c *pglock.Client) {
		t.Helper()
		_, err := c.Job(job, func(context.Context) error { return nil }, pglock.OnOneInstance())
		require.NoError(t, err)
	}
	live := namedClient(t, url, "live")
	register(live)
	closed := namedClient(t, url, "closed")
	register(closed)
	killed := startRegistrant(t, url, p)
	require.Eventually(t, func() bool {
		return registeredBy(t.Context(), live, job, "live") && registeredBy(t.Context(), live, job, "closed")
	}, 10*time.Second, 10*time.Millisecond)
	require.NoError(t, closed.Close(t.Context()))
	require.NoError(t, killed.Process.Kill()) // kill -9: it closes nothing
	_ = killed.Wait()

	states := func() map[string]string {
		t.Helper()
		r := pglockCmd(t, nil, "jobs", "-json", "-url", url, job)
		require.Equal(t, 0, r.code, r.stderr)
		var out jobRunsJSON
		require.NoError(t, json.Unmarshal([]byte(r.stdout), &out), r.stdout)
		got := map[string]string{}
		for _, reg := range out.Registrations {
			got[reg.Instance] = reg.State
			require.False(t, reg.Seen.Before(reg.Registered), "%+v", reg)
		}
		return got
	}
	require.Equal(t, map[string]string{"live": "live", "closed": "closed", "killed": "live"}, states(),
		"killed a moment ago: within its refresh period")

	admin := pglocktest.Pool(t, url, 1)
	_, err := admin.Exec(t.Context(), `UPDATE pglock.registry SET seen_at = seen_at - interval '6 minutes 1 second',
		registered_at = registered_at - interval '6 minutes 1 second' WHERE instance = 'killed'`)
	require.NoError(t, err)
	require.Equal(t, map[string]string{"live": "live", "closed": "closed", "killed": "gone"}, states())

	r := pglockCmd(t, nil, "jobs", "-url", url, job)
	require.Equal(t, 0, r.code, r.stderr)
	lines := strings.Split(strings.TrimSpace(afterReached(t, r.stdout, url, "-url")), "\n")
	require.Equal(t, "no runs recorded (within the retention)", lines[0])
	require.Equal(t, "", lines[1])
	require.Regexp(t, `^REGISTERED ON\s+STATE\s+REGISTERED\s+LAST SEEN$`, lines[2])
	require.Regexp(t, `^closed\s+closed\s+\S+ ago\s+\S+ ago$`, lines[3])
	require.Regexp(t, `^killed\s+gone\s+6m\S* ago\s+6m\S* ago$`, lines[4])
	require.Regexp(t, `^live\s+live\s+\S+ ago\s+\S+ ago$`, lines[5])
	require.Len(t, lines, 6)
	requireFits(t, r.stdout, defaultWidth)
}

// namedClient returns a pglock client on url named instance, closed when the test ends.
func namedClient(t *testing.T, url, instance string) *pglock.Client {
	t.Helper()
	c, err := pglock.New(pglocktest.Pool(t, url, 4), pglock.WithoutListener(), pglock.WithInstanceName(instance))
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, c.Close(context.Background())) })
	return c
}

// startRegistrant starts a registrant process (runRegistrant) on url and returns it
// once its registration is written; it is killed when the test ends, if still running.
func startRegistrant(t *testing.T, url, prefix string) *exec.Cmd {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), registrantEnv+"="+url, holderPrefixEnv+"="+prefix)
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	require.NoError(t, err)
	stdout, err := cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	t.Cleanup(func() {
		_ = stdin.Close()
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	ready := make(chan bool, 1)
	go func() {
		sc := bufio.NewScanner(stdout)
		ready <- sc.Scan() && sc.Text() == "ready"
	}()
	select {
	case ok := <-ready:
		require.True(t, ok, "the registrant did not say ready")
	case <-time.After(30 * time.Second):
		t.Fatal("the registrant was not ready within 30 s")
	}
	return cmd
}

// jobs JOB of a job with a schedule lists each run's slot and attempt, and what its
// slots came to; -json says the same.
func TestJobsShowASlottedJobsSlots(t *testing.T) {
	t.Parallel()
	url := pglocktest.PostgresURL(t)
	job := keyPrefix(t) + "count"
	c := namedClient(t, url, "worker-1")
	j, err := c.Job(job, func(context.Context) error { return nil }, pglock.Every(time.Hour))
	require.NoError(t, err)
	require.NoError(t, j.Run(t.Context()))
	require.NoError(t, j.Run(t.Context())) // the slot is claimed
	require.Eventually(t, func() bool {
		runs, err := c.JobRuns(t.Context(), job, 1)
		return err == nil && len(runs) == 1
	}, 10*time.Second, 10*time.Millisecond)

	r := pglockCmd(t, nil, "jobs", "-url", url, job)
	require.Equal(t, 0, r.code, r.stderr)
	lines := strings.Split(strings.TrimSpace(afterReached(t, r.stdout, url, "-url")), "\n")
	require.Regexp(t, `^SLOT \(UTC\)\s+ATTEMPT\s+STARTED\s+ON\s+TOKEN\s+TOOK\s+OUTCOME\s+ERROR$`, lines[0])
	require.Regexp(t, `^\S+:00:00Z\s+1\s+\S+ ago\s+worker-1\s+\d+\s+\S+s\s+ok\s+-$`, lines[1])
	require.Equal(t, "", lines[2])
	require.Regexp(t, `^slots up to \S+:00:00Z: ok 1, failed 0, running 0, lost 0, pending 0, retried 0$`, lines[3])
	requireFits(t, r.stdout, defaultWidth)

	r = pglockCmd(t, nil, "jobs", "-json", "-url", url, job)
	require.Equal(t, 0, r.code, r.stderr)
	var out jobRunsJSON
	require.NoError(t, json.Unmarshal([]byte(r.stdout), &out), r.stdout)
	require.Len(t, out.Runs, 1)
	require.NotNil(t, out.Runs[0].Slot)
	require.Equal(t, 1, out.Runs[0].Attempt)
	require.Equal(t, int64(1), out.Slots.OK)
	require.Equal(t, *out.Runs[0].Slot, out.Slots.Last)
}
