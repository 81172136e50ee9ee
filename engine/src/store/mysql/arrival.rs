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
/// table): one point read of the primary key a step, about 20 steps at 1 M records.
pub(super) async fn first_id_seen_at(conn: &mut MySqlConnection, at: DateTime<Utc>) -> Result<i64, sqlx::Error> {
    let (lo, hi): (Option<i64>, Option<i64>) =
        sqlx::query_as("SELECT MIN(id), MAX(id) + 1 FROM dedup_records").fetch_one(&mut *conn).await?;
    let (Some(mut lo), Some(mut hi)) = (lo, hi) else { return Ok(1) };
    while lo < hi {
        let mid = lo + (hi - lo) / 2;
        let found: Option<(i64, DateTime<Utc>)> =
            sqlx::query_as("SELECT id, first_seen_at FROM dedup_records WHERE id >= ? ORDER BY id LIMIT 1")
                .bind(mid)
                .fetch_optional(&mut *conn)
                .await?;
        match found {
            Some((id, _)) if id >= hi => hi = mid,
            None => hi = mid,
            Some((id, seen)) if seen < at => lo = id + 1,
            Some((id, _)) => hi = id,
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
