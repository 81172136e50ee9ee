//! When a leased effect starts ([`LeaseGuard::effect_starts`](crate::handler::LeaseGuard::effect_starts)):
//! the engine's part, for one batch of leased claims.
//!
//! A call that has not started when its handler is paused (circuit breaker, 410, operator) is
//! not made: its claim is given back without counting and its delivery held like those the
//! routing step holds (DESIGN.md, "Pause and circuit breaker"). The batch's probe goes on.
//!
//! And a record's effect is marked started (`effect_started`) durably before it starts, so that
//! after a crash the records whose call never started are told apart from those whose call may
//! have reached the far side (DESIGN.md, "Two handler modes"): the first claim of an unmarked
//! record whose lease expired takes it over whatever its `on_lease_expiry`. The claim marks the
//! records whose effect starts at once (all of them for a handler without a concurrency limit,
//! the first `concurrency` of a batch for one with a limit); the others are marked in waves, one
//! statement for the next `concurrency` of them when the first of those is about to start. A
//! record is thus marked before its effect starts, and at most one wave ahead of it.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use async_trait::async_trait;

use crate::handler::{EffectStart, HandlerError};
use crate::pause::Pauses;
use crate::store::postgres::PgStore;
use crate::store::{ClaimedRecord, DedupStore};

/// The claims of one batch whose effects wait for a slot, and how far they are marked.
pub(super) struct Starts {
    store: PgStore,
    pauses: Arc<Pauses>,
    /// The claims the claim statement did not mark, in claim order, each with its wave's size
    /// (its handler's concurrency).
    waiting: Vec<(ClaimedRecord, usize)>,
    /// Record id → its place in `waiting`.
    place: HashMap<i64, usize>,
    /// One wave statement at a time; the runs that need the next wave wait for it.
    marks: tokio::sync::Mutex<Marks>,
}

/// How far the waiting claims are marked.
#[derive(Default)]
struct Marks {
    /// `waiting[..upto]` went through a wave statement.
    upto: usize,
    /// Of those, the ones it found held (marked).
    marked: HashSet<i64>,
}

impl Starts {
    /// The batch's claims that wait for a slot (`waiting`: each with its handler's concurrency),
    /// to be marked on `store`, paused by `pauses`.
    pub(super) fn new(store: PgStore, pauses: Arc<Pauses>, waiting: Vec<(ClaimedRecord, usize)>) -> Arc<Self> {
        let place = waiting.iter().enumerate().map(|(at, (claim, _))| (claim.id, at)).collect();
        Arc::new(Self { store, pauses, waiting, place, marks: tokio::sync::Mutex::default() })
    }

    /// The hook of one claim's guard: `probe` says whether it is its paused handler's probe.
    pub(super) fn of(self: &Arc<Self>, claim: &ClaimedRecord, message_type: &str, probe: bool) -> Arc<dyn EffectStart> {
        Arc::new(Start { starts: self.clone(), record: claim.id, message_type: message_type.to_owned(), probe })
    }

    /// Makes sure `record` is marked: marked by its claim, or by a wave, this one's if it is
    /// the first of its wave to start. Errors: [`HandlerError::lease_lost`] when the wave did
    /// not find it held; a retryable failure when the wave could not be written.
    async fn mark(&self, record: i64) -> Result<(), HandlerError> {
        let Some(&at) = self.place.get(&record) else { return Ok(()) };
        let mut marks = self.marks.lock().await;
        if at >= marks.upto {
            let size = self.waiting[at].1.max(1);
            let end = (at + 1).max(marks.upto + size).min(self.waiting.len());
            let wave: Vec<&ClaimedRecord> = self.waiting[marks.upto..end].iter().map(|(claim, _)| claim).collect();
            let unmarked = |e: &dyn std::fmt::Display| {
                HandlerError::retryable(
                    "EFFECT_START_UNRECORDED",
                    format!("the effect was not started: marking it started failed: {e}"),
                )
            };
            let mut conn = self.store.pool().acquire().await.map_err(|e| unmarked(&e))?;
            let held = self.store.mark_effects_started(&mut conn, &wave).await.map_err(|e| unmarked(&e))?;
            marks.marked.extend(held);
            marks.upto = end;
        }
        if marks.marked.contains(&record) { Ok(()) } else { Err(HandlerError::lease_lost()) }
    }
}

/// One claim's [`EffectStart`].
struct Start {
    starts: Arc<Starts>,
    record: i64,
    message_type: String,
    probe: bool,
}

#[async_trait]
impl EffectStart for Start {
    async fn starts(&self) -> Result<(), HandlerError> {
        if !self.probe && self.starts.pauses.is_paused(&self.message_type).await {
            return Err(HandlerError::held());
        }
        self.starts.mark(self.record).await
    }
}
