//! Synthetic records for demos and benchmarks (`dedup-console seed --records N`): realistic
//! statuses, consumer groups, message types, attempts, errors, payloads and duplicates, spread
//! over a time window ending now, with the aggregates the console reads (`record_counts`,
//! `stats_minute`, `duplicate_delays`, `table_samples`) kept consistent.
//!
//! Rows are generated here and streamed with `COPY ... FROM STDIN` (two streams at a time), which
//! is several times faster than generating them in SQL; the statement-level counting trigger
//! keeps `record_counts` exact as it does for every insert. The attempt history of non-succeeded
//! records and the per-minute aggregates are then derived from the loaded rows in a few set-based
//! statements. Succeeded records keep no payload (as in production), so their `payload_hash` is
//! random.

mod rows;

use std::time::{Duration, Instant};

use futures::{StreamExt, TryStreamExt};
use sqlx::PgPool;

use super::QueryError;
use crate::stats::DELAY_BUCKETS_MS;

/// What to seed.
#[derive(Debug, Clone)]
pub struct SeedParams {
    /// Records to insert.
    pub records: u64,
    /// The window their first-seen times spread over, ending now, in days.
    pub days: u32,
    /// Records per statement.
    pub batch: u64,
}

impl Default for SeedParams {
    fn default() -> Self {
        Self { records: 100_000, days: 60, batch: 50_000 }
    }
}

/// What a seed run did.
#[derive(Debug, Clone, serde::Serialize)]
pub struct SeedReport {
    /// Records inserted.
    pub records: u64,
    /// Wall time, seconds.
    pub seconds: f64,
    /// Records per second.
    pub rate: f64,
}

/// After the load: the attempt history of the non-succeeded records with ids in `$1..=$2`.
const ATTEMPTS_SQL: &str = r#"
INSERT INTO record_attempts (record_id, attempt, worker, started_at, ended_at, outcome, error)
SELECT r.id, a.n, 'seed-host:' || (1000 + r.id % 7) || ':worker-' || (r.id % 4),
       r.first_seen_at + (a.n - 1) * interval '2 seconds',
       CASE WHEN r.status = 'processing' AND a.n = r.attempts THEN NULL
            ELSE r.first_seen_at + (a.n - 1) * interval '2 seconds' + interval '150 milliseconds' END,
       CASE WHEN r.status = 'processing' AND a.n = r.attempts THEN NULL
            WHEN r.status = 'processing' THEN 'lease_lost'
            WHEN r.status = 'dead' AND a.n = r.attempts THEN 'dead' ELSE 'failed' END,
       CASE WHEN r.status = 'processing' THEN NULL ELSE r.last_error END
FROM dedup_records r, generate_series(1, r.attempts) AS a(n)
WHERE r.id BETWEEN $1 AND $2 AND r.status <> 'succeeded'
"#;

/// After the load: the loaded records' share of the per-minute aggregates.
const MINUTES_SQL: &str = r#"
INSERT INTO stats_minute AS s (minute, consumer_group, deliveries, created, claimed, succeeded, failed, dead,
    duplicates_redis, duplicates_db, redis_hits, redis_misses, retries)
SELECT date_trunc('minute', first_seen_at), consumer_group,
       count(*) + sum(duplicate_count), count(*), sum(attempts),
       count(*) FILTER (WHERE status = 'succeeded'),
       COALESCE(sum(attempts) FILTER (WHERE status IN ('failed', 'dead')), 0),
       count(*) FILTER (WHERE status = 'dead'),
       (sum(duplicate_count) * 0.8)::bigint, sum(duplicate_count) - (sum(duplicate_count) * 0.8)::bigint,
       (sum(duplicate_count) * 0.8)::bigint, count(*),
       sum(GREATEST(attempts - 1, 0))
FROM dedup_records WHERE id BETWEEN $1 AND $2 GROUP BY 1, 2
ON CONFLICT (minute, consumer_group) DO UPDATE SET
    deliveries = s.deliveries + EXCLUDED.deliveries, created = s.created + EXCLUDED.created,
    claimed = s.claimed + EXCLUDED.claimed, succeeded = s.succeeded + EXCLUDED.succeeded,
    failed = s.failed + EXCLUDED.failed, dead = s.dead + EXCLUDED.dead,
    duplicates_redis = s.duplicates_redis + EXCLUDED.duplicates_redis,
    duplicates_db = s.duplicates_db + EXCLUDED.duplicates_db, redis_hits = s.redis_hits + EXCLUDED.redis_hits,
    redis_misses = s.redis_misses + EXCLUDED.redis_misses, retries = s.retries + EXCLUDED.retries
"#;

/// After the load: the loaded duplicates' delays (`$3`: the bucket bounds).
const DELAYS_SQL: &str = r#"
INSERT INTO duplicate_delays AS d (day, consumer_group, le_ms, count, max_delay_ms)
SELECT (last_duplicate_at AT TIME ZONE 'UTC')::date, consumer_group, le, sum(duplicate_count), max(delay_ms)
FROM (SELECT *, (extract(epoch FROM last_duplicate_at - first_seen_at) * 1000)::bigint AS delay_ms
      FROM dedup_records WHERE id BETWEEN $1 AND $2 AND duplicate_count > 0) dup,
     LATERAL (SELECT min(b) AS le FROM unnest($3::bigint[]) AS b WHERE b >= dup.delay_ms) AS bucket
