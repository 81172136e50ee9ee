//! Synthetic records for demos and benchmarks (`dedup-console seed --records N`): realistic
//! statuses, attempts, duplicates and poison, with the consumer groups, message types, errors
//! and payloads of a [`SeedDomain`] the caller gives (the engine has no domain of its own),
//! spread over a time window ending now, with the aggregates the console reads
//! (`record_counts`, `stats_minute`, `duplicate_delays`, `table_samples`) kept consistent.
//!
//! The run reserves a block of ids from the table's identity sequence, then, in one transaction,
//! streams the rows with `COPY ... FROM STDIN` while a blocking thread generates the next ones
//! (`seed/rows.rs`) and counts their per-minute and duplicate-delay aggregates (`seed/totals.rs`);
//! then it counts the loaded records into `record_counts` and their types into `message_types`,
//! as the engine's insert statements do for theirs (no trigger counts inserts).
//! Into an empty table the secondary indexes and the UNIQUE key are built after the load
//! (`seed/indexes.rs`). A failed
//! run leaves nothing behind. Succeeded records keep no payload (as in production), so their
//! `payload_hash` is random.

mod domain;
mod indexes;
mod rows;
mod totals;

use std::time::{Duration, Instant};

use chrono::SubsecRound;
use sqlx::{PgConnection, PgPool};

use super::QueryError;
pub use crate::record::HandlerMode;
pub use domain::{SeedDomain, SeedError, SeedGroup, SeedMessage, SeedType};
use indexes::Deferred;
use rows::{Chunk, Plan};
use totals::Totals;

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

/// Most records one run seeds: the ids are reserved before the load, so an absurd count would
/// use up the table's id sequence even when the run is interrupted.
pub const MAX_RECORDS: u64 = 1_000_000_000;
/// Longest window, days (100 years).
pub const MAX_DAYS: u32 = 36_500;
/// Largest batch, records.
pub const MAX_BATCH: u64 = 1_000_000;

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

/// Reserves `$1` consecutive ids (returns the first): the sequence is moved past them, and past
/// any id written explicitly. Run under a SHARE ROW EXCLUSIVE lock on the table, so no insert
/// takes a value from the sequence in between.
const RESERVE_IDS_SQL: &str = r#"
SELECT setval(pg_get_serial_sequence('dedup_records', 'id'),
              GREATEST(nextval(pg_get_serial_sequence('dedup_records', 'id')),
                       (SELECT COALESCE(max(id), 0) + 1 FROM dedup_records)) + $1 - 1) - $1 + 1
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

/// Counts the records of the id range `$1..=$2` (the run's) by group and status, and records
/// their message types: what the engine's insert statements do for the records they insert.
const COUNT_SEEDED_SQL: &str = r#"
WITH seeded AS (
    SELECT consumer_group, status, message_type, count(*) AS n FROM dedup_records
    WHERE id BETWEEN $1 AND $2 GROUP BY 1, 2, 3
), counted AS (
    INSERT INTO record_counts (consumer_group, status, n)
    SELECT consumer_group, status, sum(n)::bigint FROM seeded GROUP BY 1, 2
)
INSERT INTO message_types SELECT DISTINCT message_type FROM seeded ON CONFLICT DO NOTHING
"#;

