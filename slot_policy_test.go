package pglock_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgfence/pglock"
	"github.com/pgfence/pglock/pglocktest"
)

func TestSlotPolicySaysWhatTheJobsOptionsSet(t *testing.T) {
	t.Parallel()
	c := newPoolClient(t, pglocktest.Postgres(t))
	nop := func(context.Context) error { return nil }
	cases := []struct {
		name string
		opts []pglock.JobOption
		want pglock.SlotPolicy
	}{
		{"EveryAtMostOnce", []pglock.JobOption{pglock.Every(5 * time.Minute)},
			pglock.SlotPolicy{Every: 5 * time.Minute, Attempts: 1}},
		{"CronInUTCUnlessZoned", []pglock.JobOption{pglock.Cron("0 2 * * *"), pglock.CatchUp(1), pglock.Deadline(time.Hour)},
			pglock.SlotPolicy{Cron: "CRON_TZ=UTC 0 2 * * *", CatchUp: 1, Deadline: time.Hour, Attempts: 1}},
		{"ZonedCronAtLeastOnce", []pglock.JobOption{pglock.Cron("TZ=Europe/Paris 30 6 * * 1-5"), pglock.AtLeastOnce(3, time.Second), pglock.OnOneInstance()},
			pglock.SlotPolicy{Cron: "TZ=Europe/Paris 30 6 * * 1-5", Attempts: 3, Backoff: time.Second}},
	}
	for _, tc := range cases {
		j, err := c.Job("policy:"+tc.name, nop, tc.opts...)
		require.NoError(t, err)
		p, ok := j.SlotPolicy()
		require.True(t, ok, tc.name)
		require.Equal(t, tc.want, p, tc.name)
	}
	j, err := c.Job("policy:none", nop, pglock.WithoutOverlapping())
	require.NoError(t, err)
	p, ok := j.SlotPolicy()
	require.False(t, ok, "a job without a schedule has no slots")
	require.Zero(t, p)
}
