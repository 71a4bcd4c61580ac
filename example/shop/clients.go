package shop

import (
	"context"
	"time"
)

// Invoice is one order as the accounting system books it.
type Invoice struct {
	OrderID  string
	UserID   string
	Total    int // in cents
	PlacedAt time.Time
}

// AccountingClient is the accounting system the nightly export uploads to.
type AccountingClient interface {
	// UploadInvoices books invoices as one batch and returns the batch's id. The
	// accounting system records every batch it receives: a batch uploaded twice is
	// booked twice. ctx bounds the call.
	UploadInvoices(ctx context.Context, invoices []Invoice) (batchID string, err error)
}

// StockCount is how many units of a product the warehouse has.
type StockCount struct {
	ProductID string
	Count     int
}

// LowStockAlert is a message of the warehouse's alert feed.
type LowStockAlert struct {
	ProductID string
	Count     int // units left
}

// WarehouseClient is the warehouse: its full stock count and its alert feed.
type WarehouseClient interface {
	// StockCounts returns a full stock count. It pages through the whole catalog, so
	// it can be slow; ctx bounds it, and it returns ctx's cause when ctx ends first.
	StockCounts(ctx context.Context) ([]StockCount, error)
	// Subscribe connects to the low-stock alert feed, which allows one connection per
	// shop, and calls fn with every alert until ctx ends; it then returns nil. It
	// returns an error when it cannot connect or the connection breaks.
	Subscribe(ctx context.Context, fn func(LowStockAlert)) error
}
