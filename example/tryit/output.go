package main

import (
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"sync"
	"unicode/utf8"
)

// width is the number of columns everything tryit prints fits in.
const width = 100

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

// instanceLine prints a line of an instance's log, compacted, prefixed with the port,
// and wrapped under its message.
func (o *output) instanceLine(port int, line string) {
	o.mu.Lock()
	defer o.mu.Unlock()
	prefix := fmt.Sprintf("[%d] ", port)
	n := len(prefix)
	if o.colour {
		prefix = colours[port%len(colours)] + prefix[:n-1] + reset + " "
	}
	line, indent := compactLog(line)
	for j, l := range wrap(line, width-n, indent) {
		if j > 0 {
			prefix = strings.Repeat(" ", n)
		}
		fmt.Fprintln(o.w, prefix+l)
	}
}

// say prints a line of the story, wrapped to width.
func (o *output) say(format string, args ...any) {
	o.mu.Lock()
	defer o.mu.Unlock()
	for _, line := range strings.Split(fmt.Sprintf(format, args...), "\n") {
		for _, l := range wrap(line, width, hangingIndent(line)) {
			if o.colour && l != "" {
				l = bold + l + reset
			}
			fmt.Fprintln(o.w, l)
		}
	}
}

// raw prints text as it is.
func (o *output) raw(text string) {
	o.mu.Lock()
	defer o.mu.Unlock()
	fmt.Fprint(o.w, text)
}

// compactLog shortens a line of cmd/shop's log (slog's text format) for display: the
// time of day, the level, the message, and the attributes but those the prefix or the
// locks table show (port, owner, a job's lease key). It returns a line in another
// format as it is. indent is where the message starts, to wrap under it.
func compactLog(line string) (_ string, indent int) {
	attrs, ok := parseLogfmt(line)
	if !ok {
		return line, 0
	}
	var key string
	for _, a := range attrs {
		if a.key == "key" {
			key = a.value
		}
	}
	var b strings.Builder
	for _, a := range attrs {
		switch {
		case a.key == "time":
			if _, t, ok := strings.Cut(a.value, "T"); ok && len(t) >= 12 {
				b.WriteString(t[:12]) // 15:04:05.000
			}
		case a.key == "level":
			b.WriteString(" " + a.value + " ")
			indent = utf8.RuneCountInString(strings.TrimLeft(b.String(), " "))
		case a.key == "msg":
			b.WriteString(a.value)
		case a.key == "port", a.key == "owner", a.key == "lease" && a.value == key+":owner":
		default:
			v := a.value
			if v == "" || strings.ContainsAny(v, " \"=") {
				v = strconv.Quote(v)
			}
			b.WriteString(" " + a.key + "=" + v)
		}
	}
	return strings.TrimSpace(b.String()), indent
}

type attr struct{ key, value string }

// parseLogfmt splits a line of key=value pairs, values quoted when they have spaces.
func parseLogfmt(line string) ([]attr, bool) {
	var attrs []attr
	for rest := strings.TrimSpace(line); rest != ""; rest = strings.TrimLeft(rest, " ") {
		key, value, found := strings.Cut(rest, "=")
		if !found || key == "" || strings.ContainsAny(key, ` "`) {
			return nil, false
		}
		if strings.HasPrefix(value, `"`) {
			quoted, err := strconv.QuotedPrefix(value)
			if err != nil {
				return nil, false
			}
			rest = value[len(quoted):]
			value, _ = strconv.Unquote(quoted)
		} else {
			value, rest, _ = strings.Cut(value, " ")
		}
		attrs = append(attrs, attr{key, value})
	}
	return attrs, len(attrs) > 0 && attrs[0].key == "time"
}

// hangingIndent is how far the continuation lines of a story line are indented: under
// the text after its indent and its "== 1. " or "✔ ".
func hangingIndent(line string) int {
	rest := strings.TrimLeft(line, " ")
	n := len(line) - len(rest)
	for _, mark := range []string{"✔ ", "✘ ", "== "} {
		if strings.HasPrefix(rest, mark) {
			n += utf8.RuneCountInString(mark)
			if mark == "== " {
				if step, _, ok := strings.Cut(rest[len(mark):], " "); ok && strings.HasSuffix(step, ".") {
					n += len(step) + 1
				}
			}
		}
	}
	return n
}

// wrap breaks line at spaces into lines of at most w columns, the second and later
// indented by indent; a word too long for a line is cut.
func wrap(line string, w, indent int) []string {
	if utf8.RuneCountInString(line) <= w {
		return []string{line}
	}
	lead := len(line) - len(strings.TrimLeft(line, " "))
	var lines []string
	cur := line[:lead]
	fresh := true // cur has no word yet
	for _, word := range strings.Fields(line) {
		for {
			sep := " "
			if fresh {
				sep = ""
			}
			if utf8.RuneCountInString(cur+sep+word) <= w {
				cur, fresh = cur+sep+word, false
				break
			}
			if !fresh {
				lines = append(lines, cur)
				cur, fresh = strings.Repeat(" ", indent), true
				continue
			}
			room := w - utf8.RuneCountInString(cur)
			r := []rune(word)
			lines = append(lines, cur+string(r[:room]))
			cur, word = strings.Repeat(" ", indent), string(r[room:])
		}
	}
	return append(lines, cur)
}

// table lays out rows, the first the header, in columns two spaces apart, each line
// starting with indent, narrowing columns and wrapping their cells until a line fits
// in width.
func table(indent string, rows [][]string) string {
	widths := make([]int, len(rows[0]))
	for _, row := range rows {
		for c, cell := range row {
			widths[c] = max(widths[c], utf8.RuneCountInString(cell))
		}
	}
	// Narrow, a column at a time, the one whose cells then take the fewest lines; the
	// first column, the rows' names, only when no other can narrow.
	total := len(indent) + 2*(len(widths)-1)
	for _, w := range widths {
		total += w
	}
	for ; total > width; total-- {
		best, bestHeight := -1, 0
		for c := len(widths) - 1; c >= 0; c-- {
			if widths[c] <= 10 || c == 0 && best >= 0 {
				continue
			}
			widths[c]--
			h := height(rows, widths)
			widths[c]++
			if best < 0 || h < bestHeight || h == bestHeight && widths[c] > widths[best] {
				best, bestHeight = c, h
			}
		}
		if best < 0 {
			break
		}
		widths[best]--
	}
	var b strings.Builder
	for _, row := range rows {
		cells := make([][]string, len(row))
		lines := 0
		for c, cell := range row {
			cells[c] = wrap(cell, widths[c], 0)
			lines = max(lines, len(cells[c]))
		}
		for l := range lines {
			line := indent
			for c := range row {
				text := ""
				if l < len(cells[c]) {
					text = cells[c][l]
				}
				if c < len(row)-1 {
					text += strings.Repeat(" ", widths[c]-utf8.RuneCountInString(text)+2)
				}
				line += text
			}
			b.WriteString(strings.TrimRight(line, " ") + "\n")
		}
	}
	return b.String()
}

// height is how many lines rows take with their cells wrapped to widths.
func height(rows [][]string, widths []int) int {
	n := 0
	for _, row := range rows {
		h := 0
		for c, cell := range row {
			h = max(h, len(wrap(cell, widths[c], 0)))
		}
		n += h
	}
	return n
}
