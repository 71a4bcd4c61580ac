// Command benchcmp measures a change to the hot path: it builds the benchmark binary of
// a base commit and of the work tree, lets the two take turns on one PostgreSQL server
// (the one in PGLOCK_TEST_DATABASE_URL, as for the tests), and prints benchstat's
// comparison of the two, the ratios to the baselines measured in the same runs first.
//
//	go run ./internal/benchcmp -base 861f75b
//	go run ./internal/benchcmp -base main -bench '^BenchmarkAcquireRelease$' -rounds 10
//
// It is not run in CI: a comparison needs a quiet machine and minutes. The runs' raw
// output is kept in -out (a new temporary directory by default), base.txt and tree.txt.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strings"
)

// benchstat is the version of golang.org/x/perf/cmd/benchstat that go run fetches.
const benchstat = "golang.org/x/perf/cmd/benchstat@v0.0.0-20260908200009-22c9c6c9d4da"

func main() {
	base := flag.String("base", "", "the commit (or any revision git knows) to compare the work tree with")
	bench := flag.String("bench", "^Benchmark(AcquireRelease|LosingTryAcquire|RenewMany)$", "the benchmarks to run (go test -bench)")
	rounds := flag.Int("rounds", 6, "how many runs of each binary, taking turns (benchstat wants 6 or more)")
	benchtime := flag.String("benchtime", "1s", "go test -benchtime of each run")
	pkg := flag.String("pkg", ".", "the package whose benchmarks run, relative to the module's root")
	out := flag.String("out", "", "where the runs' output goes (default: a new temporary directory)")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if err := run(ctx, *base, *bench, *benchtime, *pkg, *out, *rounds); err != nil {
		fmt.Fprintln(os.Stderr, "benchcmp:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, base, bench, benchtime, pkg, out string, rounds int) error {
	switch {
	case base == "":
		return errors.New("-base: want a commit to compare with")
	case rounds < 1:
		return fmt.Errorf("-rounds %d: want 1 or more", rounds)
	case os.Getenv("PGLOCK_TEST_DATABASE_URL") == "":
		return errors.New("PGLOCK_TEST_DATABASE_URL is not set: both binaries must run on one server, named there")
	}
	root, err := output(ctx, "", "git", "rev-parse", "--show-toplevel")
	if err != nil {
		return err
	}
	if out == "" {
		if out, err = os.MkdirTemp("", "benchcmp-"); err != nil {
			return err
		}
	} else if err := os.MkdirAll(out, 0o755); err != nil {
		return err
	}
	tree := filepath.Join(root, pkg)
	baseTree := filepath.Join(out, "base")
	if _, err := output(ctx, root, "git", "worktree", "add", "--detach", "--force", baseTree, base); err != nil {
		return err
	}
	defer func() { _, _ = output(context.Background(), root, "git", "worktree", "remove", "--force", baseTree) }()
	binaries := map[string]string{"base": filepath.Join(out, "base.test"), "tree": filepath.Join(out, "tree.test")}
	dirs := map[string]string{"base": filepath.Join(baseTree, pkg), "tree": tree}
	for _, name := range []string{"base", "tree"} {
		fmt.Fprintf(os.Stderr, "benchcmp: building %s (%s)\n", name, dirs[name])
		if _, err := output(ctx, dirs[name], "go", "test", "-c", "-o", binaries[name], "."); err != nil {
			return err
		}
	}
	files := map[string]*os.File{}
	for _, name := range []string{"base", "tree"} {
		f, err := os.Create(filepath.Join(out, name+".txt"))
		if err != nil {
			return err
		}
		defer f.Close()
		files[name] = f
	}
	for r := range rounds {
		order := []string{"base", "tree"}
		if r%2 == 1 {
			order = []string{"tree", "base"}
		}
		for _, name := range order {
			fmt.Fprintf(os.Stderr, "benchcmp: round %d of %d: %s\n", r+1, rounds, name)
			cmd := exec.CommandContext(ctx, binaries[name], "-test.run", "^$", "-test.bench", bench,
				"-test.benchtime", benchtime, "-test.count", "1")
			cmd.Dir, cmd.Stdout, cmd.Stderr = dirs[name], files[name], os.Stderr
			if err := cmd.Run(); err != nil {
				return fmt.Errorf("%s: %w", name, err)
			}
		}
	}
	for _, f := range files {
		if err := f.Sync(); err != nil {
			return err
		}
	}
	fmt.Printf("# %s (base) against the work tree, %d runs each taking turns; raw output in %s\n\n", base, rounds, out)
	fmt.Println("## The ratios to the baselines of the same runs (vs-*: the subject's time over the baseline's)")
	if err := benchstatTo(ctx, os.Stdout, "-filter", ".unit:/^vs-/", files["base"].Name(), files["tree"].Name()); err != nil {
		return err
	}
	fmt.Println("\n## Times")
	return benchstatTo(ctx, os.Stdout, "-filter", ".unit:/ns\\/op$/", files["base"].Name(), files["tree"].Name())
}

func benchstatTo(ctx context.Context, w io.Writer, args ...string) error {
	cmd := exec.CommandContext(ctx, "go", append([]string{"run", benchstat}, args...)...)
	cmd.Stdout, cmd.Stderr = w, os.Stderr
	return cmd.Run()
}

// output runs a command in dir and returns its standard output, trimmed; its error
// carries its standard error.
func output(ctx context.Context, dir, name string, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Dir = dir
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("%s %s: %w: %s", name, strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
	}
	return strings.TrimSpace(string(out)), nil
}
