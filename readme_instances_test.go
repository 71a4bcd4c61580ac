package pglock_test

import (
	"context"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgfence/pglock"
	"github.com/pgfence/pglock/internal/testkit"
	"github.com/pgfence/pglock/pglocktest"
)

// TestReadmeSeveralInstancesRun builds the program of README.md's section on several
// instances and runs two instances of it, as a newcomer would: the first leads the
// feed and runs the summary; SIGTERMed, it exits 0 having stepped down and handed the
// job's lease back, and the second leads and runs the summary at once, not after the
// ttl; the registry lists the first as closed and the second as live.
func TestReadmeSeveralInstancesRun(t *testing.T) {
	t.Parallel()
	goTool, err := exec.LookPath("go")
	if err != nil {
		t.Skipf("no go command to build the program with: %v", err)
	}
	bin := buildReadmeProgram(t, goTool, "## Several instances: names, a job, an election, a clean shutdown")
	url := pglocktest.PostgresURL(t)
	type instance struct {
		cmd    *exec.Cmd
		out    *testkit.LogBuffer
		exited chan error
	}
	start := func(name string) *instance {
		t.Helper()
		i := &instance{out: &testkit.LogBuffer{}, exited: make(chan error, 1)}
		i.cmd = exec.Command(bin, "-instance", name, "-every", "200ms")
		i.cmd.Env = append(os.Environ(), "DATABASE_URL="+url)
		i.cmd.Stdout, i.cmd.Stderr = i.out, i.out
		require.NoError(t, i.cmd.Start())
		go func() { i.exited <- i.cmd.Wait() }()
		t.Cleanup(func() {
			_ = i.cmd.Process.Kill()
			<-i.exited
			if t.Failed() {
				t.Logf("%s's output:\n%s", name, i.out.String())
			}
		})
		return i
	}
	// says waits until i's output has a line with msg and i's name.
	says := func(i *instance, name, msg string) {
		t.Helper()
		require.Eventually(t, func() bool {
			for line := range strings.Lines(i.out.String()) {
				said := strings.Contains(line, `msg="`+msg+`"`) || strings.Contains(line, "msg="+msg+" ") // slog quotes msg if it has a space
				if said && strings.Contains(line, "instance="+name) {
					return true
				}
			}
			return false
		}, 10*time.Second, 10*time.Millisecond, "%s never said %q", name, msg)
	}
	stop := func(i *instance) {
		t.Helper()
		require.NoError(t, i.cmd.Process.Signal(syscall.SIGTERM))
		select {
		case err := <-i.exited:
			i.exited <- err // for the cleanup
			require.NoError(t, err, "exit 0 after SIGTERM:\n%s", i.out.String())
		case <-time.After(20 * time.Second):
			t.Fatalf("no exit within 20 s of SIGTERM:\n%s", i.out.String())
		}
	}

	a := start("worker-1")
	says(a, "worker-1", "leading the feed")
	says(a, "worker-1", "summary ran")
	b := start("worker-2")
	says(b, "worker-2", "started")

	stopped := time.Now()
	stop(a)
	says(a, "worker-1", "pglock: stepped down")
	says(a, "worker-1", "pglock: job lease handed back")
	says(b, "worker-2", "leading the feed")
	says(b, "worker-2", "summary ran")
	require.Less(t, time.Since(stopped), 15*time.Second, "handed over at once, not after the ttl (30 s)")

	c, err := pglock.New(pglocktest.Pool(t, url, 2), pglock.WithoutListener(), quiet)
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, c.Close(context.Background())) })
	jobs, err := c.JobStatuses(t.Context())
	require.NoError(t, err)
	require.Len(t, jobs, 1)
	states := map[string]pglock.RegistrationState{}
	for _, r := range jobs[0].Registrations {
		states[r.Instance] = r.State
	}
	require.Equal(t, map[string]pglock.RegistrationState{"worker-1": pglock.RegistrationClosed,
		"worker-2": pglock.RegistrationLive}, states)

	stop(b)
}
