package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"time"

	"github.com/pgfence/pglock/pglockui"
)

var uiCommand = &command{
	name:    "ui",
	args:    "[-addr HOST:PORT] [-actions]",
	summary: "serve the web console (locks, jobs, timelines, elections) until Ctrl+C",
	help: `
Ui serves pglock's web console (package pglockui) on -addr: the locks, held,
expiring or free, with live countdowns; the jobs, with a timeline of each job's
runs by instance; the elections. Pages update every second. It has no
authentication of its own: it listens on the loopback interface by default, and
force-release and prune are off unless -actions is given. To serve it to others,
mount pglockui in your application, behind its authentication.

It says which database it serves first. A database without schema pglock exits 1
('pglock migrate' makes it). It runs until Ctrl+C or SIGTERM, then stops within
-timeout.`,
	example: `
pglock ui -addr :8080
DATABASE_URL=postgres://ops@db.internal/shop pglock ui -actions`,
	connects: true,
	run:      runUI,
}

func runUI(ctx context.Context, e *env, fs *flag.FlagSet, args []string) error {
	addr := fs.String("addr", "127.0.0.1:8080", "listen on `HOST:PORT` (:8080 listens on every interface)")
	actions := fs.Bool("actions", false, "enable force-release and prune (anyone who reaches -addr may use them)")
	rest, err := e.parse(fs, args)
	if err != nil {
		return err
	}
	if len(rest) > 0 {
		return usageError("ui: unexpected argument %q", rest[0])
	}
	c, err := e.connect(ctx)
	if err != nil {
		return err
	}
	defer c.close()
	if st, err := c.schemaVersion(ctx); err != nil {
		return err
	} else if !st.Exists { // else each page would say it
		return c.schemaMissing()
	}
	logger := slog.New(slog.NewTextHandler(e.stderr, nil))
	opts := []pglockui.Option{pglockui.WithLogger(logger)}
	if *actions {
		opts = append(opts, pglockui.WithAuthorize(func(*http.Request) bool { return true }))
	}
	console, err := pglockui.New(c.client, opts...)
	if err != nil {
		return err
	}
	ln, err := (&net.ListenConfig{}).Listen(ctx, "tcp", *addr)
	if err != nil {
		return usageError("ui: -addr %s: %v", *addr, err)
	}
	srv := &http.Server{Handler: console, ReadHeaderTimeout: 10 * time.Second}
	fmt.Fprintf(e.stdout, "%s\npglock ui: serving it on http://%s/ (Ctrl+C stops)\n", c.reached(), ln.Addr())
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ln) }()
	select {
	case err := <-done:
		return fmt.Errorf("pglock: ui: %w", err)
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), e.timeout)
	defer cancel()
	if err := srv.Shutdown(sctx); err != nil {
		return fmt.Errorf("pglock: ui: shut down: %w", err)
	}
	if err := <-done; !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("pglock: ui: %w", err)
	}
	return nil
}
