-- The order example (the seeds' domain): orders, stock, and the SMS
-- gateway stand-in's log of sends. Reservations and payments are deliberately not unique per
-- order: a double effect must stay visible to `dedup-console verify`, not be hidden by a key.
CREATE TABLE IF NOT EXISTS inventory (
    sku       TEXT PRIMARY KEY,
    available INTEGER NOT NULL CHECK (available >= 0),
    reserved  INTEGER NOT NULL DEFAULT 0 CHECK (reserved >= 0)
);

CREATE TABLE IF NOT EXISTS orders (
    order_no     TEXT PRIMARY KEY,
    status       TEXT NOT NULL CHECK (status IN ('PENDING', 'PAID')),
    sku          TEXT NOT NULL REFERENCES inventory (sku),
    quantity     INTEGER NOT NULL CHECK (quantity > 0),
    amount_cents BIGINT NOT NULL CHECK (amount_cents >= 0),
    phone        TEXT NOT NULL,
    -- Optimistic version for the state machine: PENDING is 1, PAID is 2.
    version      INTEGER NOT NULL,
    created_at   TIMESTAMPTZ NOT NULL DEFAULT now(),
    paid_at      TIMESTAMPTZ
);

CREATE TABLE IF NOT EXISTS inventory_reservations (
    id          BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    order_no    TEXT NOT NULL,
    sku         TEXT NOT NULL,
    quantity    INTEGER NOT NULL,
    message_id  TEXT NOT NULL,
    reserved_at TIMESTAMPTZ NOT NULL DEFAULT now()
);
CREATE INDEX IF NOT EXISTS inventory_reservations_order_idx ON inventory_reservations (order_no);

CREATE TABLE IF NOT EXISTS payments (
    id           BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    order_no     TEXT NOT NULL,
    amount_cents BIGINT NOT NULL,
    message_id   TEXT NOT NULL,
    paid_at      TIMESTAMPTZ NOT NULL DEFAULT now()
);
CREATE INDEX IF NOT EXISTS payments_order_idx ON payments (order_no);

-- Every SMS the gateway stand-in accepted, in its own table (written outside the consumer's
-- transaction, like a real gateway), so double sends can be counted.
CREATE TABLE IF NOT EXISTS notifications (
    id         BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    order_no   TEXT NOT NULL,
    kind       TEXT NOT NULL,
    phone      TEXT NOT NULL,
    body       TEXT NOT NULL,
    message_id TEXT NOT NULL,
    sent_at    TIMESTAMPTZ NOT NULL DEFAULT now()
);
CREATE INDEX IF NOT EXISTS notifications_order_idx ON notifications (order_no, kind);
