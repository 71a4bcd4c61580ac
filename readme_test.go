package pglock_test

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"go/ast"
	"go/format"
	"go/parser"
	"go/token"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgfence/pglock/internal/testkit"
	"github.com/pgfence/pglock/pglocktest"
)

// readmeBlock is a ```go block of README.md.
type readmeBlock struct {
	line int // of the block's first line of code
	code string
}

// readmeEnv is what the README's text gives a block that is not a whole file: the
// block is the body of a function with these parameters, returning an error.
const readmeEnv = `ctx context.Context, databaseURL string, pool *pgxpool.Pool, client *pglock.Client,
	scheduler gocron.Scheduler, reconcile func(ctx context.Context) error,
	feed interface{ Subscribe(ctx context.Context) error }`

// readmeImports are the packages a block that is not a whole file may use, by name.
var readmeImports = map[string]string{
	"context":       "context",
	"errors":        "errors",
	"fmt":           "fmt",
	"gocron":        "github.com/go-co-op/gocron/v2",
	"log":           "log",
	"os":            "os",
	"pglock":        "github.com/pgfence/pglock",
	"pglockmetrics": "github.com/pgfence/pglock/pglockmetrics",
	"pglocktest":    "github.com/pgfence/pglock/pglocktest",
	"pgx":           "github.com/jackc/pgx/v5",
	"pgxpool":       "github.com/jackc/pgx/v5/pgxpool",
	"slog":          "log/slog",
	"time":          "time",
}

// TestReadmeGoBlocksCompile builds and vets every ```go block of README.md, each as a
// package of its own in a temporary directory of the module. A block that starts with
// "package" is a whole file, and must be gofmt'ed; any other block is the body of a
// function with readmeEnv's variables, importing the readmeImports it uses. Errors
// point at README.md's lines.
func TestReadmeGoBlocksCompile(t *testing.T) {
	t.Parallel()
	goTool, err := exec.LookPath("go")
	if err != nil {
		t.Skipf("no go command to build README.md's blocks with: %v", err)
	}
	readme, err := filepath.Abs("README.md") // the //line directives name it, for errors
	require.NoError(t, err)
	blocks := readmeGoBlocks(t, readme)
	require.NotEmpty(t, blocks, "README.md has no ```go block")

	// Inside the module, so that the blocks import this pglock; "_" hides the directory
	// from ./... patterns.
	dir, err := os.MkdirTemp(".", "_readme_blocks_")
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, os.RemoveAll(dir)) })
	args := append([]string{"vet"}, testkit.RaceFlags...)
	for i, b := range blocks {
		var src string
		if strings.HasPrefix(b.code, "package ") {
			formatted, err := format.Source([]byte(b.code))
			require.NoError(t, err, "%s:%d", readme, b.line)
			require.Equal(t, string(formatted), b.code, "%s:%d: the block is not gofmt'ed", readme, b.line)
			src = fmt.Sprintf("//line %s:%d\n%s", readme, b.line, b.code)
		} else {
			src = readmeFunc(readme, b)
		}
		pkg := filepath.Join(dir, fmt.Sprintf("block%d", i+1))
		require.NoError(t, os.Mkdir(pkg, 0o755))
		require.NoError(t, os.WriteFile(filepath.Join(pkg, "main.go"), []byte(src), 0o644))
		args = append(args, "./"+filepath.ToSlash(pkg))
	}
	out, err := exec.Command(goTool, args...).CombinedOutput()
	require.NoError(t, err, "README.md's Go blocks do not compile:\n%s", out)
}

// readmeGoBlocks returns the ```go blocks of the Markdown file path, indented or not.
func readmeGoBlocks(t *testing.T, path string) []readmeBlock {
	t.Helper()
	text, err := os.ReadFile(path)
	require.NoError(t, err)
	var blocks []readmeBlock
	var cur *readmeBlock
	indent := ""
	sc := bufio.NewScanner(bytes.NewReader(text))
	for n := 1; sc.Scan(); n++ {
		line := sc.Text()
		trimmed := strings.TrimSpace(line)
		switch {
		case cur == nil && trimmed == "```go":
			cur = &readmeBlock{line: n + 1}
			indent = line[:strings.Index(line, "```")]
		case cur != nil && trimmed == "```":
			blocks = append(blocks, *cur)
			cur = nil
		case cur != nil:
			cur.code += strings.TrimPrefix(line, indent) + "\n"
		}
	}
	require.NoError(t, sc.Err())
	require.Nil(t, cur, "%s: a ```go block is not closed", path)
	return blocks
}

// readmeFunc makes a block that is not a whole file a package main: the block is the
// body of a function with readmeEnv's parameters.
func readmeFunc(readme string, b readmeBlock) string {
	body := fmt.Sprintf("//line %s:%d\n%s\treturn nil\n", readme, b.line, b.code)
	used := map[string]bool{"context": true, "gocron": true, "pglock": true, "pgxpool": true} // readmeEnv's
	if f, err := parser.ParseFile(token.NewFileSet(), "", "package p\nfunc _() {\n"+b.code+"\n}", 0); err == nil {
		ast.Inspect(f, func(n ast.Node) bool {
			if sel, ok := n.(*ast.SelectorExpr); ok {
				if id, ok := sel.X.(*ast.Ident); ok && readmeImports[id.Name] != "" {
					used[id.Name] = true
				}
			}
			return true
		})
	} // else the build reports the syntax error, at its line in README.md
	var imports []string
	for name := range used {
		imports = append(imports, fmt.Sprintf("\t%q\n", readmeImports[name]))
	}
	slices.Sort(imports)
	return fmt.Sprintf("package main\n\nimport (\n%s)\n\nfunc main() {}\n\nfunc readmeBlock(%s) error {\n%s}\n",
		strings.Join(imports, ""), readmeEnv, body)
}

