//! A group's RabbitMQ topology against a real broker: an exchange that exists with another type
//! is refused and makes the group unhealthy (not a silent retry loop), a group declares its
//! exchange by type, and a group on topology the team made itself only checks it.

mod common;

use std::time::Duration;

use common::*;
use dedup_engine::fastpath::FastPathSettings;
use dedup_engine::group::Group;
use dedup_engine::retry::Backoff;
use dedup_engine::runtime::{Engine, EngineError};
use dedup_engine::source::rabbitmq::{ExchangeType, RabbitConnector, RabbitSettings, Topology, properties_for};
use dedup_engine::testing::{TestBroker, TestDatabase, amqp_url, redis_url};
use lapin::ExchangeKind;
use lapin::options::{ExchangeDeclareOptions, QueueBindOptions, QueueDeclareOptions};
use serde_json::json;

async fn engine(db: &TestDatabase, broker: &TestBroker, settings: RabbitSettings) -> Engine {
    let group = Group::rabbitmq(GROUP, amqp_url(), settings)
        .backoff(broker.backoff.clone())
        .transactional("ORDER.PAY", RecordEffect);
    let prefix = format!("test-{}", uuid::Uuid::new_v4().simple());
    Engine::builder(db.pool.clone())
        .schema(db.schema.clone())
        .redis(redis_url())
        .fast_path(FastPathSettings { prefix, ..FastPathSettings::default() })
        .group(group)
        .start()
        .await
        .unwrap()
}

/// Declares `exchange` as `kind`, durable, as a team's tooling would.
async fn declare_exchange(broker: &TestBroker, kind: ExchangeKind) {
    let options = ExchangeDeclareOptions { durable: true, ..ExchangeDeclareOptions::default() };
    let channel = broker.channel().await;
    channel
        .exchange_declare(broker.settings.exchange.as_str().into(), kind, options, Default::default())
        .await
        .unwrap();
}

/// Publishes through a connector on `settings` (it checks or declares that topology first).
async fn publish(broker: &TestBroker, settings: &RabbitSettings, routing_key: &str, id: &str) {
    let connector = RabbitConnector::new(&amqp_url(), settings.clone(), broker.backoff.clone());
    let publisher = connector.publisher().await.unwrap();
    let body = serde_json::to_vec(&json!({"orderNo": id})).unwrap();
    let properties = properties_for(Some(id), &Default::default(), Some("application/json"));
    publisher.publish(&broker.settings.exchange, routing_key, &body, properties).await.unwrap();
}

async fn succeeded(db: &TestDatabase, id: &str) -> bool {
    sqlx::query_scalar::<_, i64>("SELECT count(*) FROM dedup_records WHERE message_id = $1 AND status = 'succeeded'")
        .bind(id)
        .fetch_one(&db.pool)
        .await
        .unwrap()
        == 1
}

#[tokio::test]
async fn an_exchange_of_another_type_makes_the_group_unhealthy_until_declared_by_its_type() {
    let h = Harness::new().await;
    let db = &h.db;
    let broker = TestBroker::new(&amqp_url(), Backoff { initial_ms: 500, max_ms: 500 });
    declare_exchange(&broker, ExchangeKind::Direct).await;

    // Declared as a topic exchange: the broker refuses, the group says why.
    let refused = engine(db, &broker, broker.settings.clone()).await;
    let handle = refused.handle().clone();
    eventually(Duration::from_secs(10), || async { !handle.groups_health()[0].ready }).await;
    let health = &handle.groups_health()[0];
    let error = health.error.as_deref().unwrap();
    assert_eq!(health.group, GROUP);
    assert!(error.contains("PRECONDITION_FAILED") && error.contains(&broker.settings.exchange), "{error}");
    assert!(error.contains("declaring the Topic exchange"), "names what was refused: {error}");
    let status = handle.groups()[0].status.clone().unwrap();
    assert_eq!(status.running_workers(), 0, "nothing consumes meanwhile");
    refused.stop().await;

    // The same exchange, declared by its type: the group consumes with the binding key as the
    // routing key, and is healthy.
    let settings = RabbitSettings { exchange_type: ExchangeType::Direct, ..broker.settings.clone() };
    let settings = RabbitSettings { binding_keys: vec!["order.pay".to_owned()], ..settings };
    let running = engine(db, &broker, settings.clone()).await;
    let handle = running.handle().clone();
    eventually(Duration::from_secs(10), || async { handle.groups()[0].status.as_ref().unwrap().running_workers() > 0 })
        .await;
    assert!(handle.groups_health()[0].ready, "{:?}", handle.groups_health());
    publish(&broker, &settings, "order.pay", "ORDER.PAY.direct:1").await;
    eventually(Duration::from_secs(10), || succeeded(db, "ORDER.PAY.direct:1")).await;
    running.stop().await;
}

#[tokio::test]
async fn a_group_on_existing_topology_checks_it_and_binds_nothing() {
    let h = Harness::new().await;
    let db = &h.db;
    let broker = TestBroker::new(&amqp_url(), Backoff { initial_ms: 500, max_ms: 500 });
    let existing = RabbitSettings { topology: Topology::Existing, binding_keys: Vec::new(), ..broker.settings.clone() };

    // Nothing exists yet: refused, naming the missing exchange.
    let missing = engine(db, &broker, existing.clone()).await;
    let handle = missing.handle().clone();
    eventually(Duration::from_secs(10), || async { !handle.groups_health()[0].ready }).await;
    let error = handle.groups_health()[0].error.clone().unwrap();
    assert!(error.contains("NOT_FOUND") && error.contains("checking the existing exchange"), "{error}");
    missing.stop().await;

    // The team's fanout exchange and queue, bound by the team: consumed as they are.
    declare_exchange(&broker, ExchangeKind::Fanout).await;
    let channel = broker.channel().await;
    let durable = QueueDeclareOptions { durable: true, ..QueueDeclareOptions::default() };
    channel.queue_declare(broker.settings.queue.as_str().into(), durable, Default::default()).await.unwrap();
    channel
        .queue_bind(
            broker.settings.queue.as_str().into(),
            broker.settings.exchange.as_str().into(),
            "".into(),
            QueueBindOptions::default(),
            Default::default(),
        )
        .await
        .unwrap();
    let running = engine(db, &broker, existing.clone()).await;
    publish(&broker, &existing, "any.key", "ORDER.PAY.fanout:1").await;
    eventually(Duration::from_secs(10), || succeeded(db, "ORDER.PAY.fanout:1")).await;
    assert!(running.handle().groups_health()[0].ready);
    running.stop().await;
}

#[tokio::test]
async fn a_group_without_a_queue_or_topics_is_refused_at_start() {
    let db = TestDatabase::create().await;
    let group = Group::rabbitmq(GROUP, amqp_url(), RabbitSettings::default()).transactional("ORDER.PAY", RecordEffect);
    let err = Engine::builder(db.pool.clone()).schema(db.schema.clone()).group(group).start().await.err().unwrap();
    assert!(matches!(err, EngineError::GroupSource { .. }), "{err}");
    assert!(err.to_string().contains("no queue"), "{err}");
}
