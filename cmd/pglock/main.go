// Command pglock shows and steers what pglock (github.com/pgfence/pglock) does in a
// PostgreSQL database: the locks and who holds them, the jobs' last runs, failures and
// skipped ticks; it breaks a stuck lock, applies the schema and prunes old rows.
//
//	go run github.com/pgfence/pglock/cmd/pglock@latest locks -prefix orders:
//
// @latest builds the published version, outside any module: a replace directive
// does not apply. From a module that requires pglock, run it without a version (go
// run github.com/pgfence/pglock/cmd/pglock); in a checkout, go run ./cmd/pglock.
//
// It connects with -url, else DATABASE_URL, else the libpq defaults, and its output
// for people starts with the database it reached. Output is for people by default and
// JSON with -json. `pglock -h` lists the commands and the exit
// codes; `pglock <command> -h` shows a command's flags and an example.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"
)

// Exit codes, documented in the usage text.
const (
	exitOK       = 0
	exitFailure  = 1 // the server unreachable, the schema missing, a statement failed
	exitUsage    = 2 // an unknown command or flag, a missing argument, release without -force
	exitNotFound = 3 // release of a key nobody holds, jobs JOB neither registered nor recorded
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	context.AfterFunc(ctx, stop) // a second Ctrl+C kills at once
	code := run(ctx, os.Args[1:], &env{
		stdout:   os.Stdout,
		stderr:   os.Stderr,
		getenv:   os.Getenv,
		terminal: isTerminal(os.Stdout),
		width:    termWidth(os.Getenv, os.Stdout),
	})
	stop()
	os.Exit(code)
}

// env is what a command runs with: where it writes, the environment, and the
// connection flags, which every command that connects accepts before or after its name.
type env struct {
	stdout, stderr io.Writer
	getenv         func(string) string
	terminal       bool // stdout is a terminal: -watch redraws in place
	width          int  // the columns output fits: COLUMNS, the terminal's, or defaultWidth

	url     string
	timeout time.Duration
	cmd     *command // the command running
}

// command is one of pglock's commands.
type command struct {
	name     string
	args     string // the synopsis after the name
	summary  string // one line, for pglock -h
	help     string // what it does, for pglock <command> -h
	example  string
	connects bool // takes -url and -timeout
	run      func(ctx context.Context, e *env, fs *flag.FlagSet, args []string) error
}

// commands are set in init: their run functions print the usage, which lists them.
var commands []*command

func init() {
	commands = []*command{locksCommand, jobsCommand, releaseCommand, migrateCommand, sqlCommand, pruneCommand, uiCommand, versionCommand}
}

func lookup(name string) *command {
	for _, c := range commands {
		if c.name == name {
			return c
		}
	}
	return nil
}

// cliError is an error with the exit code it ends pglock with.
type cliError struct {
	code int
	err  error
}

func (e *cliError) Error() string { return e.err.Error() }
func (e *cliError) Unwrap() error { return e.err }

// usageError is bad usage: exit 2.
func usageError(format string, args ...any) error {
	return &cliError{exitUsage, fmt.Errorf("pglock: "+format, args...)}
}

// notFoundError is a key or a job not found: exit 3.
func notFoundError(format string, args ...any) error {
	return &cliError{exitNotFound, fmt.Errorf("pglock: "+format, args...)}
}

// errHelp: the usage was asked for and printed: exit 0.
var errHelp = errors.New("help")

// run runs pglock with args (without the program's name) and returns its exit code.
func run(ctx context.Context, args []string, e *env) int {
	e.timeout = 5 * time.Second
	top := flag.NewFlagSet("pglock", flag.ContinueOnError)
	top.SetOutput(io.Discard)
	top.Usage = func() {}
	e.connectionFlags(top)
	if err := top.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			e.usage(e.stdout)
			return exitOK
		}
		fmt.Fprintf(e.stderr, "pglock: %v (pglock -h)\n", err)
		return exitUsage
	}
	if top.NArg() == 0 {
		e.usage(e.stderr)
		return exitUsage
	}
	name, rest := top.Arg(0), top.Args()[1:]
	if name == "help" {
		if len(rest) == 0 {
			e.usage(e.stdout)
			return exitOK
		}
		name, rest = rest[0], []string{"-h"}
	}
	c := lookup(name)
	if c == nil {
		fmt.Fprintf(e.stderr, "pglock: unknown command %q: want one of %s (pglock -h)\n", name, commandNames())
		return exitUsage
	}
	fs := flag.NewFlagSet("pglock "+c.name, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.Usage = func() {}
	if c.connects {
		e.connectionFlags(fs)
	}
	e.cmd = c
	err := c.run(ctx, e, fs, rest)
	switch {
	case err == nil:
		return exitOK
	case errors.Is(err, errHelp):
		return exitOK
	}
	fmt.Fprintln(e.stderr, err)
	var ce *cliError
	if errors.As(err, &ce) {
		return ce.code
	}
	return exitFailure
}

