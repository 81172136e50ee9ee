//! Settling a batch's finished leased calls: completions in one statement, calls held before
//! they started given back, failures recorded one by one, all fenced by the lease token; late
//! effects noted on their attempts (the module above has the rules).

use crate::store::PipelineStore;
use crate::store::roles::Conn;
use sqlx::pool::PoolConnection;
use std::collections::HashSet;
use std::time::Duration;

use super::Finished;
use crate::handler::HandlerError;
use crate::pipeline::{AckReason, Disposition, Outcome, Pipeline};
use crate::record::HandlerMode;
use crate::stats::Event;
use crate::store::{ClaimedRecord, FailureOutcome, FailureReport, Lease, StoreError};

impl<S: PipelineStore> Pipeline<S> {
    /// Records what became of `finished` calls: the successes completed in one statement, the
    /// calls held before they started given back in one statement per type, the failures each
    /// recorded (fenced by the lease token); a connection and each of these statements are
    /// asked for again for half a lease from now ([`Tries`]). Calls whose outcome is unknown
    /// record nothing when their handler is under `hold`; under `reclaim`, which allows running
    /// the effect again, they are failures like any other (counted, so they end in a dead
    /// letter).
    pub(super) async fn settle_leased(&self, lease: &Lease, finished: Vec<Finished<'_, '_>>) -> Vec<Outcome> {
        let (unknown, finished): (Vec<_>, Vec<_>) = finished.into_iter().partition(|f| {
            !f.item.handler.reclaims_expired() && f.result.as_ref().is_err_and(HandlerError::is_outcome_unknown)
        });
        let mut outcomes = Vec::with_capacity(unknown.len() + finished.len());
        outcomes.extend(unknown.iter().map(|f| self.outcome_unknown(lease, f)));
        // The calls ran: recording them is worth waiting for a database that restarts.
        let deadline = tokio::time::Instant::now() + lease.duration / 2;
        let Some(mut conn) = self.connection_until(deadline).await else {
            // The effects may have happened; the records stay processing and, once their
            // leases expire, stuck: an operator decides. The redeliveries are judged then.
            outcomes.extend(finished.iter().map(|f| (f.item.index, Disposition::Redeliver, None)));
            return outcomes;
        };
        let (succeeded, failed): (Vec<_>, Vec<_>) = finished.into_iter().partition(|f| f.result.is_ok());
        let (held, failed): (Vec<_>, Vec<_>) =
            failed.into_iter().partition(|f| f.result.as_ref().is_err_and(HandlerError::is_held));
        outcomes.extend(self.release_held(&mut conn, deadline, &held).await);
        if !succeeded.is_empty() {
            let done: Vec<_> = succeeded.iter().map(|f| (&f.claim, f.answer.as_ref())).collect();
            let mut tries = Tries::until(deadline);
            let completed = loop {
                match self.store.complete_many_leased(&mut conn, &done).await {
                    Err(e) if self.try_again(&mut tries, &mut conn, &e).await => {}
                    completed => break completed,
                }
            };
            match completed {
                Ok(completed) => {
                    let completed: HashSet<i64> = completed.into_iter().collect();
                    for f in &succeeded {
                        outcomes.push(if completed.contains(&f.claim.id) {
                            self.stats.count(self.settings.group.as_str(), Event::Succeeded, 1);
                            let marker = self.marker(f.item, f.claim.first_seen_at);
                            (f.item.index, Disposition::Ack(AckReason::Processed), Some(marker))
                        } else {
                            self.note_late_effect(&mut conn, f).await;
                            (f.item.index, Disposition::Ack(AckReason::LeaseLost), None)
                        });
                    }
                }
                Err(e) => {
                    tracing::warn!(error = %e, count = succeeded.len(), "completions failed; redelivering");
                    outcomes.extend(succeeded.iter().map(|f| (f.item.index, Disposition::Redeliver, None)));
                }
            }
        }
        for f in &failed {
            outcomes.push((f.item.index, self.record_leased_failure(&mut conn, lease, deadline, f).await, None));
        }
        outcomes
    }

    /// A connection of the pool, asked for again (a database that restarts refuses them for a
    /// moment) until `deadline`.
    async fn connection_until(&self, deadline: tokio::time::Instant) -> Option<sqlx::pool::PoolConnection<S::Db>> {
        let mut pause = Duration::from_millis(100);
        loop {
            match tokio::time::timeout_at(deadline, self.store.pool().acquire()).await {
                Ok(Ok(conn)) => return Some(conn),
                Ok(Err(_)) if tokio::time::Instant::now() + pause < deadline => {
                    tokio::time::sleep(pause).await;
                    pause = (pause * 2).min(Duration::from_secs(1));
                }
                _ => return None,
            }
        }
    }

