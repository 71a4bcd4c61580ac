-- The shop before pglock: orders the nightly export books, and products whose stock
-- the reconciliation writes.
CREATE TABLE orders (
    id            text PRIMARY KEY,
    user_id       text NOT NULL,
    items         jsonb NOT NULL DEFAULT '[]',
    total         integer NOT NULL, -- in cents
    status        text NOT NULL CHECK (status IN ('placed', 'cancelled')),
    placed_at     timestamptz NOT NULL,
    invoiced_at   timestamptz,
    invoice_batch text
);

CREATE INDEX orders_pending_invoice ON orders (placed_at) WHERE status = 'placed' AND invoiced_at IS NULL;

CREATE TABLE products (
    id       text PRIMARY KEY,
    name     text NOT NULL,
    price    integer NOT NULL, -- in cents
    in_stock integer NOT NULL
);
