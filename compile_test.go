package pglock_test

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/pgfence/pglock/internal/testkit"
)

// misplacedOptions are calls given an option that does not fit them, each with what the
// compiler must say: the option's call and "<its type> does not implement <the call's>".
var misplacedOptions = []struct {
	name, code, option, want string
}{
	{"OnOneInstanceToTryAcquire", `c.TryAcquire(ctx, "k", pglock.OnOneInstance())`,
		"pglock.OnOneInstance()", "pglock.JobOption does not implement pglock.Option"},
	{"WaitToTryAcquire", `c.TryAcquire(ctx, "k", pglock.Wait(d))`,
		"pglock.Wait(d)", "pglock.AcquireOption does not implement pglock.Option"},
	{"WithLoggerToAcquire", `c.Acquire(ctx, "k", pglock.WithLogger(logger))`,
		"pglock.WithLogger(logger)", "pglock.ClientOption does not implement pglock.AcquireOption"},
	{"OnOneInstanceToAcquire", `c.Acquire(ctx, "k", pglock.OnOneInstance())`,
		"pglock.OnOneInstance()", "pglock.JobOption does not implement pglock.AcquireOption"},
	{"WithoutListenerToWithLock", `c.WithLock(ctx, "k", fn, pglock.WithoutListener())`,
		"pglock.WithoutListener()", "pglock.ClientOption does not implement pglock.AcquireOption"},
	{"WaitToJob", `c.Job("k", fn, pglock.OnOneInstance(), pglock.Wait(d))`,
		"pglock.Wait(d)", "pglock.AcquireOption does not implement pglock.JobOption"},
	{"WithClockToJob", `c.Job("k", fn, pglock.OnOneInstance(), pglock.WithClock(clock))`,
		"pglock.WithClock(clock)", "pglock.ClientOption does not implement pglock.JobOption"},
	{"RunHistoryToJob", `c.Job("k", fn, pglock.OnOneInstance(), pglock.RunHistory(d))`,
		"pglock.RunHistory(d)", "pglock.ClientOption does not implement pglock.JobOption"},
	{"OnOneInstanceToElect", `c.Elect("k", leader, pglock.OnOneInstance())`,
		"pglock.OnOneInstance()", "pglock.JobOption does not implement pglock.Option"},
	{"WaitToElect", `c.Elect("k", leader, pglock.Wait(d))`,
		"pglock.Wait(d)", "pglock.AcquireOption does not implement pglock.Option"},
	{"WaitToNew", `pglock.New(pool, pglock.Wait(d))`,
		"pglock.Wait(d)", "pglock.AcquireOption does not implement pglock.ClientOption"},
	{"OnOneInstanceToNewWithStore", `pglock.NewWithStore(store, pglock.OnOneInstance())`,
		"pglock.OnOneInstance()", "pglock.JobOption does not implement pglock.ClientOption"},
	{"WaitToGocronElector", `c.GocronElector("k", pglock.Wait(d))`,
		"pglock.Wait(d)", "pglock.AcquireOption does not implement pglock.Option"},
	{"WaitToGocronLocker", `c.GocronLocker(pglock.Wait(d))`,
		"pglock.Wait(d)", "pglock.AcquireOption does not implement pglock.Option"},
	{"ClientOptionInAnOptionSlice", `_ = []pglock.Option{pglock.TTL(d), pglock.WithLogger(logger)}`,
		"pglock.WithLogger(logger)", "pglock.ClientOption does not implement pglock.Option"},
	{"AnOptionOfOurOwn", `c.TryAcquire(ctx, "k", ownOption{})`,
		"ownOption{}", "ownOption does not implement pglock.Option"},
}

// fittingOptions gives every call the options that fit it, TTL to each: it must compile,
// or the test above proves nothing.
const fittingOptions = `
	pglock.New(pool, pglock.TTL(d), pglock.WithLogger(logger), pglock.WithClock(clock), pglock.WithInstanceName("a"),
		pglock.WithEventHandler(func(pglock.Event) {}), pglock.WithoutListener(), pglock.WithListenerConnString("b"),
		pglock.RunHistory(d))
	pglock.NewWithStore(store, pglock.TTL(d), pglock.WithLogger(logger))
	c.TryAcquire(ctx, "k", pglock.TTL(d))
	c.Acquire(ctx, "k", pglock.TTL(d), pglock.Wait(d))
	c.WithLock(ctx, "k", fn, pglock.TTL(d), pglock.Wait(d))
	c.Job("k", fn, pglock.TTL(d), pglock.OnOneInstance(), pglock.WithoutOverlapping())
	c.Elect("k", leader, pglock.TTL(d))
	c.GocronElector("k", pglock.TTL(d))
	c.GocronLocker(pglock.TTL(d))
	every := []pglock.Option{pglock.TTL(d)}
	c.TryAcquire(ctx, "k", every[0])
	client := []pglock.ClientOption{pglock.TTL(d), pglock.WithLogger(logger)}
	pglock.NewWithStore(store, client...)
	var none pglock.Option // compiles; fails at run time (TestBadInputGetsAClearErrorAndTouchesNothing)
	c.TryAcquire(ctx, "k", none)
`

// optionProgram is a program of its own that runs code in an environment of pglock's
// values.
func optionProgram(code string) string {
	return fmt.Sprintf(`package main

import (
	"context"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/pgfence/pglock"
)

type ownOption struct{}

func (ownOption) everyOption() {}

func main() {}

func calls(ctx context.Context, c *pglock.Client, pool *pgxpool.Pool, store *pglock.Store, logger *slog.Logger,
	clock pglock.Clock, d time.Duration, fn func(context.Context) error, leader pglock.LeaderCallbacks) {
	_ = ownOption{}
//line calls.go:1
	%s
}
`, code)
}

