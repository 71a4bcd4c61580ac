package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"time"
)

// instance is one shop process.
type instance struct {
	port int
	cmd  *exec.Cmd
	done chan struct{} // closed when the process has exited and its output is read
	err  error         // Wait's, once done is closed

	mu    sync.Mutex
	lines []string // its log
}

// start starts the shop binary on port with env, its output prefixed on out.
func start(bin string, port int, env []string, out *output) (*instance, error) {
	i := &instance{port: port, done: make(chan struct{})}
	i.cmd = exec.Command(bin)
	i.cmd.Env = append(os.Environ(), env...)
	w := &lineWriter{line: func(line string) {
		i.mu.Lock()
		i.lines = append(i.lines, line)
		i.mu.Unlock()
		out.instanceLine(port, line)
	}}
	i.cmd.Stdout, i.cmd.Stderr = w, w
	dieWithParent(i.cmd)
	if err := i.cmd.Start(); err != nil {
		return nil, fmt.Errorf("start the shop on port %d: %w", port, err)
	}
	go func() {
		i.err = i.cmd.Wait()
		w.flush()
		close(i.done)
	}()
	return i, nil
}

// running reports whether the process has not exited.
func (i *instance) running() bool {
	select {
	case <-i.done:
		return false
	default:
		return true
	}
}

// signal sends sig to the process, if it still runs.
func (i *instance) signal(sig os.Signal) {
	if i.running() {
		_ = i.cmd.Process.Signal(sig)
	}
}

// wait waits up to d for the process to exit, and returns how: "exit status 0",
// "signal: killed", or "still running".
func (i *instance) wait(d time.Duration) string {
	select {
	case <-i.done:
	case <-time.After(d):
		return "still running"
	}
	var exit *exec.ExitError
	switch {
	case i.err == nil:
		return "exit status 0"
	case errors.As(i.err, &exit):
		return exit.String()
	default:
		return i.err.Error()
	}
}

// stop ends the process: SIGTERM, and SIGKILL if it has not exited within d.
func (i *instance) stop(d time.Duration) {
	i.signal(syscall.SIGTERM)
	if i.wait(d) == "still running" {
		i.signal(syscall.SIGKILL)
		<-i.done
	}
}

// count returns how many lines of its log contain every one of parts.
func (i *instance) count(parts ...string) int {
	i.mu.Lock()
	defer i.mu.Unlock()
	n := 0
	for _, line := range i.lines {
		all := true
		for _, p := range parts {
			all = all && strings.Contains(line, p)
		}
		if all {
			n++
		}
	}
	return n
}

var httpClient = &http.Client{Timeout: 10 * time.Second}

// request sends method path to the instance with the admin token token ("" for
// none) and returns the status and the body.
func (i *instance) request(ctx context.Context, method, path, token string) (int, string, error) {
	req, err := http.NewRequestWithContext(ctx, method, fmt.Sprintf("http://127.0.0.1:%d%s", i.port, path), nil)
	if err != nil {
		return 0, "", err
	}
	if token != "" {
		req.Header.Set("X-Admin-Token", token)
	}
	res, err := httpClient.Do(req)
	if err != nil {
		return 0, "", err
	}
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	return res.StatusCode, strings.TrimSpace(string(b)), err
}

// ready waits until the instance answers GET /healthz, or fails when it exits first
// or d passes.
func (i *instance) ready(ctx context.Context, d time.Duration) error {
	deadline := time.Now().Add(d)
	for {
		if status, _, err := i.request(ctx, "GET", "/healthz", ""); err == nil && status == http.StatusOK {
			return nil
		}
		if !i.running() {
			return fmt.Errorf("the shop on port %d exited: %s", i.port, i.wait(0))
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("the shop on port %d did not answer within %v", i.port, d)
		}
		select {
		case <-ctx.Done():
			return context.Cause(ctx)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// lineWriter calls line with every complete line written to it.
type lineWriter struct {
	mu   sync.Mutex
	buf  bytes.Buffer
	line func(string)
}

func (w *lineWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.buf.Write(p)
	for {
		b := w.buf.Bytes()
		n := bytes.IndexByte(b, '\n')
		if n < 0 {
			return len(p), nil
		}
		w.line(string(b[:n]))
		w.buf.Next(n + 1)
	}
}

// flush passes on what is left, after the process exited.
func (w *lineWriter) flush() {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.buf.Len() > 0 {
		w.line(w.buf.String())
		w.buf.Reset()
	}
}
