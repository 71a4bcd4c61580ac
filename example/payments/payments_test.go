package payments_test

import (
	"context"

	"fmt"
	"log/slog"
	neturl "net/url"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/pgfence/pglock"
	"github.com/pgfence/pglock/example/payments"
	"github.com/pgfence/pglock/pglocktest"
)

const paymentID = "pay_7f3a"

// worker is either version of the payment worker.
type worker interface {
	Process(ctx context.Context, id string) (payments.Outcome, error)
}

// version builds a worker of one version on pool, as one instance of the app.
type version struct {
	name string
	new  func(t *testing.T, url string, pool *pgxpool.Pool, provider payments.Provider) worker
}

var versions = []version{
	{"RowLock", func(t *testing.T, _ string, pool *pgxpool.Pool, provider payments.Provider) worker {
		w, err := payments.NewRowLockWorker(pool, provider, payments.RowLockWait)
		require.NoError(t, err)
		return w
	}},
	{"Lease", func(t *testing.T, url string, pool *pgxpool.Pool, provider payments.Provider) worker {
		w, err := payments.NewLeaseWorker(pool, newClient(t, url), provider, 10*time.Second)
		require.NoError(t, err)
		return w
	}},
}

// newClient returns a pglock client on a pool of its own, closed when the test ends.
func newClient(t *testing.T, url string) *pglock.Client {
	t.Helper()
	c, err := pglock.New(pglocktest.Pool(t, url, 2), pglock.WithLogger(slog.New(slog.DiscardHandler)))
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, c.Close(context.Background())) })
	return c
}

// newPayment returns the URL of a fresh database with the payments table and one
// payment of 4999 cents in status, and a pool on it for the test's own reads.
func newPayment(t *testing.T, status string) (string, *pgxpool.Pool) {
	t.Helper()
	url := pglocktest.PostgresURL(t)
	admin := pglocktest.Pool(t, url, 4)
	_, err := admin.Exec(t.Context(), payments.Schema)
	require.NoError(t, err)
	require.NoError(t, payments.Insert(t.Context(), admin, paymentID, 4999, status))
	return url, admin
}

// workerPool is one worker's connections, named so that a test can kill them.
func workerPool(t *testing.T, url, name string, conns int32) *pgxpool.Pool {
	t.Helper()
	u, err := neturl.Parse(url)
	require.NoError(t, err)
	q := u.Query()
	q.Set("application_name", name)
	u.RawQuery = q.Encode()
	return pglocktest.Pool(t, u.String(), conns)
}

type result struct {
	outcome payments.Outcome
	err     error
}

// process runs w on the payment in a goroutine; the result comes on the channel.
func process(ctx context.Context, w worker) <-chan result {
	ch := make(chan result, 1)
	go func() {
		o, err := w.Process(ctx, paymentID)
		ch <- result{o, err}
	}()
	return ch
}

// outcomes waits for every result (bounded) and returns the outcomes sorted.
func outcomes(t *testing.T, chans ...<-chan result) []payments.Outcome {
	t.Helper()
	var got []payments.Outcome
	for _, ch := range chans {
		select {
		case r := <-ch:
			require.NoError(t, r.err)
			got = append(got, r.outcome)
		case <-time.After(20 * time.Second):
			t.Fatal("a worker did not finish within 20s")
		}
	}
	slices.Sort(got)
	return got
}

func requireStatus(t *testing.T, db payments.Querier, want string) {
	t.Helper()
	status, err := payments.ReadStatus(t.Context(), db, paymentID)
	require.NoError(t, err)
	require.Equal(t, want, status)
}

func TestNewPaymentIsChargedOnceAndTheOthersSkip(t *testing.T) {
	t.Parallel()
	for _, v := range versions {
		t.Run(v.name, func(t *testing.T) {
			t.Parallel()
			url, admin := newPayment(t, payments.StatusNew)
			provider := &payments.FakeProvider{Delay: 200 * time.Millisecond}
			var chans []<-chan result
			for i := range 3 {
				w := v.new(t, url, workerPool(t, url, fmt.Sprintf("worker-%d", i+1), 2), provider)
				chans = append(chans, process(t.Context(), w))
			}
			require.Equal(t, []payments.Outcome{payments.Charged, payments.Skipped, payments.Skipped}, outcomes(t, chans...))
			require.Equal(t, 1, provider.Charges(paymentID))
			requireStatus(t, admin, payments.StatusPaid)
		})
	}
}

func TestPaidPaymentIsSkippedByAll(t *testing.T) {
	t.Parallel()
	for _, v := range versions {
		t.Run(v.name, func(t *testing.T) {
			t.Parallel()
			url, admin := newPayment(t, payments.StatusPaid)
			provider := &payments.FakeProvider{}
			var chans []<-chan result
			for i := range 3 {
				w := v.new(t, url, workerPool(t, url, fmt.Sprintf("worker-%d", i+1), 2), provider)
				chans = append(chans, process(t.Context(), w))
			}
			require.Equal(t, []payments.Outcome{payments.Skipped, payments.Skipped, payments.Skipped}, outcomes(t, chans...))
			require.Equal(t, 0, provider.Charges(paymentID))
			requireStatus(t, admin, payments.StatusPaid)
		})
	}
}

