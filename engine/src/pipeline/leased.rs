//! Leased handlers: claims committed first (with a lease and an open attempt row), then the
//! external effects while one heartbeat extends the leases, then completions fenced by the
//! lease token. A worker whose lease was taken over cannot complete.
//!
//! A batch's leased messages are claimed in one set-based statement ([`ClaimAs::Leased`]). Every
//! claimed message's call starts at once; a handler with a concurrency limit (the HTTP handler's
//! `concurrency`) lets them through as its slots free up, so the batch (at most the prefetch) is
//! the bound. Right before each effect starts, `starts.rs` holds it if its handler was paused
//! meanwhile (the claim is given back uncounted, the delivery held) and makes sure its record
//! is marked started (in the claim, or in one statement per wave). Calls finish in any order:
//! whatever has finished is completed in one statement while the others still run, so a slow
//! call holds back neither the calls nor the completions of the batch's other messages. The
//! dispositions — and so the acks — follow the commits.
//!
//! A failed call of a paused handler's probe spends no attempt: given back like a 409, and held
//! for the probe interval (DESIGN.md, "Pause and circuit breaker").
//!
//! One heartbeat statement every third of the lease extends the leases of all the worker's
//! in-flight records ([`LeaseStore::extend_leases`]). Each handler gets a [`LeaseGuard`]: lost
//! when the heartbeat finds its lease taken over, or when no extension was confirmed within the
//! lease (this worker may have been frozen). The engine checks it before calling the handler;
//! the handler checks it right before its effect. A handler that stopped because the lease was
//! lost ([`HandlerError::lease_lost`]) did nothing, so its attempt is recorded as a failure like
//! any other, fenced by the lease token: retried when the record is still this worker's, left
//! alone when someone else holds it. A call that succeeded after its lease was lost completes
//! nothing: its late answer is kept on its attempt as `lease_lost` (a late effect).

mod settle;

use crate::store::PipelineStore;
use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::stream::{FuturesUnordered, StreamExt};
use futures::FutureExt;
use tracing::Instrument;

use super::starts::Starts;
use super::transactional::DEADLOCK_RERUNS;
use super::tally::Tally;
use super::{Disposition, Outcome, Pipeline, Routed};
use crate::handler::{EffectAnswer, Handler, HandlerError, HandlerInput, LeaseGuard};
use crate::record::HandlerMode;
use crate::stats::Event;
use crate::store::{
    ClaimAs, ClaimBatch, ClaimOutcome, ClaimedRecord, Lease,
    StoreError,
};


/// The records a worker's heartbeat keeps leased: the claims whose call has not finished, with
/// their guards, by record id.
type InFlight = Arc<Mutex<HashMap<i64, (ClaimedRecord, LeaseGuard)>>>;

/// Aborts the heartbeat when the batch ends — also when its future is dropped (a worker
/// cancelled mid-batch): its leases then run out, as after a crash.
struct Heartbeat(tokio::task::JoinHandle<()>);

