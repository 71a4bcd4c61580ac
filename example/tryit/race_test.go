//go:build race

package main

// raceFlags builds the shop with the race detector when the test runs with it, which
// also reuses the packages the test's build compiled.
var raceFlags = []string{"-race"}
