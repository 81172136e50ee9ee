//! One round of a transaction: the claims of messages with distinct ids in one statement, their
//! handlers one after the other, the completions of the successes in one statement. The same
//! code serves both [`Isolation`]s; they differ in where savepoints are taken, in what a failure
//! does, and in the completion: an optimistic attempt is rolled back as a whole at its first
//! failure, so it claims its records straight into `succeeded` ([`ClaimAs::Succeeded`]) and
//! needs no completion statement.

use crate::store::PipelineStore;
use std::collections::HashSet;
use std::sync::Arc;

use sqlx::Connection;

use crate::store::roles::Conn;

use super::{Abort, Attempt, Isolation};
use crate::pipeline::Outcome;
use crate::handler::{Handler, HandlerInput};
use crate::pipeline::{AckReason, Disposition, Pipeline, Routed};
use crate::record::HandlerMode;
use crate::stats::Event;
use crate::store::{
    ClaimAs, ClaimBatch, ClaimOutcome, ClaimedRecord, FailureOutcome, FailureReport, Lease,
};

/// How often a handler (or a batch's claim) is retried inside the transaction after a deadlock
/// or serialization failure before the deliveries are given back to the broker (with
/// savepoints; an optimistic attempt falls back to savepoints at the first failure instead).
const TRANSIENT_RETRIES: usize = 3;

