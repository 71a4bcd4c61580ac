//go:build unix

// Package failover runs, for a test, a PostgreSQL primary and a streaming standby of its
// own, and fails the primary over to the standby: kill the primary, promote the standby,
// rebuild the old primary as the new standby, as often as the test likes. Pair is for
// tests (a failed step fails the test); Cluster, under it, returns each step's error,
// for programs such as the torture test's controller.
//
// The servers are the machine's PostgreSQL binaries (PGLOCK_POSTGRES_BINARIES, else
// `pg_config --bindir`), in a temporary directory, on free ports of 127.0.0.1 from 25432
// up (below Linux's ephemeral range), with trust authentication. initdb and postgres
// refuse to run as root: as root, they run as user postgres (runuser). Without the
// binaries, or as root without runuser or a postgres user, a test is skipped, saying
// why, except when the CI environment variable is set: then it fails.
//
// # Modes
//
// In Synchronous mode the primary names the standby in synchronous_standby_names, with
// synchronous_commit = on: a commit returns once the standby has flushed it, so a
// failover loses nothing that a client was told about. Promote then drops the
// synchronous standby from the new primary, as Patroni does when its synchronous standby
// is gone (synchronous_mode without synchronous_mode_strict), so that it takes writes
// before its own standby is rebuilt; Rebuild names the new standby again once it streams
// (caught up), as Patroni picks a synchronous standby among those that stream.
//
// In Asynchronous mode (the default of Patroni and CloudNativePG) a commit returns
// before the standby has it, and a failover can lose the last commits the primary
// acknowledged. Detach makes sure that it does: the standby stops receiving WAL, as
// across a network partition, so that whatever the primary commits after it is lost
// with the primary.
package failover

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// Mode is how the standby replicates: Synchronous or Asynchronous.
type Mode int

const (
	// Synchronous: every commit waits for the standby to flush it.
	Synchronous Mode = iota + 1
	// Asynchronous: commits do not wait for the standby.
	Asynchronous
)

func (m Mode) String() string {
	switch m {
	case Synchronous:
		return "synchronous"
	case Asynchronous:
		return "asynchronous"
	}
	return "Mode(" + strconv.Itoa(int(m)) + ")"
}

// EnableEnv names the environment variable that must be 1 for Start to run: each pair
// takes a few seconds to start, too long for every go test ./... .
const EnableEnv = "PGLOCK_FAILOVER"

// firstPort is where the search for free ports starts: below the ephemeral range, where
// a client's own socket could hold a port that nothing listens on.
const firstPort = 25432

// opTimeout bounds each step: a start, a promotion, a rebuild.
const opTimeout = 2 * time.Minute

// ErrUnavailable is wrapped by StartCluster's error when this machine cannot run a
// pair: no PostgreSQL binaries, or, as root, no runuser or no user postgres.
var ErrUnavailable = errors.New("failover: cannot run a primary and a standby here")

// Cluster is a primary and its streaming standby, and the steps of a failover, outside
// a test: Pair for programs (the torture test's controller), each step's error returned.
// Not safe for concurrent use.
type Cluster struct {
	mode    Mode
	bin     string
	dir     string
	servers [2]*server
	primary int  // index in servers of the current primary
	standby bool // whether the other server runs as a standby
	ports   []*os.File
}

type server struct {
	name string // also the standby's application_name
	port int
	data string
	up   bool
}

// StartCluster starts a primary and a streaming standby in mode, in a new temporary
// directory; Close stops them and removes it. The standby is streaming when it returns
// (in Synchronous mode, as the primary's synchronous standby). Its error wraps
// ErrUnavailable when the machine cannot run a pair; on any error nothing is left
// running.
func StartCluster(mode Mode) (*Cluster, error) {
	if mode != Synchronous && mode != Asynchronous {
		return nil, fmt.Errorf("failover: unknown mode %v", mode)
	}
	bin, err := binaries()
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrUnavailable, err)
	}
	dir, err := os.MkdirTemp("", "pglock-failover-")
	if err != nil {
		return nil, fmt.Errorf("failover: %w", err)
	}
	c := &Cluster{mode: mode, bin: bin, dir: dir}
	if err := c.start(); err != nil {
		return nil, errors.Join(err, c.Close())
	}
	return c, nil
}

