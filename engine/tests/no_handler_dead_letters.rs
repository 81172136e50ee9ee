//! `NO_HANDLER` dead letters (DESIGN.md, "Terms", dead letter; found by a review): a delivery with
//! a handler that takes one over (its own message typed anew), one of another event that must
//! not, and a copy without a handler that makes a requeued one dead again.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use common::amqp::{broker, published};
use common::*;
use dedup_engine::LeaseExpiryPolicy;
use dedup_engine::actions::{RecordAction, RecordActionKind, record_action};
use dedup_engine::handler::{Handler, HandlerError, HandlerInput, HandlerRegistry, LeaseGuard, LeasedHandler};
use dedup_engine::message::{InboundMessage, TypePolicy, TypeSource};
use dedup_engine::pipeline::{AckReason, Disposition, Pipeline, PipelineSettings};
use serde_json::json;

fn by(from: TypeSource) -> PipelineSettings {
    let types = TypePolicy { from: vec![from], ..TypePolicy::default() };
    PipelineSettings { type_policy: types, ..settings(3, Duration::from_secs(30)) }
}

fn transactional(h: &Harness, types: &[&str], from: TypeSource) -> Pipeline {
    let mut handlers = HandlerRegistry::new();
    for t in types {
        handlers.register(*t, Handler::Transactional(Arc::new(RecordTyped)));
    }
    h.pipeline_with(handlers, by(from))
}

fn event(id: &str, message_type: &str, body: serde_json::Value) -> InboundMessage {
    let mut m = message(id, body);
    m.type_property = Some(message_type.to_owned());
    m
}

/// Fails its first run (retryable), succeeds after; records the payloads it ran with.
#[derive(Default)]
struct FailsOnce {
    runs: AtomicUsize,
    payloads: std::sync::Mutex<Vec<Vec<u8>>>,
}

#[async_trait]
impl LeasedHandler for FailsOnce {
    async fn handle(&self, input: &HandlerInput<'_>, _: &LeaseGuard) -> Result<(), HandlerError> {
        self.payloads.lock().unwrap().push(input.payload.to_vec());
        if self.runs.fetch_add(1, Ordering::SeqCst) == 0 {
            return Err(HandlerError::retryable("DOWNSTREAM_DOWN", "503"));
        }
        Ok(())
    }
}

async fn counts_agree(pool: &sqlx::PgPool) {
    let kept: Vec<(String, i64)> = sqlx::query_as(
        "SELECT status::text, sum(n)::bigint FROM record_counts GROUP BY 1 HAVING sum(n) <> 0 ORDER BY 1",
    )
    .fetch_all(pool)
    .await
    .unwrap();
    let real: Vec<(String, i64)> =
        sqlx::query_as("SELECT status::text, count(*) FROM dedup_records GROUP BY 1 ORDER BY 1")
            .fetch_all(pool)
            .await
            .unwrap();
    assert_eq!(kept, real, "record_counts against the rows");
}

/// The type read from the body (`/event`): the producer's fixed resend differs in its payload.
#[tokio::test]
async fn a_fixed_resend_typed_in_its_body_is_no_payload_conflict_of_its_own_copies() {
    let h = Harness::with_redis("redis://127.0.0.1:1").await;
    let pool = h.pool();
    let p = transactional(&h, &["ORDER.PAY"], TypeSource::JsonPointer("/event".to_owned()));
    let untyped = p.process("w", &[message("o-1", json!({ "order": 1 }))]).await;
    assert!(matches!(&untyped[0], Disposition::DeadLetter { .. }), "{untyped:?}");
    let fixed = || message("o-1", json!({ "event": "ORDER.PAY", "order": 1 }));
    assert_eq!(p.process("w", &[fixed()]).await, vec![Disposition::Ack(AckReason::Processed)]);
    // The broker's ordinary redelivery of the same fixed message.
    assert_eq!(p.process("w", &[fixed()]).await, vec![Disposition::Ack(AckReason::DuplicateDatabase)]);
    let (conflicts, kept): (i32, i64) =
        sqlx::query_as("SELECT payload_conflicts, (SELECT count(*) FROM record_conflicts) FROM dedup_records")
            .fetch_one(pool)
            .await
            .unwrap();
    assert_eq!((conflicts, kept), (0, 0), "a copy of the message that ran is no payload conflict");
}

