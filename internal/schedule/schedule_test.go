package schedule

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// Every names the slots aligned to the Unix epoch; a cron expression the times it names,
// in UTC unless it names a zone; a tick up to half the gap early (a second at most)
// stands for the coming slot.
func TestScheduleNamesTheSameSlotsEverywhere(t *testing.T) {
	t.Parallel()
	at := func(s string) time.Time {
		tt, err := time.Parse(time.RFC3339Nano, s)
		require.NoError(t, err)
		return tt
	}
	every := &Schedule{Every: 5 * time.Minute}
	hourly, err := ParseCron("0 * * * *")
	require.NoError(t, err)
	for _, tc := range []struct {
		name       string
		s          *Schedule
		now        string
		slot, next string
	}{
		{"every, inside a slot", every, "2026-12-06T08:07:30Z", "2026-12-06T08:05:00Z", "2026-12-06T08:10:00Z"},
		{"every, on a slot", every, "2026-12-06T08:10:00Z", "2026-12-06T08:10:00Z", "2026-12-06T08:15:00Z"},
		{"every, a tick early", every, "2026-12-06T08:09:59.5Z", "2026-12-06T08:10:00Z", "2026-12-06T08:15:00Z"},
		{"cron, inside a slot", hourly, "2026-12-06T08:30:00Z", "2026-12-06T08:00:00Z", "2026-12-06T09:00:00Z"},
		{"cron, a tick early", hourly, "2026-12-06T08:59:59.2Z", "2026-12-06T09:00:00Z", "2026-12-06T10:00:00Z"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			slot, next := tc.s.Current(at(tc.now))
			require.Equal(t, at(tc.slot), slot.UTC())
			require.Equal(t, at(tc.next), next.UTC())
		})
	}
	require.Len(t, every.Between(at("2026-12-06T08:00:00Z"), at("2026-12-06T08:30:00Z")), 5)
	_, err = ParseCron("@every 1m")
	require.Error(t, err)
}
