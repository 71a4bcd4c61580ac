package main

import (
	"fmt"
	"io"
	"os"
	"sync"
)

// output is the demo's terminal: the story's lines and the instances' logs, one line at
// a time, each instance's prefixed with its port, in colour on a terminal.
type output struct {
	mu     sync.Mutex
	w      io.Writer
	colour bool
}

func newOutput(w io.Writer) *output {
	o := &output{w: w}
	if f, ok := w.(*os.File); ok {
		if fi, err := f.Stat(); err == nil && fi.Mode()&os.ModeCharDevice != 0 && os.Getenv("NO_COLOR") == "" {
			o.colour = true
		}
	}
	return o
}

// ANSI colours of the instances, by port order, and of the story.
var colours = []string{"\x1b[36m", "\x1b[35m", "\x1b[33m"}

const (
	bold  = "\x1b[1m"
	reset = "\x1b[0m"
)

func (o *output) instanceLine(port int, line string) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.colour {
		fmt.Fprintf(o.w, "%s[%d]%s %s\n", colours[port%len(colours)], port, reset, line)
		return
	}
	fmt.Fprintf(o.w, "[%d] %s\n", port, line)
}

// say prints a line of the story.
func (o *output) say(format string, args ...any) {
	o.mu.Lock()
	defer o.mu.Unlock()
	line := fmt.Sprintf(format, args...)
	if o.colour {
		line = bold + line + reset
	}
	fmt.Fprintln(o.w, line)
}

// raw prints text as it is.
func (o *output) raw(text string) {
	o.mu.Lock()
	defer o.mu.Unlock()
	fmt.Fprint(o.w, text)
}
