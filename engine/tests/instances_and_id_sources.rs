//! Faults found by a review of the instances heartbeat, the record id source and the conflict
//! requeue (issue 27 parts 4 and 6), each kept as a test.

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use common::*;
use dedup_engine::IdSourceKind;
use dedup_engine::LateDuplicatePolicy;
use dedup_engine::handler::{Handler, HandlerRegistry};
use dedup_engine::message::{IdPolicy, IdSource, TypePolicy, TypeSource};
use dedup_engine::pipeline::{AckReason, Disposition, PipelineSettings};
use dedup_engine::retry::Backoff;
use dedup_engine::runtime::Engine;
use dedup_engine::source::SourceFactory;
use dedup_engine::source::kafka::{KafkaConnector, KafkaSettings};
use dedup_engine::testing::TestDatabase;
use serde_json::json;
use sqlx::Connection;

#[test]
fn every_id_source_kind_has_its_own_code() {
    let kinds =
        [IdSourceKind::Property, IdSourceKind::Header, IdSourceKind::Key, IdSourceKind::Payload, IdSourceKind::Offset];
    for kind in kinds {
        assert_eq!(IdSourceKind::from_code(kind.code()), Some(kind), "{kind:?} reads back as itself");
    }
    // The codes the migration documents: p h k j o.
    let codes: Vec<u8> = kinds.iter().map(|k| k.code() as u8).collect();
    assert_eq!(codes, b"phkjo".to_vec());
}

#[tokio::test]
async fn a_record_whose_id_came_from_the_payload_says_payload() {
    let h = Harness::new().await;
    let ids = IdPolicy::from_sources([IdSource::JsonPointer("/messageId".to_owned())]);
    let p = h.pipeline_with(recording(), PipelineSettings { id_policy: ids, ..settings(3, Duration::from_secs(30)) });
    let mut m = raw_message(None, serde_json::to_vec(&json!({ "messageId": "ORDER.PAY.77" })).unwrap());
    m.content_type = Some("application/json".to_owned());
    assert_eq!(p.process("w", &[m]).await, vec![Disposition::Ack(AckReason::Processed)]);
    let code: Option<i8> = sqlx::query_scalar("SELECT id_source FROM dedup_records WHERE message_id = 'ORDER.PAY.77'")
        .fetch_one(h.pool())
        .await
        .unwrap();
    assert_eq!(code.and_then(IdSourceKind::from_code), Some(IdSourceKind::Payload));
}

#[tokio::test]
async fn a_no_handler_record_taken_over_by_a_copy_keeps_where_its_id_came_from() {
    let h = Harness::with_redis("redis://127.0.0.1:1").await;
    let pool = h.pool();
    let types = TypePolicy { from: vec![TypeSource::TypeProperty], ..TypePolicy::default() };
    let settings = PipelineSettings {
        type_policy: types,
        late_duplicates: LateDuplicatePolicy::Process,
        ..settings(3, Duration::from_secs(30))
    };
    let mut handlers = HandlerRegistry::new();
    handlers.register("ORDER.CREATED", Handler::Transactional(Arc::new(RecordTyped)));
    let p = h.pipeline_with(handlers, settings);
    let event = |t: &str| {
        let mut m = message("order-8", json!({ "order": 8 }));
        m.type_property = Some(t.to_owned());
        m
    };
    p.process("w", &[event("ORDER.CREATE")]).await;
    let stored: Option<i8> = sqlx::query_scalar("SELECT id_source FROM dedup_records").fetch_one(pool).await.unwrap();
    assert_eq!(stored.and_then(IdSourceKind::from_code), Some(IdSourceKind::Property), "the NO_HANDLER dead letter");
    // Poison with an id of its own keeps where it came from; under a synthetic id, nothing.
    let mut unparsable = message("order-9", json!({}));
    unparsable.payload = b"{not json".to_vec();
    let mut anonymous = message("x", json!({}));
    (anonymous.property_message_id, anonymous.payload) = (None, b"{not json".to_vec());
    p.process("w", &[unparsable, anonymous]).await;
    let poison: Vec<(String, Option<i8>)> = sqlx::query_as(
        "SELECT message_id, id_source FROM dedup_records WHERE poison ORDER BY message_id LIKE 'POISON%', message_id",
    )
    .fetch_all(pool)
    .await
    .unwrap();
    assert_eq!(poison.len(), 2, "{poison:?}");
    assert_eq!(
        (poison[0].0.as_str(), poison[0].1.and_then(IdSourceKind::from_code)),
        ("order-9", Some(IdSourceKind::Property))
    );
    assert_eq!(poison[1].1, None, "a synthetic id came from nowhere: {poison:?}");
    sqlx::query(
        "UPDATE dedup_records SET status = 'failed', max_attempts = attempts + 1, next_attempt_at = now() WHERE NOT poison",
    )
        .execute(pool)
        .await
        .unwrap();
    assert_eq!(p.process("w", &[event("ORDER.CREATED")]).await, vec![Disposition::Ack(AckReason::Processed)]);
    let code: Option<i8> = sqlx::query_scalar("SELECT id_source FROM dedup_records").fetch_one(pool).await.unwrap();
    assert_eq!(code.and_then(IdSourceKind::from_code), Some(IdSourceKind::Property), "the run's id source is kept");
}

#[tokio::test]
async fn a_kafka_group_still_starting_does_not_hold_up_what_it_owns() {
    // A broker that does not answer: the member's start (topics ensured) waits its request
    // timeout, holding the member lock.
    let settings = KafkaSettings {
        brokers: "127.0.0.1:1".to_owned(),
        topics: vec!["review-owned".to_owned()],
        request_timeout_ms: 8000,
        ..KafkaSettings::default()
    };
    let connector = Arc::new(KafkaConnector::new(settings, "review", Backoff::default(), "x-message-id"));
    let opening = {
        let c = connector.clone();
        tokio::spawn(async move { c.open(0).await.is_err() })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    let started = Instant::now();
    let owned = tokio::time::timeout(Duration::from_secs(2), connector.owned()).await;
    assert!(owned.is_ok(), "owned() waited {:?} for a member that is still starting", started.elapsed());
    assert_eq!(owned.unwrap(), Vec::<String>::new());
    opening.abort();
}

#[tokio::test]
async fn a_blocked_heartbeat_row_does_not_hold_up_the_engine_stop() {
    let db = TestDatabase::create().await;
    let engine =
        Engine::builder(db.pool.clone()).schema(db.schema.clone()).redis("redis://127.0.0.1:1").start().await.unwrap();
    let table = format!("{}.consumer_instances", db.schema.as_str());
    let first = Instant::now();
    loop {
        let rows: i64 = sqlx::query_scalar(&format!("SELECT count(*) FROM {table}")).fetch_one(&db.pool).await.unwrap();
        if rows == 1 {
            break;
        }
        assert!(first.elapsed() < Duration::from_secs(10), "the first heartbeat was written");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Someone holds the table (a slow statement, a migration, a VACUUM FULL): the heartbeat's
    // statements wait on it.
    let mut holder = sqlx::PgConnection::connect(&db.url).await.unwrap();
    let mut tx = holder.begin().await.unwrap();
    sqlx::query(&format!("LOCK TABLE {table} IN ACCESS EXCLUSIVE MODE")).execute(&mut *tx).await.unwrap();
    let started = Instant::now();
    let stopped = tokio::time::timeout(Duration::from_secs(5), engine.stop()).await;
    let waited = started.elapsed();
    tx.rollback().await.unwrap();
    assert!(stopped.is_ok(), "the engine's stop waited {waited:?} on its heartbeat row");
}
