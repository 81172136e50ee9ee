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
//! the next `concurrency` in claim order, one statement each. A wave's statement is written
//! when its turn comes — every run of the wave before it has started or returned — by the
//! first of its calls to ask ([`LeaseGuard::effect_due`](crate::handler::LeaseGuard::effect_due),
//! which a handler calls before it waits for a slot of its own, so that no slot is held while
//! a mark commits; or `effect_starts`, which marks at once). A record is thus marked before its
//! effect starts, and at a crash at most one wave is marked without having started. Not
//! marked further ahead: a wave marked ahead would park records whose calls never started.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use tokio::sync::Notify;

use crate::handler::{EffectStart, HandlerError};
use crate::pause::Pauses;
use crate::store::PipelineStore;
use crate::store::{ClaimedRecord, StoreError};

/// The claims of one batch whose handlers limit their runs, in groups: the first marked by the
/// claim statement, then waves, marked one statement each.
pub(super) struct Starts<S> {
    store: S,
    pauses: Arc<Pauses>,
    /// The claims in claim order: `groups[0]` the ones the claim statement marked, then the
    /// waves.
    groups: Vec<Vec<ClaimedRecord>>,
    /// Record id → its group.
    group_of: HashMap<i64, usize>,
    /// One wave statement at a time; the calls that need a wave wait for it.
    marks: tokio::sync::Mutex<Marks>,
    /// Which runs started or returned, per group.
    moved: Mutex<Moved>,
    /// Woken when a whole group has moved: the next wave's turn.
    turn: Notify,
}

/// How far the groups are marked.
struct Marks {
    /// `groups[..done]` are marked (the first by the claim).
    done: usize,
    /// The records the wave statements found held (marked).
    marked: HashSet<i64>,
}

/// The runs that started or returned.
#[derive(Default)]
struct Moved {
    /// Per group, how many.
    count: Vec<usize>,
    /// Which.
    records: HashSet<i64>,
}

impl<S: PipelineStore> Starts<S> {
    /// The batch's claims whose handler limits its runs: `first`, marked by the claim
    /// statement, and `waiting` (in claim order, each with its handler's concurrency: the size
    /// of its wave), to be marked on `store`, paused by `pauses`.
    pub(super) fn new(
        store: S,
        pauses: Arc<Pauses>,
        first: Vec<ClaimedRecord>,
        waiting: Vec<(ClaimedRecord, usize)>,
    ) -> Arc<Self> {
        let mut waves: Vec<Vec<ClaimedRecord>> = Vec::new();
        for (claim, size) in waiting {
            match waves.last_mut() {
                Some(wave) if wave.len() < size.max(1) => wave.push(claim),
                _ => waves.push(vec![claim]),
            }
        }
        let groups: Vec<Vec<ClaimedRecord>> = std::iter::once(first).chain(waves).collect();
        let group_of = groups.iter().enumerate().flat_map(|(g, group)| group.iter().map(move |c| (c.id, g))).collect();
        let moved = Moved { count: vec![0; groups.len()], records: HashSet::new() };
        Arc::new(Self {
            store,
            pauses,
            groups,
            group_of,
            marks: tokio::sync::Mutex::new(Marks { done: 1, marked: HashSet::new() }),
            moved: Mutex::new(moved),
            turn: Notify::new(),
        })
    }

    /// The hook of one claim's guard: `probe` says whether it is its paused handler's probe.
    pub(super) fn of(self: &Arc<Self>, claim: &ClaimedRecord, message_type: &str, probe: bool) -> Arc<dyn EffectStart> {
        Arc::new(Start { starts: self.clone(), record: claim.id, message_type: message_type.to_owned(), probe })
    }

    /// Makes sure `record` is marked: by its claim, or by its wave (written now if it is not
    /// yet). Errors: [`HandlerError::lease_lost`] when its wave did not find it held; a
    /// retryable failure when its wave could not be written.
    async fn mark(&self, record: i64) -> Result<(), HandlerError> {
        let Some(&group) = self.group_of.get(&record) else { return Ok(()) };
        if group == 0 {
            return Ok(());
        }
        let mut marks = self.marks.lock().await;
        self.mark_through(&mut marks, group).await.map_err(|e| {
            HandlerError::retryable(
                "EFFECT_START_UNRECORDED",
                format!("the effect was not started: marking it started failed: {e}"),
            )
        })?;
        if marks.marked.contains(&record) { Ok(()) } else { Err(HandlerError::lease_lost()) }
    }

    /// [`Starts::mark`], once the turn of `record`'s wave has come: every run of the group
    /// before it started or returned.
    async fn mark_in_turn(&self, record: i64) -> Result<(), HandlerError> {
        let Some(&group) = self.group_of.get(&record) else { return Ok(()) };
        loop {
            let turn = self.turn.notified();
            tokio::pin!(turn);
            turn.as_mut().enable();
            let previous_moved = group == 0 || {
                let moved = self.moved.lock().unwrap_or_else(|e| e.into_inner());
                moved.count[group - 1] >= self.groups[group - 1].len()
            };
            if previous_moved || self.marks.lock().await.done > group {
                return self.mark(record).await;
            }
            turn.await;
        }
    }

    /// Notes that `record`'s run started or returned (once); wakes the next wave when its group
    /// has all moved.
    fn moved(&self, record: i64) {
        let Some(&group) = self.group_of.get(&record) else { return };
        let mut moved = self.moved.lock().unwrap_or_else(|e| e.into_inner());
        if moved.records.insert(record) {
            moved.count[group] += 1;
            if moved.count[group] == self.groups[group].len() {
                self.turn.notify_waiters();
            }
        }
    }

    /// Marks the waves up to `wave` that are not marked yet, in one statement (more than one
    /// only when a later wave's call starts first).
    async fn mark_through(&self, marks: &mut Marks, wave: usize) -> Result<(), StoreError> {
        if marks.done > wave {
            return Ok(());
        }
        let claims: Vec<&ClaimedRecord> = self.groups[marks.done..=wave].iter().flatten().collect();
        let mut conn = self.store.pool().acquire().await?;
        marks.marked.extend(self.store.mark_effects_started(&mut conn, &claims).await?);
        marks.done = wave + 1;
        Ok(())
    }
}

/// One claim's [`EffectStart`].
struct Start<S> {
    starts: Arc<Starts<S>>,
    record: i64,
    message_type: String,
    probe: bool,
}

#[async_trait]
impl<S: PipelineStore> EffectStart for Start<S> {
    async fn due(&self) -> Result<(), HandlerError> {
        self.starts.mark_in_turn(self.record).await
    }

    async fn starts(&self) -> Result<(), HandlerError> {
        if !self.probe && self.starts.pauses.is_paused(&self.message_type).await {
            return Err(HandlerError::held());
        }
        self.starts.mark(self.record).await?;
        self.starts.moved(self.record);
        Ok(())
    }

    fn finished(&self) {
        self.starts.moved(self.record);
    }
}
