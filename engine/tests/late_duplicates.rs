//! Late duplicates (DESIGN.md, "Late duplicates"): records cleaned up, the same messages (no
//! producer timestamp) replayed. Cleanup keeps their fingerprints; the copies are counted as late
//! duplicates with their delay, listed by the records filter, read by the retention advice, and
//! held for an operator when the group's policy says so.

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use common::*;
use dedup_engine::LateDuplicatePolicy;
use dedup_engine::actions::Publishers;
use dedup_engine::actions::cleanup::late::{RetentionWatch, late_duplicates};
use dedup_engine::actions::cleanup::{ScheduleInput, cleanup_runs, cleanup_schedule_save, retention_advice, scheduler};
use dedup_engine::actions::{RecordAction, RecordActionKind, record_action};
use dedup_engine::console::records::RecordReads;
use dedup_engine::handler::{Handler, HandlerRegistry};
use dedup_engine::pipeline::{AckReason, Disposition, Pipeline};
use dedup_engine::record::LeaseExpiryPolicy;
use dedup_engine::retry::Backoff;
use dedup_engine::testing::{TestBroker, amqp_url};
use lapin::options::BasicGetOptions;
use serde_json::json;
use sqlx::PgPool;

const MESSAGES: usize = 100;

fn batch(prefix: &str) -> Vec<dedup_engine::message::InboundMessage> {
    (0..MESSAGES).map(|i| message(&format!("ORDER.PAY.{prefix}{i}:1"), json!({ "order": i }))).collect()
}

