//! Deliveries that arrive after cleanup deleted their record (DESIGN.md, "Operator actions":
//! retention must outlast the longest redelivery delay). The duplicate-delay histogram only sees
//! duplicates whose record or marker still exists; a copy older than the retention finds neither
//! and runs its handler again. Its own timestamp gives it away: the pipeline compares a first
//! delivery's age with the shortest retention of the cleanup schedules that delete that group's
//! records ([`RetentionWatch`], refreshed by the scheduler), counts those older
//! ([`crate::stats::Stats::late_delivery`], table `late_deliveries`), and the retention advice
//! takes the ages of the last [`WINDOW_DAYS`] days into account. A timestamp older than
//! [`MAX_PLAUSIBLE_AGE_MS`] (zero, or a producer's broken clock) is ignored: no retention could
//! outlast it, and one such message must not ruin the advice.

use std::collections::HashMap;
use std::sync::RwLock;

use serde::{Deserialize, Serialize};
use sqlx::PgPool;

use crate::actions::ActionError;

/// Days of late deliveries the Cleanup page shows and the retention advice reads.
pub const WINDOW_DAYS: i32 = 30;

/// Ages beyond this (the longest retention a schedule may have, 3650 days) are not believed.
pub const MAX_PLAUSIBLE_AGE_MS: i64 = 3650 * 86_400_000;

/// The shortest retention, in ms, of the enabled cleanup schedules that delete `succeeded`
/// records: per consumer group, and of the schedules for every group. Shared by the scheduler
/// (which refreshes it) and the pipelines (which read it on every new record).
#[derive(Debug, Default)]
pub struct RetentionWatch {
    current: RwLock<Retentions>,
}

#[derive(Debug, Default, Clone)]
struct Retentions {
    every_group: Option<i64>,
    by_group: HashMap<String, i64>,
}

impl RetentionWatch {
    /// The retention that applies to `group`'s succeeded records, in ms; `None` when no enabled
    /// schedule deletes them.
    pub fn retention_ms(&self, group: &str) -> Option<i64> {
        let r = self.current.read().unwrap_or_else(|e| e.into_inner());
        match (r.every_group, r.by_group.get(group).copied()) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// Reads the schedules again.
    ///
    /// Errors: the database's.
    pub async fn refresh(&self, pool: &PgPool) -> Result<(), sqlx::Error> {
        let rows: Vec<(Option<String>, i64)> = sqlx::query_as(
            "SELECT consumer_group, min(retention_days)::bigint * 86400000 FROM cleanup_schedules
             WHERE enabled AND 'succeeded' = ANY(statuses) GROUP BY consumer_group",
        )
        .fetch_all(pool)
        .await?;
        let mut fresh = Retentions::default();
        for (group, ms) in rows {
            match group {
                None => fresh.every_group = Some(ms),
                Some(g) => {
                    fresh.by_group.insert(g, ms);
                }
            }
        }
        *self.current.write().unwrap_or_else(|e| e.into_inner()) = fresh;
        Ok(())
    }
}

/// Late deliveries of one consumer group over the last days.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LateDeliveries {
    /// The group.
    pub consumer_group: String,
    /// Deliveries older than the retention that found no record.
    pub count: i64,
    /// The oldest of them, ms.
    pub max_age_ms: i64,
}

/// Late deliveries per group over the last `days` days.
///
/// Errors: the database's.
pub async fn late_deliveries(pool: &PgPool, days: i32) -> Result<Vec<LateDeliveries>, ActionError> {
    Ok(sqlx::query_as::<_, (String, i64, i64)>(
        "SELECT consumer_group, sum(count)::bigint, max(max_age_ms) FROM late_deliveries
         WHERE day > current_date - $1 GROUP BY consumer_group ORDER BY consumer_group",
    )
    .bind(days)
    .fetch_all(pool)
    .await?
    .into_iter()
    .map(|(consumer_group, count, max_age_ms)| LateDeliveries { consumer_group, count, max_age_ms })
    .collect())
}
