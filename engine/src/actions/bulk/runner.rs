//! The background runner of bulk requeue jobs: one per job (the database's lock,
//! [`RequeueJobBooks::lock_job_runner`]), a canary batch first, then the rest at the job's
//! rate, pausing itself on too many failed publishes.
//!
//! Each batch is one transaction: the pending items' records are locked (in the consumers' lock
//! order), classified again (a record may have succeeded or been claimed since the freeze), the
//! requeueable ones are published concurrently on one confirm channel, the confirmed ones are
//! made claimable, and the items and the job's counters are updated. A consumer's claim of a
//! fresh copy waits for that commit, then finds the record claimable.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use futures::future::join_all;
use serde_json::json;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::super::republish::{Publishers, publish_stored};
use super::{ItemVerdict, LockedCandidate, RunnerView, audit_on_pool};
use crate::actions::NamedLock;
use crate::actions::ActionError;
use crate::audit::AuditOutcome;
use crate::console::{ConsoleStore, console_store};
use crate::runtime::EnginePool;
use crate::source::Publish;

/// The publishers a job's records go through, opened once per run: by (consumer group, broker).
pub type OpenPublishers = HashMap<(String, String), Arc<dyn Publish>>;

/// How often [`supervise`] looks for running jobs without a runner.
pub const SUPERVISE_EVERY: Duration = Duration::from_secs(1);
/// Smallest number of recent publishes the failure ratio is judged on.
const MIN_WINDOW: usize = 20;

/// What one batch did.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct BatchOutcome {
    /// Requeued (published and made claimable).
    pub done: i64,
    /// Skipped (record changed since the freeze, or gone).
    pub skipped: i64,
    /// Publish failed; record unchanged.
    pub failed: i64,
    /// Why the batch's last failed publish failed (also in its item's `detail`).
    pub last_failure: Option<String>,
}

impl BatchOutcome {
    /// Items handled.
    pub fn items(&self) -> i64 {
        self.done + self.skipped + self.failed
    }
}

/// Skip reason of an item whose record has another version than at the freeze.
pub const CHANGED_SINCE_FREEZE: &str =
    "changed since the selection was frozen (requeued, retried or released meanwhile)";

/// Handles the next `limit` pending items of job `id` in one transaction, publishing through
/// `publishers` (a record whose group and broker have none there fails its item).
///
/// Errors: database errors (the transaction rolled back; the items stay pending).
pub async fn run_batch(
    store: &dyn ConsoleStore,
    publishers: &OpenPublishers,
    id: i64,
    limit: i64,
) -> Result<BatchOutcome, ActionError> {
    let (items, rows, batch) = store.begin_batch(id, limit).await?;
    if items.is_empty() {
        return Ok(BatchOutcome::default());
    }
    let mut by_id: HashMap<i64, LockedCandidate> = rows.into_iter().map(|c| (c.stored.id, c)).collect();
    let mut verdicts: Vec<ItemVerdict> = Vec::with_capacity(items.len());
    let mut to_publish = Vec::new();
    for item in &items {
        let verdict = |state, detail: Option<String>| ItemVerdict { seq: item.seq, record_id: item.record_id, state, detail };
        match by_id.remove(&item.record_id) {
            None => verdicts.push(verdict("skipped", Some("record gone (cleaned up)".to_owned()))),
            Some(LockedCandidate { skip: Some(reason), .. }) => verdicts.push(verdict("skipped", Some(reason))),
            Some(LockedCandidate { version, .. }) if item.record_version.is_some_and(|v| v != version) => {
                verdicts.push(verdict("skipped", Some(CHANGED_SINCE_FREEZE.to_owned())))
            }
            Some(LockedCandidate { skip: None, stored, .. }) => to_publish.push((item.seq, stored)),
        }
    }
    let results = join_all(to_publish.iter().map(|(_, stored)| async move {
        stored.check_republishable()?;
        let key = (stored.consumer_group.clone(), stored.source_broker.clone());
        match publishers.get(&key) {
            Some(publisher) => publish_stored(publisher.as_ref(), stored).await,
            None => Err(ActionError::NoPublisher { id: stored.id, broker: stored.source_broker.clone() }),
        }
    }))
    .await;
    let mut claimable = Vec::new();
    for ((seq, stored), result) in to_publish.iter().zip(results) {
        let (state, detail) = match result {
            Ok(()) => {
                claimable.push(stored.id);
                ("done", None)
            }
            Err(e) => ("failed", Some(e.to_string())),
        };
        verdicts.push(ItemVerdict { seq: *seq, record_id: stored.id, state, detail });
    }
    batch.finish(id, &claimable, &verdicts).await?;
    let count = |s: &str| verdicts.iter().filter(|v| v.state == s).count() as i64;
    let last_failure = verdicts.iter().rev().find(|v| v.state == "failed").and_then(|v| v.detail.clone());
    Ok(BatchOutcome { done: count("done"), skipped: count("skipped"), failed: count("failed"), last_failure })
}

