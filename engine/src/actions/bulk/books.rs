//! What a bulk requeue keeps and locks on one database ([`RequeueJobBooks`]): the jobs, their
//! frozen items, the batches a runner works through and the lock that makes it the job's only
//! runner. The rules (what is requeued, the canary, the failure ratio, the audit) are in
//! `mod.rs` and `runner.rs`; each database's statements are in
//! `store/<database>/requeue_jobs.rs`.

use async_trait::async_trait;
use sqlx::FromRow;

use super::RequeueJob;
use crate::actions::{NamedLock, OperatorTx};
use crate::actions::republish::StoredMessage;
use crate::console::filter::RecordFilter;

/// A job as an operator confirmed it, to be stored with its frozen selection.
#[derive(Debug, Clone, Copy)]
pub struct NewRequeueJob<'a> {
    /// Who confirmed it.
    pub actor: &'a str,
    /// Why (already checked).
    pub reason: Option<&'a str>,
    /// Which records.
    pub filter: &'a RecordFilter,
    /// The filter as stored with the job (JSON of [`RecordFilter`]).
    pub filter_json: &'a serde_json::Value,
    /// Messages per second.
    pub rate_per_sec: f64,
    /// Canary batch size.
    pub canary_size: i32,
    /// Failure threshold, (0, 1].
    pub failure_threshold: f64,
}

/// The selection a job froze: its id, its items and how many of them were skipped at once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FrozenSelection {
    /// The new job's id.
    pub id: i64,
    /// Items frozen (at most the limit asked for plus one, so that "too many" shows).
    pub total: i64,
    /// Of those, items skipped at the freeze (with their reason in the item).
    pub skipped: i64,
}

/// A pending item of a job, as a runner's batch reads it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, FromRow)]
pub struct PendingItem {
    /// Its place in the job (record id order at the freeze).
    pub seq: i32,
    /// The record.
    pub record_id: i64,
    /// The record's version at the freeze (`None` for items frozen before versions existed).
    pub record_version: Option<i64>,
}

/// A pending item's record as a batch locked it: why it would be skipped now (as
/// [`RequeueJobBooks::requeue_counts`] names it; `None`: requeueable), its version, and its stored message.
#[derive(Debug, FromRow)]
pub struct LockedCandidate {
    pub(crate) skip: Option<String>,
    pub(crate) version: i64,
    #[sqlx(flatten)]
    pub(crate) stored: StoredMessage,
}

/// What became of one item: `done`, `skipped` or `failed`, and why (skipped, failed).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ItemVerdict {
    /// The item's place in the job.
    pub seq: i32,
    /// Its record.
    pub record_id: i64,
    /// `done`, `skipped` or `failed`.
    pub state: &'static str,
    /// Why it was skipped or failed.
    pub detail: Option<String>,
}

/// A job's row as its runner reads it between batches.
#[derive(Debug, Clone, PartialEq, FromRow)]
pub struct RunnerView {
    /// `running`, `paused`, `cancelled` or `completed`.
    pub state: String,
    /// Who confirmed the job (the runner's audit entries name them).
    pub created_by: String,
    /// Messages per second.
    pub rate_per_sec: f64,
    /// Canary batch size.
    pub canary_size: i32,
    /// Failure threshold, (0, 1].
    pub failure_threshold: f64,
    /// Items requeued so far.
    pub done: i64,
    /// Items whose publish failed so far.
    pub failed: i64,
}

/// The jobs of bulk requeue on one database. Implemented by each store's pool; the console
/// reaches it through [`crate::console::ConsoleStore`].
#[async_trait]
pub trait RequeueJobBooks: Send + Sync {
    /// The records `filter` matches now, at most `limit`, counted by why they would be skipped
    /// (`None`: requeueable): `already succeeded`, `lease live` (processing under a lease that
    /// has not expired, database clock), `stuck: release it first`, `poison message`, `payload
    /// missing`, in that order of precedence.
    async fn requeue_counts(&self, filter: &RecordFilter, limit: i64) -> Result<Vec<(Option<String>, i64)>, sqlx::Error>;

