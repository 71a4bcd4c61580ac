package store

import (
	"context"
	"log/slog"
	"slices"
	"sync"
	"time"
)

// The client's side of the registry (pglock's registry.go): the jobs and elections it
// registered, written to the store in the background, one statement at registration
// and one every RegistryRefresh, never on a caller's path.

// registryBatch is the most keys one registry write carries.
const registryBatch = 1000

// Registry writes a client's registrations to its store in the background, on a
// goroutine started at the first one. It is safe for concurrent use.
type Registry struct {
	store    Store
	logger   *slog.Logger
	instance string
	ctx      context.Context // the writes'; cancelled when Close stops waiting
	cancel   context.CancelFunc

	mu      sync.Mutex
	entries map[registryEntry]struct{} // refreshed every RegistryRefresh
	pending []registryEntry            // to register
	leaving []registryEntry            // to mark closed
	started bool
	closed  bool
	wake    chan struct{} // buffered 1
	done    chan struct{} // closed when the writer ends
}

// NewRegistry returns the registry writer of a client of instance on b.
func NewRegistry(b Store, logger *slog.Logger, instance string) *Registry {
	ctx, cancel := context.WithCancel(context.Background())
	return &Registry{store: b, logger: logger, instance: instance, ctx: ctx, cancel: cancel,
		entries: make(map[registryEntry]struct{}), wake: make(chan struct{}, 1), done: make(chan struct{})}
}

// Add registers key of kind (KindJob, KindElection), and refreshes it until Remove or
// Close.
func (r *Registry) Add(kind, key string) {
	e := registryEntry{kind, key}
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

func (r *Registry) wakeWriter() {
	select {
	case r.wake <- struct{}{}:
	default:
	}
}

// Remove stops refreshing key of kind (a resigned election) and marks it closed in the
// store.
func (r *Registry) Remove(kind, key string) {
	e := registryEntry{kind, key}
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
// refreshes every entry each RegistryRefresh, until Close, when it marks every entry
// closed.
func (r *Registry) write() {
	defer close(r.done)
	refresh := time.NewTimer(RegistryRefresh)
	defer refresh.Stop()
	touch := func(registering bool) func(ctx context.Context, kind string, keys []string) error {
		return func(ctx context.Context, kind string, keys []string) error {
			return r.store.RegistryTouch(ctx, kind, keys, r.instance, registering)
		}
	}
	leave := func(ctx context.Context, kind string, keys []string) error {
		return r.store.RegistryClose(ctx, kind, keys, r.instance)
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
			refresh.Reset(RegistryRefresh)
		}
	}
}

// all returns the entries; r.mu is held.
func (r *Registry) all() []registryEntry {
	all := make([]registryEntry, 0, len(r.entries))
	for e := range r.entries {
		all = append(all, e)
	}
	return all
}

// each writes entries with write, one statement per kind and batch of keys.
func (r *Registry) each(entries []registryEntry, write func(ctx context.Context, kind string, keys []string) error) {
	byKind := map[string][]string{}
	for _, e := range entries {
		byKind[e.kind] = append(byKind[e.kind], e.key)
	}
	for kind, keys := range byKind {
		slices.Sort(keys)
		for batch := range slices.Chunk(slices.Compact(keys), registryBatch) {
			ctx, cancel := context.WithTimeout(r.ctx, Timeout)
			err := write(ctx, kind, batch)
			cancel()
			if err != nil {
				r.logger.Warn("pglock: registry not written", slog.String("key", batch[0]), slog.Int("keys", len(batch)),
					slog.Any("err", err))
			}
		}
	}
}

// Close is Client.Close's step: it writes the registrations pending, then marks every
// one closed, until ctx ends.
func (r *Registry) Close(ctx context.Context) error {
	r.mu.Lock()
	r.closed = true
	started := r.started
	r.wakeWriter()
	r.mu.Unlock()
	defer r.cancel()
	if !started {
		return nil
	}
	return WaitDone(ctx, r.done)
}
