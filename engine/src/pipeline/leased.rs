//! Leased handlers: claim committed first (with a lease and an open attempt row), then the
//! external effect while the lease is extended every third of its duration, then a completion
//! fenced by the lease token. A worker whose lease was taken over cannot complete.
//!
//! The handler gets a [`LeaseGuard`]: lost when the heartbeat finds the lease taken over, or
//! when no extension was confirmed within the lease (this worker may have been frozen). The
//! engine checks it before calling the handler; the handler checks it right before its effect.
//! A handler that stopped because the lease was lost ([`HandlerError::lease_lost`]) did nothing,
//! so its attempt is recorded as a failure like any other, fenced by the lease token: retried
//! when the record is still this worker's, left alone when someone else holds it.

use std::time::Instant;

use futures::future::join_all;
use tracing::Instrument;

use super::tally::Tally;
use super::{AckReason, Disposition, DueMarker, Pipeline, Routed};
use crate::handler::{Handler, HandlerInput, LeaseGuard};
use crate::record::HandlerMode;
use crate::stats::Event;
use crate::store::{ClaimOutcome, ClaimRequest, ClaimedRecord, DedupStore, FailureOutcome, FailureReport, Lease};

type Outcome = (usize, Disposition, Option<DueMarker>);

impl Pipeline {
    pub(super) async fn run_leased(&self, worker: &str, items: Vec<Routed<'_>>) -> Vec<Outcome> {
        join_all(items.iter().map(|item| async move {
            let (disposition, marker) = self.process_leased(worker, item).await;
            (item.index, disposition, marker)
        }))
        .await
    }