/// Pauses a running job with `why` (audited as `bulk.requeue.auto_pause` by the job's creator).
async fn auto_pause(store: &dyn ConsoleStore, id: i64, actor: &str, why: String) -> Result<(), ActionError> {
    if store.pause_running_job(id, &why).await? {
        tracing::warn!(job_id = id, "bulk requeue paused: {why}");
        let detail = json!({ "job_id": id, "paused_reason": why });
        audit_on_pool(store, actor, "bulk.requeue.auto_pause", AuditOutcome::Ok, None, detail).await;
    }
    Ok(())
}

/// Items per batch at `rate` messages/s: about ten batches a second, 1 to 100 items.
fn batch_size(rate: f64) -> i64 {
    ((rate / 10.0).round() as i64).clamp(1, 100)
}

/// Runs job `id` until it completes, pauses, is cancelled, or `shutdown` fires (then it stays
/// `running` and a later runner resumes it). Returns at once when another runner holds the job
/// (the database's lock on a connection of its own, released when it closes, so a crashed
/// runner frees the job). A runner that finds its lock lost before a batch stops; the
/// supervisor starts it again when the job is free.
///
/// Errors: database errors, a broker that cannot be reached (the job stays running; the
/// supervisor retries).
#[tracing::instrument(skip_all, fields(job_id = id), err(level = "warn"))]
pub async fn run_job(
    store: &dyn ConsoleStore,
    publishers: &Publishers,
    id: i64,
    shutdown: &CancellationToken,
) -> Result<(), ActionError> {
    let Some(mut lock) = store.lock_job_runner(id).await? else { return Ok(()) };
    let result = run_locked(store, publishers, id, lock.as_mut(), shutdown).await;
    lock.release().await;
    result
}

/// Opens a publisher for every (group, broker) among job `id`'s pending records. A broker no
/// group reads from is left out (those records' items fail one by one, saying so).
///
/// Errors: a broker that cannot be reached ([`ActionError::Publish`]), a database error.
async fn open_publishers(
    store: &dyn ConsoleStore,
    publishers: &Publishers,
    id: i64,
) -> Result<OpenPublishers, ActionError> {
    let pairs = store.pending_sources(id).await?;
    let mut open = OpenPublishers::new();
    for (group, broker) in pairs {
        match publishers.for_record(0, &group, &broker).await {
            Ok(publisher) => {
                open.insert((group, broker), publisher);
            }
            Err(ActionError::NoPublisher { .. }) => {}
            Err(e) => {
                for opened in open.values() {
                    opened.close().await;
                }
                return Err(e);
            }
        }
    }
    Ok(open)
}

async fn run_locked(
    store: &dyn ConsoleStore,
    publishers: &Publishers,
    id: i64,
    lock: &mut dyn NamedLock,
    shutdown: &CancellationToken,
) -> Result<(), ActionError> {
    let Some(job) = store.runner_view(id).await? else { return Ok(()) };
    if job.state != "running" {
        return Ok(());
    }
    let publisher = open_publishers(store, publishers, id).await?;
    let result = run_open(store, &publisher, id, job, lock, shutdown).await;
    for open in publisher.values() {
        open.close().await;
    }
    result
}

