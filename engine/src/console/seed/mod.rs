//! Synthetic records for demos and benchmarks (`dedup-console seed --records N`): realistic
//! statuses, attempts, duplicates and poison, with the consumer groups, message types, errors
//! and payloads of a [`SeedDomain`] the caller gives (the engine has no domain of its own),
//! spread over a time window ending now, with the aggregates the console reads
//! (`record_counts`, `stats_minute`, `duplicate_delays`, `table_samples`, `message_types`) kept
//! consistent.
//!
//! The generation is the same on every database: a run reserves a block of ids ([`SeedBooks`]),
//! then a blocking thread generates the rows (`seed/rows.rs`) one or two chunks ahead of the
//! load and counts their per-minute and duplicate-delay aggregates (`seed/totals.rs`).
//! Succeeded records keep no payload (as in production), so their `payload_hash` is random.
//! Each store loads them its own way (`store/<database>/seed.rs`): PostgreSQL streams them with
//! `COPY` in one transaction, building the indexes of an empty table after the load; MySQL
//! sends multi-row `INSERT`s in one transaction. Then the store counts the loaded records into
//! `record_counts` and their types into `message_types`, as the engine's insert statements do
//! for theirs. A failed load leaves nothing behind but the reserved ids.

mod books;
mod domain;
mod rows;
mod totals;

use std::time::Instant;

use chrono::{DateTime, SubsecRound, Utc};

use super::QueryError;
pub use crate::record::HandlerMode;
pub use books::{SeedBooks, SeedRun};
pub use domain::{SeedDomain, SeedError, SeedGroup, SeedMessage, SeedType};
use rows::Plan;
pub(crate) use rows::{SeedAttempt, SeedRecord, SeedRows};

/// What to seed.
#[derive(Debug, Clone)]
pub struct SeedParams {
    /// Records to insert.
    pub records: u64,
    /// The window their first-seen times spread over, ending now, in days.
    pub days: u32,
    /// Records per generated chunk: per `COPY` on PostgreSQL; MySQL splits a chunk into
    /// statements by size.
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
    /// The first sighting of the first record inserted: `days` back from now, or later when
    /// records newer than that were there already (a run starts after the newest of them).
    pub from: DateTime<Utc>,
}

/// Inserts `params.records` synthetic records of `domain` spread over the last `params.days`
/// days (after the newest record already there, if it is newer: ids follow first sightings),
/// with their attempts and aggregates, `progress(done, total)` called after each batch of
/// `params.batch` records, on `books`' database (a `PgPool` or a `MySqlPool`, or
/// [`crate::console::console_store`]). On PostgreSQL, into an empty table the run holds its
/// exclusive lock until it is done.
///
/// Errors: [`QueryError::BadFilter`] for zero records or days, sizes over the limits, or a
/// domain without groups, types or errors or with a share not positive; [`QueryError::Database`].
pub async fn seed_records(
    books: &dyn SeedBooks,
    params: &SeedParams,
    domain: &SeedDomain,
    progress: impl Fn(u64, u64) + Sync,
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
    let (first, newest) = books.seed_reserve_ids(records).await?;
    let now = chrono::Utc::now().trunc_subsecs(6);
    // Ids follow first sightings (a time filter reads them as an id range, DESIGN.md): a run
    // appended to records starts after the newest of them.
    let days = chrono::TimeDelta::days(i64::from(params.days));
    let start = newest.map_or(now - days, |newest| (now - days).max(newest).min(now));
    let micros_per_record = (now - start).num_microseconds().unwrap_or(0) as f64 / records as f64;
    let plan = Plan::new(first, start, now, micros_per_record, domain.clone());
    let run = SeedRun {
        plan,
        records: params.records,
        batch: params.batch,
        progress: &progress,
        phase_started: Instant::now(),
    };
    books.seed_load(run).await?;
    let seconds = started.elapsed().as_secs_f64();
    Ok(SeedReport { records: params.records, seconds, rate: params.records as f64 / seconds.max(1e-9), from: start })
}
