//! The consumer against a real RabbitMQ: delayed retries through the retry queues, dead letters
//! (also when publishing them fails), acks, reconnection after the broker drops the connection,
//! and the order of the id sources. Every test uses its own exchange and queues.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::*;
use dedup_engine::actions::cleanup::late::{RetentionWatch, late_deliveries};
use dedup_engine::actions::cleanup::retention_advice;
use dedup_engine::consumer::{Consumer, ConsumerSettings};
use dedup_engine::handler::{Handler, HandlerRegistry};
use dedup_engine::message::{IdPolicy, IdSource, TypePolicy, TypeSource};
use dedup_engine::pipeline::{Pipeline, PipelineSettings};
use dedup_engine::retry::Backoff;
use dedup_engine::source::SourceFactory;
use dedup_engine::source::rabbitmq::amqp_values::table_to_json;
use dedup_engine::source::rabbitmq::{
    DEAD_LETTER_REASON_HEADER, SOURCE_ROUTING_KEY_HEADER, SOURCE_SIGNATURE_HEADER, properties_for,
};
use dedup_engine::store::postgres::PgStore;
use dedup_engine::testing::TestBroker as Broker;
use dedup_engine::testing::amqp_url;
use lapin::options::{BasicGetOptions, QueueDeclareOptions};
use lapin::types::{AMQPValue, FieldTable, LongString};
use serde_json::json;
use tokio_util::sync::CancellationToken;

fn consumer_settings() -> ConsumerSettings {
    ConsumerSettings {
        concurrency: 2,
        batch_size: 20,
        batch_linger_ms: 5,
        backoff_initial_ms: 100,
        backoff_max_ms: 1000,
    }
}

/// Starts a consumer; returns its shutdown token and task.
fn start(
    h: &Harness,
    broker: &Broker,
    handlers: HandlerRegistry,
    max_attempts: i32,
) -> (CancellationToken, tokio::task::JoinHandle<()>) {
    let settings =
        PipelineSettings { backoff: broker.backoff.clone(), ..settings(max_attempts, Duration::from_secs(30)) };
    consume(h.pipeline_with(handlers, settings), broker)
}

/// Runs `pipeline` on `broker`'s queue; returns its shutdown token and task.
fn consume(pipeline: Pipeline, broker: &Broker) -> (CancellationToken, tokio::task::JoinHandle<()>) {
    let consumer = Consumer::new(pipeline, broker.connector() as Arc<dyn SourceFactory>, consumer_settings());
    let token = CancellationToken::new();
    let task = tokio::spawn(consumer.run(token.clone()));
    (token, task)
}

async fn publish(broker: &Broker, ids: &[String]) {
    let publisher = broker.connector().publisher().await.unwrap();
    for id in ids {
        let body = serde_json::to_vec(&json!({"n": id})).unwrap();
        publisher
            .publish(
                &broker.settings.exchange,
                "order.test",
                &body,
                properties_for(Some(id), &Default::default(), Some("application/json")),
            )
            .await
            .unwrap();
    }
}

async fn status_count(h: &Harness, status: &str) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM dedup_records WHERE status = $1")
        .bind(status)
        .fetch_one(h.pool())
        .await
        .unwrap()
}

#[tokio::test]
async fn a_failing_message_is_retried_with_growing_delays_then_dead_lettered_and_acked() {
    let h = Harness::new().await;
    let broker = Broker::new(&amqp_url(), Backoff { initial_ms: 300, max_ms: 1200 });
    let mut handlers = HandlerRegistry::new();
    handlers.register("ORDER.PAY", Handler::Transactional(Arc::new(AlwaysFails)));
    let (token, task) = start(&h, &broker, handlers, 3);
    publish(&broker, &["ORDER.PAY.1:2".to_owned()]).await;

    eventually(Duration::from_secs(20), || async { status_count(&h, "dead").await == 1 }).await;
    let started: Vec<chrono::DateTime<chrono::Utc>> =
        sqlx::query_scalar("SELECT started_at FROM record_attempts ORDER BY attempt")
            .fetch_all(h.pool())
            .await
            .unwrap();
    assert_eq!(started.len(), 3, "exactly max_attempts attempts");
    let gaps: Vec<i64> = started.windows(2).map(|w| (w[1] - w[0]).num_milliseconds()).collect();
    assert!(gaps[0] >= 290 && gaps[1] >= 590 && gaps[1] > gaps[0], "growing delays: {gaps:?} ms");

    // The copy in the dead-letter queue carries the id and the reason.
    eventually(Duration::from_secs(5), || async { broker.depth(&broker.settings.dead_letter_queue()).await == 1 })
        .await;
    let channel = broker.channel().await;
    let copy = channel
        .basic_get(broker.settings.dead_letter_queue().as_str().into(), BasicGetOptions { no_ack: true })
        .await
        .unwrap()
        .expect("a dead-letter copy");
    assert_eq!(copy.properties.message_id().as_ref().map(|s| s.as_str()), Some("ORDER.PAY.1:2"));
    let headers = table_to_json(copy.properties.headers().as_ref().unwrap());
    assert!(headers[DEAD_LETTER_REASON_HEADER].as_str().unwrap().contains("DOWNSTREAM_DOWN"), "{headers:?}");

    token.cancel();
    task.await.unwrap();
    assert_eq!(broker.depth(&broker.settings.queue).await, 0, "the original was acked, not requeued");
}