func (c *Cluster) start() error {
	if err := os.Chmod(c.dir, 0o755); err != nil {
		return fmt.Errorf("failover: %w", err)
	}
	if err := chownPostgres(c.dir); err != nil {
		return fmt.Errorf("failover: %w", err)
	}
	for i, name := range []string{"a", "b"} {
		port, lock, err := reservePort()
		if err != nil {
			return fmt.Errorf("failover: %w", err)
		}
		c.ports = append(c.ports, lock)
		c.servers[i] = &server{name: name, port: port, data: filepath.Join(c.dir, name)}
	}

	a := c.servers[0]
	if out, err := c.run("initdb", "-D", a.data, "-U", "postgres", "--auth=trust", "-E", "UTF8", "--no-locale", "--no-sync"); err != nil {
		return fmt.Errorf("failover: initdb: %w\n%s", err, out)
	}
	// Settings every server has, as primary or standby; failover.conf holds what
	// changes with the role (written by writeRole).
	conf := `
wal_level = replica
max_wal_senders = 10
max_replication_slots = 10
hot_standby = on
wal_log_hints = on
synchronous_commit = on
wal_sender_timeout = 5s
wal_receiver_status_interval = 1s
include_if_exists = 'failover.conf'
`
	if err := appendFile(filepath.Join(a.data, "postgresql.conf"), conf); err != nil {
		return fmt.Errorf("failover: %w", err)
	}
	if err := appendFile(filepath.Join(a.data, "pg_hba.conf"), "host replication all 127.0.0.1/32 trust\n"); err != nil {
		return fmt.Errorf("failover: %w", err)
	}
	c.primary = 0
	if err := c.writeRole(a, false); err != nil {
		return err
	}
	if err := c.startServer(a); err != nil {
		return err
	}
	return c.startStandby()
}

// Mode is the cluster's mode.
func (c *Cluster) Mode() Mode { return c.mode }

// URL is a URL that names both servers with target_session_attrs=read-write: pgx (and
// libpq) try them in turn and keep the one that takes writes, the current primary.
func (c *Cluster) URL() string {
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%d,127.0.0.1:%d/postgres?target_session_attrs=read-write&sslmode=disable",
		c.servers[0].port, c.servers[1].port)
}

// PrimaryURL is the URL of the current primary alone.
func (c *Cluster) PrimaryURL() string { return c.servers[c.primary].url() }

// StandbyURL is the URL of the current standby (or of the server that Promote will
// promote, after KillPrimary).
func (c *Cluster) StandbyURL() string { return c.servers[1-c.primary].url() }

// Primary names the current primary: "a" (the first host of URL) or "b".
func (c *Cluster) Primary() string { return c.servers[c.primary].name }

// KillPrimary stops the primary at once, as a crash would (pg_ctl stop -m immediate: no
// shutdown checkpoint, and its walsenders send nothing more).
func (c *Cluster) KillPrimary() error {
	s := c.servers[c.primary]
	if out, err := c.run("pg_ctl", "-D", s.data, "-m", "immediate", "-w", "-t", "60", "stop"); err != nil {
		return fmt.Errorf("failover: kill %s: %w\n%s", s.name, err, out)
	}
	s.up = false
	return nil
}

// Detach makes the standby stop receiving WAL (its primary_conninfo emptied and
// reloaded), and returns once its WAL receiver has exited: whatever the primary commits
// from then on does not reach it. In Synchronous mode, commits then wait for a standby
// that does not come back: detach only in Asynchronous mode, to lose commits in the
// next failover.
func (c *Cluster) Detach() error {
	s := c.servers[1-c.primary]
	if err := writeFile(filepath.Join(s.data, "failover.conf"), "primary_conninfo = ''\n"); err != nil {
		return fmt.Errorf("failover: %w", err)
	}
	if err := c.reload(s); err != nil {
		return err
	}
	return c.waitFor(s, "its WAL receiver to exit", "SELECT NOT EXISTS (SELECT FROM pg_stat_wal_receiver)")
}