    /// Job `id`, if there is one.
    async fn requeue_job(&self, id: i64) -> Result<Option<RequeueJob>, sqlx::Error>;

    /// The latest `limit` jobs, newest first.
    async fn requeue_jobs(&self, limit: i64) -> Result<Vec<RequeueJob>, sqlx::Error>;

    /// Stores `job` as `running` with its selection frozen: one item per record `job.filter`
    /// matches now (at most `limit`, in record id order), `pending`, or `skipped` with its
    /// reason; each with the record's version. Nothing is kept unless the returned transaction
    /// commits.
    async fn freeze_requeue_job(
        &self,
        job: &NewRequeueJob<'_>,
        limit: i64,
    ) -> Result<(FrozenSelection, Box<dyn FrozenJob>), sqlx::Error>;

    /// A transaction for an operator's change of a job's state.
    async fn begin_job_change(&self) -> Result<Box<dyn JobChange>, sqlx::Error>;

    /// Job `id` as its runner reads it.
    async fn runner_view(&self, id: i64) -> Result<Option<RunnerView>, sqlx::Error>;

    /// The (consumer group, source broker) pairs of job `id`'s pending items' records.
    async fn pending_sources(&self, id: i64) -> Result<Vec<(String, String)>, sqlx::Error>;

    /// Opens a batch: the next `limit` pending items of job `id`, in order, locked until the
    /// batch ends (a second batch of the job waits, then takes the items after them: no item
    /// is handled twice, whoever runs the job), and the records of those that still exist,
    /// locked in the consumers' claim order.
    async fn begin_batch(
        &self,
        id: i64,
        limit: i64,
    ) -> Result<(Vec<PendingItem>, Vec<LockedCandidate>, Box<dyn RequeueBatch>), sqlx::Error>;

    /// Pauses job `id` if it is running, saying `why`; whether it did.
    async fn pause_running_job(&self, id: i64, why: &str) -> Result<bool, sqlx::Error>;

    /// Completes job `id` if it is running and none of its items is pending.
    async fn complete_running_job(&self, id: i64) -> Result<(), sqlx::Error>;

    /// The running jobs' ids, in order.
    async fn running_job_ids(&self) -> Result<Vec<i64>, sqlx::Error>;

    /// Makes this process job `id`'s only runner, across processes, until the lock is released
    /// or its connection closes (a crashed runner frees the job); `None` when another holds it.
    async fn lock_job_runner(&self, id: i64) -> Result<Option<Box<dyn NamedLock>>, sqlx::Error>;
}

/// The transaction that froze a job's selection.
#[async_trait]
pub trait FrozenJob: OperatorTx {
    /// The message ids of job `id`'s first `limit` pending items, in item order.
    async fn pending_message_ids(&mut self, id: i64, limit: i64) -> Result<Vec<String>, sqlx::Error>;
}

/// One operator's change of a job's state, in one transaction.
#[async_trait]
pub trait JobChange: OperatorTx {
    /// Job `id`'s state, its row locked until the transaction ends; `None` when there is none.
    async fn lock_job(&mut self, id: i64) -> Result<Option<String>, sqlx::Error>;

    /// Sets job `id`'s state to `to` with `paused_reason`; a cancelled job is finished now.
    async fn set_job_state(&mut self, id: i64, to: &str, paused_reason: Option<&str>) -> Result<(), sqlx::Error>;
}

/// A runner's batch in one transaction; dropped without [`RequeueBatch::finish`], it rolls back
/// (its items stay pending).
#[async_trait]
pub trait RequeueBatch: Send {
    /// Makes the records `claimable` claimable again (`failed`, due now, one more attempt if they
    /// used up theirs, the status counts following), stores each item's `verdicts`, adds them to
    /// job `id`'s counters (completing it when it is running and nothing is pending), and commits.
    async fn finish(self: Box<Self>, id: i64, claimable: &[i64], verdicts: &[ItemVerdict]) -> Result<(), sqlx::Error>;
}
