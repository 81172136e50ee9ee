//! The edges of reused ids and conflicting copies, each found by a review that tried to break
//! them (DESIGN.md, "Reused ids and payload conflicts"): the Redis fast path, cleanup's
//! fingerprints, the bulk requeue, a copy after its conflict was settled, a long id, the
//! `NO_HANDLER` exception, the copies kept per record, two requeues at once.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::amqp::{broker, published};
use common::*;
use dedup_engine::LateDuplicatePolicy;
use dedup_engine::actions::cleanup::late::RetentionWatch;
use dedup_engine::actions::cleanup::{ScheduleInput, cleanup_runs, cleanup_schedule_save, scheduler};
use dedup_engine::actions::conflicts::{dismiss_conflict, open_conflicts, requeue_conflict, requeue_conflicts};
use dedup_engine::handler::{Handler, HandlerRegistry};
use dedup_engine::message::{IdPolicy, IdSource, InboundMessage, TypePolicy, TypeSource};
use dedup_engine::pipeline::{AckReason, Disposition, Pipeline, PipelineSettings};
use serde_json::json;

fn typed(late: LateDuplicatePolicy) -> PipelineSettings {
    let types = TypePolicy { from: vec![TypeSource::TypeProperty], ..TypePolicy::default() };
    PipelineSettings { type_policy: types, late_duplicates: late, ..settings(3, Duration::from_secs(30)) }
}

fn pipeline_of(h: &Harness, types: &[&str], late: LateDuplicatePolicy) -> Pipeline {
    let mut handlers = HandlerRegistry::new();
    for t in types {
        handlers.register(*t, Handler::Transactional(Arc::new(RecordTyped)));
    }
    h.pipeline_with(handlers, typed(late))
}

fn pipeline(h: &Harness) -> Pipeline {
    pipeline_of(h, &["ORDER.CREATE", "ORDER.PAY"], LateDuplicatePolicy::Process)
}

fn event(id: &str, message_type: &str, body: serde_json::Value) -> InboundMessage {
    let mut m = message(id, body);
    m.type_property = Some(message_type.to_owned());
    m
}

#[tokio::test]
async fn redis_never_takes_a_reused_id_for_a_duplicate_even_with_the_same_payload() {
    let h = Harness::new().await;
    let p = pipeline(&h);
    let body = json!({ "order": 1 });
    assert_eq!(
        p.process("w", &[event("order-1", "ORDER.CREATE", body.clone())]).await,
        vec![Disposition::Ack(AckReason::Processed)]
    );
    let pay = p.process("w", &[event("order-1", "ORDER.PAY", body.clone())]).await;
    assert!(matches!(&pay[0], Disposition::DeadLetter { reason } if reason.contains("reused id")), "{pay:?}");
    let again = p.process("w", &[event("order-1", "ORDER.CREATE", body)]).await;
    assert_eq!(again, vec![Disposition::Ack(AckReason::DuplicateRedis)], "the CREATE's own copy still hits Redis");
}

#[tokio::test]
async fn a_reused_id_after_cleanup_is_a_new_event_not_a_late_duplicate() {
    let h = Harness::with_redis("redis://127.0.0.1:1").await;
    let pool = h.pool();
    let watch = Arc::new(RetentionWatch::default());
    let p = pipeline_of(&h, &["ORDER.CREATE", "ORDER.PAY"], LateDuplicatePolicy::Hold).with_retention(watch.clone());
    p.process("w", &[event("order-7", "ORDER.CREATE", json!({ "order": 7 }))]).await;
    sqlx::query("UPDATE dedup_records SET first_seen_at = now() - interval '40 days', completed_at = now() - interval '40 days'")
        .execute(pool)
        .await
        .unwrap();
    let schedule =
        cleanup_schedule_save(pool, "user:ann", None, &ScheduleInput { name: "n".to_owned(), ..Default::default() })
            .await
            .unwrap();
    let run = scheduler::cleanup_run_now(&pool.clone().into(), "user:ann", schedule.id).await.unwrap();
    eventually(Duration::from_secs(10), || async {
        cleanup_runs(pool, Some(schedule.id), 5).await.unwrap().iter().any(|r| r.id == run && r.finished_at.is_some())
    })
    .await;
    watch.refresh(pool).await.unwrap();
    assert!(watch.fingerprints_kept());
    let pay = p.process("w", &[event("order-7", "ORDER.PAY", json!({ "order": 7, "paid": 10 }))]).await;
    assert_eq!(pay, vec![Disposition::Ack(AckReason::Processed)], "the PAY runs: no copy of the deleted CREATE");
    let late: i64 = sqlx::query_scalar("SELECT count(*) FROM late_duplicates").fetch_one(pool).await.unwrap();
    assert_eq!(late, 0);
}

