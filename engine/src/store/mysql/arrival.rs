//! Time as ids on MySQL: the first record id seen at a time, by a binary search over the primary
//! key (PostgreSQL's `dedup_records_id_at`, in the engine: no stored function), so that a time
//! range reads a stretch of the primary key instead of every record. Used by cleanup's
//! `succeeded` batches and by the records list's and bulk requeue's `from`/`to` filter
//! ([`ArrivalIds`]).

use chrono::{DateTime, Duration, Utc};
use sqlx::{MySqlConnection, MySqlPool};

use crate::console::filter::RecordFilter;

/// How far a time is widened when it is turned into an id (PostgreSQL's `ARRIVAL_SLACK`): ids
/// follow arrival up to the length of the inserting transaction, which a lease bounds. The time
/// itself is still compared exactly.
pub(super) const ARRIVAL_SLACK: Duration = Duration::minutes(10);

/// The first record id seen at or after `at` (one past the last id when none is; 1 for an empty
/// table), by a search over the primary key, a point read a step. Ids are handed out in arrival
/// order and `first_seen_at` follows them within [`ARRIVAL_SLACK`], so the probes alternate
/// between the id `at` falls on if times grew evenly between the bounds found so far (two or
/// three probes find it when they do) and the middle of those bounds (so that bursts cost at most
/// twice a binary search's probes): a one-hour page at 1 M records 8–16 ms against a binary
/// search's 35–66 ms (BENCHMARKS.md, "2026-12-05 (night)").
pub(super) async fn first_id_seen_at(conn: &mut MySqlConnection, at: DateTime<Utc>) -> Result<i64, sqlx::Error> {
    let ends: Option<(i64, DateTime<Utc>, i64, DateTime<Utc>)> = sqlx::query_as(
        "SELECT a.id, a.first_seen_at, b.id, b.first_seen_at
         FROM (SELECT id, first_seen_at FROM dedup_records ORDER BY id LIMIT 1) a,
              (SELECT id, first_seen_at FROM dedup_records ORDER BY id DESC LIMIT 1) b",
    )
    .fetch_optional(&mut *conn)
    .await?;
    let Some((mut lo, mut lo_at, max, mut hi_at)) = ends else { return Ok(1) };
    let mut hi = max + 1;
    let mut interpolate = true;
    while lo < hi {
        let mid = if interpolate {
            let span = (hi_at - lo_at).num_microseconds().unwrap_or(i64::MAX) as f64;
            let share = ((at - lo_at).num_microseconds().unwrap_or(0) as f64 / span.max(1.0)).clamp(0.0, 1.0);
            lo + (share * (hi - lo) as f64) as i64
        } else {
            lo + (hi - lo) / 2
        }
        .min(hi - 1);
        interpolate = !interpolate;
        let found: Option<(i64, DateTime<Utc>)> =
            sqlx::query_as("SELECT id, first_seen_at FROM dedup_records WHERE id >= ? ORDER BY id LIMIT 1")
                .bind(mid)
                .fetch_optional(&mut *conn)
                .await?;
        match found {
            Some((id, seen)) if id < hi && seen < at => (lo, lo_at) = (id + 1, seen),
            Some((id, seen)) if id < hi => (hi, hi_at) = (id, seen),
            _ => hi = mid,
        }
    }
    Ok(lo)
}

/// The stretch of record ids a filter's `from`/`to` narrows to, widened by [`ARRIVAL_SLACK`]:
/// every record first seen in `[from, to)` has an id in `[from_id, to_id)`.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct ArrivalIds {
    /// The first id that may have been seen at or after `from`.
    pub(super) from_id: Option<i64>,
    /// The first id seen at or after `to` and its slack.
    pub(super) to_id: Option<i64>,
}

impl ArrivalIds {
    /// The ids of `filter`'s time range (none, and no connection taken, without one).
    pub(super) async fn of(pool: &MySqlPool, filter: &RecordFilter) -> Result<Self, sqlx::Error> {
        if filter.from.is_none() && filter.to.is_none() {
            return Ok(Self::default());
        }
        let mut conn = pool.acquire().await?;
        let from_id = match filter.from {
            Some(from) => Some(first_id_seen_at(&mut conn, from - ARRIVAL_SLACK).await?),
            None => None,
        };
        let to_id = match filter.to {
            Some(to) => Some(first_id_seen_at(&mut conn, to + ARRIVAL_SLACK).await?),
            None => None,
        };
        Ok(Self { from_id, to_id })
    }
}
