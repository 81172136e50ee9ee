-- The dedup table: one record per (consumer_group, message_id).
-- Lifecycle and statuses: see DESIGN.md ("Record lifecycle") and engine/src/record.rs.
CREATE TABLE dedup_records (
    id                 BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    consumer_group     TEXT NOT NULL,
    -- "C" collation: byte order, so the unique index also serves `LIKE 'prefix%'` searches.
    message_id         TEXT COLLATE "C" NOT NULL,
    -- `<entity>.<event>` part of the message id (e.g. ORDER.PAY), or POISON for poison messages.
    message_type       TEXT NOT NULL,
    status             TEXT NOT NULL,
    -- NULL for poison messages, which never reach a handler.
    handler_mode       TEXT,
    -- Handler executions started and committed (claims), counted here, never taken from the broker.
    attempts           INTEGER NOT NULL DEFAULT 0,
    max_attempts       INTEGER NOT NULL,
    -- Times the record re-entered processing after its lease had expired (auto-reclaim or a
    -- claim following an operator release); a growing value flags a crash loop.
    reentries          INTEGER NOT NULL DEFAULT 0,
    lease_owner        TEXT,
    lease_token        UUID,
    lease_expires_at   TIMESTAMPTZ,
    first_seen_at      TIMESTAMPTZ NOT NULL DEFAULT now(),
    updated_at         TIMESTAMPTZ NOT NULL DEFAULT now(),
    completed_at       TIMESTAMPTZ,
    -- For failed records: when the delayed retry copy is due back.
    next_attempt_at    TIMESTAMPTZ,
    last_error         TEXT,
    -- Error kind + first line, the key dead letters are grouped by.
    error_class        TEXT,
    payload_hash       BYTEA NOT NULL,
    -- Payload, headers and source are kept while the record is not succeeded (for requeue).
    payload            BYTEA,
    payload_truncated  BOOLEAN NOT NULL DEFAULT false,
    headers            JSONB,
    content_type       TEXT,
    source_broker      TEXT NOT NULL,
    source_exchange    TEXT,
    source_routing_key TEXT,
    source_queue       TEXT,
    duplicate_count    INTEGER NOT NULL DEFAULT 0,
    last_duplicate_at  TIMESTAMPTZ,
    -- Deliveries that carried this message id with a different payload hash.
    payload_conflicts  INTEGER NOT NULL DEFAULT 0,
    -- A redelivery of a stuck record under `on_lease_expiry = hold` was parked (acked, kept here).
    parked_at          TIMESTAMPTZ,
    CONSTRAINT dedup_records_group_message_key UNIQUE (consumer_group, message_id),
    CONSTRAINT dedup_records_status_check
        CHECK (status IN ('processing', 'succeeded', 'failed', 'dead')),
    CONSTRAINT dedup_records_handler_mode_check
        CHECK (handler_mode IN ('transactional', 'leased')),
    CONSTRAINT dedup_records_attempts_check CHECK (attempts >= 0 AND max_attempts > 0),
    -- Every claim writes a lease, and only a processing record holds one.
    CONSTRAINT dedup_records_lease_check CHECK (
        (status = 'processing') = (lease_owner IS NOT NULL AND lease_token IS NOT NULL
                                   AND lease_expires_at IS NOT NULL)
        AND (lease_owner IS NULL) = (lease_token IS NULL)
        AND (lease_token IS NULL) = (lease_expires_at IS NULL)
    ),
    CONSTRAINT dedup_records_source_broker_check CHECK (source_broker IN ('rabbitmq', 'kafka'))
);
