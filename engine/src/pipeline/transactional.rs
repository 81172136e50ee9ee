//! Transactional handlers and poison messages of a batch: one database transaction (per up to
//! [`MAX_PER_TRANSACTION`] messages), claims and completions each one set-based statement, one
//! savepoint per handler, one commit. Nothing is acknowledged before the commit; if the commit
//! fails, every delivery of the transaction is redelivered and judged again.

use std::collections::HashSet;
use std::time::Instant;

use sqlx::{Acquire, Executor, PgConnection};

use super::{AckReason, Disposition, DueMarker, Pipeline, Routed};
use crate::handler::Handler;
use crate::message::{InboundMessage, Poison};
use crate::record::HandlerMode;
use crate::stats::Event;
use crate::store::{
    ClaimBatch, ClaimItem, ClaimOutcome, ClaimedRecord, DedupStore, FailureOutcome, FailureReport, Lease, PoisonRecord,
};

/// How often a handler (or a batch's claim) is retried inside the transaction after a deadlock
/// or serialization failure before the deliveries are given back to the broker.
const TRANSIENT_RETRIES: usize = 3;

/// Most messages in one transaction. Every handler runs in a savepoint, and a savepoint that
/// writes takes a subtransaction id; past 64 of them in one transaction PostgreSQL's
/// per-backend subtransaction cache overflows and every concurrent snapshot has to consult
/// `pg_subtrans`, which slows the whole server. Larger batches are split into transactions of
/// this size.
pub const MAX_PER_TRANSACTION: usize = 50;

type Outcome = (usize, Disposition, Option<DueMarker>);

/// The transaction can no longer be used (a statement outside a handler's savepoint failed);
/// every delivery in it is redelivered.
struct Broken;

impl Pipeline {
    pub(super) async fn run_transaction(
        &self,
        worker: &str,
        mut items: Vec<Routed<'_>>,
        poison: Vec<(usize, &InboundMessage, Poison)>,
    ) -> Vec<Outcome> {
        if items.is_empty() && poison.is_empty() {
            return Vec::new();
        }
        // One lock order for every batch — the handler's lock key (a hot business row), then
        // the message id (its dedup record): concurrent batches touching the same rows wait for
        // each other instead of deadlocking. Messages without a lock key go last: they tend to
        // act on what keyed ones create (an order's payment after the order, whose creation
        // reserves stock), and in this order they find it in the same transaction instead of
        // failing once and waiting for a retry.
        items.sort_by_cached_key(|r| {
            let key = match &r.handler {
                Handler::Transactional(h) => h.lock_key(&Self::input(r, 0)),
                Handler::Leased { .. } => None,
            };
            (key.is_none(), key, r.identified.id.clone())
        });
        let mut poison = Some(poison);
        let mut outcomes = Vec::new();
        let mut chunks: Vec<Vec<Routed<'_>>> = Vec::new();
        let mut rest = items.into_iter().peekable();
        while rest.peek().is_some() {
            chunks.push(rest.by_ref().take(MAX_PER_TRANSACTION).collect());
        }
        if chunks.is_empty() {
            chunks.push(Vec::new());
        }
        for chunk in chunks {
            outcomes.extend(self.transaction(worker, chunk, poison.take().unwrap_or_default()).await);
        }
        outcomes
    }

    /// One transaction over `items` (and the poison messages).
    async fn transaction(
        &self,
        worker: &str,
        items: Vec<Routed<'_>>,
        poison: Vec<(usize, &InboundMessage, Poison)>,
    ) -> Vec<Outcome> {
        let indices: Vec<usize> = items.iter().map(|r| r.index).chain(poison.iter().map(|p| p.0)).collect();
        let redeliver_all = || indices.iter().map(|&i| (i, Disposition::Redeliver, None)).collect::<Vec<_>>();
        let mut tx = match self.store.pool().begin().await {
            Ok(tx) => tx,
            Err(e) => {
                tracing::warn!(error = %e, "cannot begin a transaction; redelivering the batch");
                return redeliver_all();
            }
        };
        let mut outcomes = Vec::with_capacity(indices.len());
        for (index, message, p) in &poison {
            outcomes.push((*index, self.store_poison(&mut tx, message, p).await, None));
        }
        // A message id twice in one batch: the second copy is judged after the first settled.
        let mut rounds: Vec<Vec<&Routed<'_>>> = Vec::new();
        for item in &items {
            let round = rounds.iter().position(|r| r.iter().all(|o| o.identified.id != item.identified.id));
            match round {
                Some(r) => rounds[r].push(item),
                None => rounds.push(vec![item]),
            }
        }
        for round in rounds {
            match self.round(&mut tx, worker, &round).await {
                Ok(done) => outcomes.extend(done),
                Err(Broken) => return redeliver_all(),
            }
        }
        match tx.commit().await {
            Ok(()) => {
                self.count_outcomes(&outcomes);
                outcomes
            }
            Err(e) => {
                tracing::warn!(error = %e, "batch commit failed; redelivering the batch");
                redeliver_all()
            }
        }
    }