    /// Whether to try a statement that failed with `error` again: after a pause, on a fresh
    /// connection (put in `conn`), while `tries` allow.
    async fn try_again(&self, tries: &mut Tries, conn: &mut PoolConnection<S::Db>, error: &StoreError) -> bool {
        if tokio::time::Instant::now() + tries.pause >= tries.deadline {
            return false;
        }
        tracing::warn!(error = %error, "recording what became of leased calls failed; trying again while the leases last");
        tokio::time::sleep(tries.pause).await;
        tries.pause = (tries.pause * 2).min(Duration::from_secs(1));
        let Some(fresh) = self.connection_until(tries.deadline).await else { return false };
        *conn = fresh;
        tries.again = true;
        true
    }

    /// A call whose effect may have happened ([`HandlerError::outcome_unknown`]) of a handler
    /// under `hold`: its record keeps the claim, and a copy comes back once the lease has
    /// expired, to be parked for an operator.
    fn outcome_unknown(&self, lease: &Lease, f: &Finished<'_, '_>) -> Outcome {
        let error = f.result.as_ref().err().map(ToString::to_string).unwrap_or_default();
        tracing::warn!(message_id = %f.item.identified.id, attempt = f.claim.attempt, error = %error,
            "the effect's outcome is unknown; the record keeps its claim until the lease expires");
        self.stats.count(self.settings.group.as_str(), Event::Retry, 1);
        (f.item.index, Disposition::Retry { delay: lease.duration }, None)
    }

    /// Gives back the claims of `held` calls, which never started because their handler was
    /// paused meanwhile: not counted, their deliveries held like those the routing step holds.
    async fn release_held(
        &self,
        conn: &mut PoolConnection<S::Db>,
        deadline: tokio::time::Instant,
        held: &[Finished<'_, '_>],
    ) -> Vec<Outcome> {
        let mut outcomes = Vec::with_capacity(held.len());
        let types: HashSet<&str> = held.iter().map(|f| f.item.identified.message_type.as_str()).collect();
        for message_type in types {
            let of_type: Vec<&Finished<'_, '_>> =
                held.iter().filter(|f| f.item.identified.message_type == message_type).collect();
            let delay = self.pauses.hold_for(message_type);
            let claims: Vec<&ClaimedRecord> = of_type.iter().map(|f| &f.claim).collect();
            let millis = i64::try_from(delay.as_millis()).unwrap_or(i64::MAX);
            let mut tries = Tries::until(deadline);
            let released = loop {
                match self.store.release_unstarted(conn, &claims, millis).await {
                    Err(e) if self.try_again(&mut tries, conn, &e).await => {}
                    released => break released,
                }
            };
            match released {
                Ok(released) => {
                    let released: HashSet<i64> = released.into_iter().collect();
                    self.pauses.count_held(message_type, released.len() as u64);
                    tracing::info!(message_type, count = released.len(),
                        "handler paused before these calls started; given back uncounted and held");
                    outcomes.extend(of_type.iter().map(|f| {
                        let disposition = if released.contains(&f.claim.id) {
                            Disposition::Held { delay }
                        } else if tries.again {
                            // An earlier try may have released it before its answer was lost:
                            // the record then waits as `failed` for this very delivery.
                            Disposition::Redeliver
                        } else {
                            Disposition::Ack(AckReason::LeaseLost)
                        };
                        (f.item.index, disposition, None)
                    }));
                }
                Err(e) => {
                    tracing::warn!(error = %e, count = claims.len(), "giving back held claims failed; redelivering");
                    outcomes.extend(of_type.iter().map(|f| (f.item.index, Disposition::Redeliver, None)));
                }
            }
        }
        outcomes
    }

    /// The effect ran, but the record is someone else's now (taken over, or released by an
    /// operator): it may run again there. Says so on its attempt, with the late answer.
    async fn note_late_effect(&self, conn: &mut Conn<S>, f: &Finished<'_, '_>) {
        let group = self.settings.group.as_str();
        metrics::counter!("dedup_late_effects_total", "group" => group.to_owned()).increment(1);
        tracing::warn!(message_id = %f.item.identified.id, attempt = f.claim.attempt,
            "lease lost before completion; the effect ran and may run twice");
        if let Err(e) = self.store.note_late_effect(conn, &f.claim, f.answer.as_ref()).await {
            tracing::warn!(error = %e, message_id = %f.item.identified.id, "flagging the late effect failed");
        }
    }

