package main

import (
	"flag"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// Bad configuration stops the shop before it touches any database.
func TestRefusesABadConfigBeforeStarting(t *testing.T) {
	for _, c := range []struct {
		name string
		env  map[string]string
		args []string
		want string
	}{
		{"no admin token", nil, nil, "ADMIN_TOKEN is empty"},
		{"empty admin token flag", map[string]string{"ADMIN_TOKEN": "s3cret"}, []string{"-admin-token="}, "ADMIN_TOKEN is empty"},
		{"bad PORT", map[string]string{"ADMIN_TOKEN": "s3cret", "PORT": "http"}, nil, "PORT"},
		{"bad LOCK_TTL", map[string]string{"ADMIN_TOKEN": "s3cret", "LOCK_TTL": "long"}, nil, "LOCK_TTL"},
		{"zero ttl", map[string]string{"ADMIN_TOKEN": "s3cret"}, []string{"-ttl=0s"}, "ttl 0s"},
		{"bad LOG_LEVEL", map[string]string{"ADMIN_TOKEN": "s3cret", "LOG_LEVEL": "loud"}, nil, "LOG_LEVEL"},
		{"unknown flag", map[string]string{"ADMIN_TOKEN": "s3cret"}, []string{"-colour"}, "colour"},
	} {
		t.Run(c.name, func(t *testing.T) {
			for _, name := range []string{"ADMIN_TOKEN", "PORT", "LOCK_TTL", "LOG_LEVEL", "DATABASE_URL"} {
				t.Setenv(name, c.env[name])
			}
			t.Setenv("DATABASE_URL", "postgres://nowhere.invalid/none") // never reached
			err := run(c.args)
			require.ErrorContains(t, err, c.want)
		})
	}
}

// -h prints the usage and exits 0; a bad flag is one line and exits 1.
func TestHelpExitsZero(t *testing.T) {
	t.Setenv("ADMIN_TOKEN", "s3cret")
	err := run([]string{"-h"})
	require.ErrorIs(t, err, flag.ErrHelp)
	var stderr strings.Builder
	require.Equal(t, 0, exitCode(err, &stderr))
	require.Empty(t, stderr.String())
	require.Equal(t, 1, exitCode(run([]string{"-colour"}), &stderr))
	require.Equal(t, "shop: flag provided but not defined: -colour\n", stderr.String())
}
