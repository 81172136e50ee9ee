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
//! the first `concurrency` of a batch for one with a limit); the others are marked in waves of
//! the next `concurrency` in claim order, one statement each, written when the first call of
//! the wave is about to start (the wave's other calls that arrive meanwhile wait for it). A
//! record is thus marked before its effect starts, and at a crash at most one wave is marked
//! without having started. Not marked ahead in the background: a wave marked ahead would park
//! records whose calls never started.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use async_trait::async_trait;

use crate::handler::{EffectStart, HandlerError};
use crate::pause::Pauses;
use crate::store::postgres::PgStore;
use crate::store::{ClaimedRecord, DedupStore, LeaseStore, StoreError};

/// The claims of one batch whose effects wait for a slot, in waves, and how far they are marked.
pub(super) struct Starts {
    store: PgStore,
    pauses: Arc<Pauses>,
    /// The claims the claim statement did not mark, in claim order, cut in waves.
    waves: Vec<Vec<ClaimedRecord>>,
    /// Record id → its wave.
    wave_of: HashMap<i64, usize>,
    /// One wave statement at a time; the calls that need a wave wait for it.
    marks: tokio::sync::Mutex<Marks>,
}

/// How far the waves are marked.
#[derive(Default)]
struct Marks {
    /// `waves[..done]` went through their statements.
    done: usize,
    /// The records those found held (marked).
    marked: HashSet<i64>,
}

impl Starts {
    /// The batch's claims that wait for a slot (`waiting`, in claim order, each with its
    /// handler's concurrency: the size of its wave), to be marked on `store`, paused by `pauses`.
    pub(super) fn new(store: PgStore, pauses: Arc<Pauses>, waiting: Vec<(ClaimedRecord, usize)>) -> Arc<Self> {
        let mut waves: Vec<Vec<ClaimedRecord>> = Vec::new();
        for (claim, size) in waiting {
            match waves.last_mut() {
                Some(wave) if wave.len() < size.max(1) => wave.push(claim),
                _ => waves.push(vec![claim]),
            }
        }
        let wave_of = waves.iter().enumerate().flat_map(|(w, wave)| wave.iter().map(move |c| (c.id, w))).collect();
        Arc::new(Self { store, pauses, waves, wave_of, marks: tokio::sync::Mutex::default() })
    }

    /// The hook of one claim's guard: `probe` says whether it is its paused handler's probe.
    pub(super) fn of(self: &Arc<Self>, claim: &ClaimedRecord, message_type: &str, probe: bool) -> Arc<dyn EffectStart> {
        Arc::new(Start { starts: self.clone(), record: claim.id, message_type: message_type.to_owned(), probe })
    }

    /// Makes sure `record` is marked: by its claim, or by its wave (written now if it is not
    /// yet). Errors: [`HandlerError::lease_lost`] when its wave did not find it held; a
    /// retryable failure when its wave could not be written.
    async fn mark(&self, record: i64) -> Result<(), HandlerError> {
        let Some(&wave) = self.wave_of.get(&record) else { return Ok(()) };
        let mut marks = self.marks.lock().await;
        self.mark_through(&mut marks, wave).await.map_err(|e| {
            HandlerError::retryable(
                "EFFECT_START_UNRECORDED",
                format!("the effect was not started: marking it started failed: {e}"),
            )
        })?;
        if marks.marked.contains(&record) { Ok(()) } else { Err(HandlerError::lease_lost()) }
    }

    /// Marks the waves up to `wave` that are not marked yet, in one statement (more than one
    /// only when a later wave's call starts first).
    async fn mark_through(&self, marks: &mut Marks, wave: usize) -> Result<(), StoreError> {
        if marks.done > wave {
            return Ok(());
        }
        let claims: Vec<&ClaimedRecord> = self.waves[marks.done..=wave].iter().flatten().collect();
        let mut conn = self.store.pool().acquire().await?;
        marks.marked.extend(self.store.mark_effects_started(&mut conn, &claims).await?);
        marks.done = wave + 1;
        Ok(())
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