    /// Records a failed call: deferred without counting the attempt while the far side is
    /// still working on it, or when it was a paused handler's probe (a retryable failure; held
    /// for the probe interval), else failed (retry) or dead; fenced by the lease token. Each
    /// statement is tried again while `deadline` allows (the record would otherwise stay
    /// claimed, marked started, and be parked at its redelivery though the call failed).
    async fn record_leased_failure(
        &self,
        conn: &mut PoolConnection<S::Db>,
        lease: &Lease,
        deadline: tokio::time::Instant,
        f: &Finished<'_, '_>,
    ) -> Disposition {
        let Err(error) = &f.result else { unreachable!("partitioned by result") };
        let (group, message_id, claim) = (self.settings.group.as_str(), &f.item.identified.id, &f.claim);
        let delay = error.retry_after.unwrap_or_else(|| self.settings.backoff.delay_after(claim.attempt));
        let text = error.to_string();
        let failure = FailureReport {
            claim,
            mode: HandlerMode::Leased,
            message: f.item.message,
            lease,
            error: &text,
            error_class: error.class(),
            permanent: error.is_permanent(),
            retry_delay_ms: i64::try_from(delay.as_millis()).unwrap_or(i64::MAX),
            answer: f.answer.as_ref(),
            in_progress: error.uncounted_within.is_some(),
        };
        // A probe: `Some(None)`, uncounted in any case; a 409 or 410: uncounted within its limit.
        let uncounted = if f.item.probe { Some(None) } else { error.uncounted_within.map(Some) };
        let mut tries = Tries::until(deadline);
        if let Some(within) = uncounted.filter(|_| !error.is_permanent()) {
            let deferred = loop {
                match self.store.defer_claimed(conn, &failure, within).await {
                    Err(e) if self.try_again(&mut tries, conn, &e).await => {}
                    deferred => break deferred,
                }
            };
            match deferred {
                Ok(true) if f.item.probe => {
                    tracing::info!(message_id = %message_id, attempt = claim.attempt, error = %text,
                        "the circuit breaker's probe failed; held without counting the attempt");
                    self.stats.count(group, Event::Retry, 1);
                    return Disposition::Retry { delay: self.pauses.hold_for(&f.item.identified.message_type) };
                }
                Ok(true) => {
                    tracing::info!(message_id = %message_id, attempt = claim.attempt, error = %text,
                        "the far side is still working on it; retried without counting the attempt");
                    self.stats.count(group, Event::Retry, 1);
                    return Disposition::Retry { delay };
                }
                // The lease was lost (the failure below finds it superseded), the run of such
                // answers is older than `within` (the attempt counts), or a deferral whose answer
                // was lost did commit (the failure below finds the claim gone, the attempt
                // deferred).
                Ok(false) => {}
                Err(e) => {
                    tracing::warn!(error = %e, "recording a deferral failed; redelivering");
                    return Disposition::Redeliver;
                }
            }
        }
        tracing::info!(message_id = %message_id, attempt = claim.attempt, error = %text, "handler failed");
        let failed = loop {
            match self.store.fail_claimed(conn, &failure).await {
                Err(e) if self.try_again(&mut tries, conn, &e).await => {}
                failed => break failed,
            }
        };
        // Tried again and found the lease token gone: an earlier try may have recorded the
        // failure (or the deferral) before its answer was lost; the attempt row says.
        let failed = match failed {
            Ok(FailureOutcome::Superseded) if tries.again => {
                match self.store.attempt_outcome(conn, claim.id, claim.attempt).await.ok().flatten().as_deref() {
                    Some("dead") => Ok(FailureOutcome::Dead),
                    Some("failed") => Ok(FailureOutcome::Failed),
                    Some("deferred") => {
                        self.stats.count(group, Event::Retry, 1);
                        return Disposition::Retry { delay };
                    }
                    // Taken over, released by an operator, or unread: the redelivery is judged
                    // by the record.
                    _ => return Disposition::Redeliver,
                }
            }
            failed => failed,
        };
        match failed {
            Ok(FailureOutcome::Failed) => {
                self.stats.count(group, Event::Failed, 1);
                self.stats.count(group, Event::Retry, 1);
                Disposition::Retry { delay }
            }
            Ok(FailureOutcome::Dead) => {
                self.stats.count(group, Event::Failed, 1);
                self.stats.count(group, Event::Dead, 1);
                Disposition::DeadLetter { reason: text }
            }
            // No record failed: the record is its new holder's, whose claim counted the takeover.
            Ok(FailureOutcome::Superseded) => Disposition::Ack(AckReason::LeaseLost),
            Err(e) => {
                tracing::warn!(error = %e, "recording a failure failed; redelivering");
                Disposition::Redeliver
            }
        }
    }
}

/// The tries of the statements that record what became of a batch's leased calls: the calls
/// ran, so a statement that fails is tried again, after a pause (100 ms, doubling to 1 s), until
/// `deadline` (half a lease from the settlement's start), to wait out a database that restarts; completions and failures
/// are fenced by the lease token, so a later try cannot settle what another worker took over.
struct Tries {
    deadline: tokio::time::Instant,
    pause: Duration,
    /// Whether a statement was tried again: an earlier try may have committed before its
    /// answer was lost.
    again: bool,
}

impl Tries {
    fn until(deadline: tokio::time::Instant) -> Self {
        Tries { deadline, pause: Duration::from_millis(100), again: false }
    }
}
