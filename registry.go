package pglock

import (
	"context"
	"log/slog"
	"slices"
	"sync"
	"time"
)

// The registry: the jobs and elections clients registered, kept in the store so that an
// operator finds a job before its first run and every election with its leader
// (JobStatuses, Elections). A client writes its registrations in the background, one
// statement at registration and one every registryRefresh, never on a caller's path.

const (
	// registryRefresh is how often a client tells the store that its registrations
	// are still there (Registration.Seen).
	registryRefresh = 5 * time.Minute
	// registryGone is how long a registration neither closed nor refreshed stays
	// live: a refresh period and a minute for a late one.
	registryGone = registryRefresh + time.Minute
	// registryBatch is the most keys one registry write carries.
	registryBatch = 1000
)

// Registry kinds: the kind column of pglock.registry.
const (
	kindJob      = "job"
	kindElection = "election"
)

// Registration says that an instance registered a job or an election, as the store keeps
// it (see the package doc, # Run history and registrations).
type Registration struct {
	Instance   string            // the instance's name (WithInstanceName)
	Registered time.Time         // its last registration by that instance, on the store's clock
	Seen       time.Time         // its last refresh by that instance, or its close, on the store's clock
	State      RegistrationState // whether the instance is still there
}

// RegistrationState says whether the instance of a Registration is still there, as
// the store saw it when it was read.
type RegistrationState string

// Registration states.
const (
	// RegistrationLive: not closed, and seen within the last 6 minutes (a refresh is
	// due every 5): its client is open.
	RegistrationLive RegistrationState = "live"
	// RegistrationClosed: the instance left: its Client was closed, or (an election)
	// it resigned.
	RegistrationClosed RegistrationState = "closed"
	// RegistrationGone: not closed, and not seen for over 6 minutes: its process died
	// or was killed, its Close could not reach the store, or it lost the store.
	RegistrationGone RegistrationState = "gone"
)

// registrationState is the state of a registration seen at seen, closed or not, read
// at now.
func registrationState(closed bool, seen, now time.Time) RegistrationState {
	switch {
	case closed:
		return RegistrationClosed
	case now.Sub(seen) > registryGone:
		return RegistrationGone
	}
	return RegistrationLive
}

// registryEntry is one registration of this client.
type registryEntry struct{ kind, key string }

// registryRow is one registration as the store lists it.
type registryRow struct {
	key string
	Registration
}

// registered queues what a Job, Elect, GocronElector or GocronLocker job registered
// for the store, and for a job emits EventJobRegistered.
func (c *Client) registered(kind, key string) {
	c.registry.add(registryEntry{kind, key})
	if kind == kindJob {
		c.emit(Event{Type: EventJobRegistered, Key: key}, nil)
	}
}

// registry writes a client's registrations to its store in the background, on a
// goroutine started at the first one. Its methods do nothing on a nil registry (a
// type that embeds a Store).
type registry struct {
	store    backend
	logger   *slog.Logger
	instance string
	ctx      context.Context // the writes'; cancelled when Close stops waiting
	cancel   context.CancelFunc

	mu      sync.Mutex
	entries map[registryEntry]struct{} // refreshed every registryRefresh
	pending []registryEntry            // to register
	leaving []registryEntry            // to mark closed
	started bool
	closed  bool
	wake    chan struct{} // buffered 1
	done    chan struct{} // closed when the writer ends
}

func newRegistry(store Store, logger *slog.Logger, instance string) *registry {
	b, ok := store.(backend)
	if !ok {
		return nil
	}
	ctx, cancel := context.WithCancel(context.Background())
	return &registry{store: b, logger: logger, instance: instance, ctx: ctx, cancel: cancel,
		entries: make(map[registryEntry]struct{}), wake: make(chan struct{}, 1), done: make(chan struct{})}
}

func (r *registry) add(e registryEntry) {
	if r == nil {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return
	}
	r.entries[e] = struct{}{}
	r.pending = append(r.pending, e)
	r.leaving = slices.DeleteFunc(r.leaving, func(l registryEntry) bool { return l == e })
	if !r.started {
		r.started = true
		go r.write()
	}
	r.wakeWriter()
}

func (r *registry) wakeWriter() {
	select {
	case r.wake <- struct{}{}:
	default:
	}
}

// remove stops refreshing e (a resigned election) and marks it closed in the store.
func (r *registry) remove(e registryEntry) {
	if r == nil {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, ok := r.entries[e]; !ok {
		return
	}
	delete(r.entries, e)
	r.leaving = append(r.leaving, e)
	r.wakeWriter()
}

// write is the writer: it registers what is pending, marks closed what left, and
// refreshes every entry each registryRefresh, until Close, when it marks every entry
// closed.
func (r *registry) write() {
	defer close(r.done)
	refresh := time.NewTimer(registryRefresh)
	defer refresh.Stop()
	touch := func(registering bool) func(ctx context.Context, kind string, keys []string) error {
		return func(ctx context.Context, kind string, keys []string) error {
			return r.store.registryTouch(ctx, kind, keys, r.instance, registering)
		}
	}
	leave := func(ctx context.Context, kind string, keys []string) error {
		return r.store.registryClose(ctx, kind, keys, r.instance)
	}
	for {
		r.mu.Lock()
		pending, leaving, closed := r.pending, r.leaving, r.closed
		r.pending, r.leaving = nil, nil
		if closed {
			leaving = append(leaving, r.all()...)
			clear(r.entries)
		}
		r.mu.Unlock()
		if r.ctx.Err() != nil {
			return
		}
		r.each(pending, touch(true))
		r.each(leaving, leave)
		if closed {
			return
		}
		if len(pending) > 0 || len(leaving) > 0 {
			continue
		}
		select {
		case <-r.wake:
		case <-refresh.C:
			r.mu.Lock()
			all := r.all()
			r.mu.Unlock()
			r.each(all, touch(false))
			refresh.Reset(registryRefresh)
		}
	}
}

// all returns the entries; r.mu is held.
func (r *registry) all() []registryEntry {
	all := make([]registryEntry, 0, len(r.entries))
	for e := range r.entries {
		all = append(all, e)
	}
	return all
}

// each writes entries with write, one statement per kind and batch of keys.
func (r *registry) each(entries []registryEntry, write func(ctx context.Context, kind string, keys []string) error) {
	byKind := map[string][]string{}
	for _, e := range entries {
		byKind[e.kind] = append(byKind[e.kind], e.key)
	}
	for kind, keys := range byKind {
		slices.Sort(keys)
		for batch := range slices.Chunk(slices.Compact(keys), registryBatch) {
			ctx, cancel := context.WithTimeout(r.ctx, storeTimeout)
			err := write(ctx, kind, batch)
			cancel()
			if err != nil {
				r.logger.Warn("pglock: registry not written", slog.String("key", batch[0]), slog.Int("keys", len(batch)),
					slog.Any("err", err))
			}
		}
	}
}

// close is Close's step: it writes the registrations pending, then marks every one
// closed, until ctx ends.
func (r *registry) close(ctx context.Context) error {
	if r == nil {
		return nil
	}
	r.mu.Lock()
	r.closed = true
	started := r.started
	r.wakeWriter()
	r.mu.Unlock()
	defer r.cancel()
	if !started {
		return nil
	}
	return waitDone(ctx, r.done)
}
