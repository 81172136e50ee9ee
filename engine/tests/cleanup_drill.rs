//! Cleanup schedules against PostgreSQL (cron validation, bounded batches, statuses, two
//! scheduler instances running one tick once, retention advice) and the duplicate drill against
//! a real consumer (caught by Redis with the original payload, by the database without).

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use common::*;
use dedup_engine::actions::ActionError;
use dedup_engine::actions::cleanup::late::RetentionWatch;
use dedup_engine::actions::cleanup::{
    ScheduleInput, cleanup_dry_run, cleanup_runs, cleanup_schedule_save, retention_advice, scheduler,
};
use dedup_engine::actions::drill::{DrillTarget, drill_report, drill_start};
use dedup_engine::consumer::{Consumer, ConsumerSettings};
use dedup_engine::handler::{Handler, HandlerRegistry};
use dedup_engine::pipeline::PipelineSettings;
use dedup_engine::record::RecordStatus;
use dedup_engine::retry::Backoff;
use dedup_engine::source::SourceFactory;
use dedup_engine::source::rabbitmq::properties_for;
use dedup_engine::store::postgres::PgStore;
use dedup_engine::testing::{TestBroker, amqp_url};
use sqlx::PgPool;
use tokio_util::sync::CancellationToken;

/// `n` records of `status`, aged `days` (first seen and completed then for succeeded, last
/// change then otherwise).
async fn aged(pool: &PgPool, prefix: &str, n: i64, status: &str, days: i32) {
    sqlx::query(
        "INSERT INTO dedup_records (consumer_group, message_id, message_type, status, attempts, max_attempts,
             payload_hash, source_broker, first_seen_at, completed_at, updated_at)
         SELECT 'g', $1 || i, 'ORDER.PAY', $3, 1, 5, '\\x00', 'rabbitmq', now() - make_interval(days => $4),
                CASE WHEN $3 = 'succeeded' THEN now() - make_interval(days => $4) END, now() - make_interval(days => $4)
         FROM generate_series(1, $2) AS i",
    )
    .bind(prefix)
    .bind(n)
    .bind(status)
    .bind(days)
    .execute(pool)
    .await
    .unwrap();
}

fn schedule(name: &str) -> ScheduleInput {
    ScheduleInput { name: name.to_owned(), batch_size: 7, ..ScheduleInput::default() }
}

#[tokio::test]
async fn schedules_validate_their_cron_and_delete_only_old_records_of_their_statuses_in_batches() {
    let h = Harness::new().await;
    let pool = h.pool();
    let bad = ScheduleInput { cron: "61 * * * *".to_owned(), ..schedule("bad") };
    let err = cleanup_schedule_save(pool, "user:ann", None, &bad).await.unwrap_err();
    assert!(
        matches!(err, ActionError::Invalid(ref m) if m.contains("invalid cron expression \"61 * * * *\"")),
        "{err}"
    );
    let six = ScheduleInput { cron: "0 0 3 * * *".to_owned(), ..schedule("bad") };
    assert!(matches!(cleanup_schedule_save(pool, "user:ann", None, &six).await, Err(ActionError::Invalid(_))));
    let processing = ScheduleInput { statuses: vec![RecordStatus::Processing], ..schedule("bad") };
    assert!(matches!(cleanup_schedule_save(pool, "user:ann", None, &processing).await, Err(ActionError::Invalid(_))));

    aged(pool, "OLD.", 30, "succeeded", 40).await;
    aged(pool, "NEW.", 5, "succeeded", 10).await;
    aged(pool, "DEAD.", 4, "dead", 40).await;
    let s = cleanup_schedule_save(pool, "user:ann", None, &schedule("nightly")).await.unwrap();
    assert_eq!((s.retention_days, s.statuses.clone()), (30, vec!["succeeded".to_owned()]));
    assert!(s.next_run_at.is_some());
    assert_eq!(cleanup_dry_run(pool, s.id).await.unwrap(), 30);
    let run = scheduler::cleanup_run_now(&pool.clone().into(), "user:ann", s.id).await.unwrap();
    let finished = wait_run(pool, s.id, run).await;
    assert_eq!((finished.rows_deleted, finished.batches, finished.error), (30, 5, None), "batches of 7: 7+7+7+7+2");
    let left: Vec<(String, i64)> =
        sqlx::query_as("SELECT status, count(*) FROM dedup_records GROUP BY status ORDER BY status")
            .fetch_all(pool)
            .await
            .unwrap();
    assert_eq!(left, vec![("dead".to_owned(), 4), ("succeeded".to_owned(), 5)]);
    let audit: Vec<String> =
        sqlx::query_scalar("SELECT action || ':' || outcome FROM audit_log ORDER BY id").fetch_all(pool).await.unwrap();
    assert_eq!(
        audit,
        [
            "cleanup.schedule.create:refused",
            "cleanup.schedule.create:refused",
            "cleanup.schedule.create:refused",
            "cleanup.schedule.create:ok",
            "cleanup.run:ok"
        ]
    );
}

