-- PostgreSQL's floor for the idempotent pipeline (issue 3): the statement an optimistic batch
-- runs (the claims of 500 new messages straight into `succeeded`, with their attempt rows; see
-- CLAIM_MANY_SUCCEEDED_SQL in engine/src/store/postgres/sql.rs), with no broker, no Redis and
-- no engine. Each transaction claims 500 new message ids, so records/s = 500 × tps:
--
--   createdb -h 127.0.0.1 -U postgres claim_floor
--   DATABASE_URL=postgres://postgres@127.0.0.1:5432/claim_floor cargo run -q -p dedup-console -- migrate
--   pgbench -h 127.0.0.1 -U postgres -n -f engine/benches/claim_floor.sql -c 2 -j 2 -T 30 claim_floor
--
-- BENCHMARKS.md compares it with the raw consume rate of the consume bench.
WITH claimed AS (
    INSERT INTO dedup_records AS r (
        consumer_group, message_id, message_type, status, handler_mode, attempts, max_attempts,
        completed_at, payload_hash, content_type,
        source_broker, source_exchange, source_routing_key, source_queue)
    SELECT 'bench', 'BENCH.EVENT.' || gen_random_uuid()::text || ':1', 'BENCH.EVENT', 'succeeded', 'transactional', 1, 5,
           now(), sha256(g::text::bytea), 'application/json',
           'rabbitmq', 'orders.events', 'bench', 'bench.queue'
    FROM generate_series(1, 500) AS g
    ON CONFLICT (consumer_group, message_id) DO UPDATE SET status = 'succeeded'
    WHERE r.status = 'failed' AND r.attempts < r.max_attempts
    RETURNING r.id, r.attempts
), attempt AS (
    INSERT INTO record_attempts (record_id, attempt, worker, started_at, ended_at, outcome)
    SELECT id, attempts, 'bench', now(), now(), 'succeeded' FROM claimed
)
SELECT count(*) FROM claimed;
