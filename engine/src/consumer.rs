//! The consumer service: N workers, each with its own [`Source`](crate::source::Source),
//! running deliveries through the [`Pipeline`] until shutdown.
//!
//! Lifecycle (DESIGN.md; the same for every long-running engine task): started with a shutdown
//! token; on shutdown each worker stops taking deliveries, finishes and settles the batch in
//! hand, cancels its subscription (deliveries not yet taken go back to the broker), and the
//! connection is closed. A lost connection is reopened with exponential back-off; a batch that
//! had to be redelivered (database trouble) pauses the worker with the same back-off instead of
//! spinning on immediate redeliveries.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use chrono::{DateTime, Utc};
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use crate::pipeline::{AckReason, Disposition, Pipeline};
use crate::store::PipelineStore;
use crate::store::postgres::PgStore;
use crate::source::{SourceError, SourceFactory};
use crate::worker::worker_name;

/// Consumer settings.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ConsumerSettings {
    /// Workers (each with its own channel / source). Default 4.
    pub concurrency: usize,
    /// Most deliveries processed in one database transaction. Default 50.
    pub batch_size: usize,
    /// How long a worker waits for more deliveries after the first of a batch, in ms. Default 5.
    pub batch_linger_ms: u64,
    /// First back-off after a connection loss or a redelivered batch, in ms. Default 500.
    pub backoff_initial_ms: u64,
    /// Longest such back-off, in ms. Default 30000.
    pub backoff_max_ms: u64,
}

impl Default for ConsumerSettings {
    fn default() -> Self {
        Self { concurrency: 4, batch_size: 50, batch_linger_ms: 5, backoff_initial_ms: 500, backoff_max_ms: 30_000 }
    }
}

/// What the console shows of a running consumer.
#[derive(Debug, Default)]
pub struct ConsumerStatus {
    running_workers: AtomicUsize,
    in_flight: AtomicUsize,
    last_error: std::sync::Mutex<Option<(DateTime<Utc>, String)>>,
    refused: std::sync::Mutex<Option<String>>,
    judging: std::sync::Mutex<Judging>,
    /// A run of failed batches with no new failure for this long is over: the queue drained,
    /// or went to another process (twice the workers' longest back-off).
    quiet_after: Duration,
}

/// A run of batches the pipeline could not judge (database trouble), as
/// [`ConsumerStatus::failing`] and [`ConsumerStatus::last_recovery`] report it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct FailedBatches {
    /// When the first batch of the run was given back to the broker.
    pub since: DateTime<Utc>,
    /// Batches given back in the run, by all workers of the group.
    pub batches: u64,
    /// When the run's latest batch was given back.
    pub last_at: DateTime<Utc>,
    /// When a batch was judged again (its deliveries settled); `None` while the run lasts.
    pub resumed_at: Option<DateTime<Utc>>,
}

/// The failed batches of a consumer: the count since start, the run in progress, the last
/// run that ended.
#[derive(Debug, Default)]
struct Judging {
    failed_batches: u64,
    current: Option<FailedBatches>,
    last_recovery: Option<FailedBatches>,
}

impl ConsumerStatus {
    /// Workers currently holding an open source.
    pub fn running_workers(&self) -> usize {
        self.running_workers.load(Ordering::Relaxed)
    }

    /// Deliveries taken from the broker and not yet settled.
    pub fn in_flight(&self) -> usize {
        self.in_flight.load(Ordering::Relaxed)
    }