#[tokio::test]
async fn the_bulk_requeue_runs_reused_ids_only_and_payload_conflicts_are_settled_one_by_one() {
    let h = Harness::new().await;
    let pool = h.pool();
    let p = pipeline(&h);
    let (broker, publishers) = broker().await;
    let exchange = broker.settings.exchange.clone();
    let on_broker = |mut m: InboundMessage| {
        m.source.exchange = Some(exchange.clone());
        m
    };
    // A producer's retry with a new send time: judged a duplicate, its copy kept.
    p.process("w", &[on_broker(event("order-3", "ORDER.CREATE", json!({ "order": 3, "sent_at": "10:00:00" })))]).await;
    let retry = on_broker(event("order-3", "ORDER.CREATE", json!({ "order": 3, "sent_at": "10:00:05" })));
    assert_eq!(p.process("w", &[retry]).await, vec![Disposition::Ack(AckReason::DuplicateDatabase)]);
    p.process("w", &[on_broker(event("order-3", "ORDER.PAY", json!({ "order": 3, "paid": 1 })))]).await;

    let (done, failed) = requeue_conflicts(pool, "cli:ops", Some(GROUP), &publishers).await.unwrap();
    assert_eq!((done.len(), failed.len()), (1, 0), "the PAY only");
    let settled = p.process("w", &published(&broker).await).await;
    assert_eq!(settled, vec![Disposition::Ack(AckReason::Processed)]);
    assert_eq!(
        (typed_effects(pool, "ORDER.CREATE").await, typed_effects(pool, "ORDER.PAY").await),
        (1, 1),
        "nothing ran twice"
    );

    let payload: i64 =
        sqlx::query_scalar("SELECT id FROM record_conflicts WHERE kind = 'payload'").fetch_one(pool).await.unwrap();
    let no_reason = dismiss_conflict(pool, "user:ann", payload, " ").await.unwrap_err();
    assert!(no_reason.to_string().contains("give a reason"), "{no_reason}");
    dismiss_conflict(pool, "user:ann", payload, "a producer retry with a new send time").await.unwrap();
    let twice = requeue_conflict(pool, "user:ann", payload, &publishers).await.unwrap_err();
    assert!(twice.to_string().contains("settled already"), "{twice}");
    let audit: Vec<String> = sqlx::query_scalar(
        "SELECT action FROM audit_log WHERE action LIKE 'conflict.%' AND outcome = 'ok' ORDER BY id",
    )
    .fetch_all(pool)
    .await
    .unwrap();
    assert_eq!(audit, ["conflict.requeue", "conflict.dismiss"]);
}

#[tokio::test]
async fn a_copy_after_its_conflict_was_settled_opens_a_new_one_and_a_long_id_still_requeues() {
    let h = Harness::new().await;
    let pool = h.pool();
    let p = pipeline(&h);
    let (broker, publishers) = broker().await;
    let long = format!("o-{}", "é".repeat(254));
    let on_broker = |t: &str| {
        let mut m = event(&long, t, json!({ "event": t }));
        m.source.exchange = Some(broker.settings.exchange.clone());
        m
    };
    p.process("w", &[on_broker("ORDER.CREATE")]).await;
    p.process("w", &[on_broker("ORDER.PAY")]).await;
    let first = open_conflicts(pool, None).await.unwrap();
    let new_id = requeue_conflict(pool, "user:ann", first[0], &publishers).await.unwrap();
    assert!(new_id.len() <= 512 && new_id.ends_with(&format!("#conflict-{}", first[0])), "{new_id}");
    assert!(new_id.len() > 255, "longer than the AMQP message_id property allows: sent in x-message-id");
    assert_eq!(p.process("w", &published(&broker).await).await, vec![Disposition::Ack(AckReason::Processed)]);
    // The same PAY again under the old id (a redelivery, or ids.from still reading the old source).
    p.process("w", &[on_broker("ORDER.PAY")]).await;
    let open = open_conflicts(pool, None).await.unwrap();
    assert_eq!(open.len(), 1, "a new open conflict, not a copy hidden in the settled row");
    assert_ne!(open[0], first[0]);
}

