package pglock

import (
	"context"
	"sync"

	"github.com/pgfence/pglock/internal/store"
)

// runs counts the runs in progress of a job, a gocron locker or a gocron elector, so
// that Close can refuse new ones and wait for the others. Its zero value, with c set, is ready.
type runs struct {
	c *Client

	mu      sync.Mutex
	closing bool
	n       int
	idle    chan struct{} // made by wait; closed once closing and no run is left
}

// start counts a run in, or returns ErrClosed once the client's Close has begun.
func (r *runs) start() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closing || r.c.isClosed() {
		return ErrClosed
	}
	r.n++
	return nil
}

// end counts a run out.
func (r *runs) end() {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.n--; r.closing && r.n == 0 {
		close(r.idle)
	}
}

// wait refuses new runs and waits for those in progress, or for ctx to end (returning
// its cause). It is called once, by Close.
func (r *runs) wait(ctx context.Context) error {
	r.mu.Lock()
	r.closing = true
	r.idle = make(chan struct{})
	if r.n == 0 {
		close(r.idle)
	}
	idle := r.idle
	r.mu.Unlock()
	return store.WaitDone(ctx, idle)
}
