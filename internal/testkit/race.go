//go:build race

package testkit

import "os"

// RaceFlags are the go build flags of a program a test builds and runs: -race when the
// test itself runs with the race detector, so that the program's build reuses the
// packages the test's build compiled (a plain build compiles every one a second time).
var RaceFlags = []string{"-race"}

// NoExitSleep has the programs that a test process starts from here on (children
// inherit the environment) exit at once: a race-instrumented program sleeps a second at
// exit by default (GORACE's atexit_sleep_ms), which tests that run a program many times,
// or wait for its exit, would pay each time. It keeps a GORACE that is set.
func NoExitSleep() {
	if os.Getenv("GORACE") == "" {
		os.Setenv("GORACE", "atexit_sleep_ms=0")
	}
}