// A misplaced option does not compile, and the compiler's message names the option and
// the option type the call wants; the options that fit compile. All the programs build
// in one go build (buildAgainstPglock).
func TestMisplacedOptionsDoNotCompile(t *testing.T) {
	t.Parallel()
	files := map[string]string{"fitting/main.go": optionProgram(fittingOptions)}
	for _, tc := range misplacedOptions {
		files[tc.name+"/main.go"] = optionProgram(tc.code)
	}
	messages := buildAgainstPglock(t, files)
	require.Empty(t, messages["fitting"], "the options that fit do not compile")
	for _, tc := range misplacedOptions {
		t.Run(tc.name, func(t *testing.T) {
			msg := messages[tc.name]
			require.NotEmpty(t, msg, "%s compiled", tc.code)
			lines := slices.DeleteFunc(strings.Split(strings.TrimSpace(msg), "\n"), func(l string) bool {
				return strings.HasPrefix(l, "#")
			})
			require.Len(t, lines, 1, "one error, the option's:\n%s", msg)
			require.Contains(t, lines[0], "calls.go:1:", "the error is not at the call")
			require.Contains(t, lines[0], "cannot use "+tc.option)
			require.Contains(t, lines[0], tc.want)
		})
	}
	t.Logf("for example: %s", strings.TrimSpace(messages[misplacedOptions[0].name]))
}

// buildAgainstPglock writes files (a path in the module: its text) into a temporary
// module whose pglock is this directory, builds all its packages in one go build, from
// the module cache alone (GOPROXY=off), and returns the compiler's output for each
// package that did not compile, by its path in the module. It skips the test when
// there is no go command.
func buildAgainstPglock(t *testing.T, files map[string]string) map[string]string {
	t.Helper()
	goTool, err := exec.LookPath("go")
	if err != nil {
		t.Skipf("no go command to build programs with: %v", err)
	}
	repo, err := filepath.Abs(".")
	require.NoError(t, err)
	sum, err := os.ReadFile(filepath.Join(repo, "go.sum")) // pglock's dependencies, not to be looked up
	require.NoError(t, err)
	mod, err := os.ReadFile(filepath.Join(repo, "go.mod"))
	require.NoError(t, err)
	dir := t.TempDir()
	// pglock's own requirements, all of them: with only pglock required, the go command
	// walks its dependencies' go.mod files further than pglock's build does, to files
	// that a fresh machine's module cache does not have (pgpassfile's requirement of
	// testify v1.3.0).
	files["go.mod"] = strings.Replace(string(mod), "module github.com/pgfence/pglock\n", "module built\n", 1) +
		fmt.Sprintf("\nrequire github.com/pgfence/pglock v0.0.0\n\nreplace github.com/pgfence/pglock => %s\n", repo)
	files["go.sum"] = string(sum)
	for name, text := range files {
		require.NoError(t, os.MkdirAll(filepath.Dir(filepath.Join(dir, name)), 0o755))
		require.NoError(t, os.WriteFile(filepath.Join(dir, name), []byte(text), 0o644))
	}
	cmd := exec.CommandContext(t.Context(), goTool, append(append([]string{"build"}, testkit.RaceFlags...), "-json", "./...")...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "GOFLAGS=-mod=mod -buildvcs=false", "GOPROXY=off", "GOWORK=off", "GOTOOLCHAIN=local")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	var exit *exec.ExitError
	if err != nil {
		require.ErrorAs(t, err, &exit, "go build did not run: %s", stderr.String())
	}
	// build-output events carry the compiler's messages, by package.
	messages := map[string]string{}
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		var ev struct{ ImportPath, Action, Output string }
		require.NoError(t, json.Unmarshal(sc.Bytes(), &ev), "%s", sc.Bytes())
		if ev.Action == "build-output" {
			messages[strings.TrimPrefix(ev.ImportPath, "built/")] += ev.Output
		}
	}
	require.NoError(t, sc.Err())
	if exit != nil {
		require.NotEmpty(t, messages, "go build failed with no compiler output: %s", stderr.String())
	}
	return messages
}

// Store is opaque: a type of another package with a store's methods is no Store, nor is
// a type that embeds one, and the compiler says so.
func TestStoreCannotBeImplementedOutsidePglock(t *testing.T) {
	t.Parallel()
	messages := buildAgainstPglock(t, map[string]string{
		"outside/store.go": `package outside

import (
	"context"
	"time"

	"github.com/pgfence/pglock"
)

type store struct{}

func (store) Acquire(context.Context, string, string, time.Duration) (int64, bool, error) { return 1, true, nil }
func (store) Renew(context.Context, string, string, time.Duration) (bool, error)          { return true, nil }
func (store) Release(context.Context, string, string) (bool, error)                       { return true, nil }

var _, _ = pglock.NewWithStore(store{})
`,
		"wrapper/store.go": `package wrapper

import "github.com/pgfence/pglock"

type store struct{ *pglock.Store }

var _, _ = pglock.NewWithStore(store{pglock.NewMemoryStore(nil)})
`,
	})
	for _, pkg := range []string{"outside", "wrapper"} {
		require.Contains(t, messages[pkg], "as *pglock.Store value in argument to pglock.NewWithStore", pkg)
	}
}
