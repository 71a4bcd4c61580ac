-- The fencing token of the stock reconciliation run that last wrote in_stock: a run
-- with a lower token (a paused one) can no longer overwrite a newer count.
ALTER TABLE products ADD COLUMN stock_fencing_token bigint NOT NULL DEFAULT 0;