// Promote promotes the standby and returns once it takes writes; from then on it is the
// primary. Kill the primary first (KillPrimary). In Synchronous mode the new primary has
// no synchronous standby until Rebuild.
func (c *Cluster) Promote() error {
	s := c.servers[1-c.primary]
	if c.servers[c.primary].up {
		return fmt.Errorf("failover: promote %s while the primary %s runs", s.name, c.servers[c.primary].name)
	}
	if err := c.writeRole(s, false); err != nil {
		return err
	}
	if err := c.reload(s); err != nil {
		return err
	}
	if out, err := c.run("pg_ctl", "-D", s.data, "-w", "-t", "60", "promote"); err != nil {
		return fmt.Errorf("failover: promote %s: %w\n%s", s.name, err, out)
	}
	if err := c.waitFor(s, "it to take writes", "SELECT NOT pg_is_in_recovery() AND current_setting('transaction_read_only') = 'off'"); err != nil {
		return err
	}
	c.primary = 1 - c.primary
	c.standby = false
	return nil
}

// Failover kills the primary and promotes the standby (KillPrimary, then Promote).
func (c *Cluster) Failover() error {
	if err := c.KillPrimary(); err != nil {
		return err
	}
	return c.Promote()
}

// Rebuild makes the old primary, stopped, the new primary's streaming standby, from a
// fresh base backup of the new primary, and returns once it streams (in Synchronous
// mode, as the synchronous standby). Failovers can then repeat.
func (c *Cluster) Rebuild() error {
	if c.standby {
		return errors.New("failover: rebuild: the standby runs")
	}
	s := c.servers[1-c.primary]
	if s.up {
		return fmt.Errorf("failover: rebuild %s: it runs", s.name)
	}
	if err := os.RemoveAll(s.data); err != nil {
		return fmt.Errorf("failover: %w", err)
	}
	return c.startStandby()
}

// Timeline is the current primary's timeline: 1 at first, one more at every promotion.
func (c *Cluster) Timeline() (int, error) {
	var name string
	if err := c.query(c.servers[c.primary], "SELECT pg_walfile_name(pg_current_wal_lsn())", &name); err != nil {
		return 0, err
	}
	tli, err := strconv.ParseInt(name[:8], 16, 64)
	if err != nil {
		return 0, fmt.Errorf("failover: timeline of %q: %w", name, err)
	}
	return int(tli), nil
}

// Branch is the LSN (as PostgreSQL writes it, "0/3000148") at which the current
// primary's timeline branched off the one before, from the timeline's history file:
// the new primary has every commit of the old one whose record ends at or before it,
// and none after it. It is an error on timeline 1, which has no history.
func (c *Cluster) Branch() (string, error) {
	tli, err := c.Timeline()
	if err != nil {
		return "", err
	}
	if tli < 2 {
		return "", errors.New("failover: branch: timeline 1 has no history")
	}
	var history string
	if err := c.query(c.servers[c.primary], fmt.Sprintf("SELECT pg_read_file('pg_wal/%08X.history')", tli), &history); err != nil {
		return "", err
	}
	// Each line: parent timeline, tab, the LSN where it ended, tab, a reason.
	lines := strings.Split(strings.TrimSpace(history), "\n")
	fields := strings.Fields(lines[len(lines)-1])
	if len(fields) < 2 {
		return "", fmt.Errorf("failover: branch: history of timeline %d: %q", tli, history)
	}
	return fields[1], nil
}

