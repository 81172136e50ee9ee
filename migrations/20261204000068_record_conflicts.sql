-- Reused message ids made loud (issue 27 part 4; docs/DESIGN.md, "Reused ids and payload
-- conflicts"). A delivery whose id is already the id of a record of another message type is no
-- duplicate of it (Kafka record keys that are order numbers: every PAY arrives with its CREATE's
-- id), and one of the same type with another payload may not be either. Each keeps its copy here
-- — payload, headers, source — listed in the console and requeued under a new id by an
-- operator, or dismissed with a reason; one open row per record and distinct payload, with how
-- many copies came (a copy that comes after its row was settled opens a new one).
CREATE TABLE record_conflicts (
    id                 BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    -- The record whose message id the copy carried (no foreign key; cleanup keeps a record while
    -- it has an open copy).
    record_id          BIGINT NOT NULL,
    consumer_group     TEXT NOT NULL,
    message_id         TEXT NOT NULL,
    -- `type`: the copy's message type is not the record's (never a duplicate: dead-lettered);
    -- `payload`: same type, another payload (judged a duplicate, its copy kept).
    kind               TEXT NOT NULL CHECK (kind IN ('type', 'payload')),
    message_type       TEXT NOT NULL,
    -- Where the consumer found its message id (`key`, `header:x-message-id`, ...: the group's
    -- `ids.from` source that gave it): a reused id names its culprit.
    id_source          TEXT NOT NULL,
    payload_hash       BYTEA NOT NULL,
    payload            BYTEA NOT NULL,
    headers            JSONB,
    content_type       TEXT,
    type_property      TEXT,
    source_broker      TEXT NOT NULL,
    source_exchange    TEXT,
    source_routing_key TEXT,
    source_queue       TEXT,
    copies             INTEGER NOT NULL DEFAULT 1,
    first_seen_at      TIMESTAMPTZ NOT NULL DEFAULT now(),
    last_seen_at       TIMESTAMPTZ NOT NULL DEFAULT now(),
    -- Set once, by a compare-and-set: requeued (the new message id it was published under) or
    -- dismissed (no new id; the reason is in the audit log).
    requeued_as        TEXT,
    settled_at         TIMESTAMPTZ,
    settled_by         TEXT
);
-- One open row per record and payload; the console's count, filter and list read the open ones.
CREATE UNIQUE INDEX record_conflicts_open_key ON record_conflicts (record_id, payload_hash) WHERE settled_at IS NULL;
-- Pruning the settled ones.
CREATE INDEX record_conflicts_settled_idx ON record_conflicts (settled_at) WHERE settled_at IS NOT NULL;
