package main

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/pgfence/pglock"
)

// table writes aligned columns, without trailing spaces, in at most width columns
// when it can: the columns given to clip give way first, in their order, down to their
// minimum, their cells cut with "…".
type table struct {
	w      io.Writer
	width  int // 0: no limit
	rows   [][]string
	shrink []shrinkable
}

type shrinkable struct{ col, min int }

func newTable(w io.Writer, width int, header ...string) *table {
	return &table{w: w, width: width, rows: [][]string{header}}
}

// clip lets column col be cut down to min characters to fit the width.
func (t *table) clip(col, min int) *table {
	t.shrink = append(t.shrink, shrinkable{col, min})
	return t
}

func (t *table) row(cells ...string) {
	t.rows = append(t.rows, cells)
}

func (t *table) flush() {
	const gap = 2
	var widths []int
	for _, r := range t.rows {
		for i, c := range r {
			if i == len(widths) {
				widths = append(widths, 0)
			}
			widths[i] = max(widths[i], utf8.RuneCountInString(c))
		}
	}
	total := gap * (len(widths) - 1)
	for _, w := range widths {
		total += w
	}
	for _, s := range t.shrink {
		if t.width <= 0 || total <= t.width || s.col >= len(widths) {
			break
		}
		cut := min(total-t.width, max(widths[s.col]-s.min, 0))
		widths[s.col] -= cut
		total -= cut
	}
	var b strings.Builder
	for _, r := range t.rows {
		b.Reset()
		for i, c := range r {
			c = clip(c, widths[i])
			b.WriteString(c)
			if i < len(r)-1 {
				b.WriteString(strings.Repeat(" ", widths[i]-utf8.RuneCountInString(c)+gap))
			}
		}
		fmt.Fprintln(t.w, strings.TrimRight(b.String(), " "))
	}
	t.rows = t.rows[:1]
}

// text returns s as a table cell or a line: quoted when it holds a control character
// (a tab, a newline, an escape sequence) or an unprintable one, so that a key or an
// error text can neither break the table nor drive the terminal; "-" when empty.
func text(s string) string {
	if s == "" {
		return "-"
	}
	if !utf8.ValidString(s) || strings.IndexFunc(s, func(r rune) bool { return !unicode.IsPrint(r) }) >= 0 {
		return strconv.Quote(s)
	}
	return s
}

// clip shortens s to n runes, marking the cut.
func clip(s string, n int) string {
	if utf8.RuneCountInString(s) <= n {
		return s
	}
	if n < 1 {
		return ""
	}
	r := []rune(s)
	return string(r[:n-1]) + "…"
}

// stamp formats an instant in UTC, to the second; "-" for the zero time.
func stamp(t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	return t.UTC().Format("2006-01-02T15:04:05Z")
}

// span formats a duration for people: 2.4s below 10 s, then whole seconds, minutes,
// hours (1h30m, not 1h30m0s).
func span(d time.Duration) string {
	if d < 0 {
		d = -d
	}
	switch {
	case d < time.Second:
		return d.Round(time.Millisecond).String()
	case d < 10*time.Second:
		return d.Round(100 * time.Millisecond).String()
	}
	s := d.Round(time.Second).String()
	if strings.HasSuffix(s, "m0s") {
		s = strings.TrimSuffix(s, "0s")
	}
	if strings.HasSuffix(s, "h0m") {
		s = strings.TrimSuffix(s, "0m")
	}
	return s
}

// relative says when an instant d from now is: "in 27s", "2m ago".
func relative(d time.Duration) string {
	if d > 0 {
		return "in " + span(d)
	}
	return span(d) + " ago"
}

// writeJSON writes v as indented JSON, or on one line (for -watch).
func writeJSON(w io.Writer, v any, oneLine bool) error {
	enc := json.NewEncoder(w)
	enc.SetEscapeHTML(false)
	if !oneLine {
		enc.SetIndent("", "  ")
	}
	return enc.Encode(v)
}

// plural returns "1 lock", "2 locks".
func plural(n int, word string) string {
	if n == 1 {
		return "1 " + word
	}
	return strconv.Itoa(n) + " " + word + "s"
}

// expiry says when a lock's lease ends, or when it ended: "in 30s", "released 2m ago"
// (no owner: released, or broken), "expired 2.4s ago".
func expiry(l pglock.LockInfo) string {
	switch {
	case l.Held:
		return "in " + span(l.ExpiresIn)
	case l.Owner == "":
		return "released " + span(l.ExpiresIn) + " ago"
	}
	return "expired " + span(l.ExpiresIn) + " ago"
}

// wrap breaks text into lines of at most width characters, at spaces (0: no limit).
func wrap(text string, width int) string {
	if width <= 0 {
		return text
	}
	var b strings.Builder
	n := 0
	for i, word := range strings.Fields(text) {
		w := utf8.RuneCountInString(word)
		switch {
		case i == 0:
		case n+1+w > width:
			b.WriteByte('\n')
			n = 0
		default:
			b.WriteByte(' ')
			n++
		}
		b.WriteString(word)
		n += w
	}
	return b.String()
}

// defaultWidth is the width output fits when neither COLUMNS nor a terminal says.
const defaultWidth = 100

// termWidth is the width output fits: COLUMNS when it is a positive number, else the
// width of the terminal stdout is, else defaultWidth.
func termWidth(getenv func(string) string, stdout *os.File) int {
	if n, err := strconv.Atoi(getenv("COLUMNS")); err == nil && n > 0 {
		return n
	}
	if n := terminalWidth(stdout); n > 0 {
		return n
	}
	return defaultWidth
}