// The README's two commands stay as they are: other documents and habits point at them.
func TestReadmeCommands(t *testing.T) {
	t.Parallel()
	text, err := os.ReadFile("README.md")
	require.NoError(t, err)
	for _, cmd := range []string{
		"go run ./example/tryit",
		"go vet -race ./... && go test -race -count=1 ./...",
	} {
		require.Regexp(t, "(?m)^"+regexp.QuoteMeta(cmd)+" ", string(text))
	}
}

// TestReadmeQuickStartRuns builds the Quick start's program and runs it as a newcomer
// would: against a database that accepts connections and never answers, it gives up
// within its start-up bound, exiting 1 with an error that says so; against a fresh
// database it marks payment 42 paid (one row written), and again on a second run
// (a newer lock, a greater token); when the row carries a token above the lock's, as
// after a newer holder's write, its write is refused and it says so.
func TestReadmeQuickStartRuns(t *testing.T) {
	t.Parallel()
	goTool, err := exec.LookPath("go")
	if err != nil {
		t.Skipf("no go command to build the Quick start with: %v", err)
	}
	bin := buildReadmeProgram(t, goTool, "## Quick start")
	run := func(databaseURL string) (out string, exitCode int, took time.Duration) {
		t.Helper()
		ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
		defer cancel()
		cmd := exec.CommandContext(ctx, bin)
		cmd.Env = append(os.Environ(), "DATABASE_URL="+databaseURL)
		start := time.Now()
		b, err := cmd.CombinedOutput()
		took = time.Since(start)
		var exit *exec.ExitError
		if errors.As(err, &exit) {
			return string(b), exit.ExitCode(), took
		}
		require.NoError(t, err, "%s", b)
		return string(b), 0, took
	}

	t.Run("a database that never answers", func(t *testing.T) {
		t.Parallel()
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		require.NoError(t, err)
		var mu sync.Mutex
		var conns []net.Conn
		accepted := make(chan struct{})
		go func() { // accepts, reads nothing, answers nothing
			defer close(accepted)
			for {
				c, err := ln.Accept()
				if err != nil {
					return
				}
				mu.Lock()
				conns = append(conns, c)
				mu.Unlock()
			}
		}()
		t.Cleanup(func() {
			require.NoError(t, ln.Close())
			<-accepted
			mu.Lock()
			defer mu.Unlock()
			for _, c := range conns {
				_ = c.Close()
			}
		})
		out, code, took := run("postgres://postgres@" + ln.Addr().String() + "/postgres?sslmode=disable")
		t.Logf("gave up after %v: %s", took.Round(time.Millisecond), out)
		require.Equal(t, 1, code, "%s", out)
		require.Less(t, took, 10*time.Second+5*time.Second, "the start-up bound is 10 s")
		require.Contains(t, out, "pglock: migrate")
		require.Contains(t, out, "context deadline exceeded")
	})

	t.Run("a fresh database", func(t *testing.T) {
		t.Parallel()
		url := pglocktest.PostgresURL(t)
		for range 2 {
			out, code, _ := run(url)
			require.Zero(t, code, "%s", out)
			require.Contains(t, out, `msg="marked payment 42 paid" rows_written=1 token=`)
		}
		pool := pglocktest.Pool(t, url, 1)
		_, err := pool.Exec(t.Context(), "UPDATE payments SET fencing_token = 1000000 WHERE id = 42") // a newer holder's write
		require.NoError(t, err)
		out, code, _ := run(url)
		require.Equal(t, 1, code, "%s", out)
		require.Contains(t, out, "payment 42: write refused: a holder with a token above")
		require.NotContains(t, out, "marked payment 42 paid")
	})
}

// buildReadmeProgram builds the first whole program of README.md's section heading
// ("## Quick start") and returns the executable's path.
func buildReadmeProgram(t *testing.T, goTool, heading string) string {
	t.Helper()
	readme, err := filepath.Abs("README.md")
	require.NoError(t, err)
	text, err := os.ReadFile(readme)
	require.NoError(t, err)
	at := bytes.Index(text, []byte("\n"+heading+"\n"))
	require.GreaterOrEqual(t, at, 0, "README.md has no section %q", heading)
	line := func(offset int) int { return bytes.Count(text[:offset], []byte("\n")) + 1 }
	start, end := line(at+1), len(text)
	if next := bytes.Index(text[at+1:], []byte("\n## ")); next >= 0 {
		end = at + 1 + next
	}
	blocks := readmeGoBlocks(t, readme)
	i := slices.IndexFunc(blocks, func(b readmeBlock) bool {
		return b.line > start && b.line < line(end) && strings.HasPrefix(b.code, "package main\n")
	})
	require.GreaterOrEqual(t, i, 0, "README.md's section %q has no whole program", heading)
	block := blocks[i]

	// Inside the module, so that the program imports this pglock; "_" hides the
	// directory from ./... patterns.
	dir, err := os.MkdirTemp(".", "_readme_program_")
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, os.RemoveAll(dir)) })
	src := fmt.Sprintf("//line %s:%d\n%s", readme, block.line, block.code)
	require.NoError(t, os.WriteFile(filepath.Join(dir, "main.go"), []byte(src), 0o644))
	bin := filepath.Join(t.TempDir(), "program")
	args := append(append([]string{"build"}, testkit.RaceFlags...), "-o", bin, "./"+filepath.ToSlash(dir))
	out, err := exec.Command(goTool, args...).CombinedOutput()
	require.NoError(t, err, "README.md's section %q does not build:\n%s", heading, out)
	return bin
}