    async fn process_leased(&self, worker: &str, item: &Routed<'_>) -> (Disposition, Option<DueMarker>) {
        let Handler::Leased { handler, .. } = &item.handler else { unreachable!("partitioned by mode") };
        let group = self.settings.group.as_str();
        let lease = Lease::new(worker, self.settings.lease);
        let request = ClaimRequest {
            group: &self.settings.group,
            message_id: &item.identified.id,
            message_type: &item.identified.message_type,
            mode: HandlerMode::Leased,
            max_attempts: self.settings.max_attempts,
            reclaim_expired: item.handler.reclaims_expired(),
            lease: &lease,
            message: item.message,
            payload_hash: &item.payload_hash,
        };
        let mut conn = match self.store.pool().acquire().await {
            Ok(conn) => conn,
            Err(e) => {
                tracing::warn!(error = %e, "no database connection; redelivering");
                return (Disposition::Redeliver, None);
            }
        };
        // The database starts the lease after this instant: counting from here errs on the safe side.
        let asked_at = Instant::now();
        let claim = match self.store.claim(&mut conn, &request).await {
            Ok(ClaimOutcome::Claimed(claim)) => claim,
            Ok(ClaimOutcome::Existing(existing)) => {
                // Nothing to roll back here: the judgement is final, count it at once.
                let mut tally = Tally::default();
                let disposition = self.judge_existing(item.identified.id.as_str(), &existing, &mut tally);
                tally.apply(&self.stats, group);
                return (disposition, None);
            }
            Err(e) => {
                tracing::warn!(error = %e, message_id = %item.identified.id, "claim failed; redelivering");
                return (Disposition::Redeliver, None);
            }
        };
        drop(conn);
        self.stats.count(group, Event::Claimed, 1);
        if claim.created {
            self.stats.count(group, Event::Created, 1);
            let mut tally = Tally::default();
            self.check_late(item.message, &mut tally);
            tally.apply(&self.stats, group);
        }
        if claim.took_over {
            self.stats.count(group, Event::LeaseTakeover, 1);
            tracing::warn!(message_id = %item.identified.id, attempt = claim.attempt, "expired lease taken over (on_lease_expiry = reclaim)");
        }

        let guard = LeaseGuard::new(lease.duration, asked_at);
        // In the batch's span, so that its lease extensions show under the batch.
        let heartbeat = tokio::spawn(
            self.clone().extend_lease_while_running(claim.clone(), lease.clone(), guard.clone()).in_current_span(),
        );
        let call = async {
            match guard.check() {
                Ok(()) => {
                    let input = HandlerInput {
                        calls: claim.calls,
                        previous_status: claim.previous_status,
                        ..self.input(item, claim.attempt)
                    };
                    handler.handle(&input, &guard).await
                }
                Err(lost) => Err(lost),
            }
        };
        let result = Self::call_handler(item, claim.attempt, HandlerMode::Leased, call).await;
        heartbeat.abort();
        let answer = guard.take_answer();
        if let Err(error) = &result
            && error.is_lease_lost()
        {
            metrics::counter!("dedup_lease_lost_before_effect_total", "group" => group.to_owned()).increment(1);
            tracing::warn!(message_id = %item.identified.id, attempt = claim.attempt, "lease lost before the effect; the effect was not performed");
        }

        let Ok(mut conn) = self.store.pool().acquire().await else {
            // The effect may have happened; the record stays processing and, once its lease
            // expires, stuck: an operator decides. The redelivery is judged then.
            return (Disposition::Redeliver, None);
        };
        match result {
            Ok(()) => {
                match self.store.complete(&mut conn, &claim, &lease, HandlerMode::Leased, answer.as_ref()).await {
                    Ok(true) => {
                        self.stats.count(group, Event::Succeeded, 1);
                        (Disposition::Ack(AckReason::Processed), Some(self.marker(item, claim.first_seen_at)))
                    }
                    Ok(false) => {
                        // The effect ran, but the record is someone else's now (taken over, or
                        // released by an operator): it may run again there. Say so on the record.
                        metrics::counter!("dedup_late_effects_total", "group" => group.to_owned()).increment(1);
                        tracing::warn!(message_id = %item.identified.id, attempt = claim.attempt,
                            "lease lost before completion; the effect ran and may run twice");
                        if let Err(e) = self.store.note_late_effect(&mut conn, &claim, answer.as_ref()).await {
                            tracing::warn!(error = %e, message_id = %item.identified.id, "flagging the late effect failed");
                        }
                        (Disposition::Ack(AckReason::LeaseLost), None)
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, message_id = %item.identified.id, "completion failed; redelivering");
                        (Disposition::Redeliver, None)
                    }
                }
            }
            Err(error) => {
                let delay = error.retry_after.unwrap_or_else(|| self.settings.backoff.delay_after(claim.attempt));
                let text = error.to_string();
                let failure = FailureReport {
                    claim: &claim,
                    mode: HandlerMode::Leased,
                    message: item.message,
                    lease: &lease,
                    error: &text,
                    error_class: error.class(),
                    permanent: error.is_permanent(),
                    retry_delay_ms: i64::try_from(delay.as_millis()).unwrap_or(i64::MAX),
                    answer: answer.as_ref(),
                    in_progress: error.uncounted_within.is_some(),
                };
                if let Some(within) = error.uncounted_within.filter(|_| !error.is_permanent()) {
                    match self.store.defer_claimed(&mut conn, &failure, within).await {
                        Ok(true) => {
                            tracing::info!(message_id = %item.identified.id, attempt = claim.attempt, error = %text,
                                "the far side is still working on it; retried without counting the attempt");
                            self.stats.count(group, Event::Retry, 1);
                            return (Disposition::Retry { delay }, None);
                        }
                        // The lease was lost (the failure below finds it superseded) or the run
                        // of such answers is older than `within`: the attempt counts.
                        Ok(false) => {}
                        Err(e) => {
                            tracing::warn!(error = %e, "recording a deferral failed; redelivering");
                            return (Disposition::Redeliver, None);
                        }
                    }
                }
                self.stats.count(group, Event::Failed, 1);
                tracing::info!(message_id = %item.identified.id, attempt = claim.attempt, error = %text, "handler failed");
                match self.store.fail_claimed(&mut conn, &failure).await {
                    Ok(FailureOutcome::Failed) => {
                        self.stats.count(group, Event::Retry, 1);
                        (Disposition::Retry { delay }, None)
                    }
                    Ok(FailureOutcome::Dead) => {
                        self.stats.count(group, Event::Dead, 1);
                        (Disposition::DeadLetter { reason: text }, None)
                    }
                    Ok(FailureOutcome::Superseded) => (Disposition::Ack(AckReason::LeaseLost), None),
                    Err(e) => {
                        tracing::warn!(error = %e, "recording a failure failed; redelivering");
                        (Disposition::Redeliver, None)
                    }
                }
            }
        }
    }

    /// Extends the lease every third of its duration until aborted, telling `guard` of each
    /// confirmed extension; stops when the lease can no longer be extended (taken over or
    /// released: `guard` is lost, and the fenced completion will refuse).
    async fn extend_lease_while_running(self, claim: ClaimedRecord, lease: Lease, guard: LeaseGuard) {
        let period = lease.duration / 3;
        loop {
            tokio::time::sleep(period).await;
            let asked_at = Instant::now();
            let extended = match self.store.pool().acquire().await {
                Ok(mut conn) => self.store.extend_lease(&mut conn, &claim, &lease).await,
                Err(e) => Err(e.into()),
            };
            match extended {
                Ok(true) => guard.extended(lease.duration, asked_at),
                Ok(false) => {
                    guard.lose();
                    tracing::warn!(record = claim.id, "lease lost while the handler runs");
                    return;
                }
                Err(e) => tracing::warn!(record = claim.id, error = %e, "extending the lease failed; will retry"),
            }
        }
    }
}
