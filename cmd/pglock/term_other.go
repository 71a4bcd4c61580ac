//go:build !unix

package main

import "os"

// terminalWidth is 0 where reading a terminal's size needs more than the standard
// library: output then fits COLUMNS, or defaultWidth.
func terminalWidth(*os.File) int { return 0 }
