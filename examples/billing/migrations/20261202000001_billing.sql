-- The billing example's tables, in the schema `billing` (examples/billing/src/lib.rs applies
-- this with search_path = billing). Ledger entries are deliberately not unique per invoice: a
-- double effect must stay countable, not be hidden by a key.
CREATE TABLE invoices (
    invoice_no   TEXT PRIMARY KEY,
    customer     TEXT NOT NULL,
    email        TEXT NOT NULL,
    amount_cents BIGINT NOT NULL CHECK (amount_cents >= 0),
    -- The state machine: OPEN → PAID, by a conditional update on status and version.
    status       TEXT NOT NULL CHECK (status IN ('OPEN', 'PAID')),
    version      INTEGER NOT NULL DEFAULT 1,
    issued_at    TIMESTAMPTZ NOT NULL DEFAULT now(),
    paid_at      TIMESTAMPTZ
);

CREATE TABLE ledger_entries (
    id           BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    invoice_no   TEXT NOT NULL REFERENCES invoices (invoice_no),
    account      TEXT NOT NULL,
    amount_cents BIGINT NOT NULL,
    message_id   TEXT NOT NULL,
    booked_at    TIMESTAMPTZ NOT NULL DEFAULT now()
);
CREATE INDEX ledger_entries_invoice_idx ON ledger_entries (invoice_no);

-- Every call the mail stand-in received (written by the stand-in, outside the consumer's
-- transactions, as a mail provider's own log would be), so double sends are countable.
CREATE TABLE mail_calls (
    id              BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    idempotency_key TEXT NOT NULL,
    invoice_no      TEXT NOT NULL,
    recipient       TEXT NOT NULL,
    subject         TEXT NOT NULL,
    received_at     TIMESTAMPTZ NOT NULL DEFAULT now()
);
CREATE INDEX mail_calls_invoice_idx ON mail_calls (invoice_no);
