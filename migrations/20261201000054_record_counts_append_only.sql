-- record_counts becomes append-only: each counting statement adds its deltas as new rows, and
-- a periodic fold (record_counts_fold, run by the consumer's stats flusher) sums them into one
-- row per (consumer group, status). Readers already sum(n) per (group, status), so they read
-- the same counts before and after a fold.
--
-- Why: with counters updated in place (64 shards by backend pid), a transaction held its
-- counter rows from its first counting statement until commit. Two transactions whose backends
-- shared a shard waited on each other; and where their statements changed statuses in opposite
-- orders (a batch's claim, `processing`, then its failure, `failed`; a leased failure, `failed`
-- and `processing` in one call), they deadlocked, and PostgreSQL aborted one of them: a leased
-- failure lost that way left its record `processing`. An insert of new rows takes no lock
-- another writer waits on.
ALTER TABLE record_counts DROP CONSTRAINT record_counts_pkey;
ALTER TABLE record_counts DROP COLUMN shard;

CREATE OR REPLACE FUNCTION record_counts_apply(p_groups TEXT[], p_statuses TEXT[], p_deltas BIGINT[]) RETURNS void
LANGUAGE sql AS $$
    INSERT INTO record_counts (consumer_group, status, n)
    SELECT g, s, d FROM unnest(p_groups, p_statuses, p_deltas) AS t(g, s, d) WHERE d <> 0
$$;

-- Sums the delta rows of every (group, status) that has more than one row (or a zero sum) into
-- one row, in one statement, atomically for readers; returns how many rows it folded. A table
-- already folded is only read, not rewritten (the flusher calls this every second). Rows
-- inserted after the statement's snapshot stay for the next fold. Two folds at once stay exact
-- (the second skips the rows the first deleted), but the caller runs one at a time (an
-- advisory lock) so they do not wait on each other.
CREATE FUNCTION record_counts_fold() RETURNS bigint
LANGUAGE sql AS $$
    WITH unfolded AS (
        SELECT consumer_group, status FROM record_counts GROUP BY 1, 2 HAVING count(*) > 1 OR sum(n) = 0
    ), folded AS (
        DELETE FROM record_counts c USING unfolded u
        WHERE c.consumer_group = u.consumer_group AND c.status = u.status
        RETURNING c.consumer_group, c.status, c.n
    ), summed AS (
        INSERT INTO record_counts (consumer_group, status, n)
        SELECT consumer_group, status, sum(n)::bigint FROM folded GROUP BY 1, 2 HAVING sum(n) <> 0
    )
    SELECT count(*) FROM folded
$$;

SELECT record_counts_fold();
