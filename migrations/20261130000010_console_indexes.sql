-- Indexes of the console's read queries (engine/src/console). Each names the query it serves;
-- together they keep every console page and API call on an index at 10 M records.
-- Columns that a claim or a completion changes (status, attempts, lease, error) appear only in
-- partial indexes over the small non-succeeded sets where possible, so the hot path pays little.

-- Records list newest/oldest first, time-range filters: keyset on (first_seen_at, id).
CREATE INDEX dedup_records_first_seen_idx ON dedup_records (first_seen_at, id);

-- Records list filtered by status, in time order.
CREATE INDEX dedup_records_status_first_seen_idx ON dedup_records (status, first_seen_at, id);

-- Records list sorted by attempts (keyset on (attempts, id)); `attempts >= n`.
CREATE INDEX dedup_records_attempts_idx ON dedup_records (attempts, id);

-- Records list filtered by message type, in time order; the list of known types (loose index
-- scan).
CREATE INDEX dedup_records_type_first_seen_idx ON dedup_records (message_type, first_seen_at, id);

-- Message id search across consumer groups, exact and prefix: message_id is COLLATE "C", so a
-- plain b-tree serves `message_id >= $p AND message_id < $p_next`.
CREATE INDEX dedup_records_message_id_idx ON dedup_records (message_id);

-- Stuck records: processing with an expired lease (database clock), longest stuck first.
CREATE INDEX dedup_records_stuck_idx ON dedup_records (lease_expires_at, id) WHERE status = 'processing';

-- Retries page: failed records by attempts, the attempts distribution, the most retried types
-- and the next retry, all index-only.
CREATE INDEX dedup_records_failed_idx ON dedup_records (attempts, id)
    INCLUDE (message_type, next_attempt_at) WHERE status = 'failed';

-- Dead letters grouped by error class (index-only), and a group's records in time order.
CREATE INDEX dedup_records_dead_class_idx ON dedup_records (error_class, first_seen_at, id)
    INCLUDE (message_type, updated_at) WHERE status = 'dead';

-- Overview traffic and growth over a time range, index-only.
CREATE INDEX stats_minute_minute_idx ON stats_minute (minute)
    INCLUDE (deliveries, created, duplicates_redis, duplicates_db, redis_hits, redis_misses, redis_fallbacks,
             retries, failed, dead);
