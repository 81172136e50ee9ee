//! A leased call whose answer was lost (`HandlerError::outcome_unknown`, DESIGN.md "Two handler
//! modes"): under `hold` nothing is recorded, the record keeps its claim, a redelivery before the
//! lease expires waits for it, and the first after it is parked for an operator — the effect is
//! never run twice. Under `reclaim` it is a counted failure like any other.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use common::{Harness, message, settings};
use dedup_engine::handler::{Handler, HandlerError, HandlerInput, HandlerRegistry, LeaseGuard, LeasedHandler};
use dedup_engine::pipeline::{AckReason, Disposition};
use dedup_engine::record::LeaseExpiryPolicy;
use serde_json::json;

/// A gateway whose every answer is lost after the request went out.
#[derive(Default)]
struct NoAnswer {
    calls: AtomicUsize,
}

#[async_trait]
impl LeasedHandler for NoAnswer {
    async fn handle(&self, _: &HandlerInput<'_>, _: &LeaseGuard) -> Result<(), HandlerError> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        Err(HandlerError::outcome_unknown("GATEWAY_NO_ANSWER", "connection reset after the request was sent"))
    }
}

fn registry(handler: Arc<NoAnswer>, on_lease_expiry: LeaseExpiryPolicy) -> HandlerRegistry {
    let mut handlers = HandlerRegistry::new();
    handlers.register("ORDER.NOTIFY", Handler::Leased { handler, on_lease_expiry });
    handlers
}

/// The record's status, attempts, whether a redelivery is parked on it, and its last error.
async fn record(h: &Harness) -> (String, i32, bool, Option<String>) {
    sqlx::query_as("SELECT status, attempts, parked_at IS NOT NULL, last_error FROM dedup_records")
        .fetch_one(h.pool())
        .await
        .unwrap()
}

#[tokio::test]
async fn under_hold_an_unknown_outcome_keeps_the_claim_and_is_parked_once_the_lease_expires() {
    let h = Harness::new().await;
    let handler = Arc::new(NoAnswer::default());
    let lease = Duration::from_secs(1);
    let pipeline = h.pipeline_with(registry(handler.clone(), LeaseExpiryPolicy::Hold), settings(5, lease));
    let msg = message("ORDER.NOTIFY.U1:3", json!({"orderNo": "U1"}));

    let first = pipeline.process("w:1:0", std::slice::from_ref(&msg)).await;
    assert_eq!(first, [Disposition::Retry { delay: lease }], "a copy due when the lease expires");
    assert_eq!(record(&h).await, ("processing".to_owned(), 1, false, None), "nothing recorded, the claim kept");

    let early = pipeline.process("w:1:0", std::slice::from_ref(&msg)).await;
    assert!(matches!(early[..], [Disposition::Retry { .. }]), "a redelivery within the lease waits: {early:?}");
    tokio::time::sleep(lease + Duration::from_millis(300)).await;
    let late = pipeline.process("w:1:0", std::slice::from_ref(&msg)).await;
    assert_eq!(late, [Disposition::Ack(AckReason::Parked)], "parked for an operator once the lease expired");
    let (status, attempts, parked, _) = record(&h).await;
    assert_eq!((status.as_str(), attempts, parked), ("processing", 1, true));
    assert_eq!(handler.calls.load(Ordering::SeqCst), 1, "the effect ran once");
}

#[tokio::test]
async fn under_reclaim_an_unknown_outcome_is_a_counted_failure() {
    let h = Harness::new().await;
    let handler = Arc::new(NoAnswer::default());
    let pipeline =
        h.pipeline_with(registry(handler.clone(), LeaseExpiryPolicy::Reclaim), settings(2, Duration::from_secs(5)));
    let msg = message("ORDER.NOTIFY.U2:3", json!({"orderNo": "U2"}));

    let first = pipeline.process("w:1:0", std::slice::from_ref(&msg)).await;
    assert!(matches!(first[..], [Disposition::Retry { .. }]), "{first:?}");
    let (status, attempts, _, error) = record(&h).await;
    assert_eq!((status.as_str(), attempts), ("failed", 1));
    assert!(error.is_some_and(|e| e.starts_with("GATEWAY_NO_ANSWER")), "recorded as the failure");
    let second = pipeline.process("w:1:0", std::slice::from_ref(&msg)).await;
    assert!(matches!(second[..], [Disposition::DeadLetter { .. }]), "bounded by max_attempts: {second:?}");
    assert_eq!(handler.calls.load(Ordering::SeqCst), 2);
}