/// A leased handler takes a NO_HANDLER dead letter over, fails once; the operator's requeue
/// publishes the record's stored message: it must be the delivery that ran (typed), not the
/// untyped dead letter.
#[tokio::test]
async fn a_leased_takeover_that_fails_is_requeued_as_the_delivery_that_ran() {
    let h = Harness::with_redis("redis://127.0.0.1:1").await;
    let pool = h.pool();
    let effect = Arc::new(FailsOnce::default());
    let mut handlers = HandlerRegistry::new();
    handlers.register(
        "ORDER.NOTIFY",
        Handler::Leased { handler: effect.clone(), on_lease_expiry: LeaseExpiryPolicy::Hold },
    );
    let p = h.pipeline_with(handlers, by(TypeSource::TypeProperty));
    let (broker, publishers) = broker().await;
    let on = |mut m: InboundMessage| {
        m.source.exchange = Some(broker.settings.exchange.clone());
        m
    };
    let untyped = p.process("w", &[on(message("n-1", json!({ "order": 1 })))]).await;
    assert!(matches!(&untyped[0], Disposition::DeadLetter { .. }), "{untyped:?}");
    let typed = p.process("w", &[on(event("n-1", "ORDER.NOTIFY", json!({ "order": 1 })))]).await;
    assert!(matches!(typed[0], Disposition::Retry { .. }), "{typed:?}");
    let (status, type_property): (String, Option<String>) =
        sqlx::query_as("SELECT status::text, type_property FROM dedup_records").fetch_one(pool).await.unwrap();
    assert_eq!(status, "failed");
    let (id, version): (i64, i64) =
        sqlx::query_as("SELECT id, version FROM dedup_records").fetch_one(pool).await.unwrap();
    let params = RecordAction {
        record_id: id,
        expected_status: None,
        lease_token: None,
        expected_version: Some(version),
        force: false,
        reason: None,
        requeue: false,
    };
    record_action(pool, "user:ann", RecordActionKind::Requeue, &params, &publishers).await.unwrap();
    let copies = published(&broker).await;
    assert_eq!(copies.len(), 1);
    let again = p.process("w", &copies).await;
    assert_eq!(
        again,
        vec![Disposition::Ack(AckReason::Processed)],
        "the requeued copy (type property {type_property:?} stored) reaches its handler"
    );
    counts_agree(pool).await;
}

/// record_counts through every new transition: dead → processing/succeeded (takeover), failed →
/// dead (dead again), both isolations and the leased path.
#[tokio::test]
async fn record_counts_follow_takeovers_and_dead_again() {
    let h = Harness::with_redis("redis://127.0.0.1:1").await;
    let pool = h.pool();
    let none = transactional(&h, &[], TypeSource::TypeProperty);
    let with = transactional(&h, &["ORDER.PAY"], TypeSource::TypeProperty);
    let mut failing = HandlerRegistry::new();
    failing.register("ORDER.PAY", Handler::Transactional(Arc::new(AlwaysFails)));
    let failing = h.pipeline_with(failing, by(TypeSource::TypeProperty));
    for i in 0..4 {
        none.process("w", &[event(&format!("c-{i}"), "ORDER.PAY", json!({ "i": i }))]).await;
    }
    counts_agree(pool).await;
    // Optimistic takeover (dead → succeeded).
    assert_eq!(
        with.process("w", &[event("c-0", "ORDER.PAY", json!({ "i": 0 }))]).await[0],
        Disposition::Ack(AckReason::Processed)
    );
    counts_agree(pool).await;
    // Savepoints takeover that fails (dead → processing → failed).
    let f = failing.process("w", &[event("c-1", "ORDER.PAY", json!({ "i": 1 }))]).await;
    assert!(matches!(f[0], Disposition::Retry { .. }), "{f:?}");
    counts_agree(pool).await;
    // Requeued, then dead again.
    sqlx::query("UPDATE dedup_records SET status = 'failed', next_attempt_at = now() WHERE message_id = 'c-2'")
        .execute(pool)
        .await
        .unwrap();
    let d = none.process("w", &[event("c-2", "ORDER.PAY", json!({ "i": 2 }))]).await;
    assert!(matches!(d[0], Disposition::DeadLetter { .. }), "{d:?}");
    counts_agree(pool).await;
    // One batch: untyped and typed copies of one id.
    let both =
        with.process("w", &[message("c-9", json!({ "i": 9 })), event("c-9", "ORDER.PAY", json!({ "i": 9 }))]).await;
    counts_agree(pool).await;
    assert_eq!(typed_effects(pool, "ORDER.PAY").await, 2, "{both:?}");
}

