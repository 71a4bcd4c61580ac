package main

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/pgfence/pglock"
	"github.com/pgfence/pglock/internal/devdb"
	"github.com/pgfence/pglock/internal/testkit"
	"github.com/pgfence/pglock/pglocktest"
)

// The test binary re-executed with these variables set is a holder: another process
// that holds locks and runs jobs in the database while the tests run the CLI.
const (
	holderEnv       = "PGLOCK_CLI_TEST_HOLDER"     // the database URL
	holderPrefixEnv = "PGLOCK_CLI_TEST_PREFIX"     // the prefix of its keys
	holderTTLEnv    = "PGLOCK_CLI_TEST_TTL"        // its ttl, holderTTL when unset (for a run by hand)
	registrantEnv   = "PGLOCK_CLI_TEST_REGISTRANT" // the database URL of a registrant, which registers a job and waits to be killed
)

// binary is the pglock command, built once by TestMain.
var binary string

// TestMain builds the pglock command into a temporary directory for the tests to run
// as a user would, or acts as a holder process when re-executed as one.
func TestMain(m *testing.M) {
	if url := os.Getenv(registrantEnv); url != "" {
		if err := runRegistrant(url, os.Getenv(holderPrefixEnv)); err != nil {
			fmt.Fprintln(os.Stderr, "registrant:", err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	if url := os.Getenv(holderEnv); url != "" {
		if err := runHolder(url, os.Getenv(holderPrefixEnv)); err != nil {
			fmt.Fprintln(os.Stderr, "holder:", err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	testkit.NoExitSleep() // the tests run the CLI hundreds of times
	os.Exit(buildAndRun(m))
}

func buildAndRun(m *testing.M) int {
	dir, err := os.MkdirTemp("", "pglock-cli-test-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(dir)
	binary = filepath.Join(dir, "pglock")
	build := exec.Command("go", append(append([]string{"build"}, testkit.RaceFlags...), "-o", binary, ".")...)
	build.Stdout, build.Stderr = os.Stderr, os.Stderr
	if err := build.Run(); err != nil {
		fmt.Fprintln(os.Stderr, "build pglock:", err)
		return 1
	}
	code := m.Run()
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
	}
	return code
}

// holderTTL is the holder's ttl: it renews every second, so a broken lock is noticed
// within a second.
const holderTTL = 3 * time.Second

// runHolder is the holder process. With the keys under prefix, it holds the locks
// orders:1, orders:2 (which another client waits for) and stuck:1, and permits 1 and 2
// of the semaphore feed (3 permits); runs the job reconcile twice (OnOneInstance, so it
// keeps the job's lease), has a second instance skip it, and runs the job export,
// which fails. It prints "token <key> <token>" for each lock and permit (a permit as
// "<key>#<permit>") and "ready" once the runs are recorded, then "lost <key>" when a
// lock's ctx is cancelled, and stops when stdin closes.
func runHolder(url, prefix string) error {
	ttl := holderTTL
	if s := os.Getenv(holderTTLEnv); s != "" {
		var err error
		if ttl, err = time.ParseDuration(s); err != nil {
			return err
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		return err
	}
	defer pool.Close()
	var out sync.Mutex
	say := func(format string, args ...any) {
		out.Lock()
		defer out.Unlock()
		fmt.Printf(format+"\n", args...)
	}
	newClient := func(instance string) (*pglock.Client, error) {
		return pglock.New(pool, pglock.WithInstanceName(instance), pglock.TTL(ttl))
	}
	closeClient := func(c *pglock.Client) {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = c.Close(ctx)
	}
	worker1, err := newClient("worker-1")
	if err != nil {
		return err
	}
	defer closeClient(worker1)
	var stopping sync.WaitGroup
	for _, name := range []string{"orders:1", "orders:2", "stuck:1"} {
		l, err := worker1.TryAcquire(ctx, prefix+name)
		if err != nil {
			return err
		}
		say("token %s %d", l.Key(), l.Token())
		stopping.Add(1)
		go func() {
			defer stopping.Done()
			select {
			case <-l.Context().Done():
				say("lost %s", l.Key())
			case <-ctx.Done():
			}
		}()
	}
	// Permits 1 and 2 of the semaphore feed, of 3.
	feed, err := worker1.Semaphore(prefix+"feed", 3)
	if err != nil {
		return err
	}
	for range 2 {
		l, err := feed.TryAcquire(ctx)
		if err != nil {
			return err
		}
		name := fmt.Sprintf("%s#%d", l.Key(), l.Permit())
		say("token %s %d", name, l.Token())
		stopping.Add(1)
		go func() {
			defer stopping.Done()
			select {
			case <-l.Context().Done():
				say("lost %s", name)
			case <-ctx.Done():
			}
		}()
	}
	defer stopping.Wait()
	defer cancel() // before the wait above: the watchers return

	// Another instance waits for orders:2, marking it wanted.
	worker3, err := newClient("worker-3")
	if err != nil {
		return err
	}
	defer closeClient(worker3)
	waiting := make(chan struct{})
	go func() {
		defer close(waiting)
		if l, err := worker3.Acquire(ctx, prefix+"orders:2"); err == nil {
			_ = l.Release(context.WithoutCancel(ctx))
		}
	}()
	defer func() { <-waiting }()
	defer cancel()

	reconcile, err := worker1.Job(prefix+"reconcile", func(context.Context) error { return nil },
		pglock.OnOneInstance(), pglock.WithoutOverlapping())
	if err != nil {
		return err
	}
	export, err := worker1.Job(prefix+"export", func(context.Context) error {
		return errors.New("export: the warehouse answered 503")
	}, pglock.WithoutOverlapping())
	if err != nil {
		return err
	}
	for range 2 {
		if err := reconcile.Run(ctx); err != nil {
			return err
		}
	}
	if err := export.Run(ctx); err == nil {
		return errors.New("export ran without its error")
	}
	worker2, err := newClient("worker-2")
	if err != nil {
		return err
	}
	skipper, err := worker2.Job(prefix+"reconcile", func(context.Context) error { return errors.New("ran on worker-2") }, pglock.OnOneInstance())
	if err != nil {
		return err
	}
	if err := skipper.Run(ctx); err != nil {
		return err
	}
	closeClient(worker2) // writes its skip count

	// The history is written in the background: wait for it, and for the waiter's mark.
	deadline, stop := context.WithTimeout(ctx, 20*time.Second)
	defer stop()
	poll := time.NewTicker(20 * time.Millisecond)
	defer poll.Stop()
	for {
		jobs, err := worker1.JobStatuses(deadline)
		if err != nil {
			return err
		}
		locks, err := worker1.Locks(deadline, prefix+"orders:2")
		if err != nil {
			return err
		}
		if recorded(jobs, prefix) && len(locks) == 1 && locks[0].Waiting {
			break
		}
		select {
		case <-deadline.Done():
			return fmt.Errorf("the runs or the waiter were not seen: %w", context.Cause(deadline))
		case <-poll.C:
		}
	}
	say("ready")
	_, _ = io.Copy(io.Discard, os.Stdin)
	return nil
}

// runRegistrant is an instance named "killed" that registers the job <prefix>reconcile,
// prints "ready" once the registration is written, and waits until stdin closes or
// it is killed.
func runRegistrant(url, prefix string) error {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		return err
	}
	defer pool.Close()
	c, err := pglock.New(pool, pglock.WithInstanceName("killed"), pglock.WithoutListener())
	if err != nil {
		return err
	}
	defer c.Close(ctx)
	if _, err := c.Job(prefix+"reconcile", func(context.Context) error { return nil }, pglock.OnOneInstance()); err != nil {
		return err
	}
	poll := time.NewTicker(10 * time.Millisecond) // the registration is written in the background
	defer poll.Stop()
	for !registeredBy(ctx, c, prefix+"reconcile", "killed") {
		select {
		case <-ctx.Done():
			return fmt.Errorf("the registration was not written: %w", ctx.Err())
		case <-poll.C:
		}
	}
	fmt.Println("ready")
	_, _ = io.Copy(io.Discard, os.Stdin)
	return nil
}

// registeredBy reports whether instance's registration of job is listed.
func registeredBy(ctx context.Context, c *pglock.Client, job, instance string) bool {
	jobs, _ := c.JobStatuses(ctx)
	for _, j := range jobs {
		for _, r := range j.Registrations {
			if j.Job == job && r.Instance == instance {
				return true
			}
		}
	}
	return false
}

// recorded reports whether jobs holds the holder's runs and its skip.
func recorded(jobs []pglock.JobStatus, prefix string) bool {
	var reconcile, export bool
	for _, j := range jobs {
		switch j.Job {
		case prefix + "reconcile":
			reconcile = j.LastRun != nil && len(j.Skips) > 0
		case prefix + "export":
			export = j.LastFailure != nil
		}
	}
	return reconcile && export
}

// holder is a running holder process.
type holder struct {
	cmd    *exec.Cmd
	stdin  io.WriteCloser
	lines  chan string
	tokens map[string]int64 // by key
	done   chan struct{}
	stderr bytes.Buffer
}

// startHolder starts a holder on the database url with keys under prefix, and waits
// until it is ready. It stops when the test ends.
func startHolder(t *testing.T, url, prefix string) *holder {
	t.Helper()
	h := &holder{lines: make(chan string, 100), tokens: map[string]int64{}, done: make(chan struct{})}
	h.cmd = exec.Command(os.Args[0], "-test.run=^$")
	h.cmd.Env = append(os.Environ(), holderEnv+"="+url, holderPrefixEnv+"="+prefix)
	h.cmd.Stderr = &h.stderr
	var err error
	h.stdin, err = h.cmd.StdinPipe()
	require.NoError(t, err)
	stdout, err := h.cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, h.cmd.Start())
	go func() {
		defer close(h.lines)
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			h.lines <- sc.Text()
		}
	}()
	t.Cleanup(func() {
		_ = h.stdin.Close()
		exited := make(chan error, 1)
		go func() {
			for range h.lines { // drain, so that the holder never blocks on its stdout
			}
			exited <- h.cmd.Wait()
		}()
		select {
		case err := <-exited:
			if err != nil {
				t.Errorf("holder: %v\n%s", err, h.stderr.String())
			}
		case <-time.After(30 * time.Second):
			_ = h.cmd.Process.Kill()
			t.Errorf("holder did not stop within 30 s after its stdin closed")
		}
	})
	for {
		line := h.next(t, 60*time.Second)
		if line == "ready" {
			return h
		}
		if f := strings.Fields(line); len(f) == 3 && f[0] == "token" {
			n, err := strconv.ParseInt(f[2], 10, 64)
			require.NoError(t, err)
			h.tokens[f[1]] = n
		}
	}
}

// next returns the holder's next line of output, failing the test after timeout.
func (h *holder) next(t *testing.T, timeout time.Duration) string {
	t.Helper()
	select {
	case line, ok := <-h.lines:
		if !ok {
			t.Fatalf("the holder ended: %s", h.stderr.String())
		}
		return line
	case <-time.After(timeout):
		t.Fatalf("no line from the holder within %v", timeout)
		return ""
	}
}

// result is what a run of the pglock command did.
type result struct {
	stdout, stderr string
	code           int
}

// pglockCmd runs the built pglock command with args, with DATABASE_URL unset unless
// env sets it, and returns what it printed and its exit code.
func pglockCmd(t *testing.T, env []string, args ...string) result {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, binary, args...)
	cmd.Env = append(withoutDatabaseURL(os.Environ()), env...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	var exit *exec.ExitError
	if err != nil && !errors.As(err, &exit) {
		t.Fatalf("run pglock %v: %v", args, err)
	}
	return result{stdout.String(), stderr.String(), cmd.ProcessState.ExitCode()}
}

func withoutDatabaseURL(env []string) []string {
	out := env[:0:0]
	for _, kv := range env {
		if !strings.HasPrefix(kv, "DATABASE_URL=") {
			out = append(out, kv)
		}
	}
	return out
}

// keyPrefix is a prefix for the keys of t, unique among the tests.
func keyPrefix(t *testing.T) string {
	return strings.NewReplacer("/", ".", " ", "_").Replace(t.Name()) + "/"
}

// unmigratedDatabase creates an empty database (no schema pglock) on the test server,
// dropped when the test ends, and returns its URL.
func unmigratedDatabase(t *testing.T) string {
	t.Helper()
	url := pglocktest.PostgresURL(t) // a database on the test server, to create another from
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, url)
	require.NoError(t, err)
	defer conn.Close(context.WithoutCancel(ctx))
	name := fmt.Sprintf("pglock_cli_empty_%d_%d", os.Getpid(), time.Now().UnixNano())
	_, err = conn.Exec(ctx, "CREATE DATABASE "+name)
	require.NoError(t, err)
	t.Cleanup(func() {
		// A DROP DATABASE waits for a checkpoint, which takes long on a loaded machine:
		// the deadline of internal/testdb's drops.
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		conn, err := pgx.Connect(ctx, url)
		if err != nil {
			t.Errorf("drop database %s: %v", name, err)
			return
		}
		defer conn.Close(ctx)
		if _, err := conn.Exec(ctx, "DROP DATABASE IF EXISTS "+name+" WITH (FORCE)"); err != nil {
			t.Errorf("drop database %s: %v", name, err)
		}
	})
	empty, err := devdb.WithDatabase(url, name)
	require.NoError(t, err)
	return empty
}
