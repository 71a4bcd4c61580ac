package pglockui_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/cdproto/page"
	"github.com/chromedp/chromedp"
)

// The browser tests drive a real headless Chromium through the DevTools protocol
// (chromedp). One browser serves the whole package, started by the first test that
// needs it and stopped by TestMain; each test gets a tab of its own, so they can run
// in parallel.

// chromiumEnv names a Chromium (or Chrome) binary to use instead of the first of
// chromiumNames found on PATH.
const chromiumEnv = "PGLOCK_CHROMIUM"

var chromiumNames = []string{"chromium", "chromium-browser", "google-chrome", "google-chrome-stable", "headless-shell", "headless_shell"}

var browser struct {
	once   sync.Once
	ctx    context.Context // a chromedp context whose browser runs; tabs are its children
	cancel context.CancelFunc
	err    error
}

// chromiumPath returns the browser binary to run, or an error saying how to get one.
func chromiumPath() (string, error) {
	if p := os.Getenv(chromiumEnv); p != "" {
		return exec.LookPath(p)
	}
	for _, name := range chromiumNames {
		if p, err := exec.LookPath(name); err == nil {
			return p, nil
		}
	}
	return "", fmt.Errorf("no Chromium found (tried %q and $%s): install Debian's chromium (.ci/packages does)", chromiumNames, chromiumEnv)
}

// startBrowser starts the package's browser once.
func startBrowser() (context.Context, error) {
	browser.once.Do(func() {
		path, err := chromiumPath()
		if err != nil {
			browser.err = err
			return
		}
		opts := append(chromedp.DefaultExecAllocatorOptions[:],
			chromedp.ExecPath(path),
			chromedp.NoSandbox, // tests and CI run as root, where Chromium's sandbox refuses to start
			chromedp.WindowSize(1280, 800),
			chromedp.Flag("disable-gpu", true),
			chromedp.Flag("renderer-process-limit", "4"), // 2 cores: a renderer per tab would only thrash
		)
		allocCtx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
		ctx, cancelBrowser := chromedp.NewContext(allocCtx)
		browser.cancel = func() { cancelBrowser(); cancelAlloc() }
		// The first Run starts the browser and binds it to ctx: no timeout here (see
		// chromedp.NewContext). A start that hangs fails the test's own deadline.
		if err := chromedp.Do(ctx); err != nil {
			browser.cancel()
			browser.err = fmt.Errorf("start %s: %w", path, err)
			return
		}
		browser.ctx = ctx
	})
	return browser.ctx, browser.err
}

// stopBrowser stops the package's browser, if a test started it: TestMain calls it
// before the goroutine-leak check.
func stopBrowser() {
	if browser.cancel != nil {
		browser.cancel()
	}
}

// stoppingBrowser runs the tests, then stops the package's browser, before goleak
// looks for leaks.
type stoppingBrowser struct{ m *testing.M }

func (s stoppingBrowser) Run() int {
	defer stopBrowser()
	return s.m.Run()
}

// tab is a browser tab of one test.
type tab struct {
	t       testing.TB
	ctx     context.Context // the tab's chromedp context; actions take a deadline from it
	mu      sync.Mutex
	dialogs []string // JavaScript dialogs (alert, confirm, prompt) the page opened
}

// newTab opens a tab for t, closed when t ends, and fails t at its end if the page
// opened any JavaScript dialog: the console confirms with a <dialog> element, so an
// alert() is a script that should not have run. Without Chromium the test is skipped,
// saying why, except when CI is set: then it fails, so that CI cannot pass without
// having run it.
func newTab(t testing.TB) *tab {
	t.Helper()
	bctx, err := startBrowser()
	if err != nil {
		if os.Getenv("CI") != "" {
			t.Fatalf("browser test (CI is set, so this fails rather than skips): %v", err)
		}
		t.Skipf("browser test skipped: %v", err)
	}
	ctx, cancel := chromedp.NewContext(bctx)
	tb := &tab{t: t, ctx: ctx}
	dialogs := chromedp.Events(ctx, page.JavascriptDialogOpening) // opens the tab
	done := make(chan struct{})
	go func() {
		defer close(done)
		for ev, err := range dialogs {
			if err != nil {
				return
			}
			tb.mu.Lock()
			tb.dialogs = append(tb.dialogs, fmt.Sprintf("%s(%q)", ev.Type, ev.Message))
			tb.mu.Unlock()
			// An open dialog blocks the page: dismiss it so that the test goes on to fail.
			_, _ = chromedp.Call(ctx, page.HandleJavaScriptDialog, page.HandleJavaScriptDialogParams{Accept: false})
		}
	}()
	t.Cleanup(func() {
		cancel()
		<-done
		tb.mu.Lock()
		defer tb.mu.Unlock()
		if len(tb.dialogs) > 0 {
			t.Errorf("the page opened JavaScript dialogs: %v", tb.dialogs)
		}
	})
	return tb
}

// do runs actions in the tab within d. An action whose node the page replaced between
// finding it and using it (a live update re-renders the tables: "Could not find node
// with given id", in a fresh-clone CI run, on a click) runs again: the node went away
// before any input was sent to it.
func (tb *tab) do(d time.Duration, actions ...chromedp.Action[chromedp.Void]) {
	tb.t.Helper()
	ctx, cancel := context.WithTimeout(tb.ctx, d)
	defer cancel()
	for {
		err := chromedp.Do(ctx, actions...)
		if err == nil {
			return
		}
		if !nodeGone(err) || ctx.Err() != nil {
			tb.t.Fatalf("browser: %v", err)
		}
	}
}

// nodeGone reports whether err says that a node the action had found is no longer in
// the page.
func nodeGone(err error) bool {
	msg := err.Error()
	return strings.Contains(msg, "Could not find node with given id") || strings.Contains(msg, "No node with given id") ||
		strings.Contains(msg, "Node is detached from document")
}

// eval evaluates a JavaScript expression in the page and decodes its value.
// A promise is awaited.
func eval[T any](tb *tab, expr string) T {
	tb.t.Helper()
	ctx, cancel := context.WithTimeout(tb.ctx, 10*time.Second)
	defer cancel()
	v, err := chromedp.Run(ctx, chromedp.Evaluate[T](expr, chromedp.EvalAwaitPromise))
	if err != nil {
		tb.t.Fatalf("browser: evaluate %s: %v", expr, err)
	}
	return v
}

// waitFor polls a JavaScript expression until it is truthy, failing the test after d
// with what the page then shows of what.
func (tb *tab) waitFor(d time.Duration, expr, what string) {
	tb.t.Helper()
	ctx, cancel := context.WithTimeout(tb.ctx, d+5*time.Second)
	defer cancel()
	_, err := chromedp.Run(ctx, chromedp.Poll[bool](expr, chromedp.WithPollingInterval(50*time.Millisecond), chromedp.WithPollingTimeout(d)))
	if err != nil {
		tb.t.Fatalf("browser: within %v: %s: %v", d, what, err)
	}
}