    /// Counts the outcomes of a committed transaction (claims and failures are counted as they
    /// happen, so a batch whose commit fails has counted its claims once more).
    fn count_outcomes(&self, outcomes: &[Outcome]) {
        let group = self.settings.group.as_str();
        for (_, disposition, _) in outcomes {
            match disposition {
                Disposition::Ack(AckReason::Processed) => self.stats.count(group, Event::Succeeded, 1),
                Disposition::Retry { .. } => self.stats.count(group, Event::Retry, 1),
                Disposition::DeadLetter { .. } => self.stats.count(group, Event::Dead, 1),
                _ => {}
            }
        }
    }

    async fn store_poison(&self, tx: &mut PgConnection, message: &InboundMessage, p: &Poison) -> Disposition {
        let group = self.settings.group.as_str();
        let reason = p.reason.to_string();
        let record = PoisonRecord {
            group: &self.settings.group,
            message_id: &p.record_id,
            message_type: &p.message_type,
            reason: &reason,
            reason_kind: p.reason.kind(),
            message,
            payload_hash: &message.payload_hash(),
            keep_payload_bytes: self.settings.keep_poison_payload_bytes,
            max_attempts: self.settings.max_attempts,
        };
        let Ok(mut savepoint) = tx.begin().await else { return Disposition::Redeliver };
        match self.store.record_poison(&mut savepoint, &record).await {
            Ok((_, created)) => {
                if savepoint.commit().await.is_err() {
                    return Disposition::Redeliver;
                }
                if created {
                    self.stats.count(group, Event::Poison, 1);
                    tracing::warn!(message_id = %p.record_id, reason = %reason, "poison message dead-lettered");
                    Disposition::DeadLetter { reason }
                } else {
                    // The same poison again: its record and dead-letter copy exist already.
                    self.stats.count(group, Event::DuplicateDb, 1);
                    Disposition::Ack(AckReason::DuplicateDatabase)
                }
            }
            Err(e) => {
                tracing::warn!(error = %e, "storing a poison record failed");
                let _ = savepoint.rollback().await;
                Disposition::Redeliver
            }
        }
    }

