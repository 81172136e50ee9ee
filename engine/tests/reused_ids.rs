//! Reused ids made loud (DESIGN.md, "Reused ids and payload conflicts"): a producer whose ids
//! are entity keys (every PAY carries its CREATE's id). Each later event is no duplicate: it is
//! dead-lettered with its copy kept, listed, and recoverable by requeueing the copies under new
//! ids — ending with every order paid once. A payload conflict keeps its copy too. The Kafka
//! case end to end: record keys that are order numbers, no id header, `ids.from` left at its
//! default.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::*;
use dedup_engine::actions::Publishers;
use dedup_engine::actions::conflicts::{open_conflicts, record_conflicts, requeue_conflict, requeue_conflicts};
use dedup_engine::consumer::{Consumer, ConsumerSettings};
use dedup_engine::handler::{Handler, HandlerRegistry};
use dedup_engine::message::{InboundMessage, TypePolicy, TypeSource};
use dedup_engine::pipeline::{AckReason, Disposition, Pipeline, PipelineSettings};
use dedup_engine::record::LeaseExpiryPolicy;
use dedup_engine::retry::Backoff;
use dedup_engine::source::{Outbound, SourceFactory};
use dedup_engine::testing::kafka::TestKafka;
use dedup_engine::testing::{TestBroker, amqp_url};
use lapin::options::BasicGetOptions;
use serde_json::json;
use tokio_util::sync::CancellationToken;

const ORDERS: usize = 20;

/// A group whose message types come from the AMQP `type` property.
fn pipeline(h: &Harness, pay: Handler) -> Pipeline {
    let mut handlers = HandlerRegistry::new();
    handlers.register("ORDER.CREATE", Handler::Transactional(Arc::new(RecordTyped)));
    handlers.register("ORDER.PAY", pay);
    let types = TypePolicy { from: vec![TypeSource::TypeProperty], ..TypePolicy::default() };
    h.pipeline_with(handlers, PipelineSettings { type_policy: types, ..settings(3, Duration::from_secs(30)) })
}

/// Order `n`'s event of `message_type`, whose message id is the order number (an entity key).
fn event(n: usize, message_type: &str, exchange: &str) -> InboundMessage {
    let mut m = message(&format!("order-{n}"), json!({ "order": n, "event": message_type }));
    m.type_property = Some(message_type.to_owned());
    m.source.exchange = Some(exchange.to_owned());
    m
}

