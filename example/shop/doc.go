// Package shop is the cat-food shop of pglock's tutorial, in Go: an order API that runs
// on three instances, with two scheduled jobs that must not run three times and a feed
// that allows one connection.
//
//   - The nightly invoice export (InvoiceExportKey, 02:00 Europe/Warsaw) uploads every
//     placed order without an invoice to the accounting system, which books every batch
//     it receives: a run on each instance would book each invoice three times. It runs
//     on one instance (pglock.OnOneInstance) and never alongside another run
//     (pglock.WithoutOverlapping). Started by hand from POST /admin/invoice-exports
//     too, at most InvoiceExportLimit (2) exports run at once, on any instances: the
//     accounting system takes two uploads at once. Each holds a permit of the
//     semaphore InvoiceExportsKey, and claims its orders batch by batch
//     (FOR UPDATE SKIP LOCKED), so that two exports at once book each invoice once.
//   - The stock reconciliation (StockReconciliationKey, every five minutes) writes the
//     warehouse's full count to the products table. One instance runs it, one run at a
//     time, and its writes carry the run's fencing token, so that a run paused past its
//     lease cannot overwrite a newer count. Its call to the warehouse's API holds a
//     permit of WarehouseCallsKey: the API takes WarehouseCallLimit (3) calls at once
//     from the whole shop.
//   - The warehouse's low-stock alert feed (WarehouseFeedKey) is held by the leader of
//     an election.
//
// The external systems are interfaces (AccountingClient, WarehouseClient) with fakes
// that count what they were asked. The command in cmd/shop runs one instance; the
// command in example/tryit runs three and walks the tutorial's story. The package's
// tests run three instances in one process on one database and prove each claim.
package shop