impl Drop for Heartbeat {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// How long the completions of a batch's finished calls wait for more calls to finish after the
/// first: calls that answer at once (an HTTP service on the same network) then complete in one
/// statement, not in one statement each as they come in; a slow call's completion waits no
/// more than this. With an HTTP handler answering at once, batches of 50 went from several
/// completion statements each to about one (BENCHMARKS.md, "Leased and HTTP handlers").
const COMPLETION_LINGER: Duration = Duration::from_millis(20);

/// A claimed message whose handler has returned.
struct Finished<'r, 'a> {
    item: &'r Routed<'a>,
    claim: ClaimedRecord,
    result: Result<(), HandlerError>,
    answer: Option<EffectAnswer>,
}

impl<S: PipelineStore> Pipeline<S> {
    /// Claims `items` in one statement, runs the claimed ones' handlers concurrently under one
    /// heartbeat, and completes or fails them as they finish. One outcome per item.
    pub(super) async fn run_leased(&self, worker: &str, items: Vec<Routed<'_>>) -> Vec<Outcome> {
        if items.is_empty() {
            return Vec::new();
        }
        let group = self.settings.group.as_str();
        let lease = Lease::new(worker, self.settings.lease);
        // The database starts the leases after this instant: counting from here errs on the safe side.
        let asked_at = Instant::now();
        let at_once = Self::starts_at_once(&items);
        let mut claimed = self.claim_leased(&lease, &items, &at_once).await;
        // The claim (one transaction) may be a deadlock victim of another worker's overlapping
        // batch (MySQL's next-key locks) or completions (locked in the order their calls
        // finished), and nothing of it stays: claim again.
        let mut reruns = 0;
        while reruns < DEADLOCK_RERUNS && matches!(&claimed, Err(e) if e.is_deadlock()) {
            reruns += 1;
            self.count_deadlock();
            claimed = self.claim_leased(&lease, &items, &at_once).await;
        }
        let claims = match claimed {
            Ok(claims) => claims,
            Err(e) => {
                tracing::warn!(error = %e, count = items.len(), "leased claims failed; redelivering");
                return items.iter().map(|item| (item.index, Disposition::Redeliver, None)).collect();
            }
        };
        let mut outcomes = Vec::with_capacity(items.len());
        let mut tally = Tally::default();
        let in_flight: InFlight = Arc::default();
        let mut claimed = Vec::with_capacity(items.len());
        let (mut first, mut waiting) = (Vec::new(), Vec::new());
        let mut conflicts = Vec::new();
        for ((item, claim), at_once) in items.iter().zip(claims).zip(at_once) {
            let claim = match claim {
                ClaimOutcome::Existing(existing) => {
                    // Nothing to roll back here: the judgement is final.
                    let disposition = self.judge_existing(item.identified.id.as_str(), &existing, &mut tally);
                    if let Some(copy) = self.conflict_copy(item, &existing, &disposition) {
                        conflicts.push((item.index, copy));
                    }
                    outcomes.push((item.index, disposition, None));
                    continue;
                }
                ClaimOutcome::Claimed(claim) => claim,
            };
            tally.count(Event::Claimed);
            if claim.created {
                tally.count(Event::Created);
                self.check_late(item.message, &mut tally);
            }
            if claim.took_over {
                tally.count(Event::LeaseTakeover);
                let why = if item.handler.reclaims_expired() {
                    "on_lease_expiry = reclaim"
                } else {
                    "its effect had not started"
                };
                tracing::warn!(message_id = %item.identified.id, attempt = claim.attempt, why, "expired lease taken over");
            }
            match item.handler.concurrency() {
                Some(concurrency) if !at_once => waiting.push((claim.clone(), concurrency)),
                Some(_) => first.push(claim.clone()),
                None => {}
            }
            claimed.push((item, claim));
        }
        // Copies first: a delivery whose copy could not be kept goes back unacknowledged.
        self.keep_conflicts(&conflicts, &mut outcomes).await;
        tally.apply(&self.stats, group);
        if claimed.is_empty() {
            return outcomes;
        }
        let starts = Starts::new(self.store.clone(), self.pauses.clone(), first, waiting);
        let mut calls = FuturesUnordered::new();
        for (item, claim) in claimed {
            let start = starts.of(&claim, &item.identified.message_type, item.probe);
            let guard = LeaseGuard::new(lease.duration, asked_at).with_start(start);
            in_flight.lock().unwrap_or_else(|e| e.into_inner()).insert(claim.id, (claim.clone(), guard.clone()));
            calls.push(self.call_leased(item, claim, guard));
        }

        // In the batch's span, so that the lease extensions show under the batch.
        let _heartbeat = Heartbeat(tokio::spawn(
            self.clone().extend_leases_while_running(in_flight.clone(), lease.clone()).in_current_span(),
        ));
        // Finished calls wait here while a settlement runs, or for COMPLETION_LINGER after the
        // first of them; the next settlement takes them all.
        let mut finished = Vec::new();
        let mut settle_at: Option<tokio::time::Instant> = None;
        let mut settling = FuturesUnordered::new();
        loop {
            let due = calls.is_empty() || settle_at.is_some_and(|at| at <= tokio::time::Instant::now());
            if settling.is_empty() && !finished.is_empty() && due {
                settling.push(self.settle_leased(&lease, std::mem::take(&mut finished)));
                settle_at = None;
            }
            let lingering = settling.is_empty() && !finished.is_empty();
            tokio::select! {
                Some(done) = calls.next() => {
                    if finished.is_empty() {
                        settle_at = Some(tokio::time::Instant::now() + COMPLETION_LINGER);
                    }
                    finished.push(done);
                    // Whatever else has finished by now goes into the same statement.
                    while let Some(Some(done)) = calls.next().now_or_never() {
                        finished.push(done);
                    }
                    let mut held = in_flight.lock().unwrap_or_else(|e| e.into_inner());
                    for done in &finished {
                        held.remove(&done.claim.id);
                    }
                }
                Some(settled) = settling.next() => outcomes.extend(settled),
                () = tokio::time::sleep_until(settle_at.unwrap_or_else(tokio::time::Instant::now)), if lingering => {}
                else => break,
            }
        }
        outcomes
    }

