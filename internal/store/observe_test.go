package store

import (
	"context"
	"reflect"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// recorder is a store with every capability that records the method called last.
type recorder struct{ last string }

func (r *recorder) called(name string) { r.last = name }

func (r *recorder) Acquire(context.Context, string, string, time.Duration) (int64, bool, error) {
	r.called("Acquire")
	return 0, false, nil
}

func (r *recorder) Renew(context.Context, string, string, time.Duration) (bool, error) {
	r.called("Renew")
	return false, nil
}

func (r *recorder) Release(context.Context, string, string) (bool, error) {
	r.called("Release")
	return false, nil
}

func (r *recorder) RenewMany(context.Context, []string, []string, time.Duration) ([]string, error) {
	r.called("RenewMany")
	return nil, nil
}

func (r *recorder) Holder(context.Context, string) (LockInfo, error) {
	r.called("Holder")
	return LockInfo{}, nil
}

func (r *recorder) ListLocks(context.Context, string) ([]LockInfo, error) {
	r.called("ListLocks")
	return nil, nil
}

func (r *recorder) SemAcquire(context.Context, string, string, time.Duration, int) (int, int64, bool, error) {
	r.called("SemAcquire")
	return 0, 0, false, nil
}

func (r *recorder) ReleaseMany(context.Context, []string, []string) ([]int, error) {
	r.called("ReleaseMany")
	return nil, nil
}

func (r *recorder) ForceRelease(context.Context, string) (LockInfo, error) {
	r.called("ForceRelease")
	return LockInfo{}, nil
}

func (r *recorder) Prune(context.Context, time.Duration, int) (int64, error) {
	r.called("Prune")
	return 0, nil
}

func (r *recorder) RecordRun(context.Context, RunRecord, time.Duration) error {
	r.called("RecordRun")
	return nil
}

func (r *recorder) RecordSkips(context.Context, string, []SkipCount, time.Duration) error {
	r.called("RecordSkips")
	return nil
}

func (r *recorder) JobRuns(context.Context, string, int) ([]JobRun, error) {
	r.called("JobRuns")
	return nil, nil
}

func (r *recorder) JobStatuses(context.Context) ([]JobStatus, error) {
	r.called("JobStatuses")
	return nil, nil
}

func (r *recorder) QueueAcquire(context.Context, Target, string, time.Duration) (int, int64, int64, int, error) {
	r.called("QueueAcquire")
	return 0, 0, 0, 0, nil
}

func (r *recorder) QueuePoll(context.Context, string, int64) (int, int64, bool, int, error) {
	r.called("QueuePoll")
	return 0, 0, false, 0, nil
}

func (r *recorder) QueueLeave(context.Context, string, int64) (bool, error) {
	r.called("QueueLeave")
	return false, nil
}

func (r *recorder) RegistryTouch(context.Context, string, []string, string, bool) error {
	r.called("RegistryTouch")
	return nil
}

func (r *recorder) RegistryClose(context.Context, string, []string, string) error {
	r.called("RegistryClose")
	return nil
}

func (r *recorder) Registrations(context.Context, string) ([]RegistryRow, error) {
	r.called("Registrations")
	return nil, nil
}

func (r *recorder) Elections(context.Context) ([]LockInfo, error) {
	r.called("Elections")
	return nil, nil
}

func (r *recorder) MarkWanted(context.Context, string) (bool, error) {
	r.called("MarkWanted")
	return false, nil
}

func (r *recorder) AcquireOrWant(context.Context, string, string, time.Duration) (int64, bool, bool, error) {
	r.called("AcquireOrWant")
	return 0, false, false, nil
}

func (r *recorder) SemWant(context.Context, string, int) (bool, error) {
	r.called("SemWant")
	return false, nil
}

func (r *recorder) SlotClaim(context.Context, SlotClaimArgs) (SlotClaimReply, error) {
	r.called("SlotClaim")
	return SlotClaimReply{}, nil
}

func (r *recorder) SlotEnd(context.Context, string, time.Time, string, int64, string, time.Duration) (bool, error) {
	r.called("SlotEnd")
	return false, nil
}

func (r *recorder) SlotRetry(context.Context, string, string, time.Duration) (SlotRetryReply, error) {
	r.called("SlotRetry")
	return SlotRetryReply{}, nil
}

func (r *recorder) SlotPrune(context.Context, time.Duration, int) (int64, error) {
	r.called("SlotPrune")
	return 0, nil
}

// Every method of Store, Wanter and Slots is forwarded by the observed store (and
// ObserveSlots) to the same method of the store it observes, and recorded: a method
// added to an interface must be added to observe.go, and to recorder here.
func TestObserveForwardsEveryCall(t *testing.T) {
	t.Parallel()
	rec := &recorder{}
	k := &Calls{now: time.Now, afterFunc: func(time.Duration, func()) func() bool { return func() bool { return true } },
		patience: time.Hour}
	observed := watch(rec, k)
	for _, tc := range []struct {
		iface reflect.Type
		value any
	}{
		{reflect.TypeFor[Store](), observed},
		{reflect.TypeFor[Wanter](), observed},
		{reflect.TypeFor[Slots](), ObserveSlots(rec, k)},
	} {
		v := reflect.ValueOf(tc.value)
		require.True(t, v.Type().Implements(tc.iface), "%v is no %v", v.Type(), tc.iface)
		for i := range tc.iface.NumMethod() {
			m := tc.iface.Method(i)
			t.Run(tc.iface.Name()+"/"+m.Name, func(t *testing.T) {
				args := []reflect.Value{reflect.ValueOf(context.Background())}
				for j := 1; j < m.Type.NumIn(); j++ {
					args = append(args, reflect.Zero(m.Type.In(j)))
				}
				rec.last = ""
				k.mu.Lock()
				k.answered = time.Time{}
				k.mu.Unlock()
				v.MethodByName(m.Name).Call(args)
				require.Equal(t, m.Name, rec.last, "forwarded to another method, or not at all")
				require.False(t, k.State().Answered.IsZero(), "not recorded")
			})
		}
	}
	require.Equal(t, rec, Unobserved(observed))
	_, isWanter := watch(NewMemory(nil), k).(Wanter)
	require.False(t, isWanter, "the observed memory store is a Wanter")
}