#[tokio::test]
async fn a_requeued_copy_whose_id_came_from_a_header_carries_its_new_id_there() {
    let h = Harness::new().await;
    let pool = h.pool();
    // What the README advises when producers stamp a fresh message_id on every send.
    let ids = IdPolicy::from_sources([IdSource::Header("x-idempotency-key".to_owned()), IdSource::Property]);
    let mut handlers = HandlerRegistry::new();
    for t in ["ORDER.CREATE", "ORDER.PAY"] {
        handlers.register(t, Handler::Transactional(Arc::new(RecordTyped)));
    }
    let p = h.pipeline_with(handlers, PipelineSettings { id_policy: ids, ..typed(LateDuplicatePolicy::Process) });
    let (broker, publishers) = broker().await;
    let sent = |send: &str, t: &str| {
        let mut m = event(send, t, json!({ "event": t }));
        m.headers.insert("x-idempotency-key".to_owned(), json!("order-12"));
        m.source.exchange = Some(broker.settings.exchange.clone());
        m
    };
    p.process("w", &[sent("send-1", "ORDER.CREATE")]).await;
    p.process("w", &[sent("send-2", "ORDER.PAY")]).await;
    let conflict = open_conflicts(pool, None).await.unwrap()[0];
    let new_id = requeue_conflict(pool, "user:ann", conflict, &publishers).await.unwrap();
    let copies = published(&broker).await;
    assert_eq!(copies[0].headers.get("x-idempotency-key"), Some(&json!(new_id)), "the header the id was read from");
    assert_eq!(p.process("w", &copies).await, vec![Disposition::Ack(AckReason::Processed)]);
    assert!(open_conflicts(pool, None).await.unwrap().is_empty(), "no new conflict under the old id");
    assert_eq!((typed_effects(pool, "ORDER.CREATE").await, typed_effects(pool, "ORDER.PAY").await), (1, 1));
}

#[tokio::test]
async fn a_record_dead_for_want_of_a_handler_is_claimed_by_a_copy_a_type_mapping_renamed() {
    let h = Harness::with_redis("redis://127.0.0.1:1").await;
    let pool = h.pool();
    let p = pipeline_of(&h, &["ORDER.CREATED"], LateDuplicatePolicy::Process);
    p.process("w", &[event("order-8", "ORDER.CREATE", json!({ "order": 8 }))]).await;
    let class: String = sqlx::query_scalar("SELECT error_class FROM dedup_records").fetch_one(pool).await.unwrap();
    assert_eq!(class, "NO_HANDLER: ORDER.CREATE");
    // What a requeue does after the mapping ORDER.CREATE → ORDER.CREATED was added.
    sqlx::query("UPDATE dedup_records SET status = 'failed', max_attempts = attempts + 1, next_attempt_at = now()")
        .execute(pool)
        .await
        .unwrap();
    let copy = p.process("w", &[event("order-8", "ORDER.CREATED", json!({ "order": 8 }))]).await;
    assert_eq!(copy, vec![Disposition::Ack(AckReason::Processed)]);
    assert_eq!(typed_effects(pool, "ORDER.CREATED").await, 1);
}

#[tokio::test]
async fn a_delivery_with_a_handler_claims_a_no_handler_dead_letter_of_its_id() {
    let h = Harness::with_redis("redis://127.0.0.1:1").await;
    let pool = h.pool();
    let p = pipeline_of(&h, &["ORDER.PAY"], LateDuplicatePolicy::Process);
    // Sent without its type first (UNKNOWN, no handler), then resent typed by its producer.
    let untyped = p.process("w", &[message("notype-1", json!({ "order": 1 }))]).await;
    assert!(matches!(&untyped[0], Disposition::DeadLetter { reason } if reason.contains("no handler")), "{untyped:?}");
    let typed = p.process("w", &[event("notype-1", "ORDER.PAY", json!({ "order": 1 }))]).await;
    assert_eq!(typed, vec![Disposition::Ack(AckReason::Processed)], "no effect of it had run: it runs now");
    let again = p.process("w", &[event("notype-1", "ORDER.PAY", json!({ "order": 1 }))]).await;
    assert_eq!(again, vec![Disposition::Ack(AckReason::DuplicateDatabase)]);
    assert_eq!(typed_effects(pool, "ORDER.PAY").await, 1);
    let status: String = sqlx::query_scalar("SELECT status::text FROM dedup_records").fetch_one(pool).await.unwrap();
    assert_eq!(status, "succeeded");
}

