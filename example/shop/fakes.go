package shop

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"time"
)

// Hold keeps the next calls of a fake open after they did their work (a count read,
// a batch booked), as a slow external system would, until Release. A held call whose
// ctx ends returns ctx's cause. Tests take one with FakeAccounting.Hold or
// FakeWarehouse.Hold. Its methods are safe for concurrent use.
type Hold struct {
	left     int // calls still to catch; guarded by the holds' mutex
	arrived  chan struct{}
	released chan struct{}
	release  func()
}

// Arrived returns a channel closed once every call the Hold was made for is held.
func (h *Hold) Arrived() <-chan struct{} { return h.arrived }

// Release lets the held calls, and those still to come, return. It is safe to call
// more than once.
func (h *Hold) Release() { h.release() }

// holds are a fake's pending Holds, first come first served.
type holds struct {
	mu      sync.Mutex
	pending []*Hold
}

func (hs *holds) add(n int) *Hold {
	released := make(chan struct{})
	h := &Hold{left: max(n, 1), arrived: make(chan struct{}), released: released,
		release: sync.OnceFunc(func() { close(released) })}
	hs.mu.Lock()
	hs.pending = append(hs.pending, h)
	hs.mu.Unlock()
	return h
}

// wait holds the calling call if a Hold wants it.
func (hs *holds) wait(ctx context.Context) error {
	hs.mu.Lock()
	if len(hs.pending) == 0 {
		hs.mu.Unlock()
		return nil
	}
	h := hs.pending[0]
	if h.left--; h.left == 0 {
		hs.pending = hs.pending[1:]
		close(h.arrived)
	}
	hs.mu.Unlock()
	select {
	case <-h.released:
		return nil
	case <-ctx.Done():
		return context.Cause(ctx)
	}
}

// FakeAccounting is an AccountingClient that books every batch it receives, and
// counts them. It is safe for concurrent use.
type FakeAccounting struct {
	logger *slog.Logger
	holds  holds

	mu        sync.Mutex
	batches   [][]string
	delay     time.Duration
	uploading int // uploads in progress
	most      int // the most uploads ever in progress at once
}

// NewFakeAccounting returns an accounting system with no batch booked, logging to
// logger (nil means slog.Default()).
func NewFakeAccounting(logger *slog.Logger) *FakeAccounting {
	return &FakeAccounting{logger: orDefault(logger)}
}

// UploadInvoices books invoices as a new batch and returns its id, "acc_" and 8 hex
// digits. The batch is booked even when the call is held and its ctx ends (the
// answer was lost, not the upload).
func (a *FakeAccounting) UploadInvoices(ctx context.Context, invoices []Invoice) (string, error) {
	if err := ctx.Err(); err != nil {
		return "", context.Cause(ctx)
	}
	a.mu.Lock()
	a.uploading++
	a.most = max(a.most, a.uploading)
	delay := a.delay
	a.mu.Unlock()
	defer func() {
		a.mu.Lock()
		a.uploading--
		a.mu.Unlock()
	}()
	if delay > 0 {
		select {
		case <-time.After(delay):
		case <-ctx.Done():
			return "", context.Cause(ctx)
		}
	}
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	id := "acc_" + hex.EncodeToString(b)
	orders := make([]string, len(invoices))
	for i, inv := range invoices {
		orders[i] = inv.OrderID
	}
	a.mu.Lock()
	a.batches = append(a.batches, orders)
	a.mu.Unlock()
	a.logger.Info("accounting: booked batch", slog.String("batch", id), slog.String("orders", strings.Join(orders, ", ")))
	if err := a.holds.wait(ctx); err != nil {
		return "", err
	}
	return id, nil
}

// Batches returns the order ids of every batch booked, in order.
func (a *FakeAccounting) Batches() [][]string {
	a.mu.Lock()
	defer a.mu.Unlock()
	return slices.Clone(a.batches)
}