// startStandby makes servers[1-primary] a standby of the primary from a base backup and
// waits until it streams.
func (c *Cluster) startStandby() error {
	prim, s := c.servers[c.primary], c.servers[1-c.primary]
	if out, err := c.run("pg_basebackup", "-D", s.data, "-X", "stream", "--no-sync", "-c", "fast",
		"-d", prim.conninfo(s.name, 30)); err != nil {
		return fmt.Errorf("failover: pg_basebackup of %s: %w\n%s", prim.name, err, out)
	}
	if err := writeFile(filepath.Join(s.data, "standby.signal"), ""); err != nil {
		return fmt.Errorf("failover: %w", err)
	}
	if err := c.writeRole(s, true); err != nil {
		return err
	}
	if err := c.startServer(s); err != nil {
		return err
	}
	c.standby = true
	if err := c.waitFor(prim, "standby "+s.name+" to stream",
		"SELECT EXISTS (SELECT FROM pg_stat_replication WHERE application_name = '"+s.name+"' AND state = 'streaming')"); err != nil {
		return err
	}
	if c.mode != Synchronous {
		return nil
	}
	// Only a standby that streams becomes the synchronous one, as Patroni picks it: named
	// while it replays the WAL written since its base backup, it would hold every commit
	// of the primary until it caught up (seconds of SyncRep waits in the torture test).
	if err := c.writeRole(prim, false); err != nil {
		return err
	}
	if err := c.reload(prim); err != nil {
		return err
	}
	return c.waitFor(prim, "standby "+s.name+" to confirm commits",
		"SELECT EXISTS (SELECT FROM pg_stat_replication WHERE application_name = '"+s.name+"' AND sync_state = 'sync')")
}

// writeRole writes s's failover.conf: as a standby, where its primary is; as the
// primary in Synchronous mode, which standby must confirm commits (none just after a
// promotion, while the old primary is down).
func (c *Cluster) writeRole(s *server, standby bool) error {
	other := c.servers[1-c.index(s)]
	var conf string
	if standby {
		conf = "primary_conninfo = '" + c.servers[c.primary].conninfo(s.name, 5) + "'\n"
	} else if c.mode == Synchronous && other.up {
		conf = "synchronous_standby_names = '" + other.name + "'\n"
	} else {
		conf = "synchronous_standby_names = ''\n"
	}
	if err := writeFile(filepath.Join(s.data, "failover.conf"), conf); err != nil {
		return fmt.Errorf("failover: %w", err)
	}
	return nil
}

func (c *Cluster) index(s *server) int {
	if c.servers[0] == s {
		return 0
	}
	return 1
}

func (c *Cluster) startServer(s *server) error {
	opts := fmt.Sprintf("-p %d -c listen_addresses=127.0.0.1 -c unix_socket_directories=%s -c cluster_name=%s", s.port, c.dir, s.name)
	if out, err := c.run("pg_ctl", "-D", s.data, "-l", c.logFile(s), "-w", "-t", "60", "-o", opts, "start"); err != nil {
		log, _ := os.ReadFile(c.logFile(s))
		return fmt.Errorf("failover: start %s: %w\n%s\n%s", s.name, err, out, log)
	}
	s.up = true
	return nil
}

func (c *Cluster) logFile(s *server) string { return filepath.Join(c.dir, s.name+".log") }

func (c *Cluster) reload(s *server) error {
	if out, err := c.run("pg_ctl", "-D", s.data, "reload"); err != nil {
		return fmt.Errorf("failover: reload %s: %w\n%s", s.name, err, out)
	}
	return nil
}

// waitFor polls query (one boolean) on s until it is true.
func (c *Cluster) waitFor(s *server, what, query string) error {
	deadline := time.Now().Add(opTimeout)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		var ok bool
		err := queryRow(ctx, s.url(), query, &ok)
		cancel()
		if err == nil && ok {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("failover: waited %v for %s on %s (last error: %v)", opTimeout, what, s.name, err)
		}
		time.Sleep(20 * time.Millisecond) // polls the server's state: nothing to wait on
	}
}

func (c *Cluster) query(s *server, query string, dest ...any) error {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := queryRow(ctx, s.url(), query, dest...); err != nil {
		return fmt.Errorf("failover: %s on %s: %w", query, s.name, err)
	}
	return nil
}

// Logs returns the last lines of each server's log, for a look after a failure.
func (c *Cluster) Logs(lines int) string {
	var b strings.Builder
	for _, s := range c.servers {
		if s == nil {
			continue
		}
		if log, err := os.ReadFile(c.logFile(s)); err == nil {
			fmt.Fprintf(&b, "failover: log of %s:\n%s\n", s.name, tail(string(log), lines))
		}
	}
	return b.String()
}

