-- Counts of dedup records by (consumer group, status), kept exact by triggers so the console
-- never runs COUNT(*) over the big table.
--
-- The triggers are statement-level with transition tables: the engine writes a whole batch
-- with one INSERT and one UPDATE, so counting costs one trigger call per statement rather than
-- one per row. Each counter is split over 64 shards chosen by the writing backend's pid, so
-- concurrent transactions (each holding its counter rows until commit) rarely wait on each
-- other; a reader sums the shards.
CREATE TABLE record_counts (
    consumer_group TEXT NOT NULL,
    status         TEXT NOT NULL,
    shard          SMALLINT NOT NULL,
    n              BIGINT NOT NULL,
    PRIMARY KEY (consumer_group, status, shard)
);

-- Adds per-(group, status) deltas; `deltas` is any query's result of (consumer_group, status, n).
CREATE FUNCTION record_counts_apply(p_groups TEXT[], p_statuses TEXT[], p_deltas BIGINT[]) RETURNS void
LANGUAGE sql AS $$
    INSERT INTO record_counts AS c (consumer_group, status, shard, n)
    SELECT g, s, (pg_backend_pid() % 64)::smallint, d
    FROM unnest(p_groups, p_statuses, p_deltas) AS t(g, s, d)
    WHERE d <> 0
    ORDER BY g, s
    ON CONFLICT (consumer_group, status, shard) DO UPDATE SET n = c.n + EXCLUDED.n
$$;

CREATE FUNCTION dedup_records_count_inserted() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM record_counts_apply(array_agg(consumer_group), array_agg(status), array_agg(n))
    FROM (SELECT consumer_group, status, count(*) AS n FROM new_rows GROUP BY 1, 2) d;
    RETURN NULL;
END
$$;

CREATE FUNCTION dedup_records_count_updated() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM record_counts_apply(array_agg(consumer_group), array_agg(status), array_agg(n))
    FROM (
        SELECT consumer_group, status, sum(n)::bigint AS n FROM (
            SELECT o.consumer_group, o.status, -1 AS n
            FROM old_rows o JOIN new_rows w ON w.id = o.id
            WHERE o.status IS DISTINCT FROM w.status OR o.consumer_group IS DISTINCT FROM w.consumer_group
            UNION ALL
            SELECT w.consumer_group, w.status, 1
            FROM old_rows o JOIN new_rows w ON w.id = o.id
            WHERE o.status IS DISTINCT FROM w.status OR o.consumer_group IS DISTINCT FROM w.consumer_group
        ) changes GROUP BY 1, 2
    ) d;
    RETURN NULL;
END
$$;

CREATE FUNCTION dedup_records_count_deleted() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM record_counts_apply(array_agg(consumer_group), array_agg(status), array_agg(-n))
    FROM (SELECT consumer_group, status, count(*) AS n FROM old_rows GROUP BY 1, 2) d;
    RETURN NULL;
END
$$;

CREATE TRIGGER dedup_records_count_insert AFTER INSERT ON dedup_records
    REFERENCING NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION dedup_records_count_inserted();
CREATE TRIGGER dedup_records_count_update AFTER UPDATE ON dedup_records
    REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION dedup_records_count_updated();
CREATE TRIGGER dedup_records_count_delete AFTER DELETE ON dedup_records
    REFERENCING OLD TABLE AS old_rows
    FOR EACH STATEMENT EXECUTE FUNCTION dedup_records_count_deleted();
