//! A gateway that dies mid-batch under `on_lease_expiry = hold` (DESIGN.md, "Two handler modes",
//! lease expiry): the records whose call never started are told apart from the one whose call
//! was in flight. Once their leases run out, the never-started ones are taken over by the next
//! delivery and called once; the one in flight, which the service may have seen, is parked for
//! an operator, with the one wave marked while it waited for a slot (at most one wave is marked
//! without having started). The worker is cancelled mid-batch (its task aborted: no heartbeat, no
//! completion), as a SIGKILL leaves it; against a real HTTP service the test starts.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::service::{Reply, Service};
use common::{Harness, message, settings};
use dedup_engine::handler::{Handler, HandlerRegistry};
use dedup_engine::http::{HttpHandler, HttpSettings};
use dedup_engine::message::InboundMessage;
use dedup_engine::pipeline::{AckReason, Disposition};
use dedup_engine::record::LeaseExpiryPolicy;
use serde_json::json;

const TYPE: &str = "ORDER.PAID";

fn registry(settings: &HttpSettings) -> HandlerRegistry {
    let mut handlers = HandlerRegistry::new();
    let handler = HttpHandler::new(settings).unwrap();
    handlers.register(TYPE, Handler::Leased { handler: Arc::new(handler), on_lease_expiry: settings.on_lease_expiry });
    handlers
}

fn paid(key: &str) -> InboundMessage {
    message(&format!("{TYPE}.{key}:1"), json!({"orderNo": key}))
}

/// (message id, status, effect_started, parked) of every record, by message id.
async fn records(h: &Harness) -> Vec<(String, String, Option<bool>, bool)> {
    sqlx::query_as(
        "SELECT message_id, status, effect_started, parked_at IS NOT NULL FROM dedup_records ORDER BY message_id",
    )
    .fetch_all(h.pool())
    .await
    .unwrap()
}

/// The service's calls per key, in key order.
fn calls_per_key(service: &Service, keys: &[&str]) -> Vec<usize> {
    let calls = service.calls();
    keys.iter()
        .map(|k| {
            let key = format!("\"{TYPE}.{k}:1\"");
            calls.iter().filter(|c| c.headers["idempotency-key"].to_str().unwrap() == key).count()
        })
        .collect()
}

#[tokio::test]
async fn after_a_crash_the_calls_never_marked_are_reclaimed_and_the_one_in_flight_is_parked() {
    let h = Harness::new().await;
    // The first call hangs (until released); every later one is answered at once.
    let service = Service::start([Reply::status(200).gated(), Reply::status(200)]).await;
    let mut s = HttpSettings::new(service.url());
    s.concurrency = 1;
    s.on_lease_expiry = LeaseExpiryPolicy::Hold;
    let lease = Duration::from_secs(1);
    let keys = ["U1", "U2", "U3", "U4"];
    let batch: Vec<InboundMessage> = keys.iter().map(|k| paid(k)).collect();

    let a = h.pipeline_with(registry(&s), settings(5, lease));
    let worker = tokio::spawn({
        let batch = batch.clone();
        async move { a.process("host-a:1:0", &batch).await }
    });
    tokio::time::timeout(Duration::from_secs(10), service.inner.arrived.notified()).await.expect("U1 is called");
    // U2, U3 and U4 wait for the one slot; then the worker dies.
    tokio::time::sleep(Duration::from_millis(200)).await;
    worker.abort();
    assert!(worker.await.unwrap_err().is_cancelled());
    let processing = |id: &str, started| (format!("{TYPE}.{id}:1"), "processing".to_owned(), Some(started), false);
    assert_eq!(
        records(&h).await,
        [processing("U1", true), processing("U2", true), processing("U3", false), processing("U4", false)],
        "the claim marked the call that started, and U1's start made U2's wave due: marked while it waits for \
         the slot (no slot is held while a mark commits); the waves after it were never marked"
    );

    // Their leases run out; the broker redelivers the batch to another gateway.
    tokio::time::sleep(lease + Duration::from_millis(500)).await;
    let b = h.pipeline_with(registry(&s), settings(5, lease));
    let done = b.process("host-b:2:0", &batch).await;
    assert_eq!(
        done,
        [
            Disposition::Ack(AckReason::Parked),
            Disposition::Ack(AckReason::Parked),
            Disposition::Ack(AckReason::Processed),
            Disposition::Ack(AckReason::Processed)
        ],
        "U1 may have reached the service, and U2 is marked as if it might: parked under hold; U3 and U4 \
         never did: taken over"
    );
    assert_eq!(calls_per_key(&service, &keys), [1, 0, 1, 1], "each key that was called, called once");
    let now = records(&h).await;
    assert!(now[..2].iter().all(|r| (r.1.as_str(), r.3) == ("processing", true)), "U1 and U2 wait for an operator");
    assert!(now[2..].iter().all(|r| r.1 == "succeeded"), "{now:?}");

    // U1 stays parked however often it comes back.
    assert_eq!(b.process("host-b:2:0", &batch[..1]).await, [Disposition::Ack(AckReason::Parked)]);
    assert_eq!(calls_per_key(&service, &keys), [1, 0, 1, 1]);
    service.inner.release.notify_one();
}
