//! Deliveries that arrive after cleanup deleted their record. Two kinds of evidence: the
//! fingerprints cleanup keeps of what it deleted (a *late duplicate*: a new record whose
//! fingerprint matches, noted in `late_duplicates` with its delay, see
//! `engine/src/pipeline/late.rs`), and, below, the producer's own timestamp (a *late
//! delivery*). Deliveries that arrive after cleanup deleted their record (DESIGN.md, "Operator actions":
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
use std::sync::atomic::{AtomicBool, Ordering};

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use sqlx::FromRow;

use super::{CleanupBooks, RETENTION_SAFETY_FACTOR};
use crate::actions::ActionError;

/// Days of late deliveries and late duplicates the Cleanup page shows and the retention advice
/// reads.
pub const WINDOW_DAYS: i32 = 30;

/// Days a late duplicate's note is kept (the record it created is cleaned up as any other).
pub const KEEP_NOTES_DAYS: i32 = 90;

/// Ages beyond this (the longest retention a schedule may have, 3650 days) are not believed.
pub const MAX_PLAUSIBLE_AGE_MS: i64 = 3650 * 86_400_000;

/// The shortest retention, in ms, of the enabled cleanup schedules that delete `succeeded`
/// records: per consumer group, and of the schedules for every group; and whether cleanup keeps
/// any fingerprint of deleted records (the pipelines look late duplicates up only then).
/// Shared by the scheduler (which refreshes it) and the pipelines (which read it on every
/// batch).
#[derive(Debug, Default)]
pub struct RetentionWatch {
    current: RwLock<Retentions>,
    fingerprints: AtomicBool,
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

    /// Whether any fingerprint of a deleted record is kept (as of the last refresh).
    pub fn fingerprints_kept(&self) -> bool {
        self.fingerprints.load(Ordering::Relaxed)
    }

    /// Says fingerprints are kept, at once: called by a run as soon as a batch kept some, so
    /// that the pipelines look up the copies of what it deleted without waiting for the next
    /// [`Self::refresh`] (the scheduler's, after the run).
    pub(crate) fn fingerprints_written(&self) {
        self.fingerprints.store(true, Ordering::Relaxed);
    }

    #[cfg(feature = "testing")]
    /// A watch that says fingerprints are kept (and no retention) without reading any schedule:
    /// for tests of a pipeline's late duplicates whose fingerprints are written by hand.
    pub fn keeping_fingerprints() -> Self {
        Self { fingerprints: AtomicBool::new(true), ..Self::default() }
    }

    /// Reads the schedules again, and whether fingerprints are kept.
    ///
    /// Errors: the database's.
    pub async fn refresh(&self, books: &dyn CleanupBooks) -> Result<(), sqlx::Error> {
        let (kept, rows) = books.retention_by_group().await?;
        self.fingerprints.store(kept, Ordering::Relaxed);
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
pub async fn late_deliveries(books: &dyn CleanupBooks, days: i32) -> Result<Vec<LateDeliveries>, ActionError> {
    Ok(books.late_deliveries(days).await?)
}

/// The retention advice: the longest delay a copy of a message was seen to arrive after the
/// first (duplicate-delay histogram, and late duplicates caught by their fingerprint in the last
/// [`WINDOW_DAYS`] days) or after it was sent (late deliveries of those days), and the
/// shortest retention that outlasts it by the safety factor (2).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RetentionAdvice {
    /// That longest delay, ms; `None` before any duplicate or late delivery.
    pub longest_delay_ms: Option<i64>,
    /// The factor applied.
    pub safety_factor: f64,
    /// `longest_delay_ms × safety_factor`, ms; `None` before any.
    pub minimum_retention_ms: Option<i64>,
}

impl RetentionAdvice {
    /// Whether a retention of `retention_days` is shorter than the advice.
    pub fn is_too_short(&self, retention_days: i32) -> bool {
        self.minimum_retention_ms.is_some_and(|min| i64::from(retention_days) * 86_400_000 < min)
    }
}

/// Reads the advice from the duplicate-delay histogram, the recent late duplicates and the
/// recent late deliveries.
pub async fn retention_advice(books: &dyn CleanupBooks) -> Result<RetentionAdvice, ActionError> {
    let longest = books.longest_delay(WINDOW_DAYS).await?;
    Ok(RetentionAdvice {
        longest_delay_ms: longest,
        safety_factor: RETENTION_SAFETY_FACTOR,
        minimum_retention_ms: longest.map(|ms| (ms as f64 * RETENTION_SAFETY_FACTOR).round() as i64),
    })
}

/// Late duplicates of one consumer group over the last days.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, FromRow)]
pub struct LateDuplicates {
    /// The group.
    pub consumer_group: String,
    /// New records whose message id matched a kept fingerprint.
    pub count: i64,
    /// Of them, held for an operator.
    pub held: i64,
    /// The longest delay after the first delivery of the same id, ms.
    pub longest_delay_ms: i64,
    /// The latest one.
    pub last_seen_at: DateTime<Utc>,
}

/// Late duplicates per group over the last `days` days.
///
/// Errors: the database's.
pub async fn late_duplicates(books: &dyn CleanupBooks, days: i32) -> Result<Vec<LateDuplicates>, ActionError> {
    Ok(books.late_duplicates(days).await?)
}

/// Forgets the fingerprints past their horizon, and the late-duplicate notes and the settled
/// conflicting copies older than [`KEEP_NOTES_DAYS`], `batch` rows per statement. Returns the
/// fingerprints forgotten.
///
/// Errors: the database's.
pub(crate) async fn forget_expired(books: &dyn CleanupBooks, batch: i32) -> Result<i64, sqlx::Error> {
    let mut forgotten = 0;
    loop {
        let n = books.forget_fingerprints(batch).await?;
        forgotten += n;
        if n < i64::from(batch) {
            break;
        }
    }
    books.forget_notes(KEEP_NOTES_DAYS).await?;
    Ok(forgotten)
}
