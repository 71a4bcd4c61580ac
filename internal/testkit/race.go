//go:build race

package testkit

// RaceFlags are the go build flags of a program a test builds and runs: -race when the
// test itself runs with the race detector, so that the program's build reuses the
// packages the test's build compiled (a plain build compiles every one a second time).
var RaceFlags = []string{"-race"}
