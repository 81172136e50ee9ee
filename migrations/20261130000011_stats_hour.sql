-- Records created per hour and consumer group, rolled up from stats_minute by a trigger as the
-- engine flushes it, so the console's 7-day and 30-day growth charts read a few thousand rows
-- instead of every minute of the range.
CREATE TABLE stats_hour (
    hour           TIMESTAMPTZ NOT NULL,
    consumer_group TEXT NOT NULL,
    created        BIGINT NOT NULL,
    PRIMARY KEY (hour, consumer_group)
);

CREATE FUNCTION stats_minute_rollup() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    -- date_bin, not date_trunc: hours on the UTC grid whatever the session's time zone.
    INSERT INTO stats_hour AS h (hour, consumer_group, created)
    VALUES (date_bin(interval '1 hour', NEW.minute, 'epoch'), NEW.consumer_group,
            NEW.created - CASE WHEN TG_OP = 'UPDATE' THEN OLD.created ELSE 0 END)
    ON CONFLICT (hour, consumer_group) DO UPDATE SET created = h.created + EXCLUDED.created;
    RETURN NULL;
END
$$;

CREATE TRIGGER stats_minute_rollup_insert AFTER INSERT ON stats_minute
    FOR EACH ROW WHEN (NEW.created <> 0) EXECUTE FUNCTION stats_minute_rollup();
CREATE TRIGGER stats_minute_rollup_update AFTER UPDATE OF created ON stats_minute
    FOR EACH ROW WHEN (NEW.created IS DISTINCT FROM OLD.created) EXECUTE FUNCTION stats_minute_rollup();
-- Bulk loads (the seed command) run with session_replication_role = replica; the rollup must
-- follow them too.
ALTER TABLE stats_minute ENABLE ALWAYS TRIGGER stats_minute_rollup_insert;
ALTER TABLE stats_minute ENABLE ALWAYS TRIGGER stats_minute_rollup_update;

INSERT INTO stats_hour (hour, consumer_group, created)
SELECT date_bin(interval '1 hour', minute, 'epoch'), consumer_group, sum(created)
FROM stats_minute GROUP BY 1, 2 HAVING sum(created) <> 0;
