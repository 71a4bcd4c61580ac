package main

import (
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/stretchr/testify/require"

	"github.com/pgfence/pglock/example/shop"
)

func TestTableFitsInTheWidth(t *testing.T) {
	t.Parallel()
	long := strings.Repeat("word ", 20)
	out := table("  ", [][]string{{"STEP", "EXPECTED", "SEEN", "OK"}, {"a step", long, long, "ok"}})
	lines := strings.Split(strings.TrimSuffix(out, "\n"), "\n")
	require.Greater(t, len(lines), 2, "the long cells wrap")
	for _, l := range lines {
		require.LessOrEqual(t, utf8.RuneCountInString(l), width, l)
	}
	require.True(t, strings.HasPrefix(lines[1], "  a step  word"), lines[1])
	require.True(t, strings.HasSuffix(lines[1], "ok"), lines[1])
}

func TestCompactLogKeepsTheMessageAndTheAttributes(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name, line, want string
		indent           int
	}{
		{
			"drops the date and the port",
			`time=2026-11-30T23:12:01.123Z level=INFO msg="shop: listening" port=3001 addr=[::]:3001 ttl=5s`,
			`23:12:01.123 INFO shop: listening addr=[::]:3001 ttl=5s`, 18,
		},
		{
			"drops the owner and a job's lease key",
			`time=2026-11-30T23:12:01.500+01:00 level=DEBUG msg=x port=3002 key=a owner=vm:3002/xyz lease=a:owner`,
			`23:12:01.500 DEBUG x key=a`, 19,
		},
		{
			"quotes a value with spaces again",
			`time=2026-11-30T23:12:01.500Z level=WARN msg=x err="pglock: \"a\" lost" lease=b:owner`,
			`23:12:01.500 WARN x err="pglock: \"a\" lost" lease=b:owner`, 18,
		},
		{"leaves another format alone", "panic: boom", "panic: boom", 0},
		{"leaves a broken quote alone", `time=2026-11-30T23:12:01.123Z msg="open`, `time=2026-11-30T23:12:01.123Z msg="open`, 0},
	} {
		t.Run(c.name, func(t *testing.T) {
			got, indent := compactLog(c.line)
			require.Equal(t, c.want, got)
			require.Equal(t, c.indent, indent)
		})
	}
}

func TestInstanceLinesWrapUnderTheMessage(t *testing.T) {
	t.Parallel()
	var b strings.Builder
	o := newOutput(&b)
	o.instanceLine(23001, `time=2026-11-30T23:12:01.123Z level=INFO msg="pglock: stepped down" port=23001 `+
		`key=inventory:warehouse-feed token=7 err="pglock: resigned from the election" stack="`+strings.Repeat("x", 120)+`"`)
	lines := strings.Split(strings.TrimSuffix(b.String(), "\n"), "\n")
	require.Greater(t, len(lines), 2)
	require.True(t, strings.HasPrefix(lines[0], "[23001] 23:12:01.123 INFO pglock: stepped down key="), lines[0])
	for _, l := range lines {
		require.LessOrEqual(t, utf8.RuneCountInString(l), width, l)
	}
	under := strings.Repeat(" ", len("[23001] 23:12:01.123 INFO "))
	for _, l := range lines[1:] {
		require.True(t, strings.HasPrefix(l, under) && l[len(under)] != ' ', l)
	}
}

func TestWrapBreaksAtSpacesUnderTheIndent(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name   string
		line   string
		w, ind int
		want   []string
	}{
		{"a short line stays", "   ✔ ok", 10, 5, []string{"   ✔ ok"}},
		{"a long one wraps", "   ✔ aaa bbb ccc", 10, 5, []string{"   ✔ aaa", "     bbb", "     ccc"}},
		{"a long word is cut", "abcdefghijkl", 5, 1, []string{"abcde", " fghi", " jkl"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			require.Equal(t, c.want, wrap(c.line, c.w, c.ind))
		})
	}
	require.Equal(t, 6, hangingIndent("== 1. Start"))
	require.Equal(t, 5, hangingIndent("   ✘ step"))
}

// A lock released long ago shows when it ended, never a negative time to its expiry.
func TestExpiresSaysWhenALeaseEnded(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		row  shop.LockRow
		want string
	}{
		{shop.LockRow{Owner: "a/1", Held: true, ExpiresIn: "26.027s"}, "in 26.027s"},
		{shop.LockRow{ExpiresIn: "-36m10.013s"}, "released 36m10s ago"},
		{shop.LockRow{Owner: "a/1", ExpiresIn: "-2.4s"}, "expired 2s ago"},
		{shop.LockRow{ExpiresIn: "bogus"}, "released"},
	} {
		require.Equal(t, tc.want, expires(tc.row))
	}
}