    /// Claims `items` (distinct ids) in one statement, runs each claimed message's handler in a
    /// savepoint, completes the successes in one statement.
    async fn round(&self, tx: &mut PgConnection, worker: &str, items: &[&Routed<'_>]) -> Result<Vec<Outcome>, Broken> {
        let group = self.settings.group.as_str();
        let lease = Lease::new(worker, self.settings.lease);
        let batch = ClaimBatch {
            group: &self.settings.group,
            max_attempts: self.settings.max_attempts,
            lease: &lease,
            items: items
                .iter()
                .map(|r| ClaimItem {
                    message_id: &r.identified.id,
                    message_type: &r.identified.message_type,
                    payload_hash: &r.payload_hash,
                    message: r.message,
                })
                .collect(),
        };
        let claims = self.claim_batch(tx, &batch).await?;
        let mut savepoint_open = false;
        let mut outcomes = Vec::with_capacity(items.len());
        let mut succeeded: Vec<(&Routed<'_>, ClaimedRecord)> = Vec::new();
        for (item, claim) in items.iter().zip(claims) {
            match claim {
                ClaimOutcome::Existing(existing) => {
                    outcomes.push((item.index, self.judge_existing(item.identified.id.as_str(), &existing), None));
                }
                ClaimOutcome::Claimed(claim) => {
                    self.stats.count(group, Event::Claimed, 1);
                    if claim.created {
                        self.stats.count(group, Event::Created, 1);
                    }
                    match self.run_handler(tx, &mut savepoint_open, item, &claim, &lease).await? {
                        None => succeeded.push((item, claim)),
                        Some(failed) => outcomes.push((item.index, failed, None)),
                    }
                }
            }
        }
        let claims: Vec<&ClaimedRecord> = succeeded.iter().map(|(_, c)| c).collect();
        let completed: HashSet<i64> = match self.store.complete_many(tx, &claims, &lease).await {
            Ok(ids) => ids.into_iter().collect(),
            Err(e) => {
                tracing::warn!(error = %e, "completing the batch failed; redelivering it");
                return Err(Broken);
            }
        };
        for (item, claim) in succeeded {
            let disposition = if completed.contains(&claim.id) {
                outcomes.push((
                    item.index,
                    Disposition::Ack(AckReason::Processed),
                    Some(self.marker(item, claim.first_seen_at)),
                ));
                continue;
            } else {
                Disposition::Redeliver
            };
            outcomes.push((item.index, disposition, None));
        }
        Ok(outcomes)
    }

    /// The batch's claims in a savepoint, retried after a deadlock or serialization failure.
    async fn claim_batch(&self, tx: &mut PgConnection, batch: &ClaimBatch<'_>) -> Result<Vec<ClaimOutcome>, Broken> {
        for try_no in 1..=TRANSIENT_RETRIES {
            let mut savepoint = tx.begin().await.map_err(|_| Broken)?;
            match self.store.claim_many(&mut savepoint, batch).await {
                Ok(claims) => {
                    savepoint.commit().await.map_err(|_| Broken)?;
                    return Ok(claims);
                }
                Err(e) => {
                    let _ = savepoint.rollback().await;
                    if !(e.is_transient() && try_no < TRANSIENT_RETRIES) {
                        tracing::warn!(error = %e, "claiming the batch failed; redelivering it");
                        return Err(Broken);
                    }
                }
            }
        }
        Err(Broken)
    }

    /// Runs one claimed message's handler in a savepoint. `None`: it succeeded (completion is
    /// due); `Some(disposition)`: it failed, and the failure is recorded.
    ///
    /// The savepoint is managed by hand to save a round trip per message: a successful
    /// handler's savepoint stays open and is released together with the next one's creation
    /// (`RELEASE SAVEPOINT h; SAVEPOINT h`, one simple query); the commit releases the last.
    async fn run_handler(
        &self,
        tx: &mut PgConnection,
        savepoint_open: &mut bool,
        item: &Routed<'_>,
        claim: &ClaimedRecord,
        lease: &Lease,
    ) -> Result<Option<Disposition>, Broken> {
        let Handler::Transactional(handler) = &item.handler else { unreachable!("partitioned by mode") };
        for try_no in 1..=TRANSIENT_RETRIES {
            let open =
                if *savepoint_open { "RELEASE SAVEPOINT handler; SAVEPOINT handler" } else { "SAVEPOINT handler" };
            tx.execute(open).await.map_err(|_| Broken)?;
            *savepoint_open = true;
            let started = Instant::now();
            let result = handler.handle(&Self::input(item, claim.attempt), tx).await;
            metrics::histogram!("dedup_handler_duration_seconds", "type" => item.identified.message_type.clone())
                .record(started.elapsed().as_secs_f64());
            let Err(error) = result else { return Ok(None) };
            tx.execute("ROLLBACK TO SAVEPOINT handler").await.map_err(|_| Broken)?;
            if error.transient && try_no < TRANSIENT_RETRIES {
                continue;
            }
            self.stats.count(self.settings.group.as_str(), Event::Failed, 1);
            let delay = self.settings.backoff.delay_after(claim.attempt);
            let text = error.to_string();
            let failure = FailureReport {
                claim,
                mode: HandlerMode::Transactional,
                message: item.message,
                lease,
                error: &text,
                error_class: &error.error_class(),
                permanent: error.permanent,
                retry_delay_ms: i64::try_from(delay.as_millis()).unwrap_or(i64::MAX),
            };
            let outcome = self.store.fail_claimed(tx, &failure).await.map_err(|e| {
                tracing::warn!(error = %e, "recording a failure failed; redelivering the batch");
                Broken
            })?;
            tracing::info!(message_id = %item.identified.id, attempt = claim.attempt, error = %text, "handler failed");
            return Ok(Some(match outcome {
                FailureOutcome::Dead => Disposition::DeadLetter { reason: text },
                FailureOutcome::Failed => Disposition::Retry { delay },
                FailureOutcome::Superseded => Disposition::Redeliver,
            }));
        }
        Err(Broken)
    }
}