// Close stops both servers, removes the directory and frees the ports. It is safe to
// call twice.
func (c *Cluster) Close() error {
	var errs []error
	for _, s := range c.servers {
		if s != nil && s.up {
			if out, err := c.run("pg_ctl", "-D", s.data, "-m", "immediate", "-w", "-t", "60", "stop"); err != nil {
				errs = append(errs, fmt.Errorf("failover: stop %s: %w\n%s", s.name, err, out))
				continue
			}
			s.up = false
		}
	}
	if err := os.RemoveAll(c.dir); err != nil {
		errs = append(errs, fmt.Errorf("failover: %w", err))
	}
	for _, f := range c.ports {
		f.Close() // releases its flock
	}
	c.ports = nil
	return errors.Join(errs...)
}

// Pair is a Cluster for a test: its methods fail the test (t.Fatal) when a step fails,
// so call them from the test's goroutine. Not safe for concurrent use.
type Pair struct {
	t testing.TB
	c *Cluster
}

// Start starts a primary and a streaming standby in mode (StartCluster), and stops and
// removes them when the test ends. It skips the test unless PGLOCK_FAILOVER=1
// (EnableEnv), and when the machine cannot run a pair (ErrUnavailable), except when the
// CI environment variable is set: then it fails. The standby is streaming when Start
// returns (and in Synchronous mode, is the primary's synchronous standby).
func Start(t testing.TB, mode Mode) *Pair {
	t.Helper()
	if os.Getenv(EnableEnv) != "1" {
		t.Skipf("failover: set %s=1 to run the tests on a primary and a standby of their own (.ci/failover does)", EnableEnv)
	}
	c, err := StartCluster(mode)
	if errors.Is(err, ErrUnavailable) && os.Getenv("CI") == "" {
		t.Skip(err)
	}
	if errors.Is(err, ErrUnavailable) {
		t.Fatalf("%v (CI is set, so this fails rather than skips)", err)
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Log(c.Logs(40))
		}
		if err := c.Close(); err != nil {
			t.Error(err)
		}
	})
	return &Pair{t: t, c: c}
}

// Mode is the pair's mode.
func (p *Pair) Mode() Mode { return p.c.Mode() }

// URL is a URL that names both servers with target_session_attrs=read-write: pgx (and
// libpq) try them in turn and keep the one that takes writes, the current primary.
func (p *Pair) URL() string { return p.c.URL() }

// PrimaryURL is the URL of the current primary alone.
func (p *Pair) PrimaryURL() string { return p.c.PrimaryURL() }

// StandbyURL is the URL of the current standby (or of the server that Promote will
// promote, after KillPrimary).
func (p *Pair) StandbyURL() string { return p.c.StandbyURL() }

// KillPrimary stops the primary at once, as a crash would (Cluster.KillPrimary).
func (p *Pair) KillPrimary() {
	p.t.Helper()
	p.must(p.c.KillPrimary())
}

// Detach makes the standby stop receiving WAL (Cluster.Detach): detach only in
// Asynchronous mode, to lose commits in the next failover.
func (p *Pair) Detach() {
	p.t.Helper()
	p.must(p.c.Detach())
}

// Promote promotes the standby and returns once it takes writes (Cluster.Promote).
func (p *Pair) Promote() {
	p.t.Helper()
	p.must(p.c.Promote())
}

// Failover kills the primary and promotes the standby (KillPrimary, then Promote).
func (p *Pair) Failover() {
	p.t.Helper()
	p.must(p.c.Failover())
}

// Rebuild makes the old primary the new primary's streaming standby (Cluster.Rebuild).
func (p *Pair) Rebuild() {
	p.t.Helper()
	p.must(p.c.Rebuild())
}

// Timeline is the current primary's timeline: 1 at first, one more at every promotion.
func (p *Pair) Timeline() int {
	p.t.Helper()
	tli, err := p.c.Timeline()
	p.must(err)
	return tli
}

func (p *Pair) must(err error) {
	p.t.Helper()
	if err != nil {
		p.t.Fatal(err)
	}
}

func queryRow(ctx context.Context, url, query string, dest ...any) error {
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		return err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	return conn.QueryRow(ctx, query).Scan(dest...)
}