async fn wait_run(pool: &PgPool, schedule: i64, run: i64) -> dedup_engine::actions::cleanup::CleanupRun {
    let started = Instant::now();
    loop {
        let runs = cleanup_runs(pool, Some(schedule), 10).await.unwrap();
        if let Some(r) = runs.into_iter().find(|r| r.id == run && r.finished_at.is_some()) {
            return r;
        }
        assert!(started.elapsed() < Duration::from_secs(10), "run {run} did not finish");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_scheduler_instances_run_each_tick_once() {
    let h = Harness::new().await;
    let pool = h.pool();
    aged(pool, "OLD.", 50, "succeeded", 40).await;
    let every_minute = ScheduleInput { cron: "* * * * *".to_owned(), ..schedule("minutely") };
    let s = cleanup_schedule_save(pool, "user:ann", None, &every_minute).await.unwrap();
    let watch = RetentionWatch::default();
    for round in 0..5 {
        // The tick is due now (as if the minute had come).
        sqlx::query("UPDATE cleanup_schedules SET next_run_at = now() - interval '1 second' WHERE id = $1")
            .bind(s.id)
            .execute(pool)
            .await
            .unwrap();
        // Two instances, each with its own pool (its own connections and locks): the other
        // one's is an engine pool, as an engine builds it on its host pool.
        let host = PgPool::connect(&h.db.url).await.unwrap();
        let other = dedup_engine::store::postgres::engine_pool(&host, &h.db.schema, 4);
        let (a, b) = tokio::join!(scheduler::run_due(pool, &watch), scheduler::run_due(&other, &watch));
        let ran = a.unwrap().len() + b.unwrap().len();
        assert_eq!(ran, 1, "round {round}: exactly one instance ran the tick");
        let (a, b) = tokio::join!(scheduler::run_due(pool, &watch), scheduler::run_due(&other, &watch));
        assert_eq!(a.unwrap().len() + b.unwrap().len(), 0, "the next tick is not due yet");
        other.close().await;
        host.close().await;
    }
    let runs: i64 = sqlx::query_scalar("SELECT count(*) FROM cleanup_runs WHERE trigger = 'schedule'")
        .fetch_one(pool)
        .await
        .unwrap();
    assert_eq!(runs, 5);
}

#[tokio::test]
async fn retention_advice_warns_when_retention_is_shorter_than_the_longest_duplicate_delay() {
    let h = Harness::new().await;
    let pool = h.pool();
    assert!(!retention_advice(pool).await.unwrap().is_too_short(1), "no duplicate seen yet");
    sqlx::query(
        "INSERT INTO duplicate_delays (day, consumer_group, le_ms, count, max_delay_ms)
         VALUES (current_date, 'g', 9223372036854775807, 1, 20 * 86400000::bigint)",
    )
    .execute(pool)
    .await
    .unwrap();
    let advice = retention_advice(pool).await.unwrap();
    assert_eq!(advice.minimum_retention_ms, Some(40 * 86_400_000));
    assert!(advice.is_too_short(30));
    assert!(!advice.is_too_short(45));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drill_copy_is_caught_by_redis_with_the_original_payload_and_by_the_database_without() {
    let h = Harness::new().await;
    let pool = h.pool();
    let broker = TestBroker::new(&amqp_url(), Backoff { initial_ms: 1000, max_ms: 1000 });
    let mut handlers = HandlerRegistry::new();
    handlers.register("ORDER.PAY", Handler::Transactional(Arc::new(RecordEffect)));
    let settings = PipelineSettings { backoff: broker.backoff.clone(), ..settings(5, Duration::from_secs(30)) };
    let consumer = Consumer::new(
        h.pipeline_with(handlers, settings),
        broker.connector() as Arc<dyn SourceFactory>,
        ConsumerSettings { concurrency: 1, ..ConsumerSettings::default() },
    );
    let stop = CancellationToken::new();
    let task = tokio::spawn(consumer.run(stop.clone()));
    let publisher = broker.connector().publisher().await.unwrap();
    let payload = br#"{"order":"1"}"#;
    let props = properties_for(Some("ORDER.PAY.1:1"), &Default::default(), Some("application/json"));
    publisher.publish(&broker.settings.exchange, "order.pay", payload, props).await.unwrap();
    let store = PgStore::new(pool.clone(), &h.db.schema);
    let publishers = publishers(broker.connector());
    let record_id = eventually_succeeded(&h, "ORDER.PAY.1:1").await;

    let by_redis =
        drill_start(pool, &h.fast_path, &publishers, "user:ann", &DrillTarget::Record(record_id), Some(payload))
            .await
            .unwrap();
    assert!(by_redis.marker_present);
    let report = follow(&h, &store, by_redis.id).await;
    assert_eq!((report.caught_by.as_deref(), report.passed, report.attempts_added), (Some("redis"), true, 0));

    let wrong =
        drill_start(pool, &h.fast_path, &publishers, "user:ann", &DrillTarget::Record(record_id), Some(b"{}")).await;
    assert!(matches!(wrong, Err(ActionError::Invalid(_))));
    let latest = DrillTarget::LatestOfType("ORDER.PAY".to_owned());
    let by_db = drill_start(pool, &h.fast_path, &publishers, "user:ann", &latest, None).await.unwrap();
    let report = follow(&h, &store, by_db.id).await;
    assert_eq!((report.caught_by.as_deref(), report.passed), (Some("database"), true));
    assert_eq!(h.effects("ORDER.PAY.1:1").await, 1, "the effect happened once");
    stop.cancel();
    task.await.unwrap();
}

async fn eventually_succeeded(h: &Harness, message_id: &str) -> i64 {
    let started = Instant::now();
    loop {
        let id: Option<i64> =
            sqlx::query_scalar("SELECT id FROM dedup_records WHERE message_id = $1 AND status = 'succeeded'")
                .bind(message_id)
                .fetch_optional(h.pool())
                .await
                .unwrap();
        if let Some(id) = id {
            return id;
        }
        assert!(started.elapsed() < Duration::from_secs(10), "{message_id} not consumed");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Flushes the fast path's duplicate counts (the engine's flusher does it every second) until
/// the drill is caught.
async fn follow(h: &Harness, store: &PgStore, id: i64) -> dedup_engine::actions::drill::DrillReport {
    let started = Instant::now();
    loop {
        h.stats.flush(h.pool().clone(), store).await.unwrap();
        let report = drill_report(h.pool(), id).await.unwrap();
        if report.caught_by.is_some() {
            return report;
        }
        assert!(started.elapsed() < Duration::from_secs(10), "drill {id} not caught: {report:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
