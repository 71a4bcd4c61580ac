//go:build !race

package testkit

// RaceFlags are the go build flags of a program a test builds and runs: none when the
// test runs without the race detector (see race.go).
var RaceFlags []string

// NoExitSleep does nothing without the race detector (see race.go).
func NoExitSleep() {}