GROUP BY 1, 2, 3
ON CONFLICT (day, consumer_group, le_ms) DO UPDATE SET
    count = d.count + EXCLUDED.count, max_delay_ms = GREATEST(d.max_delay_ms, EXCLUDED.max_delay_ms)
"#;

/// Rebuilds `table_samples` every 10 minutes of the window from the cumulative `created` counts,
/// scaling the current table and index sizes by the share of records then.
const SAMPLES_SQL: &str = r#"
WITH per AS (
    SELECT date_bin(interval '10 minutes', minute, 'epoch') + interval '10 minutes' AS at, sum(created) AS created
    FROM stats_minute GROUP BY 1
), cumulative AS (
    SELECT at, sum(created) OVER (ORDER BY at) AS total FROM per
), size AS (
    SELECT pg_table_size('dedup_records') AS table_bytes, pg_indexes_size('dedup_records') AS index_bytes,
           GREATEST((SELECT sum(n) FROM record_counts), 1) AS records
)
INSERT INTO table_samples (sampled_at, total_records, table_bytes, index_bytes)
SELECT at, total, (table_bytes * total / records)::bigint, (index_bytes * total / records)::bigint
FROM cumulative, size WHERE at >= $1 AND at <= now()
ON CONFLICT (sampled_at) DO UPDATE SET total_records = EXCLUDED.total_records,
    table_bytes = EXCLUDED.table_bytes, index_bytes = EXCLUDED.index_bytes
"#;

/// Inserts `params.records` synthetic records spread over the last `params.days` days, with
/// their attempts and aggregates, `progress(done, total)` called after each batch.
///
/// Errors: [`QueryError::BadFilter`] for zero records or days; [`QueryError::Database`].
pub async fn seed_records(
    pool: &PgPool,
    params: &SeedParams,
    progress: impl Fn(u64, u64),
) -> Result<SeedReport, QueryError> {
    if params.records == 0 || params.days == 0 || params.batch == 0 {
        return Err(QueryError::BadFilter("records, days and batch must be positive".to_owned()));
    }
    let started = Instant::now();
    // Sequence numbers continue past every record so far, so message ids never repeat.
    let first: i64 = sqlx::query_scalar("SELECT COALESCE(max(id), 0) + 1 FROM dedup_records").fetch_one(pool).await?;
    let window = Duration::from_secs(u64::from(params.days) * 86_400);
    let now = chrono::Utc::now();
    let plan = rows::Plan {
        first,
        start: now - window,
        now,
        micros_per_record: window.as_micros() as f64 / params.records as f64,
    };
    let last = first + params.records as i64 - 1;
    let batches: Vec<(i64, i64)> = (first..=last)
        .step_by(params.batch as usize)
        .map(|lo| (lo, (lo + params.batch as i64 - 1).min(last)))
        .collect();
    let done = std::sync::atomic::AtomicU64::new(0);
    futures::stream::iter(batches)
        .map(|(lo, hi)| {
            let plan = &plan;
            async move {
                let text = tokio::task::spawn_blocking({
                    let plan = plan.clone();
                    move || plan.copy_text(lo, hi)
                })
                .await
                .map_err(|e| QueryError::BadFilter(format!("generating rows failed: {e}")))?;
                let mut conn = pool.acquire().await?;
                let mut copy = conn.copy_in_raw(rows::COPY_SQL).await?;
                copy.send(text.into_bytes()).await?;
                let inserted = copy.finish().await?;
                Ok::<u64, QueryError>(inserted)
            }
        })
        .buffer_unordered(2)
        .try_for_each(|n| {
            let total = done.fetch_add(n, std::sync::atomic::Ordering::Relaxed) + n;
            progress(total, params.records);
            futures::future::ready(Ok(()))
        })
        .await?;
    // The identity column may have skipped values; the loaded rows are those above `first - 1`.
    let (lo, hi): (i64, i64) =
        sqlx::query_as("SELECT COALESCE(min(id), 0), COALESCE(max(id), -1) FROM dedup_records WHERE id >= $1")
            .bind(first)
            .fetch_one(pool)
            .await?;
    let buckets: Vec<i64> = DELAY_BUCKETS_MS.to_vec();
    for sql in [ATTEMPTS_SQL, MINUTES_SQL] {
        sqlx::query(sql).bind(lo).bind(hi).execute(pool).await?;
    }
    sqlx::query(DELAYS_SQL).bind(lo).bind(hi).bind(&buckets).execute(pool).await?;
    let start = plan.start;
    // The window's samples are rebuilt from the seeded counts; a sample taken before the seed
    // (a server that started on the empty table) would read as the table shrinking.
    sqlx::query("DELETE FROM table_samples WHERE sampled_at >= $1").bind(start).execute(pool).await?;
    sqlx::query(SAMPLES_SQL).bind(start).execute(pool).await?;
    // Fresh statistics, and a visibility map for the index-only scans of the overview.
    sqlx::query("VACUUM ANALYZE stats_minute").execute(pool).await?;
    sqlx::query("ANALYZE dedup_records").execute(pool).await?;
    let seconds = started.elapsed().as_secs_f64();
    let records = done.into_inner();
    Ok(SeedReport { records, seconds, rate: records as f64 / seconds.max(1e-9) })
}
