-- Fingerprints that outlive the records (issue 27; docs/DESIGN.md, "Late duplicates"). Cleanup
-- keeps, for every succeeded record it deletes, a 64-bit fingerprint of its (consumer group,
-- message type, message id) and when the record was first seen, for a horizon much longer than
-- the retention. A message that creates a new record and whose fingerprint matches is a late
-- duplicate: a copy that came back after its record was deleted, found without any producer
-- timestamp. The type is in it because a later event that reuses the id (another type) is no
-- copy of the deleted one.
--
-- Exact up to the hash: two different (group, type, message id) triples share a fingerprint with
-- probability 2^-64 per pair, so at a billion kept fingerprints one new message in about 18
-- billion is taken for a late duplicate by mistake (counted, or held for an operator, never
-- dropped). Size (BENCHMARKS.md, "Fingerprints"): a 48-byte heap tuple and a 16-byte B-tree
-- entry per fingerprint, against a record's ~380 bytes with its indexes.

-- The first 64 bits of MD5(group, newline, type, newline, message id), as a signed bigint.
-- Neither a group, a type nor a message id can hold a control character (engine/src/record.rs,
-- engine/src/message/type_policy.rs), so the newlines keep every triple apart. Immutable and
-- inlinable: the same expression in cleanup and in the lookup.
CREATE FUNCTION dedup_fingerprint(p_group text, p_message_type text, p_message_id text) RETURNS bigint
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT ('x' || left(md5(p_group || chr(10) || p_message_type || chr(10) || p_message_id), 16))::bit(64)::bigint
$$;

CREATE TABLE dedup_fingerprints (
    fingerprint   BIGINT PRIMARY KEY,
    -- When the deleted record was first seen: a late duplicate's delay counts from it.
    first_seen_at TIMESTAMPTZ NOT NULL,
    -- When cleanup forgets it (the schedule's fingerprint horizon after the deletion).
    forget_at     TIMESTAMPTZ NOT NULL
);
-- Pruning by age: rows arrive in deletion order, so block ranges follow forget_at.
CREATE INDEX dedup_fingerprints_forget_brin ON dedup_fingerprints USING brin (forget_at);

-- Days a schedule keeps the fingerprints of what it deleted: NULL is ten times its retention
-- (at most 36500), 0 keeps none.
ALTER TABLE cleanup_schedules ADD COLUMN fingerprint_days INTEGER,
    ADD CONSTRAINT cleanup_schedules_fingerprint_days_check CHECK (fingerprint_days BETWEEN 0 AND 36500);

-- Each late duplicate: the record it created (which cleanup may delete in turn), the copy's
-- delay after the first delivery of its message id, and whether the group's policy held it for
-- an operator. Rare by nature; pruned after 90 days by the cleanup runs.
CREATE TABLE late_duplicates (
    record_id      BIGINT PRIMARY KEY,
    consumer_group TEXT NOT NULL,
    message_id     TEXT NOT NULL,
    first_seen_at  TIMESTAMPTZ NOT NULL,
    seen_at        TIMESTAMPTZ NOT NULL DEFAULT now(),
    delay_ms       BIGINT NOT NULL,
    held           BOOLEAN NOT NULL
);
CREATE INDEX late_duplicates_seen_idx ON late_duplicates (seen_at);
