//! What a seed run asks of a database ([`SeedBooks`]): ids reserved for its records, and the
//! load of the rows generated here ([`SeedRun`]) with their counts and aggregates. Each
//! database's statements are in `store/<database>/seed.rs`.

use std::time::Instant;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use tokio::sync::mpsc::Receiver;
use tokio::task::JoinHandle;

use super::rows::{Chunk, Plan, SeedRows};
use super::totals::Totals;
use crate::console::QueryError;

/// A database's side of a seed run ([`super::seed_records`]), implemented on the pool types.
#[async_trait]
pub trait SeedBooks: Send + Sync {
    /// Reserves `n` consecutive ids of `dedup_records` in a short transaction of its own: the
    /// engine's inserts, now and later, take ids past them. Returns the first, and when the
    /// first sighting of the record before it (the newest), read under the same lock. A run that
    /// fails later leaves them unused.
    async fn seed_reserve_ids(&self, n: i64) -> Result<(i64, Option<DateTime<Utc>>), sqlx::Error>;

    /// Loads the run: its records and attempts ([`SeedRun`]), their counts in `record_counts`
    /// and `message_types` (as the engine's inserts count theirs), the aggregates
    /// (`stats_minute`, `stats_hour`, `duplicate_delays`), the window's `table_samples`, and
    /// fresh planner statistics.
    async fn seed_load(&self, run: SeedRun<'_>) -> Result<(), QueryError>;
}

/// A seed run as a store loads it: the reserved ids, the window, and its rows generated on a
/// blocking thread (`SeedRun::rows`, crate-internal).
pub struct SeedRun<'a> {
    pub(super) plan: Plan,
    /// Records in the run.
    pub(super) records: u64,
    /// Records per generated chunk.
    pub(super) batch: u64,
    pub(super) progress: &'a (dyn Fn(u64, u64) + Sync),
    /// When the phase under way started.
    pub(super) phase_started: Instant,
}

impl std::fmt::Debug for SeedRun<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SeedRun").field("first", &self.plan.first).field("records", &self.records).finish()
    }
}

impl<'a> SeedRun<'a> {
    /// The run's first id.
    pub(crate) fn first(&self) -> i64 {
        self.plan.first
    }

    /// The run's last id.
    pub(crate) fn last(&self) -> i64 {
        self.plan.first + self.records as i64 - 1
    }

    /// The window's start: the samples from there on are the run's to rebuild.
    pub(crate) fn start(&self) -> DateTime<Utc> {
        self.plan.start
    }

    /// The run's groups' names, by index (as the totals count them).
    pub(crate) fn group_names(&self) -> Vec<String> {
        self.plan.group_names()
    }

    /// Logs how long the phase that ends now took (`RUST_LOG=info`).
    pub(crate) fn phase_done(&mut self, phase: &str) {
        tracing::info!(phase, ms = self.phase_started.elapsed().as_millis() as u64, "seed phase done");
        self.phase_started = Instant::now();
    }

    /// Starts generating the run's rows, in chunks of the run's batch size, each written into
    /// a fresh `make(records in the chunk)`, one or two chunks ahead of the load.
    pub(crate) fn rows<E: SeedRows>(&self, make: impl Fn(usize) -> E + Send + 'static) -> RowStream<'a, E> {
        let (plan, last, batch) = (self.plan.clone(), self.last(), self.batch as i64);
        let (sender, chunks) = tokio::sync::mpsc::channel::<Chunk<E>>(2);
        let generator = tokio::task::spawn_blocking(move || {
            let mut totals = Totals::default();
            for lo in (plan.first..=last).step_by(batch as usize) {
                let hi = (lo + batch - 1).min(last);
                // Closed when the load failed: stop.
                if sender.blocking_send(plan.chunk(lo, hi, make((hi - lo + 1) as usize), &mut totals)).is_err() {
                    break;
                }
            }
            totals
        });
        RowStream { chunks, generator, progress: self.progress, total: self.records, done: 0, handed: 0 }
    }
}

/// The chunks of a run as they are generated ([`SeedRun::rows`]).
pub(crate) struct RowStream<'a, E> {
    chunks: Receiver<Chunk<E>>,
    generator: JoinHandle<Totals>,
    progress: &'a (dyn Fn(u64, u64) + Sync),
    total: u64,
    /// Records loaded.
    done: u64,
    /// Records of the chunk handed out last (loaded once the next is asked for).
    handed: u64,
}

impl<E> RowStream<'_, E> {
    /// The next chunk, once generated; `None` after the last. Asking for it reports the one
    /// before as loaded.
    pub(crate) async fn next(&mut self) -> Option<Chunk<E>> {
        self.loaded();
        let chunk = self.chunks.recv().await?;
        self.handed = chunk.count;
        Some(chunk)
    }

    /// The aggregates of the rows generated, once the last chunk is loaded.
    pub(crate) async fn finish(mut self) -> Result<Totals, QueryError> {
        self.loaded();
        drop(self.chunks);
        self.generator.await.map_err(|e| QueryError::BadFilter(format!("generating rows failed: {e}")))
    }

    fn loaded(&mut self) {
        if self.handed > 0 {
            self.done += std::mem::take(&mut self.handed);
            (self.progress)(self.done, self.total);
        }
    }
}