// Hold holds the next n uploads open after they are booked, until Release.
func (a *FakeAccounting) Hold(n int) *Hold { return a.holds.add(n) }

// SetDelay makes every upload from now on take d before it books its batch, as a slow
// accounting system does (cmd/shop's -accounting-delay).
func (a *FakeAccounting) SetDelay(d time.Duration) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.delay = d
}

// MostAtOnce returns the most uploads that were ever in progress at once.
func (a *FakeAccounting) MostAtOnce() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.most
}

// FakeWarehouse is a WarehouseClient with the seed products on its shelves. It counts
// the full stock counts it is asked for and the feed connections it has, and sends
// the alerts a test gives Notify. It is safe for concurrent use.
type FakeWarehouse struct {
	logger *slog.Logger
	holds  holds

	mu       sync.Mutex
	stock    []StockCount
	counts   int
	subs     map[int]func(LowStockAlert)
	nextSub  int
	maxConns int
}

// NewFakeWarehouse returns a warehouse whose shelves hold what Seed puts in the
// products table, logging to logger (nil means slog.Default()).
func NewFakeWarehouse(logger *slog.Logger) *FakeWarehouse {
	w := &FakeWarehouse{logger: orDefault(logger), subs: make(map[int]func(LowStockAlert))}
	for _, p := range seedProducts {
		w.stock = append(w.stock, StockCount{ProductID: p.id, Count: p.inStock})
	}
	return w
}

// SetStock puts count units of productID on the shelves: what the next count reads.
func (w *FakeWarehouse) SetStock(productID string, count int) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for i := range w.stock {
		if w.stock[i].ProductID == productID {
			w.stock[i].Count = count
			return
		}
	}
	w.stock = append(w.stock, StockCount{ProductID: productID, Count: count})
}

// StockCounts reads the shelves, then, if a Hold wants the call, waits for its
// release: what it returns is what it read before the wait.
func (w *FakeWarehouse) StockCounts(ctx context.Context) ([]StockCount, error) {
	if err := ctx.Err(); err != nil {
		return nil, context.Cause(ctx)
	}
	w.mu.Lock()
	counts := slices.Clone(w.stock)
	w.counts++
	w.mu.Unlock()
	w.logger.Info("warehouse: counted stock", slog.Int("products", len(counts)))
	if err := w.holds.wait(ctx); err != nil {
		return nil, err
	}
	return counts, nil
}

// Counts returns how many full stock counts the warehouse was asked for.
func (w *FakeWarehouse) Counts() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.counts
}

// Hold holds the next n stock counts open after they read the shelves, until Release.
func (w *FakeWarehouse) Hold(n int) *Hold { return w.holds.add(n) }

// Subscribe connects fn to the alert feed until ctx ends, then returns nil.
func (w *FakeWarehouse) Subscribe(ctx context.Context, fn func(LowStockAlert)) error {
	w.mu.Lock()
	id := w.nextSub
	w.nextSub++
	w.subs[id] = fn
	w.maxConns = max(w.maxConns, len(w.subs))
	w.mu.Unlock()
	<-ctx.Done()
	w.mu.Lock()
	delete(w.subs, id)
	w.mu.Unlock()
	return nil
}

// Notify sends alert to every connection of the feed, and returns once each has
// handled it.
func (w *FakeWarehouse) Notify(alert LowStockAlert) {
	w.mu.Lock()
	fns := make([]func(LowStockAlert), 0, len(w.subs))
	for _, fn := range w.subs {
		fns = append(fns, fn)
	}
	w.mu.Unlock()
	for _, fn := range fns {
		fn(alert)
	}
}

// Connections returns how many connections the feed has now.
func (w *FakeWarehouse) Connections() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return len(w.subs)
}

// MaxConnections returns the most connections the feed ever had at once.
func (w *FakeWarehouse) MaxConnections() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.maxConns
}

func orDefault(l *slog.Logger) *slog.Logger {
	if l == nil {
		return slog.Default()
	}
	return l
}