// The article's database error: the first worker's connection dies after the provider
// charged and before the status is written. The charge must not be made twice.
func TestConnectionKilledAfterTheChargeNextWorkerOnlyRecordsTheStatus(t *testing.T) {
	t.Parallel()
	for _, v := range versions {
		t.Run(v.name, func(t *testing.T) {
			t.Parallel()
			ctx := t.Context()
			url, admin := newPayment(t, payments.StatusNew)
			provider := &payments.FakeProvider{AfterCharge: func(string) {
				// pg_terminate_backend's timeout waits until the backend is gone.
				_, err := admin.Exec(context.Background(), `SELECT pg_terminate_backend(pid, 5000) FROM pg_stat_activity
					WHERE application_name = 'worker-1' AND datname = current_database()`)
				if err != nil {
					panic(err)
				}
			}}
			first := process(ctx, v.new(t, url, workerPool(t, url, "worker-1", 2), provider))
			select {
			case <-provider.Calling():
			case <-time.After(10 * time.Second):
				t.Fatal("the first worker did not call the provider within 10s")
			}
			second := process(ctx, v.new(t, url, workerPool(t, url, "worker-2", 2), provider))
			third := process(ctx, v.new(t, url, workerPool(t, url, "worker-3", 2), provider))

			r := <-first
			require.Error(t, r.err, "the first worker's status write died with its connection")
			require.Equal(t, []payments.Outcome{payments.Recorded, payments.Skipped}, outcomes(t, second, third))
			require.Equal(t, 1, provider.Charges(paymentID))
			requireStatus(t, admin, payments.StatusPaid)
		})
	}
}

// gatedProvider is a provider whose charges wait until the test opens the gate: the
// provider call lasts exactly as long as the test needs, however slow the machine.
type gatedProvider struct {
	*payments.FakeProvider
	calling chan struct{} // closed when the first Charge starts
	gate    chan struct{} // closed by open: the charges go through
	called  sync.Once
	opened  sync.Once
}

func newGatedProvider(t *testing.T) *gatedProvider {
	p := &gatedProvider{FakeProvider: &payments.FakeProvider{}, calling: make(chan struct{}), gate: make(chan struct{})}
	t.Cleanup(p.open) // a failed test must not leave a worker waiting
	return p
}

// Charge waits for the gate (or ctx), then charges.
func (p *gatedProvider) Charge(ctx context.Context, idempotencyKey string, amount int64) (string, error) {
	p.called.Do(func() { close(p.calling) })
	select {
	case <-p.gate:
	case <-ctx.Done():
		return "", context.Cause(ctx)
	}
	return p.FakeProvider.Charge(ctx, idempotencyKey, amount)
}

func (p *gatedProvider) open() { p.opened.Do(func() { close(p.gate) }) }

// receive returns what ch gives, failing the test after 20 s.
func receive[T any](t *testing.T, ch <-chan T, what string) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(20 * time.Second):
		t.Fatalf("%s did not come within 20s", what)
		panic("unreachable")
	}
}