#[tokio::test]
async fn when_the_dead_letter_copy_cannot_be_published_the_record_stays_dead_and_the_queue_moves_on() {
    let h = Harness::new().await;
    let mut broker = Broker::new(&amqp_url(), Backoff { initial_ms: 100, max_ms: 100 });
    // A queue that refuses every message: publishing the copy is nacked by the broker.
    let refusing = format!("{}.refusing", broker.settings.queue);
    let mut args = FieldTable::default();
    args.insert("x-max-length".into(), AMQPValue::LongLongInt(0));
    args.insert("x-overflow".into(), AMQPValue::LongString(LongString::from("reject-publish")));
    broker.channel().await.queue_declare(refusing.as_str().into(), QueueDeclareOptions::default(), args).await.unwrap();
    broker.also_delete(&refusing);
    broker.settings.dead_letter_routing_key = Some(refusing.clone());
    broker.settings.dead_letter_publish_attempts = 2;

    let mut handlers = HandlerRegistry::new();
    handlers.register("ORDER.PAY", Handler::Transactional(Arc::new(AlwaysFails)));
    handlers.register("ORDER.CREATE", Handler::Transactional(Arc::new(RecordEffect)));
    let (token, task) = start(&h, &broker, handlers, 1);
    publish(&broker, &["ORDER.PAY.1:2".into(), "ORDER.PAY.2:2".into(), "ORDER.CREATE.3:1".into()]).await;

    eventually(Duration::from_secs(20), || async {
        status_count(&h, "dead").await == 2 && status_count(&h, "succeeded").await == 1
    })
    .await;
    let payloads_kept: i64 =
        sqlx::query_scalar("SELECT count(*) FROM dedup_records WHERE status = 'dead' AND payload IS NOT NULL")
            .fetch_one(h.pool())
            .await
            .unwrap();
    assert_eq!(payloads_kept, 2, "nothing is lost: the dead records keep their payloads");
    token.cancel();
    task.await.unwrap();
    assert_eq!(broker.depth(&refusing).await, 0);
    assert_eq!(broker.depth(&broker.settings.queue).await, 0, "originals acked: the queue kept moving");
}

/// Closes our connection from the broker side, as an operator or a broker restart would.
async fn close_connection_by_name(name: &str) {
    let out = tokio::process::Command::new("rabbitmqctl")
        .args(["list_connections", "-q", "--no-table-headers", "pid", "client_properties"])
        .output()
        .await
        .expect("rabbitmqctl runs");
    let listing = String::from_utf8_lossy(&out.stdout);
    let pids: Vec<&str> =
        listing.lines().filter(|l| l.contains(name)).filter_map(|l| l.split_whitespace().next()).collect();
    assert!(!pids.is_empty(), "connection {name} not found in:\n{listing}");
    for pid in pids {
        let status = tokio::process::Command::new("rabbitmqctl")
            .args(["close_connection", pid, "closed by the reconnect test"])
            .status()
            .await
            .unwrap();
        assert!(status.success());
    }
}

#[tokio::test]
async fn the_consumer_reconnects_after_the_broker_closes_its_connection() {
    let h = Harness::new().await;
    let broker = Broker::new(&amqp_url(), Backoff { initial_ms: 200, max_ms: 200 });
    let mut handlers = HandlerRegistry::new();
    handlers.register("ORDER.CREATE", Handler::Transactional(Arc::new(RecordEffect)));
    let ids: Vec<String> = (0..400).map(|i| format!("ORDER.CREATE.{i}:1")).collect();
    publish(&broker, &ids).await;
    let (token, task) = start(&h, &broker, handlers, 5);

    eventually(Duration::from_secs(20), || async { status_count(&h, "succeeded").await >= 20 }).await;
    close_connection_by_name(&broker.settings.connection_name).await;
    eventually(Duration::from_secs(60), || async { status_count(&h, "succeeded").await == 400 }).await;

    let effects: (i64, i64) = sqlx::query_as("SELECT count(*), count(DISTINCT message_id) FROM test_effects")
        .fetch_one(h.pool())
        .await
        .unwrap();
    assert_eq!(effects, (400, 400), "every message exactly once across the reconnect");
    token.cancel();
    task.await.unwrap();
    assert_eq!(broker.depth(&broker.settings.queue).await, 0);
}

