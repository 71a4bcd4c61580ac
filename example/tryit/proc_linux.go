package main

import (
	"os/exec"
	"syscall"
)

// dieWithParent makes the kernel send the shop SIGTERM if tryit dies without stopping
// it (kill -9), so that no instance outlives the demo.
func dieWithParent(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGTERM}
}