/// Inserts `params.records` synthetic records of `domain` spread over the last `params.days`
/// days, with their attempts and aggregates, `progress(done, total)` called after each batch of
/// `params.batch` records. Into an empty table the run holds its exclusive lock until it is done.
///
/// Errors: [`QueryError::BadFilter`] for zero records or days, sizes over the limits, or a
/// domain without groups, types or errors or with a share not positive; [`QueryError::Database`].
pub async fn seed_records(
    pool: &PgPool,
    params: &SeedParams,
    domain: &SeedDomain,
    progress: impl Fn(u64, u64),
) -> Result<SeedReport, QueryError> {
    if params.records == 0 || params.days == 0 || params.batch == 0 {
        return Err(QueryError::BadFilter("records, days and batch must be positive".to_owned()));
    }
    if params.records > MAX_RECORDS || params.days > MAX_DAYS || params.batch > MAX_BATCH {
        return Err(QueryError::BadFilter(format!(
            "at most {MAX_RECORDS} records, {MAX_DAYS} days and batches of {MAX_BATCH}"
        )));
    }
    domain.check().map_err(QueryError::BadFilter)?;
    let started = Instant::now();
    let records = i64::try_from(params.records).map_err(|_| QueryError::BadFilter("too many records".to_owned()))?;
    let first = reserve_ids(pool, records).await?;
    let window = Duration::from_secs(u64::from(params.days) * 86_400);
    let now = chrono::Utc::now().trunc_subsecs(6);
    let micros_per_record = window.as_micros() as f64 / records as f64;
    let plan = Plan::new(first, now - window, now, micros_per_record, domain.clone());
    let mut tx = pool.begin().await?;
    // Building the indexes of millions of rows takes longer than any statement timeout the
    // pool's connections carry.
    sqlx::query("SET LOCAL statement_timeout = 0").execute(&mut *tx).await?;
    let mut phase = Phases(Instant::now());
    let deferred = Deferred::drop_if_empty(pool, &mut tx).await?;
    let totals = load(&mut tx, &plan, params, progress).await?;
    phase.done("rows copied");
    deferred.rebuild(&mut tx).await?;
    phase.done("indexes built");
    sqlx::query(COUNT_SEEDED_SQL).bind(first).bind(first + records - 1).execute(&mut *tx).await?;
    phase.done("records counted");
    totals.write(&mut tx, &plan.group_names()).await?;
    // The window's samples are rebuilt from the seeded counts; a sample taken before the seed
    // (a server that started on the empty table) would read as the table shrinking.
    sqlx::query("DELETE FROM table_samples WHERE sampled_at >= $1").bind(plan.start).execute(&mut *tx).await?;
    sqlx::query(SAMPLES_SQL).bind(plan.start).execute(&mut *tx).await?;
    tx.commit().await?;
    phase.done("aggregates written");
    // Fresh statistics, and a visibility map for the index-only scans of the overview, the
    // retries and the dead letters (without it, at 10 M records, the retries page took 200 ms
    // and the dead letters 130 ms until autovacuum came by; 15-20 ms after).
    let mut conn = pool.acquire().await?;
    sqlx::query("SET statement_timeout = 0").execute(&mut *conn).await?;
    sqlx::query("VACUUM ANALYZE stats_minute").execute(&mut *conn).await?;
    sqlx::query("VACUUM ANALYZE dedup_records").execute(&mut *conn).await?;
    sqlx::query("RESET statement_timeout").execute(&mut *conn).await?;
    phase.done("analyzed");
    let seconds = started.elapsed().as_secs_f64();
    Ok(SeedReport { records: params.records, seconds, rate: params.records as f64 / seconds.max(1e-9) })
}

/// Logs how long each phase of a seed run took (`RUST_LOG=info`).
struct Phases(Instant);

impl Phases {
    fn done(&mut self, phase: &str) {
        tracing::info!(phase, ms = self.0.elapsed().as_millis() as u64, "seed phase done");
        self.0 = Instant::now();
    }
}

/// Reserves `n` ids in a short transaction of its own; returns the first.
async fn reserve_ids(pool: &PgPool, n: i64) -> Result<i64, sqlx::Error> {
    let mut tx = pool.begin().await?;
    sqlx::query("LOCK TABLE dedup_records IN SHARE ROW EXCLUSIVE MODE").execute(&mut *tx).await?;
    let first = sqlx::query_scalar(RESERVE_IDS_SQL).bind(n).fetch_one(&mut *tx).await?;
    tx.commit().await?;
    Ok(first)
}

/// Streams the plan's rows in batches, generated on a blocking thread one or two batches
/// ahead of the COPY; returns their aggregates.
async fn load(
    conn: &mut PgConnection,
    plan: &Plan,
    params: &SeedParams,
    progress: impl Fn(u64, u64),
) -> Result<Totals, QueryError> {
    let last = plan.first + params.records as i64 - 1;
    let batch = params.batch as i64;
    let (sender, mut chunks) = tokio::sync::mpsc::channel::<Chunk>(2);
    let generator = tokio::task::spawn_blocking({
        let plan = plan.clone();
        move || {
            let mut totals = Totals::default();
            for lo in (plan.first..=last).step_by(batch as usize) {
                // Closed when the load failed: stop.
                if sender.blocking_send(plan.chunk(lo, (lo + batch - 1).min(last), &mut totals)).is_err() {
                    break;
                }
            }
            totals
        }
    });
    let mut done = 0;
    while let Some(chunk) = chunks.recv().await {
        copy(conn, rows::COPY_SQL, chunk.records.finish()).await?;
        if chunk.attempts.rows() > 0 {
            copy(conn, rows::ATTEMPTS_COPY_SQL, chunk.attempts.finish()).await?;
        }
        done += chunk.count;
        progress(done, params.records);
    }
    generator.await.map_err(|e| QueryError::BadFilter(format!("generating rows failed: {e}")))
}

/// One `COPY ... FROM STDIN` of `data`.
async fn copy(conn: &mut PgConnection, sql: &str, data: Vec<u8>) -> Result<u64, sqlx::Error> {
    let mut copy = conn.copy_in_raw(sql).await?;
    copy.send(data).await?;
    copy.finish().await
}
