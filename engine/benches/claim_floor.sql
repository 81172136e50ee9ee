-- PostgreSQL's floor for the idempotent pipeline (issues 3 and 23): the statement an optimistic
-- batch runs (the claims of 500 new messages straight into `succeeded`, their count delta and
-- message type, attempt rows only for retries; see CLAIM_MANY_SUCCEEDED_SQL in
-- engine/src/store/postgres/sql.rs), with no broker, no Redis and no engine. Each transaction
-- claims 500 new message ids, so records/s = 500 × tps:
--
--   createdb -h 127.0.0.1 -U postgres claim_floor
--   DATABASE_URL=postgres://postgres@127.0.0.1:5432/claim_floor cargo run -q -p dedup-console -- migrate
--   pgbench -h 127.0.0.1 -U postgres -n -f engine/benches/claim_floor.sql -c 2 -j 2 -T 30 claim_floor
--
-- The tables are in the engine's schema (`dedup`, the default): pgbench's connection needs
-- `PGOPTIONS='-c search_path=dedup'`. BENCHMARKS.md compares it with the raw consume rate of the
-- consume bench, and with the statement before the lean write path (migration 065).
WITH claimed AS (
    INSERT INTO dedup_records AS r (
        consumer_group, message_id, message_type, status, handler_mode, attempts, max_attempts,
        completed_at, payload_hash, content_type,
        source_broker, source_exchange, source_routing_key, source_queue, id_source)
    SELECT 'bench', 'BENCH.EVENT.' || gen_random_uuid()::text || ':1', 'BENCH.EVENT', 'succeeded', 'transactional', 1, 5,
           now(), sha256(g::text::bytea), 'application/json',
           'rabbitmq', 'orders.events', 'bench', 'bench.queue', 'h'
    FROM generate_series(1, 500) AS g
    ON CONFLICT (consumer_group, message_id) DO UPDATE SET status = 'succeeded'
    WHERE r.status = 'failed' AND r.attempts < r.max_attempts
    RETURNING r.id, r.attempts, r.message_type, (r.xmax = 0) AS created
), counted AS (
    INSERT INTO record_counts (consumer_group, status, n)
    SELECT 'bench', 'succeeded', count(*) FROM claimed WHERE created HAVING count(*) > 0
), typed AS (
    INSERT INTO message_types (message_type)
    SELECT DISTINCT message_type FROM claimed ORDER BY 1
    ON CONFLICT DO NOTHING
), attempt AS (
    INSERT INTO record_attempts (record_id, attempt, worker, started_at, ended_at, outcome)
    SELECT id, attempts, 'bench', now(), now(), 'succeeded' FROM claimed WHERE attempts > 1
)
SELECT count(*) FROM claimed;