#[tokio::test]
async fn an_entity_key_reused_by_later_events_dead_letters_them_with_their_copies_and_a_requeue_pays_every_order_once()
{
    let h = Harness::new().await;
    let pool = h.pool();
    let pipeline = pipeline(&h, Handler::Transactional(Arc::new(RecordTyped)));
    let broker = TestBroker::new(&amqp_url(), Backoff { initial_ms: 1000, max_ms: 1000 });
    let connector = broker.connector();
    connector.publisher().await.expect("RabbitMQ at AMQP_URL");
    let mut publishers = Publishers::default();
    publishers.add(GROUP, connector);
    let exchange = broker.settings.exchange.clone();
    let all = |t: &str| (0..ORDERS).map(|n| event(n, t, &exchange)).collect::<Vec<_>>();

    let created = pipeline.process("w", &all("ORDER.CREATE")).await;
    assert!(created.iter().all(|d| *d == Disposition::Ack(AckReason::Processed)));
    let paid = pipeline.process("w", &all("ORDER.PAY")).await;
    assert!(
        paid.iter().all(|d| matches!(d, Disposition::DeadLetter { reason } if reason.contains("reused id"))),
        "{paid:?}"
    );
    assert_eq!(typed_effects(pool, "ORDER.PAY").await, 0, "never judged a duplicate, never run under another's record");
    let (dups, conflicts): (i64, i64) =
        sqlx::query_as("SELECT sum(duplicate_count)::bigint, sum(payload_conflicts)::bigint FROM dedup_records")
            .fetch_one(pool)
            .await
            .unwrap();
    assert_eq!((dups, conflicts), (0, 0), "nothing counted on the CREATE records");
    // A redelivery of the same PAY adds a copy to its row, not a row.
    pipeline.process("w", &all("ORDER.PAY")[..1]).await;
    let record: i64 =
        sqlx::query_scalar("SELECT id FROM dedup_records WHERE message_id = 'order-0'").fetch_one(pool).await.unwrap();
    let kept = record_conflicts(pool, record).await.unwrap();
    assert_eq!(kept.len(), 1);
    assert_eq!((kept[0].kind.as_str(), kept[0].message_type.as_str(), kept[0].copies), ("type", "ORDER.PAY", 2));
    assert_eq!(kept[0].id_source, "property", "where the reused id came from");
    assert!(kept[0].payload_excerpt.0.contains("ORDER.PAY"), "{:?}", kept[0].payload_excerpt);
    assert_eq!(open_conflicts(pool, Some(GROUP)).await.unwrap().len(), ORDERS);

    // A CREATE of another payload under the same id: a payload conflict, acked as a duplicate,
    // its copy kept beside the PAY.
    let mut other = event(0, "ORDER.CREATE", &exchange);
    other.payload = br#"{"order":0,"event":"ORDER.CREATE","amount":2}"#.to_vec();
    assert_eq!(pipeline.process("w", &[other]).await, vec![Disposition::Ack(AckReason::DuplicateDatabase)]);
    let kinds: Vec<String> = record_conflicts(pool, record).await.unwrap().into_iter().map(|c| c.kind).collect();
    assert_eq!(kinds, ["type", "payload"]);

    // The recovery: requeue the reused ids' copies under new ids; each becomes a record of its
    // own. The payload conflict (judged a duplicate) is left to an operator.
    let (done, failed) = requeue_conflicts(pool, "user:ann", Some(GROUP), &publishers).await.unwrap();
    assert!(failed.is_empty(), "{failed:?}");
    assert_eq!(done.len(), ORDERS);
    let again = requeue_conflict(pool, "user:ann", done[0].0, &publishers).await.unwrap_err();
    assert!(again.to_string().contains("settled already"), "{again}");
    let channel = broker.channel().await;
    let mut copies = Vec::new();
    while let Some(got) =
        channel.basic_get(broker.settings.queue.as_str().into(), BasicGetOptions { no_ack: true }).await.unwrap()
    {
        let props = &got.delivery.properties;
        let mut m = message(props.message_id().as_ref().unwrap().as_str(), json!({}));
        m.payload = got.delivery.data.clone();
        m.type_property = props.kind().as_ref().map(|t| t.to_string());
        copies.push(m);
    }
    assert_eq!(copies.len(), ORDERS, "every copy published");
    assert!(copies.iter().all(|m| m.property_message_id.as_deref().unwrap().contains("#conflict-")));
    let settled = pipeline.process("w", &copies).await;
    assert!(settled.iter().all(|d| *d == Disposition::Ack(AckReason::Processed)), "{settled:?}");
    assert_eq!(typed_effects(pool, "ORDER.PAY").await, ORDERS as i64, "every order paid once");
    // Replayed, the requeued copies are duplicates of their own records.
    let replay = pipeline.process("w", &copies).await;
    let duplicate =
        |d: &Disposition| matches!(d, Disposition::Ack(AckReason::DuplicateRedis | AckReason::DuplicateDatabase));
    assert!(replay.iter().all(duplicate), "{replay:?}");
    assert_eq!(typed_effects(pool, "ORDER.PAY").await, ORDERS as i64);
    assert!(open_conflicts(pool, None).await.unwrap().is_empty());
}