/// Ages every record by 40 days and deletes them with a 30-day schedule (its fingerprints kept
/// for `fingerprint_days`, default ten times the retention); returns the rows deleted.
async fn clean_up_aged_records(pool: &PgPool, fingerprint_days: Option<i32>) -> i64 {
    sqlx::query(
        "UPDATE dedup_records SET first_seen_at = now() - interval '40 days', completed_at = now() - interval '40 days'",
    )
    .execute(pool)
    .await
    .unwrap();
    let input = ScheduleInput { name: "nightly".to_owned(), fingerprint_days, ..ScheduleInput::default() };
    let schedule = cleanup_schedule_save(pool, "user:ann", None, &input).await.unwrap();
    let run = scheduler::cleanup_run_now(&pool.clone().into(), "user:ann", schedule.id).await.unwrap();
    let started = Instant::now();
    loop {
        let runs = cleanup_runs(pool, Some(schedule.id), 10).await.unwrap();
        if let Some(r) = runs.into_iter().find(|r| r.id == run && r.finished_at.is_some()) {
            assert_eq!(r.error, None);
            return r.rows_deleted;
        }
        assert!(started.elapsed() < Duration::from_secs(10), "run {run} did not finish");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn count(pool: &PgPool, sql: &str) -> i64 {
    sqlx::query_scalar(sql).fetch_one(pool).await.unwrap()
}

/// A harness whose Redis is down: the drill is about the database path (a Redis marker that
/// outlived the retention would have caught the copies first).
async fn harness() -> Harness {
    Harness::with_redis("redis://127.0.0.1:1").await
}

async fn watching(h: &Harness, pipeline: Pipeline) -> (Pipeline, Arc<RetentionWatch>) {
    let watch = Arc::new(RetentionWatch::default());
    watch.refresh(h.pool()).await.unwrap();
    (pipeline.with_retention(watch.clone()), watch)
}

#[tokio::test]
async fn replayed_after_cleanup_they_are_late_duplicates_with_their_delay_and_processed_by_default() {
    let h = harness().await;
    let pool = h.pool();
    let (pipeline, watch) = watching(&h, h.pipeline(recording(), 3)).await;
    assert!(!watch.fingerprints_kept());
    let first = pipeline.process("w", &batch("A")).await;
    assert!(first.iter().all(|d| *d == Disposition::Ack(AckReason::Processed)));
    assert_eq!(clean_up_aged_records(pool, None).await, MESSAGES as i64);
    assert_eq!(count(pool, "SELECT count(*) FROM dedup_fingerprints").await, MESSAGES as i64);
    let horizon_days =
        count(pool, "SELECT min(extract(day FROM forget_at - now()))::bigint FROM dedup_fingerprints").await;
    assert!((299..=300).contains(&horizon_days), "ten times the 30-day retention: {horizon_days}");

    watch.refresh(pool).await.unwrap();
    assert!(watch.fingerprints_kept());
    let replay = pipeline.process("w", &batch("A")).await;
    assert!(replay.iter().all(|d| *d == Disposition::Ack(AckReason::Processed)), "{replay:?}");
    assert_eq!(count(pool, "SELECT count(*) FROM test_effects").await, 2 * MESSAGES as i64, "processed again");

    let per_group = late_duplicates(pool, 30).await.unwrap();
    assert_eq!(per_group.len(), 1);
    assert_eq!((per_group[0].consumer_group.as_str(), per_group[0].count, per_group[0].held), (GROUP, 100, 0));
    let forty_days_ms = 40 * 86_400_000;
    assert!(
        (forty_days_ms..forty_days_ms + 60_000).contains(&per_group[0].longest_delay_ms),
        "delay measured from the first sighting: {}",
        per_group[0].longest_delay_ms
    );
    let record: i64 = count(pool, "SELECT min(id) FROM dedup_records").await;
    let (_, delay_ms, held) = pool.late_duplicate_note(record).await.unwrap().expect("noted on the record");
    assert!(delay_ms >= forty_days_ms && !held);
    let advice = retention_advice(pool).await.unwrap();
    assert!(advice.longest_delay_ms.unwrap() >= forty_days_ms, "the advice reads the late duplicates: {advice:?}");
    assert!(advice.is_too_short(30), "a 30-day retention is too short for a 40-day delay");

    // A third copy is an ordinary duplicate of the record the second one created: not late again.
    let third = pipeline.process("w", &batch("A")).await;
    assert!(third.iter().all(|d| *d == Disposition::Ack(AckReason::DuplicateDatabase)), "{third:?}");
    assert_eq!(count(pool, "SELECT count(*) FROM late_duplicates").await, MESSAGES as i64);
    // New messages are not late.
    pipeline.process("w", &batch("B")).await;
    assert_eq!(count(pool, "SELECT count(*) FROM late_duplicates").await, MESSAGES as i64);
}

#[tokio::test]
async fn under_hold_a_late_duplicate_is_parked_with_its_message_until_an_operator_releases_it() {
    let h = harness().await;
    let pool = h.pool();
    let settings = dedup_engine::pipeline::PipelineSettings {
        late_duplicates: LateDuplicatePolicy::Hold,
        ..settings(3, Duration::from_secs(30))
    };
    let (pipeline, watch) = watching(&h, h.pipeline_with(recording(), settings)).await;
    let broker = TestBroker::new(&amqp_url(), Backoff { initial_ms: 1000, max_ms: 1000 });
    let connector = broker.connector();
    connector.publisher().await.expect("RabbitMQ at AMQP_URL");
    let mut publishers = Publishers::default();
    publishers.add(GROUP, connector);
    let from_broker = || {
        let mut messages = batch("A");
        for m in &mut messages {
            m.source.exchange = Some(broker.settings.exchange.clone());
        }
        messages
    };
    pipeline.process("w", &from_broker()).await;
    clean_up_aged_records(pool, None).await;
    watch.refresh(pool).await.unwrap();

    let replay = pipeline.process("w", &from_broker()).await;
    assert!(replay.iter().all(|d| *d == Disposition::Ack(AckReason::Parked)), "{replay:?}");
    assert_eq!(count(pool, "SELECT count(*) FROM test_effects").await, MESSAGES as i64, "no handler ran");
    let held: (String, i32, String, bool, i64) = sqlx::query_as(
        "SELECT status, attempts, error_class, parked_at IS NOT NULL, length(payload)::bigint FROM dedup_records
         WHERE message_id = 'ORDER.PAY.A7:1'",
    )
    .fetch_one(pool)
    .await
    .unwrap();
    assert_eq!(held, ("processing".to_owned(), 0, "LATE_DUPLICATE".to_owned(), true, 11), "parked with its payload");
    assert_eq!(late_duplicates(pool, 30).await.unwrap()[0].held, MESSAGES as i64);
    let stuck =
        count(pool, "SELECT count(*) FROM dedup_records WHERE status = 'processing' AND lease_expires_at < now()")
            .await;
    assert_eq!(stuck, MESSAGES as i64, "shown to operators as stuck records");

    // Another copy stays parked; still no handler run.
    let again = pipeline.process("w", &batch("A")).await;
    assert!(again.iter().all(|d| *d == Disposition::Ack(AckReason::Parked)), "{again:?}");
    assert_eq!(count(pool, "SELECT count(*) FROM test_effects").await, MESSAGES as i64);

    // An operator releases one: its stored message is published again (it was acknowledged),
    // and that copy runs its handler.
    let (id, token): (i64, uuid::Uuid) =
        sqlx::query_as("SELECT id, lease_token FROM dedup_records WHERE message_id = 'ORDER.PAY.A7:1'")
            .fetch_one(pool)
            .await
            .unwrap();
    let action = RecordAction {
        record_id: id,
        reason: Some("checked: the order was refunded, run it again"),
        lease_token: Some(token),
        ..RecordAction::default()
    };
    let done = record_action(pool, "user:ann", RecordActionKind::Release, &action, &publishers).await.unwrap();
    assert!(done.republished);
    let channel = broker.channel().await;
    let got = channel
        .basic_get(broker.settings.queue.as_str().into(), BasicGetOptions { no_ack: true })
        .await
        .unwrap()
        .expect("the released copy is in the work queue");
    let copy = message("ORDER.PAY.A7:1", serde_json::from_slice(&got.delivery.data).unwrap());
    assert_eq!(pipeline.process("w", &[copy]).await, vec![Disposition::Ack(AckReason::Processed)]);
    assert_eq!(h.effects("ORDER.PAY.A7:1").await, 2);
}

#[tokio::test]
async fn a_held_late_duplicate_of_a_reclaiming_leased_handler_is_not_taken_over() {
    let h = harness().await;
    let pool = h.pool();
    let effect = CountingEffect::new(Duration::ZERO);
    let mut handlers = HandlerRegistry::new();
    handlers.register(
        "ORDER.PAY",
        Handler::Leased { handler: effect.clone(), on_lease_expiry: LeaseExpiryPolicy::Reclaim },
    );
    let settings = dedup_engine::pipeline::PipelineSettings {
        late_duplicates: LateDuplicatePolicy::Hold,
        ..settings(3, Duration::from_secs(30))
    };
    let (pipeline, watch) = watching(&h, h.pipeline_with(handlers, settings)).await;
    let one = || vec![message("ORDER.PAY.L1:1", json!({ "order": 1 }))];
    assert_eq!(pipeline.process("w", &one()).await, vec![Disposition::Ack(AckReason::Processed)]);
    clean_up_aged_records(pool, None).await;
    watch.refresh(pool).await.unwrap();
    assert_eq!(pipeline.process("w", &one()).await, vec![Disposition::Ack(AckReason::Parked)]);
    assert_eq!(pipeline.process("w", &one()).await, vec![Disposition::Ack(AckReason::Parked)], "not reclaimed");
    assert_eq!(effect.runs(), 1);
    let mode: String = sqlx::query_scalar("SELECT handler_mode FROM dedup_records").fetch_one(pool).await.unwrap();
    assert_eq!(mode, "leased");
}

#[tokio::test]
async fn a_schedule_can_keep_no_fingerprints_and_expired_ones_are_forgotten() {
    let h = harness().await;
    let pool = h.pool();
    let (pipeline, watch) = watching(&h, h.pipeline(recording(), 3)).await;
    pipeline.process("w", &batch("A")).await;
    assert_eq!(clean_up_aged_records(pool, Some(0)).await, MESSAGES as i64);
    assert_eq!(count(pool, "SELECT count(*) FROM dedup_fingerprints").await, 0);
    watch.refresh(pool).await.unwrap();
    assert!(!watch.fingerprints_kept());

    let bad = ScheduleInput { name: "bad".to_owned(), fingerprint_days: Some(36_501), ..ScheduleInput::default() };
    let err = cleanup_schedule_save(pool, "user:ann", None, &bad).await.unwrap_err();
    assert!(err.to_string().contains("fingerprints are kept 0 to 36500 days"), "{err}");

    // Fingerprints past their horizon go with the next run.
    sqlx::query("INSERT INTO dedup_fingerprints VALUES (1, now() - interval '400 days', now() - interval '1 day')")
        .execute(pool)
        .await
        .unwrap();
    let input = ScheduleInput { name: "again".to_owned(), ..ScheduleInput::default() };
    let schedule = cleanup_schedule_save(pool, "user:ann", None, &input).await.unwrap();
    let run = scheduler::cleanup_run_now(&pool.clone().into(), "user:ann", schedule.id).await.unwrap();
    common::eventually(Duration::from_secs(10), || async {
        cleanup_runs(pool, Some(schedule.id), 10).await.unwrap().iter().any(|r| r.id == run && r.finished_at.is_some())
    })
    .await;
    assert_eq!(count(pool, "SELECT count(*) FROM dedup_fingerprints").await, 0);
}