    /// For each of `items`, whether its effect starts as soon as it is claimed: always for a
    /// handler without a concurrency limit; for one with a limit, the first `concurrency` of
    /// its type in the batch. The claim marks those started; the others are marked in waves
    /// right before they start (`starts.rs`).
    fn starts_at_once(items: &[Routed<'_>]) -> Vec<bool> {
        let mut seen: HashMap<&str, usize> = HashMap::new();
        items
            .iter()
            .map(|item| match item.handler.concurrency() {
                None => true,
                Some(concurrency) => {
                    let before = seen.entry(item.identified.message_type.as_str()).or_default();
                    *before += 1;
                    *before <= concurrency
                }
            })
            .collect()
    }

    /// The claims of `items`, in their order: one statement per round of distinct message ids
    /// (a message id twice in a batch is judged the second time after the first was claimed),
    /// all in one transaction. A claim that fails anywhere (a round, the duplicate check after
    /// the claim statement, the commit) claims nothing: committed alone, the claims before the
    /// failure would stay marked started without their calls, and their redeliveries would be
    /// parked under `hold` once the leases ran out (a CI run parked 3 SMS so). In the
    /// transaction the claim statement locks every row it meets in message-id order, so the
    /// duplicate check takes no lock of its own.
    async fn claim_leased(
        &self,
        lease: &Lease,
        items: &[Routed<'_>],
        at_once: &[bool],
    ) -> Result<Vec<ClaimOutcome>, StoreError> {
        let mut tx = self.store.pool().begin().await?;
        let mut claims: Vec<Option<ClaimOutcome>> = vec![None; items.len()];
        let position: HashMap<usize, usize> = items.iter().enumerate().map(|(at, item)| (item.index, at)).collect();
        for round in Self::rounds(items) {
            let batch = ClaimBatch {
                group: &self.settings.group,
                max_attempts: self.settings.max_attempts,
                lease,
                claim_as: ClaimAs::Leased,
                items: round.iter().map(|r| r.claim_item(at_once[position[&r.index]])).collect(),
            };
            for (item, claim) in round.iter().zip(self.store.claim_many(&mut tx, &batch).await?) {
                claims[position[&item.index]] = Some(claim);
            }
        }
        tx.commit().await?;
        Ok(claims.into_iter().map(|c| c.expect("every item is in one round")).collect())
    }

    /// Calls the handler of one claimed message, unless its lease is lost already. A handler
    /// without a concurrency limit starts its effect at once: the engine asks
    /// [`LeaseGuard::effect_starts`] for it; one with a limit asks when its run has its slot.
    async fn call_leased<'r, 'a>(
        &self,
        item: &'r Routed<'a>,
        claim: ClaimedRecord,
        guard: LeaseGuard,
    ) -> Finished<'r, 'a> {
        let Handler::Leased { handler, .. } = &item.handler else { unreachable!("partitioned by mode") };
        let call = async {
            if handler.concurrency().is_some() {
                guard.check()?;
            } else {
                guard.effect_starts().await?;
            }
            let input =
                HandlerInput { calls: claim.calls, previous_status: claim.previous_status, ..self.input(item, claim.attempt) };
            handler.handle(&input, &guard).await
        };
        let result = Self::call_handler(item, claim.attempt, HandlerMode::Leased, call).await;
        if let Err(error) = &result
            && error.is_lease_lost()
        {
            let group = self.settings.group.as_str();
            metrics::counter!("dedup_lease_lost_before_effect_total", "group" => group.to_owned()).increment(1);
            tracing::warn!(message_id = %item.identified.id, attempt = claim.attempt, "lease lost before the effect; the effect was not performed");
        }
        guard.finished();
        Finished { item, claim, result, answer: guard.take_answer() }
    }

    /// The worker's heartbeat: every third of the lease, one statement (bounded by that third)
    /// extends the leases of all records in `in_flight`, telling each guard of its confirmed
    /// extension. A record the
    /// statement no longer finds held (taken over or released) has its guard lost and leaves
    /// the set (the fenced completion will refuse it). Runs until aborted.
    async fn extend_leases_while_running(self, in_flight: InFlight, lease: Lease) {
        let period = lease.duration / 3;
        loop {
            tokio::time::sleep(period).await;
            let held: Vec<(ClaimedRecord, LeaseGuard)> =
                in_flight.lock().unwrap_or_else(|e| e.into_inner()).values().cloned().collect();
            if held.is_empty() {
                continue;
            }
            let asked_at = Instant::now();
            let claims: Vec<&ClaimedRecord> = held.iter().map(|(claim, _)| claim).collect();
            // Bounded by the period: a heartbeat the database does not answer in time is
            // abandoned and its connection closed (not returned to the pool, where it would wait
            // for the statement), and the guards count from the last confirmed extension.
            let deadline = tokio::time::Instant::now() + period;
            let extended = match tokio::time::timeout_at(deadline, self.store.pool().acquire()).await {
                Ok(Ok(mut conn)) => {
                    match tokio::time::timeout_at(deadline, self.store.extend_leases(&mut conn, &claims, &lease)).await {
                        Ok(extended) => extended.map_err(|e| e.to_string()),
                        Err(_) => {
                            conn.close_on_drop();
                            Err(format!("no answer within {period:?}"))
                        }
                    }
                }
                Ok(Err(e)) => Err(e.to_string()),
                Err(_) => Err(format!("no connection within {period:?}")),
            };
            let extended: HashSet<i64> = match extended {
                Ok(ids) => ids.into_iter().collect(),
                Err(error) => {
                    tracing::warn!(count = held.len(), error, "extending the leases failed; will retry");
                    continue;
                }
            };
            for (claim, guard) in &held {
                if extended.contains(&claim.id) {
                    guard.extended(lease.duration, asked_at);
                } else {
                    guard.lose();
                    in_flight.lock().unwrap_or_else(|e| e.into_inner()).remove(&claim.id);
                    tracing::warn!(record = claim.id, "lease lost while the handler runs");
                }
            }
        }
    }
}