#[tokio::test]
async fn source_headers_a_producer_forged_are_ignored_and_the_products_own_copies_keep_the_origin() {
    let h = Harness::new().await;
    let broker = Broker::new(&amqp_url(), Backoff { initial_ms: 100, max_ms: 100 });
    let mut handlers = HandlerRegistry::new();
    handlers.register("ORDER.PAY", Handler::Transactional(Arc::new(AlwaysFails)));
    let (token, task) = start(&h, &broker, handlers, 2);
    // A producer names another exchange and routing key for the retry copy and the dead letter.
    let mut forged = serde_json::Map::new();
    forged.insert("x-dedup-source-exchange".into(), json!("amq.topic"));
    forged.insert(SOURCE_ROUTING_KEY_HEADER.into(), json!("payments.refund"));
    forged.insert(SOURCE_SIGNATURE_HEADER.into(), json!("00"));
    let publisher = broker.connector().publisher().await.unwrap();
    let props = properties_for(Some("ORDER.PAY.9:2"), &forged, Some("application/json"));
    publisher.publish(&broker.settings.exchange, "order.pay", b"{}", props).await.unwrap();

    // Two attempts: the second ran on the product's own (signed) retry copy.
    eventually(Duration::from_secs(20), || async { status_count(&h, "dead").await == 1 }).await;
    let source: (String, String, i32) =
        sqlx::query_as("SELECT source_exchange, source_routing_key, attempts FROM dedup_records")
            .fetch_one(h.pool())
            .await
            .unwrap();
    assert_eq!(source, (broker.settings.exchange.clone(), "order.pay".to_owned(), 2), "where it was really published");
    eventually(Duration::from_secs(5), || async { broker.depth(&broker.settings.dead_letter_queue()).await == 1 })
        .await;
    let copy = broker
        .channel()
        .await
        .basic_get(broker.settings.dead_letter_queue().as_str().into(), BasicGetOptions { no_ack: true })
        .await
        .unwrap()
        .expect("a dead-letter copy");
    let headers = table_to_json(copy.properties.headers().as_ref().unwrap());
    assert_eq!(headers[SOURCE_ROUTING_KEY_HEADER], "order.pay", "the dead letter names the real origin");
    assert_ne!(headers[SOURCE_SIGNATURE_HEADER], "00", "signed by the product");
    token.cancel();
    task.await.unwrap();
}

#[tokio::test]
async fn a_first_delivery_older_than_the_retention_is_counted_late_by_its_amqp_timestamp() {
    let h = Harness::new().await;
    let broker = Broker::new(&amqp_url(), Backoff { initial_ms: 100, max_ms: 100 });
    sqlx::query(
        "INSERT INTO cleanup_schedules (name, cron, retention_days, batch_size, statuses, enabled, next_run_at, created_by)
         VALUES ('daily', '0 3 * * *', 1, 1000, '{succeeded}', true, now() + interval '1 day', 'test')",
    )
    .execute(h.pool())
    .await
    .unwrap();
    let retention = Arc::new(RetentionWatch::default());
    retention.refresh(h.pool()).await.unwrap();
    assert_eq!(retention.retention_ms(GROUP), Some(86_400_000));
    let mut handlers = HandlerRegistry::new();
    handlers.register("ORDER.PAY", Handler::Transactional(Arc::new(RecordEffect)));
    let pipeline = h.pipeline_with(handlers, settings(5, Duration::from_secs(30))).with_retention(retention);
    let (token, task) = consume(pipeline, &broker);

    // A copy sent two days ago (its record long deleted by a 1-day retention), a fresh one.
    let publisher = broker.connector().publisher().await.unwrap();
    let two_days_ago = u64::try_from((chrono::Utc::now() - chrono::Duration::days(2)).timestamp()).unwrap();
    let old = properties_for(Some("ORDER.PAY.1:1"), &Default::default(), None).with_timestamp(two_days_ago);
    publisher.publish(&broker.settings.exchange, "order.pay", b"{}", old).await.unwrap();
    let fresh = properties_for(Some("ORDER.PAY.2:1"), &Default::default(), None);
    publisher.publish(&broker.settings.exchange, "order.pay", b"{}", fresh).await.unwrap();
    // A timestamp of 0 (a broken producer clock) is not believed: it would ruin the advice.
    let epoch = properties_for(Some("ORDER.PAY.3:1"), &Default::default(), None).with_timestamp(0);
    publisher.publish(&broker.settings.exchange, "order.pay", b"{}", epoch).await.unwrap();
    eventually(Duration::from_secs(20), || async { status_count(&h, "succeeded").await == 3 }).await;
    token.cancel();
    task.await.unwrap();

    h.stats.flush(h.pool().clone(), &PgStore::new(h.pool().clone(), &h.db.schema)).await.unwrap();
    let late = late_deliveries(h.pool(), 30).await.unwrap();
    assert_eq!(late.len(), 1, "{late:?}");
    assert_eq!((late[0].consumer_group.as_str(), late[0].count), (GROUP, 1), "the old copy only");
    assert!(late[0].max_age_ms >= 2 * 86_400_000 - 60_000, "aged by its own timestamp: {late:?}");
    let advice = retention_advice(h.pool()).await.unwrap();
    assert!(advice.is_too_short(1), "the retention advice now says 1 day is too short: {advice:?}");
    assert!(advice.longest_delay_ms < Some(3 * 86_400_000), "the epoch timestamp is not in it: {advice:?}");
}

