-- Counts of dedup records by (consumer group, status), kept exact by triggers so the console
-- never runs COUNT(*) over the big table. Each counter is split over 16 shards chosen by the
-- writing backend's pid, so concurrent transactions rarely wait on the same counter row; a
-- reader sums the shards.
CREATE TABLE record_counts (
    consumer_group TEXT NOT NULL,
    status         TEXT NOT NULL,
    shard          SMALLINT NOT NULL,
    n              BIGINT NOT NULL,
    PRIMARY KEY (consumer_group, status, shard)
);

CREATE FUNCTION record_counts_add(p_group TEXT, p_status TEXT, p_delta BIGINT) RETURNS void
LANGUAGE sql AS $$
    INSERT INTO record_counts (consumer_group, status, shard, n)
    VALUES (p_group, p_status, (pg_backend_pid() % 16)::smallint, p_delta)
    ON CONFLICT (consumer_group, status, shard) DO UPDATE SET n = record_counts.n + EXCLUDED.n
$$;

-- Row level for inserts and status changes (single-row statements on the hot path).
CREATE FUNCTION dedup_records_count_row() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'UPDATE' THEN
        PERFORM record_counts_add(OLD.consumer_group, OLD.status, -1);
    END IF;
    PERFORM record_counts_add(NEW.consumer_group, NEW.status, 1);
    RETURN NULL;
END
$$;

CREATE TRIGGER dedup_records_count_insert AFTER INSERT ON dedup_records
    FOR EACH ROW EXECUTE FUNCTION dedup_records_count_row();
CREATE TRIGGER dedup_records_count_update AFTER UPDATE OF status, consumer_group ON dedup_records
    FOR EACH ROW
    WHEN (OLD.status IS DISTINCT FROM NEW.status OR OLD.consumer_group IS DISTINCT FROM NEW.consumer_group)
    EXECUTE FUNCTION dedup_records_count_row();

-- Statement level for deletes: cleanup deletes thousands of rows per statement; one grouped
-- update per statement instead of one per row.
CREATE FUNCTION dedup_records_count_deleted() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO record_counts (consumer_group, status, shard, n)
    SELECT consumer_group, status, (pg_backend_pid() % 16)::smallint, -count(*)
    FROM deleted_rows GROUP BY consumer_group, status
    ON CONFLICT (consumer_group, status, shard) DO UPDATE SET n = record_counts.n + EXCLUDED.n;
    RETURN NULL;
END
$$;

CREATE TRIGGER dedup_records_count_delete AFTER DELETE ON dedup_records
    REFERENCING OLD TABLE AS deleted_rows
    FOR EACH STATEMENT EXECUTE FUNCTION dedup_records_count_deleted();