/// Runs job `id` (`job` as it was read) with its publishers open, until it completes, pauses,
/// is cancelled, `shutdown` fires or `lock` is lost.
async fn run_open(
    store: &dyn ConsoleStore,
    publisher: &OpenPublishers,
    id: i64,
    job: RunnerView,
    lock: &mut dyn NamedLock,
    shutdown: &CancellationToken,
) -> Result<(), ActionError> {
    let canary = i64::from(job.canary_size);
    let mut published = job.done + job.failed;
    let mut canary_failed = job.failed;
    let window_len = (canary as usize).max(100);
    let mut window: VecDeque<bool> = VecDeque::with_capacity(window_len);
    let mut last_failure: Option<String> = None;
    let size = batch_size(job.rate_per_sec);
    let mut next = Instant::now();
    tracing::info!(job_id = id, rate = job.rate_per_sec, canary, "bulk requeue runner started");
    loop {
        if !lock.held().await {
            tracing::warn!(job_id = id, "bulk requeue runner lost its lock (its connection closed); stopping");
            return Ok(());
        }
        match store.runner_view(id).await? {
            Some(state) if state.state == "running" => {}
            Some(state) if state.state == "completed" => {
                let detail = json!({ "job_id": id, "done": state.done, "failed": state.failed });
                audit_on_pool(store, &job.created_by, "bulk.requeue.complete", AuditOutcome::Ok, None, detail).await;
                tracing::info!(job_id = id, done = state.done, failed = state.failed, "bulk requeue completed");
                return Ok(());
            }
            _ => return Ok(()),
        }
        let in_canary = published < canary;
        let limit = if in_canary { size.min(canary - published) } else { size };
        let outcome = match run_batch(store, publisher, id, limit).await {
            Ok(o) => o,
            Err(ActionError::Unexpected(e)) => {
                tracing::warn!(job_id = id, error = %e, "bulk requeue batch failed; retrying");
                tokio::time::sleep(Duration::from_millis(200)).await;
                continue;
            }
            Err(e) => return Err(e),
        };
        if outcome.items() == 0 {
            // Nothing pending: complete it (if still running); the check above ends the loop.
            store.complete_running_job(id).await?;
            continue;
        }
        let attempts = outcome.done + outcome.failed;
        published += attempts;
        for (n, failed) in [(outcome.done, false), (outcome.failed, true)] {
            for _ in 0..n {
                if window.len() == window_len {
                    window.pop_front();
                }
                window.push_back(failed);
            }
        }
        if outcome.last_failure.is_some() {
            last_failure = outcome.last_failure;
        }
        // The reason shown wherever the job is (CLI, API, Requeues page) says why publishes fail.
        let last = || last_failure.as_deref().map(|e| format!("; last failure: {e}")).unwrap_or_default();
        if in_canary {
            canary_failed += outcome.failed;
            if published >= canary && canary_failed > 0 {
                let why = format!("canary failed: {canary_failed} of the first {published} publishes failed{}", last());
                return auto_pause(store, id, &job.created_by, why).await;
            }
        } else if window.len() >= MIN_WINDOW {
            let ratio = window.iter().filter(|f| **f).count() as f64 / window.len() as f64;
            if ratio > job.failure_threshold {
                let why = format!(
                    "failure ratio {:.0}% of the last {} publishes exceeds the threshold {:.0}%{}",
                    ratio * 100.0,
                    window.len(),
                    job.failure_threshold * 100.0,
                    last()
                );
                return auto_pause(store, id, &job.created_by, why).await;
            }
        }
        next += Duration::from_secs_f64(attempts as f64 / job.rate_per_sec);
        tokio::select! {
            () = shutdown.cancelled() => return Ok(()),
            () = tokio::time::sleep_until(next) => {}
        }
    }
}

/// Starts a runner for every running job that has none in this process, every
/// [`SUPERVISE_EVERY`], until `shutdown` (then waits for its runners to stop). Runners of other
/// instances keep their jobs: the runner lock decides.
pub async fn supervise(pool: EnginePool, publishers: Publishers, shutdown: CancellationToken) {
    let mut running: HashMap<i64, tokio::task::JoinHandle<()>> = HashMap::new();
    let mut ticker = tokio::time::interval(SUPERVISE_EVERY);
    loop {
        tokio::select! {
            () = shutdown.cancelled() => break,
            _ = ticker.tick() => {}
        }
        running.retain(|_, task| !task.is_finished());
        let ids = match console_store(&pool).running_job_ids().await {
            Ok(ids) => ids,
            Err(e) => {
                tracing::warn!(error = %e, "looking for running requeue jobs failed");
                continue;
            }
        };
        let live: HashSet<i64> = running.keys().copied().collect();
        for id in ids.into_iter().filter(|id| !live.contains(id)) {
            let (pool, publishers, shutdown) = (pool.clone(), publishers.clone(), shutdown.clone());
            running.insert(
                id,
                tokio::spawn(async move {
                    if let Err(e) = run_job(console_store(&pool), &publishers, id, &shutdown).await {
                        tracing::warn!(job_id = id, error = %e, "bulk requeue runner stopped; will retry");
                    }
                }),
            );
        }
    }
    for (_, task) in running {
        let _ = task.await;
    }
}
