package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
	"unicode"
	"unicode/utf8"
)

// table writes aligned columns, without trailing spaces.
type table struct {
	w   io.Writer
	buf bytes.Buffer
	tw  *tabwriter.Writer
}

func newTable(w io.Writer, header ...string) *table {
	t := &table{w: w}
	t.tw = tabwriter.NewWriter(&t.buf, 0, 0, 2, ' ', 0)
	t.row(header...)
	return t
}

func (t *table) row(cells ...string) {
	fmt.Fprintln(t.tw, strings.Join(cells, "\t"))
}

func (t *table) flush() {
	_ = t.tw.Flush()
	for _, line := range strings.SplitAfter(t.buf.String(), "\n") {
		if line != "" {
			fmt.Fprintln(t.w, strings.TrimRight(line, " \n"))
		}
	}
	t.buf.Reset()
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
