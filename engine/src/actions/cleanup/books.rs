//! What cleanup keeps and locks on one database ([`CleanupBooks`]): the schedules and their
//! runs, a run's delete batches (the fingerprints of what they delete kept beside them), the
//! forgetting of expired fingerprints and notes, the scheduler's lock of a schedule, and the
//! reads of the retention watch and the Cleanup page. The rules (validation, retention, the
//! batches' loop, what a run records, the audit) are in `mod.rs`, `scheduler.rs` and `late.rs`;
//! each database's statements are in `store/<database>/cleanup.rs`.

use async_trait::async_trait;
use chrono::{DateTime, Utc};

use super::late::{LateDeliveries, LateDuplicates};
use super::{CleanupRun, CleanupSchedule};
use crate::actions::NamedLock;
use crate::audit::NewAuditEntry;

/// A schedule's values as they are stored (already validated and normalized).
#[derive(Debug, Clone)]
pub struct ScheduleRow<'a> {
    /// Unique name, trimmed.
    pub name: &'a str,
    /// Five-field cron expression, UTC.
    pub cron: &'a str,
    /// Retention, days.
    pub retention_days: i32,
    /// Records per delete batch.
    pub batch_size: i32,
    /// Statuses deleted, sorted, without repeats.
    pub statuses: &'a [&'a str],
    /// Only this group; `None`: all.
    pub consumer_group: Option<&'a str>,
    /// Whether the scheduler runs it.
    pub enabled: bool,
    /// Its next tick.
    pub next_run_at: DateTime<Utc>,
    /// Days the fingerprints of deleted records are kept; `None`: the default.
    pub fingerprint_days: Option<i32>,
}

/// One delete batch of a run.
#[derive(Debug, Clone, Copy)]
pub struct DeleteBatch<'a> {
    /// `succeeded`, `failed` or `dead`.
    pub status: &'a str,
    /// Records of `status` older than this (`completed_at` for `succeeded`, `updated_at` for the
    /// others) are deleted.
    pub cutoff: DateTime<Utc>,
    /// Only this group; `None`: all.
    pub group: Option<&'a str>,
    /// At most this many records.
    pub limit: i32,
    /// Days the fingerprints of the deleted `succeeded` records are kept (0: none).
    pub fingerprint_days: i32,
}

impl DeleteBatch<'_> {
    /// Whether the batch keeps the fingerprints of what it deletes: `succeeded` records only (a
    /// copy of a failed or dead one repeats no effect), unless the schedule keeps none.
    pub fn keeps_fingerprints(&self) -> bool {
        self.status == "succeeded" && self.fingerprint_days > 0
    }
}

/// How a run ended, as [`CleanupBooks::finish_run`] stores it.
#[derive(Debug, Clone, Copy)]
pub struct RunEnd<'a> {
    /// The run.
    pub run_id: i64,
    /// Records deleted.
    pub rows_deleted: i64,
    /// Delete statements run.
    pub batches: i32,
    /// Why it stopped early.
    pub error: Option<&'a str>,
}

/// The cleanup schedules of one database. Implemented by each store's pool; the console reaches
/// it through [`crate::console::ConsoleStore`].
#[async_trait]
pub trait CleanupBooks: Send + Sync {
    /// Every schedule, by name.
    async fn cleanup_schedules(&self) -> Result<Vec<CleanupSchedule>, sqlx::Error>;

    /// Schedule `id`, if there is one.
    async fn cleanup_schedule(&self, id: i64) -> Result<Option<CleanupSchedule>, sqlx::Error>;

    /// The latest `limit` runs of schedule `schedule` (every schedule's when `None`), newest
    /// first.
    async fn cleanup_runs(&self, schedule: Option<i64>, limit: i64) -> Result<Vec<CleanupRun>, sqlx::Error>;

    /// Stores a new schedule created by `actor` (`id = None`) or replaces schedule `id`'s
    /// values, and returns it as stored; `None` when there is no schedule `id`.
    ///
    /// Errors: a unique violation when another schedule has the name; the database's.
    async fn save_cleanup_schedule(
        &self,
        actor: &str,
        id: Option<i64>,
        row: &ScheduleRow<'_>,
    ) -> Result<Option<CleanupSchedule>, sqlx::Error>;

