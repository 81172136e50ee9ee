-- A dedup record's version: raised by one by every state transition (claim, completion,
-- failure, operator action, requeue; engine/src/store/postgres/sql.rs and
-- engine/src/actions/record.rs), never by a duplicate note or a lease heartbeat, so "the record
-- changed since you saw it" means its state changed. Operators give it back with an action
-- (expected_version); a bulk requeue stores it with each frozen item and skips an item whose
-- record changed since (requeued by another job or by hand, retried, released), so two
-- overlapping jobs, or a job and a single requeue, never both republish one record. A constant
-- default: PostgreSQL adds the column without rewriting the table.
ALTER TABLE dedup_records ADD COLUMN version BIGINT NOT NULL DEFAULT 0;
-- NULL for items frozen before this column (not checked).
ALTER TABLE requeue_job_items ADD COLUMN record_version BIGINT;