    /// The last connection or settlement error, with when it happened.
    pub fn last_error(&self) -> Option<(DateTime<Utc>, String)> {
        self.last_error.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Why the broker refuses the group's topology ([`SourceError::Topology`]), while it
    /// does: the group consumes nothing, and is unhealthy on `/readyz`. Cleared when a worker's
    /// source opens.
    pub fn topology_refused(&self) -> Option<String> {
        self.refused.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Batches given back to the broker unjudged since the consumer started: the pipeline could
    /// not claim or record them (database trouble) and the source nacked them or left their
    /// offsets uncommitted. Also counted by the `dedup_failed_batches_total` metric.
    pub fn failed_batches(&self) -> u64 {
        self.judging().failed_batches
    }

    /// The run of failed batches in progress: since the last batch the database judged, in
    /// any worker, every batch has been given back (batches of Redis duplicates and held
    /// deliveries, which do not reach the database, neither extend nor end it). `/readyz` is
    /// not ready meanwhile. The run ends with the next batch judged (the consumer resumes by
    /// itself: its workers retry with the back-off of [`ConsumerSettings`], DESIGN.md
    /// "Recovery"), or when no batch has failed for twice the longest back-off (nothing left
    /// to judge here: the queue drained, or went to another process).
    pub fn failing(&self) -> Option<FailedBatches> {
        let run = self.judging().current?;
        let quiet = (Utc::now() - run.last_at).to_std().unwrap_or_default();
        (quiet < self.quiet_after).then_some(run)
    }

    /// The last run of failed batches that ended, with when the consumer resumed.
    pub fn last_recovery(&self) -> Option<FailedBatches> {
        self.judging().last_recovery
    }

    fn judging(&self) -> std::sync::MutexGuard<'_, Judging> {
        self.judging.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Notes a settled batch: given back when any of its deliveries was, judged when the
    /// database judged any of them.
    fn batch_done(&self, group: &str, dispositions: &[Disposition]) {
        let failed = dispositions.contains(&Disposition::Redeliver);
        let judged = dispositions
            .iter()
            .any(|d| !matches!(d, Disposition::Ack(AckReason::DuplicateRedis) | Disposition::Held { .. }));
        let mut judging = self.judging();
        if failed {
            metrics::counter!("dedup_failed_batches_total", "group" => group.to_owned()).increment(1);
            judging.failed_batches += 1;
            let now = Utc::now();
            let quiet_after = self.quiet_after;
            let run = match judging.current.take() {
                Some(run) if (now - run.last_at).to_std().unwrap_or_default() < quiet_after => run,
                _ => FailedBatches { since: now, batches: 0, last_at: now, resumed_at: None },
            };
            judging.current = Some(FailedBatches { batches: run.batches + 1, last_at: now, ..run });
        } else if judged && let Some(mut run) = judging.current.take() {
            let now = Utc::now();
            run.resumed_at = Some(now);
            let failed_for = (now - run.since).to_std().unwrap_or_default();
            tracing::info!(group, batches = run.batches, failed_for = ?failed_for, "batches are judged again");
            judging.last_recovery = Some(run);
        }
    }

    fn set_error(&self, error: &SourceError) {
        *self.last_error.lock().unwrap_or_else(|e| e.into_inner()) = Some((Utc::now(), error.to_string()));
        if let SourceError::Topology(_) = error {
            *self.refused.lock().unwrap_or_else(|e| e.into_inner()) = Some(error.to_string());
        }
    }

    fn opened(&self) {
        self.running_workers.fetch_add(1, Ordering::Relaxed);
        *self.refused.lock().unwrap_or_else(|e| e.into_inner()) = None;
    }
}

/// A consumer: a pipeline fed by sources from a factory.
pub struct Consumer<S = PgStore> {
    pipeline: Pipeline<S>,
    factory: Arc<dyn SourceFactory>,
    settings: ConsumerSettings,
    status: Arc<ConsumerStatus>,
}

impl<S: PipelineStore> Consumer<S> {
    /// A consumer; call [`Consumer::run`] to start it.
    pub fn new(pipeline: Pipeline<S>, factory: Arc<dyn SourceFactory>, settings: ConsumerSettings) -> Self {
        let status = ConsumerStatus {
            quiet_after: Duration::from_millis(settings.backoff_max_ms.max(settings.backoff_initial_ms)) * 2,
            ..ConsumerStatus::default()
        };
        // Registered at 0, so a dashboard or an alert sees the series before the first failure.
        metrics::counter!("dedup_failed_batches_total", "group" => pipeline.group().to_string()).increment(0);
        Self { pipeline, factory, settings, status: Arc::new(status) }
    }

    /// The status handle (shared; stays valid while the consumer runs).
    pub fn status(&self) -> Arc<ConsumerStatus> {
        self.status.clone()
    }

    /// Runs the workers until `shutdown` is cancelled and they have drained, then closes the
    /// connection.
    pub async fn run(self, shutdown: CancellationToken) {
        let workers: Vec<_> = (0..self.settings.concurrency.max(1))
            .map(|n| {
                tokio::spawn(run_worker(
                    n,
                    self.pipeline.clone(),
                    self.factory.clone(),
                    self.settings.clone(),
                    self.status.clone(),
                    shutdown.clone(),
                ))
            })
            .collect();
        for worker in workers {
            let _ = worker.await;
        }
        self.factory.close().await;
        tracing::info!(group = %self.pipeline.group(), "consumer stopped");
    }
}

/// Doubling back-off between `initial` and `max`.
struct Pause {
    next: Duration,
    initial: Duration,
    max: Duration,
}

impl Pause {
    fn new(settings: &ConsumerSettings) -> Self {
        let initial = Duration::from_millis(settings.backoff_initial_ms.max(1));
        Self { next: initial, initial, max: Duration::from_millis(settings.backoff_max_ms).max(initial) }
    }

    /// Sleeps for the current pause (or until shutdown) and doubles it. False on shutdown.
    async fn sleep(&mut self, shutdown: &CancellationToken) -> bool {
        let pause = self.next;
        self.next = (self.next * 2).min(self.max);
        tokio::select! {
            () = shutdown.cancelled() => false,
            () = tokio::time::sleep(pause) => true,
        }
    }

    fn reset(&mut self) {
        self.next = self.initial;
    }
}

async fn run_worker<S: PipelineStore>(
    n: usize,
    pipeline: Pipeline<S>,
    factory: Arc<dyn SourceFactory>,
    settings: ConsumerSettings,
    status: Arc<ConsumerStatus>,
    shutdown: CancellationToken,
) {
    let name = worker_name(n);
    let linger = Duration::from_millis(settings.batch_linger_ms);
    let mut pause = Pause::new(&settings);
    while !shutdown.is_cancelled() {
        let opened = tokio::select! {
            () = shutdown.cancelled() => break,
            opened = factory.open(n) => opened,
        };
        let mut source = match opened {
            Ok(source) => source,
            Err(e) => {
                tracing::warn!(worker = %name, error = %e, "cannot open the source; retrying");
                status.set_error(&e);
                if !pause.sleep(&shutdown).await {
                    break;
                }
                continue;
            }
        };
        pause.reset();
        status.opened();
        let error = loop {
            let next = tokio::select! {
                biased;
                () = shutdown.cancelled() => None,
                next = source.next_batch(settings.batch_size, linger) => Some(next),
            };
            let batch = match next {
                None | Some(Ok(None)) => break None,
                Some(Err(e)) => break Some(e),
                Some(Ok(Some(batch))) => batch,
            };
            status.in_flight.fetch_add(batch.len(), Ordering::Relaxed);
            let size = batch.len();
            // One span for the batch, its settlement included (`pipeline/spans.rs`).
            let span = pipeline.batch_span(&name, size);
            let dispositions = pipeline.process_in(&span, &name, batch).await;
            let settled = source.settle(&dispositions).instrument(span).await;
            status.in_flight.fetch_sub(size, Ordering::Relaxed);
            if let Err(e) = settled {
                break Some(e);
            }
            status.batch_done(pipeline.group().as_str(), &dispositions);
            if dispositions.contains(&Disposition::Redeliver) {
                if !pause.sleep(&shutdown).await {
                    break None;
                }
            } else {
                pause.reset();
            }
        };
        source.stop().await;
        status.running_workers.fetch_sub(1, Ordering::Relaxed);
        if let Some(e) = error {
            tracing::warn!(worker = %name, error = %e, "source failed; reconnecting");
            status.set_error(&e);
            if !pause.sleep(&shutdown).await {
                break;
            }
        }
    }
}
