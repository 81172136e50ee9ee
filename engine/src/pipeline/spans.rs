//! The pipeline's `tracing` spans: one per batch, one per handler call (or batch handler call).
//!
//! Levels (DESIGN.md, "Tracing"): the **batch** and each **handler call** are `INFO` — they
//! answer an on-call engineer's first questions (which batch was slow, which message's handler,
//! what became of the deliveries) under the usual `info` filter, at one span per batch and one
//! per message. What the engine does inside a batch — the transaction attempt, each store
//! statement group, the Redis round trips, the broker settle — is `DEBUG`, switched on per
//! module (`dedup_engine::store=debug`, `dedup_engine::source=debug`, or `dedup_engine=debug`).
//! Targets are the modules' paths. A span whose level a host filters out is never built: its
//! fields are not evaluated, and recording on it does nothing. The engine installs no
//! subscriber and no propagator; the host's subscriber decides (see the README's OpenTelemetry
//! example).

use crate::store::PipelineStore;
use std::time::Instant;

use tracing::field::Empty;
use tracing::{Instrument, Span};

use super::{AckReason, Disposition, Pipeline, Routed};
use crate::handler::HandlerError;
use crate::record::HandlerMode;

impl<S: PipelineStore> Pipeline<S> {
    /// The span of one batch: `group`, `worker` (the lease owner) and `size` (deliveries), then,
    /// when the pipeline has judged it, what became of the deliveries (see [`Outcomes`]). The
    /// consumer settles the batch inside it too.
    pub(crate) fn batch_span(&self, worker: &str, size: usize) -> Span {
        tracing::info_span!(
            "batch",
            group = %self.settings.group,
            worker,
            size,
            succeeded = Empty,
            duplicate = Empty,
            retried = Empty,
            dead = Empty,
            poison = Empty,
            redelivered = Empty,
            parked = Empty,
            lease_lost = Empty,
            held = Empty,
        )
    }

    /// Runs one handler call in a span of its own (`message_id`, `message_type`, `attempt`,
    /// `mode`; `duration_ms` and `outcome` — `ok`, `error` or `lease_lost` — when it returns)
    /// and records its duration in the `dedup_handler_duration_seconds` histogram.
    pub(super) async fn call_handler(
        item: &Routed<'_>,
        attempt: i32,
        mode: HandlerMode,
        call: impl Future<Output = Result<(), HandlerError>>,
    ) -> Result<(), HandlerError> {
        let span = tracing::info_span!(
            "handler",
            message_id = %item.identified.id,
            message_type = %item.identified.message_type,
            attempt,
            mode = mode.as_str(),
            duration_ms = Empty,
            outcome = Empty,
        );
        let started = Instant::now();
        let result = call.instrument(span.clone()).await;
        let elapsed = started.elapsed();
        metrics::histogram!("dedup_handler_duration_seconds", "type" => item.identified.message_type.clone())
            .record(elapsed.as_secs_f64());
        span.record("duration_ms", elapsed.as_micros() as f64 / 1000.0);
        span.record(
            "outcome",
            match &result {
                Ok(()) => "ok",
                Err(e) if e.is_lease_lost() => "lease_lost",
                Err(e) if e.is_held() => "held",
                Err(_) => "error",
            },
        );
        result
    }

    /// Runs one [`crate::handler::TransactionalHandler::handle_batch`] call over `items` (at
    /// least one, all of one type) in a span of its own, `handler_batch` (`message_type`,
    /// `messages`, the `first_message_id` and `last_message_id`; `duration_ms` and `outcome` —
    /// `ok` or `error` — when it returns), at the level of a handler call. Each message's share
    /// of the duration goes to the `dedup_handler_duration_seconds` histogram, once per message.
    pub(super) async fn call_batch_handler(
        items: &[&Routed<'_>],
        call: impl Future<Output = Result<(), HandlerError>>,
    ) -> Result<(), HandlerError> {
        let (first, last) = (items[0], items[items.len() - 1]);
        let span = tracing::info_span!(
            "handler_batch",
            message_type = %first.identified.message_type,
            messages = items.len(),
            first_message_id = %first.identified.id,
            last_message_id = %last.identified.id,
            duration_ms = Empty,
            outcome = Empty,
        );
        let started = Instant::now();
        let result = call.instrument(span.clone()).await;
        let elapsed = started.elapsed();
        let share = elapsed.as_secs_f64() / items.len() as f64;
        let histogram =
            metrics::histogram!("dedup_handler_duration_seconds", "type" => first.identified.message_type.clone());
        for _ in items {
            histogram.record(share);
        }
        span.record("duration_ms", elapsed.as_micros() as f64 / 1000.0);
        span.record("outcome", if result.is_ok() { "ok" } else { "error" });
        result
    }
}

/// What became of a batch's deliveries, by [`Disposition`], recorded on its span.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(super) struct Outcomes {
    /// Handled: the record is `succeeded`.
    succeeded: usize,
    /// Duplicates caught by Redis or the database.
    duplicate: usize,
    /// Failed with attempts left: a retry copy is due.
    retried: usize,
    /// Dead-lettered after a handler failed for good, or for want of a handler.
    dead: usize,
    /// Dead-lettered unread: no usable id, bad JSON, too large, hostile headers.
    poison: usize,
    /// Given back to the broker unjudged (database trouble).
    redelivered: usize,
    /// Redeliveries of stuck records kept under `hold`.
    parked: usize,
    /// Leases taken over before completion.
    lease_lost: usize,
    /// Held unclaimed: their handler is paused.
    held: usize,
}

impl Outcomes {
    /// Counts `dispositions`; `poison` holds the indexes of the batch's poison deliveries.
    pub(super) fn of(dispositions: &[Disposition], poison: &[usize]) -> Self {
        let mut o = Outcomes::default();
        for (index, disposition) in dispositions.iter().enumerate() {
            let n = match disposition {
                Disposition::Ack(AckReason::Processed) => &mut o.succeeded,
                Disposition::Ack(AckReason::DuplicateRedis | AckReason::DuplicateDatabase) => &mut o.duplicate,
                Disposition::Ack(AckReason::Parked) => &mut o.parked,
                Disposition::Ack(AckReason::LeaseLost) => &mut o.lease_lost,
                Disposition::Retry { .. } => &mut o.retried,
                Disposition::DeadLetter { .. } if poison.contains(&index) => &mut o.poison,
                Disposition::DeadLetter { .. } => &mut o.dead,
                Disposition::Redeliver => &mut o.redelivered,
                Disposition::Held { .. } => &mut o.held,
            };
            *n += 1;
        }
        o
    }

    /// Records the counts on a span from [`Pipeline::batch_span`].
    pub(super) fn record(&self, span: &Span) {
        span.record("succeeded", self.succeeded)
            .record("duplicate", self.duplicate)
            .record("retried", self.retried)
            .record("dead", self.dead)
            .record("poison", self.poison)
            .record("redelivered", self.redelivered)
            .record("parked", self.parked)
            .record("lease_lost", self.lease_lost)
            .record("held", self.held);
    }
}
