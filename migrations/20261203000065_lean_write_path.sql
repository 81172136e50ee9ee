-- A lean write path (issue 23; docs/DESIGN.md, "The engine's schema"): a new record that
-- succeeds at its first try costs the dedup promise and little more.
--
-- 1. Counting new records leaves the statement trigger: the engine's insert statements
--    (engine/src/store/postgres/sql.rs) add their own count deltas to record_counts, and the
--    message types they bring to message_types, in the same statement. The INSERT trigger's
--    transition table copied every new row once more. Updates and deletes (claims of existing
--    records, completions, failures, operator actions, cleanup) are still counted by their
--    triggers: a first-try success is inserted `succeeded` and never updated.
-- 2. Six full indexes on dedup_records give way to a BRIN index on time and narrow partial
--    indexes over the small sets operators act on (10 M seeded records: 3.1 GB of indexes over
--    2.9 GB of table before, 0.9 GB after, most of it the dedup key). The console lists records in identity order (ids follow arrival) and bounds every
--    filter over the succeeded bulk (engine/src/console/records.rs). Kept: the primary key, the
--    dedup key, the partial indexes of stuck, failed and dead records.
--
-- Runs in one transaction, in an order that keeps the console reading: first what takes only a
-- SHARE lock (the index builds, each a pass over the table: writers wait, readers do not), then
-- the trigger and index drops, which need the table's ACCESS EXCLUSIVE lock for a moment.
-- BENCHMARKS.md ("Lean write path") measures it at 10 M records. Consumers still running a
-- binary from before it insert without counting: run `SELECT record_counts_rebuild()` once every
-- consumer runs the new one (or stop them while migrating).

-- (1) The new indexes, first: no console query is left without one.

-- Time ranges (the records list's from/to, cleanup's age by first_seen_at): block ranges.
CREATE INDEX dedup_records_first_seen_brin ON dedup_records USING brin (first_seen_at);
-- Records list filtered by a status other than succeeded, newest first (and any other filter
-- within that status).
CREATE INDEX dedup_records_unsettled_idx ON dedup_records (status, id) WHERE status <> 'succeeded';
-- Records list sorted by attempts and `attempts >= n` (n > 1): the records tried more than once
-- (or never: poison, deferred), a few percent; a first-try success writes no entry.
CREATE INDEX dedup_records_retried_idx ON dedup_records (attempts, id) WHERE attempts <> 1;

-- (2) Counting without the INSERT trigger: what the insert statements write, and the helpers.

-- Every message type ever stored, for the console's type filter (it replaces a loose index scan
-- over the message-type index). Written by the insert statements (ON CONFLICT DO NOTHING: a type
-- already known costs one index probe, no write). Types whose records were all deleted stay.
CREATE TABLE message_types (
    message_type TEXT PRIMARY KEY
);
INSERT INTO message_types SELECT DISTINCT message_type FROM dedup_records;

-- Counts every record of the table afresh, replacing the delta rows, and records its message
-- types: for fixtures that insert rows by hand, bulk loads, and a repair after writers that did
-- not count (a binary from before this migration, still running while it was applied). One
-- statement, one snapshot: delta rows committed after it stay and count once.
CREATE FUNCTION record_counts_rebuild() RETURNS void
LANGUAGE sql SET search_path FROM CURRENT AS $$
    WITH cleared AS (
        DELETE FROM record_counts RETURNING 1
    ), counted AS (
        INSERT INTO record_counts (consumer_group, status, n)
        SELECT consumer_group, status, count(*) FROM dedup_records GROUP BY 1, 2
    )
    INSERT INTO message_types SELECT DISTINCT message_type FROM dedup_records
    ON CONFLICT DO NOTHING;
$$;

-- The smallest id whose record was first seen at or after `p_at` (one past the largest id when
-- there is none), by a binary search over the primary key: ids are handed out in arrival order
-- and first_seen_at is the inserting transaction's start, so they follow each other up to the
-- length of a transaction. About 25 index probes at 10 M records. The console turns a time range
-- into an id range with it, widened by a margin and the time filter applied exactly.
CREATE FUNCTION dedup_records_id_at(p_at timestamptz) RETURNS bigint
LANGUAGE plpgsql STABLE SET search_path FROM CURRENT AS $$
DECLARE
    lo bigint;
    hi bigint;
    mid bigint;
    found_id bigint;
    found_at timestamptz;
BEGIN
    SELECT min(id), max(id) + 1 INTO lo, hi FROM dedup_records;
    IF lo IS NULL THEN
        RETURN 1;
    END IF;
    WHILE lo < hi LOOP
        mid := lo + (hi - lo) / 2;
        SELECT id, first_seen_at INTO found_id, found_at FROM dedup_records WHERE id >= mid ORDER BY id LIMIT 1;
        IF found_id IS NULL OR found_id >= hi THEN
            hi := mid;
        ELSIF found_at < p_at THEN
            lo := found_id + 1;
        ELSE
            hi := found_id;
        END IF;
    END LOOP;
    RETURN lo;
END
$$;

-- (3) What needs the ACCESS EXCLUSIVE lock, last: the INSERT trigger and the old indexes.
DROP TRIGGER dedup_records_count_insert ON dedup_records;
DROP FUNCTION dedup_records_count_inserted();
DROP INDEX dedup_records_first_seen_idx;
DROP INDEX dedup_records_status_first_seen_idx;
DROP INDEX dedup_records_attempts_idx;
DROP INDEX dedup_records_type_first_seen_idx;
DROP INDEX dedup_records_message_id_idx;
-- Cleanup of succeeded records finds them by first_seen_at (BRIN) as well as completed_at: a
-- record completes after it was first seen.
DROP INDEX dedup_records_cleanup_idx;