#[tokio::test]
async fn a_no_handler_dead_letter_requeued_before_its_handler_exists_is_dead_again_not_stranded() {
    let h = Harness::with_redis("redis://127.0.0.1:1").await;
    let pool = h.pool();
    let without = pipeline_of(&h, &["ORDER.PAY"], LateDuplicatePolicy::Process);
    let foo = || event("foo-1", "ORDER.FOO", json!({ "x": 1 }));
    assert!(matches!(&without.process("w", &[foo()]).await[0], Disposition::DeadLetter { .. }));
    // An operator's requeue (the copy is republished) while ORDER.FOO still has no handler.
    sqlx::query("UPDATE dedup_records SET status = 'failed', max_attempts = attempts + 1, next_attempt_at = now()")
        .execute(pool)
        .await
        .unwrap();
    let copy = without.process("w", &[foo()]).await;
    assert!(matches!(&copy[0], Disposition::DeadLetter { reason } if reason.contains("no handler")), "{copy:?}");
    let (status, duplicates, class): (String, i32, String) =
        sqlx::query_as("SELECT status::text, duplicate_count, error_class FROM dedup_records")
            .fetch_one(pool)
            .await
            .unwrap();
    assert_eq!((status.as_str(), duplicates, class.as_str()), ("dead", 0, "NO_HANDLER: ORDER.FOO"));
    // Once the handler exists, the next copy runs it.
    let with = pipeline_of(&h, &["ORDER.FOO"], LateDuplicatePolicy::Process);
    assert_eq!(with.process("w", &[foo()]).await, vec![Disposition::Ack(AckReason::Processed)]);
    assert_eq!(typed_effects(pool, "ORDER.FOO").await, 1);
}

#[tokio::test]
async fn a_reused_id_whose_type_has_no_handler_is_a_dead_letter_with_its_copy_not_a_duplicate() {
    let h = Harness::with_redis("redis://127.0.0.1:1").await;
    let pool = h.pool();
    // A group that handles CREATE only, its ids the order numbers.
    let p = pipeline_of(&h, &["ORDER.CREATE"], LateDuplicatePolicy::Process);
    p.process("w", &[event("order-5", "ORDER.CREATE", json!({ "order": 5 }))]).await;
    for _ in 0..2 {
        let pay = p.process("w", &[event("order-5", "ORDER.PAY", json!({ "order": 5, "paid": 1 }))]).await;
        assert!(matches!(&pay[0], Disposition::DeadLetter { reason } if reason.contains("reused id")), "{pay:?}");
    }
    let (status, duplicates): (String, i32) =
        sqlx::query_as("SELECT status::text, duplicate_count FROM dedup_records").fetch_one(pool).await.unwrap();
    assert_eq!((status.as_str(), duplicates), ("succeeded", 0), "nothing counted on the CREATE");
    let (kind, copies): (String, i32) =
        sqlx::query_as("SELECT kind, copies FROM record_conflicts").fetch_one(pool).await.unwrap();
    assert_eq!((kind.as_str(), copies), ("type", 2), "the PAY kept, both copies counted");
}

#[tokio::test]
async fn a_record_keeps_at_most_five_open_payload_conflicts_and_two_requeues_at_once_publish_once() {
    let h = Harness::new().await;
    let pool = h.pool();
    let p = pipeline(&h);
    for n in 0..8 {
        p.process("w", &[event("order-9", "ORDER.CREATE", json!({ "order": 9, "n": n }))]).await;
    }
    let (rows, counted): (i64, i32) =
        sqlx::query_as("SELECT (SELECT count(*) FROM record_conflicts), (SELECT payload_conflicts FROM dedup_records)")
            .fetch_one(pool)
            .await
            .unwrap();
    assert_eq!((rows, counted), (5, 7), "5 copies kept, all 7 conflicts counted on the record");

    let (broker, publishers) = broker().await;
    let mut pay = event("order-9", "ORDER.PAY", json!({ "paid": 1 }));
    pay.source.exchange = Some(broker.settings.exchange.clone());
    p.process("w", &[pay]).await;
    let id = open_conflicts(pool, None).await.unwrap()[0];
    let (a, b) = tokio::join!(
        requeue_conflict(pool, "user:a", id, &publishers),
        requeue_conflict(pool, "user:b", id, &publishers)
    );
    assert!(a.is_ok() != b.is_ok(), "one wins: {a:?} {b:?}");
    assert_eq!(published(&broker).await.len(), 1);
}