// run runs one of the PostgreSQL programs, as user postgres when this runs as root.
func (c *Cluster) run(program string, args ...string) ([]byte, error) {
	ctx, cancel := context.WithTimeout(context.Background(), opTimeout)
	defer cancel()
	path := filepath.Join(c.bin, program)
	var cmd *exec.Cmd
	if os.Geteuid() == 0 {
		cmd = exec.CommandContext(ctx, "runuser", append([]string{"-u", "postgres", "--", path}, args...)...)
	} else {
		cmd = exec.CommandContext(ctx, path, args...)
	}
	cmd.Dir = c.dir
	return cmd.CombinedOutput()
}

func (s *server) url() string {
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable&connect_timeout=5", s.port)
}

// conninfo is how a standby named application reaches s, giving up a connection attempt
// after timeout seconds: 5 for the standby's streaming, 30 for its base backup (a primary
// just promoted, on a machine running the rest of CI, took over 5 s to take the base
// backup's connection in a fresh-clone run).
func (s *server) conninfo(application string, timeout int) string {
	return fmt.Sprintf("host=127.0.0.1 port=%d user=postgres application_name=%s connect_timeout=%d", s.port, application, timeout)
}

// binaries finds the PostgreSQL binaries, and as root, runuser and a postgres user.
func binaries() (string, error) {
	bin := os.Getenv("PGLOCK_POSTGRES_BINARIES")
	if bin != "" {
		bin = filepath.Join(bin, "bin")
	} else {
		out, err := exec.Command("pg_config", "--bindir").Output()
		if err != nil {
			return "", fmt.Errorf("no PostgreSQL binaries: pg_config --bindir: %w", err)
		}
		bin = strings.TrimSpace(string(out))
	}
	for _, program := range []string{"initdb", "pg_ctl", "pg_basebackup", "postgres"} {
		if _, err := os.Stat(filepath.Join(bin, program)); err != nil {
			return "", fmt.Errorf("no PostgreSQL binaries: %w", err)
		}
	}
	if os.Geteuid() == 0 {
		if _, err := exec.LookPath("runuser"); err != nil {
			return "", errors.New("running as root, and no runuser to run PostgreSQL as user postgres")
		}
		if _, err := user.Lookup("postgres"); err != nil {
			return "", fmt.Errorf("running as root, and no user postgres to run PostgreSQL as: %w", err)
		}
	}
	return bin, nil
}

// reservePort finds a port of 127.0.0.1 that nothing listens on, from firstPort up, and
// reserves it for the pair's life with an exclusive flock on a file named after it, so
// that the pairs of test processes running at once (go test ./... runs packages in
// parallel) do not pick the same one. Closing the file releases it.
func reservePort() (int, *os.File, error) {
	dir := filepath.Join(os.TempDir(), "pglock-failover-ports")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return 0, nil, err
	}
	for port := firstPort; port < firstPort+2000; port++ {
		f, err := os.OpenFile(filepath.Join(dir, strconv.Itoa(port)), os.O_CREATE|os.O_RDWR, 0o644)
		if err != nil {
			return 0, nil, err
		}
		if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
			f.Close()
			continue
		}
		l, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", port))
		if err != nil {
			f.Close()
			continue
		}
		l.Close()
		return port, f, nil
	}
	return 0, nil, fmt.Errorf("no free port from %d to %d", firstPort, firstPort+2000)
}

func chownPostgres(path string) error {
	if os.Geteuid() != 0 {
		return nil
	}
	u, err := user.Lookup("postgres")
	if err != nil {
		return err
	}
	uid, _ := strconv.Atoi(u.Uid)
	gid, _ := strconv.Atoi(u.Gid)
	return os.Chown(path, uid, gid)
}

func writeFile(path, content string) error {
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		return err
	}
	return chownPostgres(path)
}

func appendFile(path, content string) error {
	f, err := os.OpenFile(path, os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		return err
	}
	if _, err := f.WriteString(content); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

func tail(s string, lines int) string {
	all := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(all) > lines {
		all = all[len(all)-lines:]
	}
	return strings.Join(all, "\n")
}