#[tokio::test]
async fn a_reused_id_never_takes_over_a_failed_record_of_another_type_nor_a_leased_one() {
    let h = Harness::new().await;
    let pool = h.pool();
    // CREATE fails (retryable): its record is `failed`, claimable by its own retry.
    let mut handlers = HandlerRegistry::new();
    handlers.register("ORDER.CREATE", Handler::Transactional(Arc::new(AlwaysFails)));
    let effect = CountingEffect::new(Duration::ZERO);
    handlers.register(
        "ORDER.PAY",
        Handler::Leased { handler: effect.clone(), on_lease_expiry: LeaseExpiryPolicy::Reclaim },
    );
    let types = TypePolicy { from: vec![TypeSource::TypeProperty], ..TypePolicy::default() };
    let pipeline =
        h.pipeline_with(handlers, PipelineSettings { type_policy: types, ..settings(3, Duration::from_secs(30)) });
    let failed = pipeline.process("w", &[event(1, "ORDER.CREATE", "x")]).await;
    assert!(matches!(failed[0], Disposition::Retry { .. }), "{failed:?}");
    let pay = pipeline.process("w", &[event(1, "ORDER.PAY", "x")]).await;
    assert!(matches!(&pay[0], Disposition::DeadLetter { reason } if reason.contains("reused id")), "{pay:?}");
    assert_eq!(effect.runs(), 0, "the leased PAY never ran");
    let (message_type, status): (String, String) =
        sqlx::query_as("SELECT message_type, status FROM dedup_records").fetch_one(pool).await.unwrap();
    assert_eq!(
        (message_type.as_str(), status.as_str()),
        ("ORDER.CREATE", "failed"),
        "the CREATE's record is untouched"
    );
    let kinds: Vec<(String, String)> =
        sqlx::query_as("SELECT kind, message_type FROM record_conflicts").fetch_all(pool).await.unwrap();
    assert_eq!(kinds, [("type".to_owned(), "ORDER.PAY".to_owned())], "the leased path keeps its copy too");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_kafka_with_order_numbers_as_keys_no_event_is_lost_and_the_requeue_pays_every_order_once() {
    let h = Harness::new().await;
    let kafka = TestKafka::new(2, Backoff { initial_ms: 300, max_ms: 600 });
    let connector = kafka.connector();
    let topic = kafka.topic().to_owned();
    let mut handlers = HandlerRegistry::new();
    handlers.register("ORDER.CREATE", Handler::Transactional(Arc::new(RecordTyped)));
    handlers.register("ORDER.PAY", Handler::Transactional(Arc::new(RecordTyped)));
    // ids.from at its default (property, header:x-message-id, key, json:/messageId): with no id
    // header, the key — the order number — is the id.
    let types = TypePolicy { from: vec![TypeSource::JsonPointer("/event".to_owned())], ..TypePolicy::default() };
    let settings =
        PipelineSettings { type_policy: types, backoff: kafka.backoff.clone(), ..settings(3, Duration::from_secs(30)) };
    let workers = ConsumerSettings {
        concurrency: 2,
        batch_size: 10,
        batch_linger_ms: 0,
        backoff_initial_ms: 100,
        backoff_max_ms: 1000,
    };
    let consumer =
        Consumer::new(h.pipeline_with(handlers, settings), connector.clone() as Arc<dyn SourceFactory>, workers);
    let token = CancellationToken::new();
    let task = tokio::spawn(consumer.run(token.clone()));

    let publisher = connector.open_publisher().await.expect("topics created");
    let headers = serde_json::Map::new();
    for event in ["ORDER.CREATE", "ORDER.PAY"] {
        for n in 0..ORDERS {
            let key = format!("order-{n}");
            let payload = serde_json::to_vec(&json!({ "order": n, "event": event })).unwrap();
            let record = Outbound {
                destination: &topic,
                routing_key: "",
                key: Some(&key),
                message_id: None,
                payload: &payload,
                headers: &headers,
                content_type: Some("application/json"),
                type_property: None,
            };
            publisher.publish(record).await.expect("published");
        }
    }
    // Two workers take a partition's records in parallel, so an order's PAY may claim the id
    // before its CREATE: whichever comes second is the conflict. Every event is one or the other.
    let pool = h.pool();
    let records =
        || async { sqlx::query_scalar::<_, i64>("SELECT count(*) FROM dedup_records").fetch_one(pool).await.unwrap() };
    eventually(Duration::from_secs(60), || async {
        records().await == ORDERS as i64 && open_conflicts(pool, None).await.unwrap().len() == ORDERS
    })
    .await;
    let run = typed_effects(pool, "ORDER.CREATE").await + typed_effects(pool, "ORDER.PAY").await;
    assert_eq!(run, ORDERS as i64, "one handler run per order id, the other event kept");
    let dead = kafka
        .read(&dedup_engine::source::kafka::KafkaSettings::dead_letter_topic(&topic), ORDERS, Duration::from_secs(10))
        .await;
    assert_eq!(dead.len(), ORDERS, "every conflicting event is a dead letter too");
    let source: String =
        sqlx::query_scalar("SELECT DISTINCT id_source FROM record_conflicts").fetch_one(pool).await.unwrap();
    assert_eq!(source, "key", "the copies say their id came from the record key");

    let mut publishers = Publishers::default();
    publishers.add(GROUP, connector.clone());
    let (done, failed) = requeue_conflicts(pool, "user:ann", None, &publishers).await.unwrap();
    assert_eq!((done.len(), failed.len()), (ORDERS, 0), "{failed:?}");
    eventually(Duration::from_secs(60), || async {
        typed_effects(pool, "ORDER.PAY").await == ORDERS as i64
            && typed_effects(pool, "ORDER.CREATE").await == ORDERS as i64
    })
    .await;
    eventually(Duration::from_secs(20), || async { connector.lag().await.unwrap() == 0 }).await;
    assert_eq!(typed_effects(pool, "ORDER.PAY").await, ORDERS as i64, "every order paid once");
    assert_eq!(typed_effects(pool, "ORDER.CREATE").await, ORDERS as i64, "and created once");
    let kinds: Vec<(String, i64)> =
        sqlx::query_as("SELECT id_source::text, count(*) FROM dedup_records GROUP BY 1 ORDER BY 1")
            .fetch_all(pool)
            .await
            .unwrap();
    let expected = [("h".to_owned(), ORDERS as i64), ("k".to_owned(), ORDERS as i64)];
    assert_eq!(kinds, expected, "each record keeps where its id came from: the copies' id header, the key");
    token.cancel();
    task.await.unwrap();
}