    /// The database's clock less `retention_days` days: a run's cutoff.
    async fn cleanup_cutoff(&self, retention_days: i32) -> Result<DateTime<Utc>, sqlx::Error>;

    /// Records of `status` older than `cutoff` (of `group` only, unless `None`) that a run
    /// would delete: those without an open conflicting copy.
    async fn count_deletable(&self, status: &str, cutoff: DateTime<Utc>, group: Option<&str>) -> Result<i64, sqlx::Error>;

    /// Deletes one batch in one short transaction: at most `batch.limit` records of the
    /// batch's status older than its cutoff, rows locked by others skipped (a consumer is never
    /// waited for), records with an open conflicting copy kept; the status counts follow, and
    /// the fingerprints of deleted `succeeded` records are kept `batch.fingerprint_days` days
    /// (a fingerprint kept already keeps its earliest sighting and its latest horizon).
    /// Returns the records deleted.
    async fn delete_batch(&self, batch: &DeleteBatch<'_>) -> Result<i64, sqlx::Error>;

    /// Deletes at most `limit` fingerprints past their horizon; returns how many.
    async fn forget_fingerprints(&self, limit: i32) -> Result<i64, sqlx::Error>;

    /// Deletes the late-duplicate notes and the settled conflicting copies older than `days`.
    async fn forget_notes(&self, days: i32) -> Result<(), sqlx::Error>;

    /// Writes a run's progress so far.
    async fn run_progress(&self, run_id: i64, rows_deleted: i64, batches: i32) -> Result<(), sqlx::Error>;

    /// Stores a run's end (finished now, database clock) and `audit`, in one transaction.
    async fn finish_run(&self, end: &RunEnd<'_>, audit: &NewAuditEntry<'_>) -> Result<(), sqlx::Error>;

    /// The enabled schedules whose next tick is due (database clock), by id.
    async fn due_schedules(&self) -> Result<Vec<CleanupSchedule>, sqlx::Error>;

    /// Claims schedule `id`'s tick `tick` (compare-and-set of its `next_run_at` to `next`, while
    /// it is enabled) and stores its run (`schedule`, by `actor`, `cutoff`), in one transaction;
    /// the run's id, or `None` when another instance ran the tick.
    async fn claim_tick(
        &self,
        id: i64,
        tick: DateTime<Utc>,
        next: DateTime<Utc>,
        actor: &str,
        cutoff: DateTime<Utc>,
    ) -> Result<Option<i64>, sqlx::Error>;

    /// Stores a manual run of schedule `id` by `actor` with `cutoff`; its id.
    async fn start_manual_run(&self, id: i64, actor: &str, cutoff: DateTime<Utc>) -> Result<i64, sqlx::Error>;

    /// Makes this process schedule `id`'s only runner, across processes, until the lock is
    /// released or its connection closes; `None` when another holds it.
    async fn lock_schedule(&self, id: i64) -> Result<Option<Box<dyn NamedLock>>, sqlx::Error>;

    /// Whether any fingerprint is kept, and the shortest retention in ms of the enabled
    /// schedules deleting `succeeded` records, per consumer group (`None`: every group).
    async fn retention_by_group(&self) -> Result<(bool, Vec<(Option<String>, i64)>), sqlx::Error>;

    /// Late deliveries per group over the last `days` days (database's UTC date), by group.
    async fn late_deliveries(&self, days: i32) -> Result<Vec<LateDeliveries>, sqlx::Error>;

    /// Late duplicates per group seen over the last `days` days, by group.
    async fn late_duplicates(&self, days: i32) -> Result<Vec<LateDuplicates>, sqlx::Error>;

    /// The longest delay, ms, of a copy after the first: the duplicate-delay histogram's, the
    /// late duplicates' and the late deliveries' of the last `days` days; `None` before any.
    async fn longest_delay(&self, days: i32) -> Result<Option<i64>, sqlx::Error>;
}
