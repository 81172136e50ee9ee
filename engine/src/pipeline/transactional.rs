//! Transactional handlers and poison messages of a batch: one database transaction, one
//! savepoint per message, one commit. Nothing is acknowledged before the commit; if the commit
//! fails, every delivery of the transaction is redelivered and judged again.

use std::time::Instant;

use sqlx::{Acquire, PgConnection};

use super::{AckReason, Disposition, DueMarker, Pipeline, Routed};
use crate::handler::Handler;
use crate::message::{InboundMessage, Poison};
use crate::record::HandlerMode;
use crate::stats::Event;
use crate::store::{ClaimOutcome, ClaimRequest, DedupStore, FailureOutcome, FailureReport, Lease, PoisonRecord};

/// How often one message is retried inside the transaction after a deadlock or
/// serialization failure before it is given back to the broker.
const TRANSIENT_RETRIES: usize = 3;

type Outcome = (usize, Disposition, Option<DueMarker>);

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
        let indices: Vec<usize> = items.iter().map(|r| r.index).chain(poison.iter().map(|p| p.0)).collect();
        let redeliver_all = || indices.iter().map(|&i| (i, Disposition::Redeliver, None)).collect::<Vec<_>>();
        let mut tx = match self.store.pool().begin().await {
            Ok(tx) => tx,
            Err(e) => {
                tracing::warn!(error = %e, "cannot begin a transaction; redelivering the batch");
                return redeliver_all();
            }
        };
        // One lock order for every batch — the handler's lock key (a hot business row), then
        // the message id (its dedup record): concurrent batches touching the same rows wait for
        // each other instead of deadlocking.
        items.sort_by_cached_key(|r| {
            let key = match &r.handler {
                Handler::Transactional(h) => h.lock_key(&Self::input(r, 0)),
                Handler::Leased { .. } => None,
            };
            (key, r.identified.id.clone())
        });
        let mut outcomes = Vec::with_capacity(indices.len());
        for (index, message, p) in &poison {
            outcomes.push((*index, self.store_poison(&mut tx, message, p).await, None));
        }
        for item in &items {
            let (disposition, marker) = self.process_in_transaction(&mut tx, worker, item).await;
            outcomes.push((item.index, disposition, marker));
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

    async fn process_in_transaction(
        &self,
        tx: &mut PgConnection,
        worker: &str,
        item: &Routed<'_>,
    ) -> (Disposition, Option<DueMarker>) {
        let Handler::Transactional(handler) = &item.handler else { unreachable!("partitioned by mode") };
        let group = self.settings.group.as_str();
        let lease = Lease::new(worker, self.settings.lease);
        let request = ClaimRequest {
            group: &self.settings.group,
            message_id: &item.identified.id,
            message_type: &item.identified.message_type,
            mode: HandlerMode::Transactional,
            max_attempts: self.settings.max_attempts,
            reclaim_expired: false,
            lease: &lease,
            message: item.message,
            payload_hash: &item.payload_hash,
        };
        for try_no in 1..=TRANSIENT_RETRIES {
            let retry_transient = try_no < TRANSIENT_RETRIES;
            let Ok(mut savepoint) = tx.begin().await else { return (Disposition::Redeliver, None) };
            let claim = match self.store.claim(&mut savepoint, &request).await {
                Ok(ClaimOutcome::Claimed(claim)) => claim,
                Ok(ClaimOutcome::Existing(existing)) => {
                    if savepoint.commit().await.is_err() {
                        return (Disposition::Redeliver, None);
                    }
                    return (self.judge_existing(item.identified.id.as_str(), &existing), None);
                }
                Err(e) => {
                    let _ = savepoint.rollback().await;
                    if e.is_transient() && retry_transient {
                        continue;
                    }
                    tracing::warn!(error = %e, message_id = %item.identified.id, "claim failed; redelivering");
                    return (Disposition::Redeliver, None);
                }
            };
            self.stats.count(group, Event::Claimed, 1);
            if claim.created {
                self.stats.count(group, Event::Created, 1);
            }
            let started = Instant::now();
            let result = handler.handle(&Self::input(item, claim.attempt), &mut savepoint).await;
            metrics::histogram!("dedup_handler_duration_seconds", "type" => item.identified.message_type.clone())
                .record(started.elapsed().as_secs_f64());
            match result {
                Ok(()) => match self.store.complete(&mut savepoint, &claim, &lease, HandlerMode::Transactional).await {
                    Ok(true) => {
                        if savepoint.commit().await.is_err() {
                            return (Disposition::Redeliver, None);
                        }
                        return (Disposition::Ack(AckReason::Processed), Some(self.marker(item, claim.first_seen_at)));
                    }
                    Ok(false) => {
                        let _ = savepoint.rollback().await;
                        return (Disposition::Redeliver, None);
                    }
                    Err(e) => {
                        let _ = savepoint.rollback().await;
                        if e.is_transient() && retry_transient {
                            continue;
                        }
                        return (Disposition::Redeliver, None);
                    }
                },
                Err(error) => {
                    let _ = savepoint.rollback().await;
                    if error.transient && retry_transient {
                        continue;
                    }
                    self.stats.count(group, Event::Failed, 1);
                    let delay = self.settings.backoff.delay_after(claim.attempt);
                    let text = error.to_string();
                    let failure = FailureReport {
                        claim: &claim,
                        lease: &lease,
                        error: &text,
                        error_class: &error.error_class(),
                        permanent: error.permanent,
                        retry_delay_ms: i64::try_from(delay.as_millis()).unwrap_or(i64::MAX),
                    };
                    let Ok(mut savepoint) = tx.begin().await else { return (Disposition::Redeliver, None) };
                    let outcome = self.store.fail_rolled_back(&mut savepoint, &request, &failure).await;
                    if outcome.is_err() || savepoint.commit().await.is_err() {
                        return (Disposition::Redeliver, None);
                    }
                    tracing::info!(message_id = %item.identified.id, attempt = claim.attempt, error = %text, "handler failed");
                    return match outcome {
                        Ok(FailureOutcome::Dead) => (Disposition::DeadLetter { reason: text }, None),
                        _ => (Disposition::Retry { delay }, None),
                    };
                }
            }
        }
        (Disposition::Redeliver, None)
    }
}
