//go:build !linux

package main

import "os/exec"

// dieWithParent does nothing here: only Linux can tie a child's life to its parent's.
// tryit stops its instances on every exit path it controls.
func dieWithParent(*exec.Cmd) {}
