-- Aggregates kept as the engine works (flushed from memory every second), for the console's
-- counters and charts.

-- Per minute and consumer group.
CREATE TABLE stats_minute (
    minute           TIMESTAMPTZ NOT NULL,
    consumer_group   TEXT NOT NULL,
    deliveries       BIGINT NOT NULL DEFAULT 0,
    created          BIGINT NOT NULL DEFAULT 0,  -- new dedup records
    claimed          BIGINT NOT NULL DEFAULT 0,
    succeeded        BIGINT NOT NULL DEFAULT 0,
    failed           BIGINT NOT NULL DEFAULT 0,
    dead             BIGINT NOT NULL DEFAULT 0,
    poison           BIGINT NOT NULL DEFAULT 0,
    parked           BIGINT NOT NULL DEFAULT 0,
    duplicates_redis BIGINT NOT NULL DEFAULT 0,
    duplicates_db    BIGINT NOT NULL DEFAULT 0,
    redis_hits       BIGINT NOT NULL DEFAULT 0,
    redis_misses     BIGINT NOT NULL DEFAULT 0,
    redis_fallbacks  BIGINT NOT NULL DEFAULT 0,
    lease_takeovers  BIGINT NOT NULL DEFAULT 0,
    retries          BIGINT NOT NULL DEFAULT 0,
    PRIMARY KEY (minute, consumer_group)
);

-- Histogram of duplicate arrival delays (arrival of a duplicate minus the record's first
-- seen), per day and group; `le_ms` is the bucket's upper bound in milliseconds
-- (9223372036854775807 for the overflow bucket); `max_delay_ms` the largest delay in the bucket.
CREATE TABLE duplicate_delays (
    day            DATE NOT NULL,
    consumer_group TEXT NOT NULL,
    le_ms          BIGINT NOT NULL,
    count          BIGINT NOT NULL,
    max_delay_ms   BIGINT NOT NULL,
    PRIMARY KEY (day, consumer_group, le_ms)
);

-- Total records and on-disk size of the dedup table over time (sampled each minute).
CREATE TABLE table_samples (
    sampled_at    TIMESTAMPTZ PRIMARY KEY,
    total_records BIGINT NOT NULL,
    table_bytes   BIGINT NOT NULL,
    index_bytes   BIGINT NOT NULL
);