// The difference: the application has a pool of two connections, the provider call
// is in progress (it lasts until the test ends it), three workers process the payment
// and a page reads it meanwhile.
func TestRowLockStarvesTheReaderAndALeaseDoesNot(t *testing.T) {
	t.Parallel()

	t.Run("RowLock", func(t *testing.T) {
		t.Parallel()
		ctx := t.Context()
		url, admin := newPayment(t, payments.StatusNew)
		pool := workerPool(t, url, "app", 2)
		provider := newGatedProvider(t)
		w := versions[0].new(t, url, pool, provider)
		first := process(ctx, w)
		receive(t, provider.calling, "the first worker's provider call")
		second, third := process(ctx, w), process(ctx, w)
		// The first worker holds the row and a connection for the provider call; the
		// second holds the other connection, waiting for the row.
		require.Eventually(t, func() bool {
			var waiting int
			err := admin.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
				WHERE application_name = 'app' AND datname = current_database() AND wait_event_type = 'Lock'`).Scan(&waiting)
			return err == nil && waiting == 1
		}, 10*time.Second, 5*time.Millisecond)

		// NOWAIT fails and SKIP LOCKED skips, each on a pool of its own, without waiting
		// for the row: they return while the provider call, and so the row lock, lasts.
		other := workerPool(t, url, "other", 2)
		bounded, cancel := context.WithTimeout(ctx, 20*time.Second) // one that waited would wait for ever
		defer cancel()
		noWait, err := payments.NewRowLockWorker(other, provider, payments.RowLockNoWait)
		require.NoError(t, err)
		_, err = noWait.Process(bounded, paymentID)
		var pgErr *pgconn.PgError
		require.ErrorAs(t, err, &pgErr)
		require.Equal(t, "55P03", pgErr.Code) // lock_not_available
		skipLocked, err := payments.NewRowLockWorker(other, provider, payments.RowLockSkipLocked)
		require.NoError(t, err)
		out, err := skipLocked.Process(bounded, paymentID)
		require.NoError(t, err)
		require.Equal(t, payments.Busy, out)

		// The page gets no connection while the provider call lasts, however long it
		// waits: both are held by the workers.
		short, cancelShort := context.WithTimeout(ctx, 200*time.Millisecond)
		defer cancelShort()
		_, err = payments.ReadStatus(short, pool, paymentID)
		require.ErrorIs(t, err, context.DeadlineExceeded, "the reader got a connection during the provider call")
		// A page that waits reads once the charge is committed.
		read := make(chan result, 1)
		go func() {
			status, err := payments.ReadStatus(ctx, pool, paymentID)
			read <- result{payments.Outcome(status), err}
		}()
		provider.open()
		r := receive(t, read, "the reader's status")
		require.NoError(t, r.err)
		require.Equal(t, payments.StatusPaid, string(r.outcome), "the reader got a connection only after the charge committed")

		require.Equal(t, []payments.Outcome{payments.Charged, payments.Skipped, payments.Skipped}, outcomes(t, first, second, third))
		require.Equal(t, 1, provider.Charges(paymentID))
	})

	t.Run("Lease", func(t *testing.T) {
		t.Parallel()
		ctx := t.Context()
		url, _ := newPayment(t, payments.StatusNew)
		pool := workerPool(t, url, "app", 2)
		provider := newGatedProvider(t)
		locks, err := pglock.New(pool, pglock.WithLogger(slog.New(slog.DiscardHandler))) // the same two connections
		require.NoError(t, err)
		t.Cleanup(func() { require.NoError(t, locks.Close(context.Background())) })
		w, err := payments.NewLeaseWorker(pool, locks, provider, 10*time.Second)
		require.NoError(t, err)
		first := process(ctx, w)
		receive(t, provider.calling, "the first worker's provider call")
		second, third := process(ctx, w), process(ctx, w)

		// The provider call lasts until the read returns: a reader that had to wait for
		// it would never return, and would read "paid".
		bounded, cancel := context.WithTimeout(ctx, 20*time.Second)
		defer cancel()
		start := time.Now()
		status, err := payments.ReadStatus(bounded, pool, paymentID)
		require.NoError(t, err, "the reader waited for the provider call")
		require.Equal(t, payments.StatusNew, status, "the reader read during the provider call")
		t.Logf("lease: the reader waited %v", time.Since(start).Round(time.Millisecond))
		provider.open()

		require.Equal(t, []payments.Outcome{payments.Charged, payments.Skipped, payments.Skipped}, outcomes(t, first, second, third))
		require.Equal(t, 1, provider.Charges(paymentID))
	})
}

func TestBadInputGetsAClearErrorAndChangesNothing(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	url, admin := newPayment(t, payments.StatusNew)
	pool := workerPool(t, url, "app", 2)
	provider := &payments.FakeProvider{}
	locks := newClient(t, url)

	constructors := []struct {
		name string
		err  error
	}{
		{"RowLock nil db", second(payments.NewRowLockWorker(nil, provider, payments.RowLockWait))},
		{"RowLock nil provider", second(payments.NewRowLockWorker(pool, nil, payments.RowLockWait))},
		{"RowLock FOR SHARE", second(payments.NewRowLockWorker(pool, provider, "FOR SHARE"))},
		{"Lease nil db", second(payments.NewLeaseWorker(nil, locks, provider, 0))},
		{"Lease nil locks", second(payments.NewLeaseWorker(pool, nil, provider, 0))},
		{"Lease nil provider", second(payments.NewLeaseWorker(pool, locks, nil, 0))},
		{"Lease negative wait", second(payments.NewLeaseWorker(pool, locks, provider, -time.Second))},
	}
	for _, c := range constructors {
		require.ErrorIs(t, c.err, payments.ErrInvalidArgument, c.name)
	}

	rowLock, err := payments.NewRowLockWorker(pool, provider, payments.RowLockWait)
	require.NoError(t, err)
	lease, err := payments.NewLeaseWorker(pool, locks, provider, 0)
	require.NoError(t, err)
	for _, w := range []worker{rowLock, lease} {
		_, err := w.Process(ctx, "")
		require.ErrorIs(t, err, payments.ErrInvalidArgument)
		_, err = w.Process(ctx, "pay_missing")
		require.ErrorIs(t, err, payments.ErrNotFound)
	}
	_, err = payments.ReadStatus(ctx, pool, "pay_missing")
	require.ErrorIs(t, err, payments.ErrNotFound)
	require.Equal(t, 0, provider.Charges(paymentID))
	requireStatus(t, admin, payments.StatusNew)
}

func second[T any](_ T, err error) error { return err }
