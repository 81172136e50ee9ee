-- The engine's tables live in a schema of their own (engine/src/db/schema.rs) and statements of
-- the claim path run in a team's transaction, under the team's search_path. The trigger and
-- helper functions name their tables without a schema, so each one resolves names in the
-- engine's schema whatever the caller's search_path: the one this migration runs under.
ALTER FUNCTION record_counts_apply(TEXT[], TEXT[], BIGINT[]) SET search_path FROM CURRENT;
ALTER FUNCTION record_counts_fold() SET search_path FROM CURRENT;
ALTER FUNCTION dedup_records_count_inserted() SET search_path FROM CURRENT;
ALTER FUNCTION dedup_records_count_updated() SET search_path FROM CURRENT;
ALTER FUNCTION dedup_records_count_deleted() SET search_path FROM CURRENT;
ALTER FUNCTION stats_minute_rollup() SET search_path FROM CURRENT;

-- A poison message (no id, an invalid id, a payload that does not parse or is too large) can
-- never be processed and is never requeued. A message whose type has no handler is a dead letter
-- too, but not poison: once the handler exists, a requeue processes it. Until now only poison
-- records and those without a handler (error class NO_HANDLER) lacked a handler mode.
ALTER TABLE dedup_records ADD COLUMN poison BOOLEAN NOT NULL DEFAULT false;
UPDATE dedup_records SET poison = true WHERE handler_mode IS NULL AND error_class IS DISTINCT FROM 'NO_HANDLER';

-- The AMQP `type` property of the delivery (some producers carry the message type there), kept
-- with the payload so a requeue publishes it again.
ALTER TABLE dedup_records ADD COLUMN type_property TEXT;

-- A drill's verdict comes from the record and its attempts; the engine knows no business tables.
ALTER TABLE drills DROP COLUMN effects_before;
