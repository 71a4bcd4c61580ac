package payments

import (
	"context"
	"fmt"
	"sync"
	"time"
)

// FakeProvider is a payment provider for the examples and tests: every Charge call
// moves money (it does not deduplicate by itself), Lookup answers by idempotency key,
// and each call takes Delay. It records what it was asked. It is safe for concurrent
// use; set its fields before its first call.
type FakeProvider struct {
	// Delay is how long each Charge takes, honouring ctx: a slow provider.
	Delay time.Duration
	// AfterCharge, when set, runs once a charge is made and before Charge returns:
	// tests break the caller's database connection there, the worst moment.
	AfterCharge func(idempotencyKey string)

	mu      sync.Mutex
	charges map[string][]string // references of the charges made, by idempotency key
	calling chan struct{}       // closed when the first Charge starts
}

// Charge waits Delay (or until ctx ends, returning its cause without charging), then
// charges amount and returns the charge's reference.
func (p *FakeProvider) Charge(ctx context.Context, idempotencyKey string, amount int64) (string, error) {
	p.mu.Lock()
	p.init()
	select {
	case <-p.calling:
	default:
		close(p.calling)
	}
	p.mu.Unlock()
	if p.Delay > 0 {
		t := time.NewTimer(p.Delay)
		defer t.Stop()
		select {
		case <-t.C:
		case <-ctx.Done():
			return "", context.Cause(ctx)
		}
	}
	p.mu.Lock()
	ref := fmt.Sprintf("ch_%s_%d", idempotencyKey, len(p.charges[idempotencyKey])+1)
	p.charges[idempotencyKey] = append(p.charges[idempotencyKey], ref)
	p.mu.Unlock()
	if p.AfterCharge != nil {
		p.AfterCharge(idempotencyKey)
	}
	return ref, nil
}

// Lookup returns the reference of the first charge made under idempotencyKey, if any.
func (p *FakeProvider) Lookup(ctx context.Context, idempotencyKey string) (string, bool, error) {
	if err := ctx.Err(); err != nil {
		return "", false, context.Cause(ctx)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if refs := p.charges[idempotencyKey]; len(refs) > 0 {
		return refs[0], true, nil
	}
	return "", false, nil
}

// Charges returns how many times idempotencyKey's payment was charged.
func (p *FakeProvider) Charges(idempotencyKey string) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.charges[idempotencyKey])
}

// Calling returns a channel closed when the first Charge call starts.
func (p *FakeProvider) Calling() <-chan struct{} {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.init()
	return p.calling
}

func (p *FakeProvider) init() {
	if p.charges == nil {
		p.charges = make(map[string][]string)
		p.calling = make(chan struct{})
	}
}
