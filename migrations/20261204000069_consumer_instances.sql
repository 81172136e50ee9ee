-- Every instance on the overview (issue 27 part 6; docs/DESIGN.md, "Instances"). Each engine
-- that consumes writes its row every 5 s: who it is, and per consumer group what it owns (Kafka
-- partitions assigned to it, or the RabbitMQ queue its channels read), its running workers and
-- the deliveries in flight. An operator sees who owns what during a rebalance from any process
-- that serves the console. A clean stop deletes the row; a row not written for an hour is
-- deleted by any instance's next write.
CREATE TABLE consumer_instances (
    -- `<host>:<pid>:<8 random hex digits>` (a pid reused after a restart is another instance).
    instance_id  TEXT PRIMARY KEY,
    host         TEXT NOT NULL,
    pid          INTEGER NOT NULL,
    started_at   TIMESTAMPTZ NOT NULL,
    last_seen_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    -- [{"group", "broker", "owned": [..], "workers", "in_flight", "connected"}], one per group.
    consumers    JSONB NOT NULL
);