// connectionFlags adds -url and -timeout to fs; given before the command or after it,
// they set the same values.
func (e *env) connectionFlags(fs *flag.FlagSet) {
	fs.StringVar(&e.url, "url", e.url, "the database's `URL` or key=value connection string (default: DATABASE_URL, else the libpq defaults)")
	fs.DurationVar(&e.timeout, "timeout", e.timeout, "give up on the server after `D`: the connection, and each statement of locks, jobs and release")
}

// parse parses the arguments of the command running with fs, flags and arguments in
// any order ("--" ends the flags), and returns the arguments. -h prints its usage on stdout and returns errHelp; a bad
// flag is a usage error.
func (e *env) parse(fs *flag.FlagSet, args []string) ([]string, error) {
	c := e.cmd
	var positional []string
	for {
		if err := fs.Parse(args); err != nil {
			if errors.Is(err, flag.ErrHelp) {
				e.commandUsage(e.stdout, c, fs)
				return nil, errHelp
			}
			return nil, usageError("%s: %v (pglock %s -h)", c.name, err, c.name)
		}
		rest := fs.Args()
		if len(rest) == 0 {
			break
		}
		if used := len(args) - len(rest); used > 0 && args[used-1] == "--" {
			positional = append(positional, rest...)
			break
		}
		positional = append(positional, rest[0])
		args = rest[1:]
	}
	if c.connects && e.timeout <= 0 {
		return nil, usageError("%s: -timeout %v: want a positive duration such as 5s", c.name, e.timeout)
	}
	return positional, nil
}

func commandNames() string {
	names := make([]string, len(commands))
	for i, c := range commands {
		names[i] = c.name
	}
	return strings.Join(names, ", ")
}

// usage prints pglock -h.
func (e *env) usage(w io.Writer) {
	fmt.Fprint(w, `pglock shows and steers pglock's locks and jobs in a PostgreSQL database
(github.com/pgfence/pglock).

Usage:
  pglock [-url URL] [-timeout D] <command> [flags] [arguments]
  go run github.com/pgfence/pglock/cmd/pglock@latest <command> ...
  go run ./cmd/pglock <command> ...   (in a checkout; @latest ignores a replace)

Commands:
`)
	for _, c := range commands {
		fmt.Fprintf(w, "  %-8s %s\n", c.name, c.summary)
	}
	fmt.Fprint(w, `
Connection (every command but sql; before or after the command's name):
  -url URL     the database, as a postgres:// URL or a key=value string;
               default: DATABASE_URL, else the libpq defaults (PGHOST, PGPORT,
               PGDATABASE, PGUSER, PGPASSWORD, ~/.pgpass, the local socket)
  -timeout D   give up on the server after D (default 5s): the connection, and
               each statement of locks, jobs and release; migrate and prune run
               until they are done or Ctrl+C

Output is for people, its first line the database reached (name, host:port,
user, and where they came from); -json prints JSON for scripts. Times are in
UTC, on the database's clock.

Exit codes:
  0  ok
  1  failure: PostgreSQL unreachable, schema pglock missing (or behind, for
     version and migrate status), a statement failed
  2  bad usage: an unknown command or flag, a missing argument, release
     without -force (nothing is changed)
  3  not found: release of a key nobody holds, jobs JOB neither registered
     nor recorded

Examples:
  pglock locks -prefix orders:
  DATABASE_URL=postgres://ops@db.internal/shop pglock jobs
  pglock release -force orders:42
  pglock -url postgres://postgres@localhost/shop migrate status

Run 'pglock <command> -h' for a command's flags and an example.
`)
}

// commandUsage prints pglock <command> -h.
func (e *env) commandUsage(w io.Writer, c *command, fs *flag.FlagSet) {
	fmt.Fprintf(w, "Usage: %s\n\n%s\n", strings.TrimSpace("pglock "+c.name+" "+c.args), strings.TrimSpace(c.help))
	flags := 0
	fs.VisitAll(func(*flag.Flag) { flags++ })
	if flags > 0 {
		fmt.Fprintln(w, "\nFlags:")
		fs.SetOutput(w)
		fs.PrintDefaults()
		fs.SetOutput(io.Discard)
	}
	fmt.Fprintf(w, "\nExample:\n%s\n", indent(strings.TrimSpace(c.example), "  "))
	if c.connects {
		fmt.Fprintln(w, "\nExit codes and the connection: pglock -h.")
	}
}

func indent(s, prefix string) string {
	lines := strings.Split(s, "\n")
	for i, l := range lines {
		if l != "" {
			lines[i] = prefix + l
		}
	}
	return strings.Join(lines, "\n")
}

// isTerminal reports whether f is a terminal (a character device).
func isTerminal(f *os.File) bool {
	st, err := f.Stat()
	return err == nil && st.Mode()&os.ModeCharDevice != 0
}