/// Two untyped copies of a requeued NO_HANDLER record: the one whose statement waited on the
/// other's row lock is a duplicate, not a second dead letter.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_copy_that_waited_for_the_record_dead_again_is_its_duplicate() {
    let h = Harness::with_redis("redis://127.0.0.1:1").await;
    let pool = h.pool().clone();
    let none = transactional(&h, &[], TypeSource::TypeProperty);
    let foo = || event("r-1", "ORDER.FOO", json!({ "x": 1 }));
    none.process("w", &[foo()]).await;
    sqlx::query("UPDATE dedup_records SET status = 'failed', next_attempt_at = now()").execute(&pool).await.unwrap();
    // Another worker's copy makes it dead again and has not committed yet.
    let mut other = pool.begin().await.unwrap();
    sqlx::query("UPDATE dedup_records SET status = 'dead', version = version + 1, next_attempt_at = NULL")
        .execute(&mut *other)
        .await
        .unwrap();
    let late = tokio::spawn(async move { none.process("w2", &[foo()]).await });
    tokio::time::sleep(Duration::from_millis(500)).await;
    other.commit().await.unwrap();
    let late = late.await.unwrap();
    assert_eq!(late, vec![Disposition::Ack(AckReason::DuplicateDatabase)], "one dead letter per requeue");
    counts_agree(&pool).await;
}

/// Order numbers as ids, a group handling CREATE only until PAY's handler is deployed: the PAY
/// arrives first and is a NO_HANDLER dead letter; the CREATE of the same order must not take its
/// record over: the PAY stays recoverable in the database (not only in the broker's dead-letter
/// queue), and the CREATE is a reused id with its copy kept.
#[tokio::test]
async fn a_delivery_of_another_type_does_not_erase_a_no_handler_dead_letter() {
    let h = Harness::with_redis("redis://127.0.0.1:1").await;
    let pool = h.pool();
    let p = transactional(&h, &["ORDER.CREATE"], TypeSource::TypeProperty);
    let pay = p.process("w", &[event("order-5", "ORDER.PAY", json!({ "order": 5, "amount": 10 }))]).await;
    assert!(matches!(&pay[0], Disposition::DeadLetter { .. }), "{pay:?}");
    // Another event under the same id: a reused id, dead-lettered with its copy kept.
    let create = p.process("w", &[event("order-5", "ORDER.CREATE", json!({ "order": 5 }))]).await;
    assert!(matches!(&create[0], Disposition::DeadLetter { reason } if reason.contains("reused id")), "{create:?}");
    let kept: i64 = sqlx::query_scalar("SELECT count(*) FROM record_conflicts WHERE message_type = 'ORDER.CREATE'")
        .fetch_one(pool)
        .await
        .unwrap();
    assert_eq!(kept, 1, "the CREATE is kept for an operator too");
    let dead_pay: i64 = sqlx::query_scalar(
        "SELECT (SELECT count(*) FROM dedup_records WHERE message_type = 'ORDER.PAY' AND status = 'dead')
              + (SELECT count(*) FROM record_conflicts WHERE message_type = 'ORDER.PAY')",
    )
    .fetch_one(pool)
    .await
    .unwrap();
    assert_eq!(dead_pay, 1, "the PAY's dead letter is kept somewhere an operator can requeue it");
}

/// Two workers with the handler (leased) get copies of a NO_HANDLER dead letter's id at once:
/// one effect.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_workers_taking_over_one_no_handler_dead_letter_run_one_effect() {
    let h = Harness::with_redis("redis://127.0.0.1:1").await;
    let pool = h.pool();
    let none = transactional(&h, &[], TypeSource::TypeProperty);
    none.process("w", &[message("k-1", json!({ "k": 1 }))]).await;
    let effect = CountingEffect::new(Duration::from_millis(200));
    let mut handlers = HandlerRegistry::new();
    handlers.register(
        "ORDER.NOTIFY",
        Handler::Leased { handler: effect.clone(), on_lease_expiry: LeaseExpiryPolicy::Reclaim },
    );
    let p = Arc::new(h.pipeline_with(handlers, by(TypeSource::TypeProperty)));
    let (a, b) = (p.clone(), p.clone());
    let one = tokio::spawn(async move { a.process("w1", &[event("k-1", "ORDER.NOTIFY", json!({ "k": 1 }))]).await });
    let two = tokio::spawn(async move { b.process("w2", &[event("k-1", "ORDER.NOTIFY", json!({ "k": 1 }))]).await });
    let (one, two) = (one.await.unwrap(), two.await.unwrap());
    assert_eq!(effect.runs(), 1, "{one:?} {two:?}");
    counts_agree(pool).await;
}