impl<S: PipelineStore> Pipeline<S> {
    /// Claims `items` (distinct ids) in one statement, runs each claimed message's handler,
    /// completes the successes in one statement.
    pub(super) async fn round(
        &self,
        tx: &mut Conn<S>,
        attempt: &mut Attempt,
        worker: &str,
        items: &[&Routed<'_>],
    ) -> Result<Vec<Outcome>, Abort> {
        let lease = Lease::new(worker, self.settings.lease);
        let batch = ClaimBatch {
            group: &self.settings.group,
            max_attempts: self.settings.max_attempts,
            lease: &lease,
            claim_as: match attempt.isolation {
                Isolation::Optimistic => ClaimAs::Succeeded,
                Isolation::Savepoints => ClaimAs::Processing,
            },
            items: items.iter().map(|r| r.claim_item(true)).collect(),
        };
        let claims = self.claim_batch(tx, attempt, &batch).await?;
        let mut savepoint_open = false;
        let mut outcomes = Vec::with_capacity(items.len());
        let mut succeeded: Vec<(&Routed<'_>, ClaimedRecord)> = Vec::new();
        // Claims waiting for one call of their batch handler (optimistic only): a run of
        // consecutive messages of one handler, at most its `max_batch`.
        let mut run: Vec<(&Routed<'_>, ClaimedRecord)> = Vec::new();
        let mut conflicts = Vec::new();
        for (item, claim) in items.iter().zip(claims) {
            match claim {
                ClaimOutcome::Existing(existing) => {
                    let disposition = self.judge_existing(item.identified.id.as_str(), &existing, &mut attempt.tally);
                    conflicts.extend(self.conflict_copy(item, &existing, &disposition));
                    outcomes.push((item.index, disposition, None));
                }
                ClaimOutcome::Claimed(claim) => {
                    attempt.tally.count(Event::Claimed);
                    if claim.created {
                        attempt.tally.count(Event::Created);
                        self.check_late(item.message, &mut attempt.tally);
                    }
                    let batches = attempt.isolation == Isolation::Optimistic && max_batch(item) > 1;
                    if run.first().is_some_and(|(head, _)| {
                        !batches || !same_handler(head, item) || run.len() >= max_batch(head)
                    }) {
                        self.run_batch_handler(&mut *tx, &run).await?;
                        succeeded.append(&mut run);
                    }
                    if batches {
                        run.push((item, claim));
                        continue;
                    }
                    match self.run_handler(tx, attempt, &mut savepoint_open, item, &claim, &lease).await? {
                        None => succeeded.push((item, claim)),
                        Some(failed) => outcomes.push((item.index, failed, None)),
                    }
                }
            }
        }
        if !run.is_empty() {
            self.run_batch_handler(&mut *tx, &run).await?;
            succeeded.append(&mut run);
        }
        // Kept in the transaction that judged them: acknowledged only with their copy.
        if !conflicts.is_empty()
            && let Err(e) = self.store.keep_conflicts(tx, &self.settings.group, &conflicts).await
        {
            attempt.deadlocked |= e.is_deadlock();
            return Err(attempt.isolation.abort("keeping conflicting copies failed", &e));
        }
        let completed: HashSet<i64> = match batch.claim_as {
            ClaimAs::Succeeded => succeeded.iter().map(|(_, c)| c.id).collect(),
            ClaimAs::Leased => unreachable!("a transaction claims as processing or succeeded"),
            ClaimAs::Processing if succeeded.is_empty() => HashSet::new(),
            ClaimAs::Processing => {
                let claims: Vec<&ClaimedRecord> = succeeded.iter().map(|(_, c)| c).collect();
                match self.store.complete_many(tx, &claims, &lease).await {
                    Ok(ids) => ids.into_iter().collect(),
                    Err(e) => {
                        attempt.deadlocked |= e.is_deadlock();
                        return Err(attempt.isolation.abort("completing the batch failed", &e));
                    }
                }
            }
        };
        for (item, claim) in succeeded {
            if completed.contains(&claim.id) {
                attempt.tally.count(Event::Succeeded);
                let marker = self.marker(item, claim.first_seen_at);
                outcomes.push((item.index, Disposition::Ack(AckReason::Processed), Some(marker)));
            } else {
                outcomes.push((item.index, Disposition::Redeliver, None));
            }
        }
        Ok(outcomes)
    }

    /// The batch's claims. With savepoints, in a savepoint, retried after a deadlock or
    /// serialization failure. Optimistic, without one: a failed claim aborts the attempt, which
    /// is rolled back as a whole anyway, so the savepoint's two round trips would buy nothing.
    /// On a store whose deadlock loses the whole transaction (MySQL), a deadlock is not retried
    /// in the savepoint: the attempt is marked `deadlocked` and run again from its start.
    async fn claim_batch(
        &self,
        tx: &mut Conn<S>,
        attempt: &mut Attempt,
        batch: &ClaimBatch<'_>,
    ) -> Result<Vec<ClaimOutcome>, Abort> {
        let isolation = attempt.isolation;
        const FAILED: &str = "claiming the batch failed";
        if isolation == Isolation::Optimistic {
            return self.store.claim_many(tx, batch).await.map_err(|e| {
                attempt.deadlocked |= e.is_deadlock();
                isolation.abort(FAILED, &e)
            });
        }
        for try_no in 1..=TRANSIENT_RETRIES {
            let mut savepoint = tx.begin().await.map_err(|e| isolation.abort(FAILED, &e))?;
            match self.store.claim_many(&mut savepoint, batch).await {
                Ok(claims) => {
                    savepoint.commit().await.map_err(|e| isolation.abort(FAILED, &e))?;
                    return Ok(claims);
                }
                Err(e) => {
                    if S::DEADLOCK_LOSES_TRANSACTION && e.is_deadlock() {
                        attempt.deadlocked = true;
                        return Err(Abort);
                    }
                    let _ = savepoint.rollback().await;
                    if !(e.is_transient() && try_no < TRANSIENT_RETRIES) {
                        return Err(isolation.abort(FAILED, &e));
                    }
                }
            }
        }
        Err(Abort) // not reached: the last try returns
    }

    /// Runs one batch handler's call over a run of its claimed messages, in an optimistic
    /// attempt ([`crate::handler::TransactionalHandler::handle_batch`]). An error aborts the
    /// attempt, as a handler's does: the savepoint attempt that follows runs each message's
    /// `handle` alone and records the failure on its own message.
    async fn run_batch_handler(&self, tx: &mut Conn<S>, run: &[(&Routed<'_>, ClaimedRecord)]) -> Result<(), Abort> {
        let Handler::Transactional(handler) = &run[0].0.handler else { unreachable!("partitioned by mode") };
        let inputs: Vec<HandlerInput<'_>> = run.iter().map(|(item, claim)| self.input(item, claim.attempt)).collect();
        let items: Vec<&Routed<'_>> = run.iter().map(|(item, _)| *item).collect();
        let result = Self::call_batch_handler(&items, handler.handle_batch_any(&inputs, tx)).await;
        result.map_err(|error| {
            tracing::debug!(messages = run.len(), error = %error, "batch handler failed; running the batch again with savepoints");
            Abort
        })
    }

    /// Runs one claimed message's handler. `None`: it succeeded (completion is due);
    /// `Some(disposition)`: it failed, and the failure is recorded. Optimistic, a handler's
    /// error aborts the attempt (nothing is recorded: the savepoint attempt that follows runs
    /// the handler again and records its failure).
    ///
    /// With savepoints, the savepoint is managed by hand to save a round trip per message: a
    /// successful handler's savepoint stays open and is released together with the next one's
    /// creation (`RELEASE SAVEPOINT h; SAVEPOINT h`, one simple query); the commit releases the
    /// last.
    async fn run_handler(
        &self,
        tx: &mut Conn<S>,
        attempt: &mut Attempt,
        savepoint_open: &mut bool,
        item: &Routed<'_>,
        claim: &ClaimedRecord,
        lease: &Lease,
    ) -> Result<Option<Disposition>, Abort> {
        let Handler::Transactional(handler) = &item.handler else { unreachable!("partitioned by mode") };
        let isolation = attempt.isolation;
        for try_no in 1..=TRANSIENT_RETRIES {
            if isolation == Isolation::Savepoints {
                self.store
                    .open_savepoint(tx, *savepoint_open)
                    .await
                    .map_err(|e| isolation.abort("opening a savepoint failed", &e))?;
                *savepoint_open = true;
            }
            let input = self.input(item, claim.attempt);
            let call = handler.handle_any(&input, &mut *tx);
            let result = Self::call_handler(item, claim.attempt, HandlerMode::Transactional, call).await;
            let Err(error) = result else { return Ok(None) };
            attempt.deadlocked |= error.is_deadlock();
            if isolation == Isolation::Optimistic || (S::DEADLOCK_LOSES_TRANSACTION && error.is_deadlock()) {
                tracing::debug!(message_id = %item.identified.id, error = %error, "handler failed; running the batch again with savepoints");
                return Err(Abort);
            }
            self.store
                .rollback_to_savepoint(tx)
                .await
                .map_err(|e| isolation.abort("rolling back to a savepoint failed", &e))?;
            if error.is_transient() && try_no < TRANSIENT_RETRIES {
                continue;
            }
            if error.is_transient() {
                let hint = match handler.lock_key_any(&input) {
                    Some(_) => "",
                    None => {
                        "; batches that lock shared rows in different orders deadlock each other: give this \
                         type's handler a lock_key (TransactionalHandler::lock_key)"
                    }
                };
                tracing::warn!(
                    message_id = %item.identified.id,
                    message_type = %item.identified.message_type,
                    tries = TRANSIENT_RETRIES,
                    error = %error,
                    "a database conflict persisted through every try in its transaction; the attempt counts as a failure{hint}"
                );
            }
            attempt.tally.count(Event::Failed);
            let delay = self.settings.backoff.delay_after(claim.attempt);
            let text = error.to_string();
            let failure = FailureReport {
                claim,
                mode: HandlerMode::Transactional,
                message: item.message,
                lease,
                error: &text,
                error_class: error.class(),
                permanent: error.is_permanent(),
                retry_delay_ms: i64::try_from(delay.as_millis()).unwrap_or(i64::MAX),
                answer: None,
                in_progress: false,
            };
            let outcome = self
                .store
                .fail_claimed(tx, &failure)
                .await
                .map_err(|e| isolation.abort("recording a failure failed", &e))?;
            tracing::info!(message_id = %item.identified.id, attempt = claim.attempt, error = %text, "handler failed");
            return Ok(Some(match outcome {
                FailureOutcome::Dead => {
                    attempt.tally.count(Event::Dead);
                    Disposition::DeadLetter { reason: text }
                }
                FailureOutcome::Failed => {
                    attempt.tally.count(Event::Retry);
                    Disposition::Retry { delay }
                }
                FailureOutcome::Superseded => Disposition::Redeliver,
            }));
        }
        Err(Abort) // not reached: the last try returns
    }
}

/// [`crate::handler::TransactionalHandler::max_batch`] of a transactional message's handler.
fn max_batch(item: &Routed<'_>) -> usize {
    match &item.handler {
        Handler::Transactional(handler) => handler.max_batch_any(),
        Handler::Leased { .. } => 1,
    }
}

/// Whether two messages go to the same handler instance under the same type (one call of a batch
/// handler takes only its own messages, of one type: an instance registered for two types gets
/// a call per type, and its span and duration histogram are labelled with that type).
fn same_handler(a: &Routed<'_>, b: &Routed<'_>) -> bool {
    match (&a.handler, &b.handler) {
        (Handler::Transactional(x), Handler::Transactional(y)) => {
            Arc::ptr_eq(x, y) && a.identified.message_type == b.identified.message_type
        }
        _ => false,
    }
}
