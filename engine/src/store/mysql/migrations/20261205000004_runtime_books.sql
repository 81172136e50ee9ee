-- The tables a running engine writes besides its records (issue 25, store-seam.md 3.7 step 4):
-- its shared keys (PostgreSQL's migration 20261202000057), the aggregates (004, 011, 058), the
-- table samples (004) and the instances' heartbeat rows (20261204000069), in MySQL's terms. No
-- trigger rolls `stats_minute` up into `stats_hour`: the flush writes both in one transaction
-- (store/mysql/runtime.rs). MariaDB 10.11 and MySQL 8.0.16+ accept it.

CREATE TABLE engine_keys (
    name       VARBINARY(255) NOT NULL,                               -- text key → bytes
    `key`      BINARY(32) NOT NULL,                                   -- bytea of 32 bytes → BINARY(32) (the CHECK on its length is the type)
    created_at DATETIME(6) NOT NULL DEFAULT (UTC_TIMESTAMP(6)),       -- now() default → UTC expression default
    PRIMARY KEY (name)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;

CREATE TABLE stats_minute (
    minute           DATETIME NOT NULL,                               -- timestamptz (whole minutes) → DATETIME in UTC
    consumer_group   VARBINARY(255) NOT NULL,                         -- as dedup_records.consumer_group
    deliveries       BIGINT NOT NULL DEFAULT 0,
    created          BIGINT NOT NULL DEFAULT 0,
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
    PRIMARY KEY (minute, consumer_group)                              -- as PostgreSQL
) ENGINE = InnoDB;

CREATE TABLE stats_hour (
    hour           DATETIME NOT NULL,                                 -- timestamptz (whole hours) → DATETIME in UTC
    consumer_group VARBINARY(255) NOT NULL,                           -- as dedup_records.consumer_group
    created        BIGINT NOT NULL,
    PRIMARY KEY (hour, consumer_group)                                -- as PostgreSQL
) ENGINE = InnoDB;

CREATE TABLE duplicate_delays (
    day            DATE NOT NULL,
    consumer_group VARBINARY(255) NOT NULL,                           -- as dedup_records.consumer_group
    le_ms          BIGINT NOT NULL,
    count          BIGINT NOT NULL,
    max_delay_ms   BIGINT NOT NULL,
    PRIMARY KEY (day, consumer_group, le_ms)                          -- as PostgreSQL
) ENGINE = InnoDB;

CREATE TABLE late_deliveries (
    day            DATE NOT NULL,
    consumer_group VARBINARY(255) NOT NULL,                           -- as dedup_records.consumer_group
    count          BIGINT NOT NULL,
    max_age_ms     BIGINT NOT NULL,
    PRIMARY KEY (day, consumer_group)                                 -- as PostgreSQL
) ENGINE = InnoDB;

CREATE TABLE table_samples (
    sampled_at    DATETIME NOT NULL,                                  -- timestamptz (whole minutes) → DATETIME in UTC
    total_records BIGINT NOT NULL,
    table_bytes   BIGINT NOT NULL,                                    -- information_schema's data_length (InnoDB's estimate)
    index_bytes   BIGINT NOT NULL,                                    -- information_schema's index_length
    PRIMARY KEY (sampled_at)
) ENGINE = InnoDB;

CREATE TABLE consumer_instances (
    instance_id  VARBINARY(255) NOT NULL,                             -- text key → bytes
    host         VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
    pid          INT NOT NULL,
    started_at   DATETIME(6) NOT NULL,                                -- timestamptz → DATETIME(6) UTC
    last_seen_at DATETIME(6) NOT NULL DEFAULT (UTC_TIMESTAMP(6)),     -- now() default → UTC expression default
    consumers    LONGTEXT CHARACTER SET utf8mb4 NOT NULL,             -- jsonb → JSON text (read whole, never queried inside)
    PRIMARY KEY (instance_id),
    CONSTRAINT consumer_instances_consumers_check CHECK (JSON_VALID(consumers))
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;