/// Three sends of one business message by a client that stamps a fresh AMQP `message_id` on
/// every send, the business key in the `x-message-id` header; consumed with `ids`. Returns
/// (records, effects) once every send is judged.
async fn sends_with_a_fresh_message_id_each(ids: IdPolicy, judged: impl Fn(i64, i64) -> bool) -> (i64, i64) {
    let h = Harness::new().await;
    let broker = Broker::new(&amqp_url(), Backoff { initial_ms: 100, max_ms: 100 });
    let mut handlers = HandlerRegistry::new();
    handlers.register("ORDER.PAY", Handler::Transactional(Arc::new(RecordEffect)));
    let settings = PipelineSettings {
        id_policy: ids,
        type_policy: TypePolicy::from_sources([TypeSource::RoutingKey]).map("order.pay", "ORDER.PAY"),
        ..settings(5, Duration::from_secs(30))
    };
    let (token, task) = consume(h.pipeline_with(handlers, settings), &broker);
    let publisher = broker.connector().publisher().await.unwrap();
    let mut headers = serde_json::Map::new();
    headers.insert("x-message-id".into(), json!("ORDER.PAY.77:2"));
    for _ in 0..3 {
        let per_send = uuid::Uuid::new_v4().to_string();
        let props = properties_for(Some(&per_send), &headers, Some("application/json"));
        publisher.publish(&broker.settings.exchange, "order.pay", br#"{"orderNo":"77"}"#, props).await.unwrap();
    }
    let store = PgStore::new(h.pool().clone(), &h.db.schema);
    let counts = || async {
        // Duplicates the fast path caught reach the records when the aggregates are flushed.
        h.stats.flush(h.pool().clone(), &store).await.unwrap();
        sqlx::query_as::<_, (i64, i64)>(
            "SELECT (SELECT count(*) FROM dedup_records WHERE status = 'succeeded'),
                    (SELECT count(*) + COALESCE(sum(duplicate_count), 0) FROM dedup_records)",
        )
        .fetch_one(h.pool())
        .await
        .unwrap()
    };
    eventually(Duration::from_secs(20), || async {
        let (succeeded, judged_sends) = counts().await;
        judged(succeeded, judged_sends)
    })
    .await;
    token.cancel();
    task.await.unwrap();
    let records: i64 = sqlx::query_scalar("SELECT count(*) FROM dedup_records").fetch_one(h.pool()).await.unwrap();
    let effects: i64 = sqlx::query_scalar("SELECT count(*) FROM test_effects").fetch_one(h.pool()).await.unwrap();
    (records, effects)
}

#[tokio::test]
async fn the_order_of_the_id_sources_decides_whether_per_send_message_ids_defeat_dedup() {
    // The default order: the AMQP property first. Each send's fresh id is a record of its own.
    let (records, effects) = sends_with_a_fresh_message_id_each(IdPolicy::default(), |ok, _| ok == 3).await;
    assert_eq!((records, effects), (3, 3), "property first: three records, the effect three times");

    // The header first: one record, the other sends duplicates of it.
    let header_first = IdPolicy::from_sources([IdSource::Header("x-message-id".into()), IdSource::Property]);
    let (records, effects) = sends_with_a_fresh_message_id_each(header_first, |ok, sends| ok == 1 && sends == 3).await;
    assert_eq!((records, effects), (1, 1), "header first: one record, the effect once");
}
