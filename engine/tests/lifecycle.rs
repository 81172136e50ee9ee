//! The engine's builder and lifecycle misused as a host could: two engines starting at once on
//! one fresh database, dropping the engine without `stop`, Redis and RabbitMQ down when it
//! starts (and RabbitMQ coming back), a group without handlers, an invalid schema name, two
//! groups on one queue, a message type registered twice, an HTTP timeout longer than the lease.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use common::*;
use dedup_engine::fastpath::FastPathSettings;
use dedup_engine::group::Group;
use dedup_engine::handler::{Handler, HandlerRegistry};
use dedup_engine::retry::Backoff;
use dedup_engine::runtime::{Engine, EngineBuilder, EngineError};
use dedup_engine::source::rabbitmq::{RabbitConnector, properties_for};
use dedup_engine::testing::{TestBroker, TestDatabase, amqp_url, redis_url};
use dedup_engine::{Schema, SchemaNameError};
use tokio::net::{TcpListener, TcpStream};

/// A fresh database (migrated or not) with the table [`RecordEffect`] writes to.
async fn database(migrated: bool) -> TestDatabase {
    let db = TestDatabase::create_unmigrated().await;
    let db = if migrated { db.migrated().await } else { db };
    sqlx::query("CREATE TABLE test_effects (message_id TEXT NOT NULL, payload JSONB, at TIMESTAMPTZ DEFAULT now())")
        .execute(&db.pool)
        .await
        .unwrap();
    db
}

/// An engine of `group` on `db`, its fast path's markers under a prefix of its own.
fn builder(db: &TestDatabase, group: Group, redis: &str) -> EngineBuilder {
    let prefix = format!("test-{}", uuid::Uuid::new_v4().simple());
    Engine::builder(db.pool.clone())
        .schema(db.schema.clone())
        .redis(redis)
        .fast_path(FastPathSettings { prefix, reconnect_ms: 500, ..FastPathSettings::default() })
        .group(group)
}

fn group(broker: &TestBroker, url: &str) -> Group {
    Group::rabbitmq(GROUP, url, broker.settings.clone())
        .backoff(broker.backoff.clone())
        .transactional("ORDER.PAY", RecordEffect)
}

async fn publish(broker: &TestBroker, id: &str) {
    let connector = RabbitConnector::new(&amqp_url(), broker.settings.clone(), broker.backoff.clone());
    let publisher = connector.publisher().await.unwrap();
    let body = serde_json::to_vec(&serde_json::json!({"orderNo": id})).unwrap();
    let properties = properties_for(Some(id), &Default::default(), Some("application/json"));
    publisher.publish(&broker.settings.exchange, "order.pay", &body, properties).await.unwrap();
}

/// Whether the group's queue was declared (a passive declare succeeds).
async fn queue_exists(broker: &TestBroker) -> bool {
    let passive = lapin::options::QueueDeclareOptions { passive: true, ..Default::default() };
    broker
        .channel()
        .await
        .queue_declare(broker.settings.queue.as_str().into(), passive, Default::default())
        .await
        .is_ok()
}

async fn status(db: &TestDatabase, id: &str) -> Option<(String, Option<String>)> {
    sqlx::query_as("SELECT status::text, error_class FROM dedup_records WHERE message_id = $1")
        .bind(id)
        .fetch_optional(&db.pool)
        .await
        .unwrap()
}

async fn succeeded(db: &TestDatabase, id: &str) -> bool {
    status(db, id).await.is_some_and(|s| s.0 == "succeeded")
}

/// A TCP forwarder to `target` on a port of its own, accepting only while `up`.
struct Switch {
    port: u16,
    up: Arc<AtomicBool>,
}

impl Switch {
    async fn new(target: &'static str) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let up = Arc::new(AtomicBool::new(false));
        let accepting = up.clone();
        tokio::spawn(async move {
            while let Ok((mut inbound, _)) = listener.accept().await {
                if !accepting.load(Ordering::SeqCst) {
                    continue; // dropped: the connection closes at once, as a broker that is down
                }
                tokio::spawn(async move {
                    if let Ok(mut outbound) = TcpStream::connect(target).await {
                        let _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
                    }
                });
            }
        });
        Self { port, up }
    }
}

#[tokio::test]
async fn two_engines_starting_at_once_on_one_fresh_database_both_start() {
    let db = database(false).await;
    let broker = TestBroker::new(&amqp_url(), Backoff { initial_ms: 500, max_ms: 500 });
    let (a, b) = tokio::time::timeout(
        Duration::from_secs(20),
        futures::future::join(
            builder(&db, group(&broker, &amqp_url()), &redis_url()).start(),
            builder(&db, group(&broker, &amqp_url()), &redis_url()).start(),
        ),
    )
    .await
    .expect("both start within 20 s");
    let (a, b) = (a.expect("the first starts"), b.expect("the second starts"));
    publish(&broker, "ORDER.PAY.both:1").await;
    eventually(Duration::from_secs(10), || succeeded(&db, "ORDER.PAY.both:1")).await;
    tokio::time::timeout(Duration::from_secs(10), futures::future::join(a.stop(), b.stop())).await.expect("both stop");
}

#[tokio::test]
async fn redis_down_at_start_is_no_reason_not_to_consume() {
    let db = database(true).await;
    let broker = TestBroker::new(&amqp_url(), Backoff { initial_ms: 500, max_ms: 500 });
    // A port nothing listens on.
    let closed = TcpListener::bind("127.0.0.1:0").await.unwrap().local_addr().unwrap().port();
    let engine = tokio::time::timeout(
        Duration::from_secs(10),
        builder(&db, group(&broker, &amqp_url()), &format!("redis://127.0.0.1:{closed}")).start(),
    )
    .await
    .expect("start does not wait for Redis")
    .expect("starts");
    eventually(Duration::from_secs(10), || async { engine.handle().groups_health()[0].ready }).await;
    publish(&broker, "ORDER.PAY.no-redis:1").await;
    eventually(Duration::from_secs(10), || succeeded(&db, "ORDER.PAY.no-redis:1")).await;
    publish(&broker, "ORDER.PAY.no-redis:1").await; // a redelivery: the database decides
    eventually(Duration::from_secs(10), || async {
        sqlx::query_scalar::<_, i32>("SELECT duplicate_count FROM dedup_records WHERE message_id = $1")
            .bind("ORDER.PAY.no-redis:1")
            .fetch_one(&db.pool)
            .await
            .unwrap()
            == 1
    })
    .await;
    tokio::time::timeout(Duration::from_secs(10), engine.stop()).await.expect("stops");
}

#[tokio::test]
async fn redis_down_at_start_then_back_gets_the_markers_again() {
    let db = database(true).await;
    let broker = TestBroker::new(&amqp_url(), Backoff { initial_ms: 200, max_ms: 200 });
    let switch = Switch::new("127.0.0.1:6379").await;
    let redis = format!("redis://127.0.0.1:{}", switch.port);
    let engine = builder(&db, group(&broker, &amqp_url()), &redis).start().await.unwrap();
    eventually(Duration::from_secs(10), || queue_exists(&broker)).await;
    publish(&broker, "ORDER.PAY.redis-down:1").await;
    eventually(Duration::from_secs(10), || succeeded(&db, "ORDER.PAY.redis-down:1")).await;
    // EXISTS on the markers' own keys, not KEYS: a scan of the whole keyspace can outlast the
    // client's response timeout while other tests fill Redis.
    let ids = ["ORDER.PAY.redis-down:1", "ORDER.PAY.redis-back:2", "ORDER.PAY.redis-back:3", "ORDER.PAY.redis-back:4"];
    let keys: Vec<String> = ids.iter().map(|id| engine.handle().fast_path().key(GROUP, id)).collect();
    let markers = || async {
        let client = redis::Client::open(redis_url()).unwrap();
        let mut conn = client.get_multiplexed_async_connection().await.unwrap();
        redis::cmd("EXISTS").arg(&keys).query_async::<usize>(&mut conn).await.unwrap()
    };
    assert_eq!(markers().await, 0, "no marker while Redis is down");
    switch.up.store(true, Ordering::SeqCst);
    tokio::time::sleep(Duration::from_secs(1)).await; // past reconnect_ms
    for id in &ids[1..] {
        publish(&broker, id).await;
        eventually(Duration::from_secs(10), || succeeded(&db, id)).await;
    }
    eventually(Duration::from_secs(10), || async { markers().await > 0 }).await;
    tokio::time::timeout(Duration::from_secs(10), engine.stop()).await.expect("stops");
}

#[tokio::test]
async fn rabbitmq_down_at_start_then_back_is_consumed_from_once_it_is_back() {
    let db = database(true).await;
    let broker = TestBroker::new(&amqp_url(), Backoff { initial_ms: 200, max_ms: 200 });
    let switch = Switch::new("127.0.0.1:5672").await;
    let url = format!("amqp://guest:guest@127.0.0.1:{}/%2f", switch.port);
    let engine =
        tokio::time::timeout(Duration::from_secs(10), builder(&db, group(&broker, &url), &redis_url()).start())
            .await
            .expect("start does not wait for the broker")
            .expect("starts");
    tokio::time::sleep(Duration::from_secs(2)).await;
    switch.up.store(true, Ordering::SeqCst);
    // Published once the workers declared the queue (binding `#`), through the broker itself.
    eventually(Duration::from_secs(15), || async { queue_exists(&broker).await }).await;
    publish(&broker, "ORDER.PAY.back:1").await;
    eventually(Duration::from_secs(10), || succeeded(&db, "ORDER.PAY.back:1")).await;
    tokio::time::timeout(Duration::from_secs(10), engine.stop()).await.expect("stops");
}

#[tokio::test]
async fn a_group_without_handlers_starts_and_dead_letters_each_message_as_no_handler() {
    let db = database(true).await;
    let broker = TestBroker::new(&amqp_url(), Backoff { initial_ms: 200, max_ms: 200 });
    let bare = Group::rabbitmq(GROUP, amqp_url(), broker.settings.clone()).backoff(broker.backoff.clone());
    let engine = builder(&db, bare, &redis_url()).start().await.expect("starts, with a warning");
    eventually(Duration::from_secs(10), || async { engine.handle().groups_health()[0].ready }).await;
    publish(&broker, "ORDER.PAY.nobody:1").await;
    eventually(Duration::from_secs(10), || async {
        status(&db, "ORDER.PAY.nobody:1").await == Some(("dead".to_owned(), Some("NO_HANDLER: ORDER.PAY".to_owned())))
    })
    .await;
    tokio::time::timeout(Duration::from_secs(10), engine.stop()).await.expect("stops");
}

#[tokio::test]
async fn dropping_the_engine_without_stop_leaves_its_workers_consuming_as_documented() {
    let db = database(true).await;
    let broker = TestBroker::new(&amqp_url(), Backoff { initial_ms: 200, max_ms: 200 });
    let engine = builder(&db, group(&broker, &amqp_url()), &redis_url()).start().await.unwrap();
    eventually(Duration::from_secs(10), || async { engine.handle().groups_health()[0].ready }).await;
    publish(&broker, "ORDER.PAY.before-drop:1").await;
    eventually(Duration::from_secs(10), || succeeded(&db, "ORDER.PAY.before-drop:1")).await;
    drop(engine);
    tokio::time::sleep(Duration::from_secs(2)).await;
    publish(&broker, "ORDER.PAY.after-drop:1").await;
    // `Engine`'s docs: "dropping it leaves its tasks running until the runtime ends".
    eventually(Duration::from_secs(10), || succeeded(&db, "ORDER.PAY.after-drop:1")).await;
}

#[test]
fn an_invalid_schema_name_is_refused_with_its_reason() {
    for name in
        ["", "1abc", "a-b", "a\"b", "a;drop", "Ab", "public", "information_schema", "pg_x", "a\nb", &"a".repeat(64)]
    {
        let err: SchemaNameError = Schema::parse(name).err().unwrap_or_else(|| panic!("{name:?} is taken"));
        assert!(!err.to_string().is_empty(), "{name:?}");
    }
    assert!(Schema::parse("billing_dedup").is_ok());
}

/// `start`'s refusal, within 10 s.
async fn refused(builder: EngineBuilder) -> EngineError {
    let started = tokio::time::timeout(Duration::from_secs(10), builder.start()).await.expect("answers within 10 s");
    started.err().expect("refused")
}

#[tokio::test]
async fn two_groups_on_one_queue_are_refused_at_start() {
    let db = database(true).await;
    let broker = TestBroker::new(&amqp_url(), Backoff { initial_ms: 200, max_ms: 200 });
    // The same broker spelt with other credentials, and another group name.
    let other = Group::rabbitmq("other-group", "amqp://someone:else@127.0.0.1:5672/%2f", broker.settings.clone())
        .transactional("ORDER.SHIP", RecordEffect);
    let err = refused(builder(&db, group(&broker, &amqp_url()), &redis_url()).group(other)).await;
    assert!(matches!(err, EngineError::SharedSource { .. }), "{err}");
    let text = err.to_string();
    assert!(text.contains(&broker.settings.queue) && text.contains("other-group"), "{text}");
    assert!(!text.contains("else"), "no credentials in the error: {text}");
    // Another vhost is another queue.
    let elsewhere = Group::rabbitmq("other-group", "amqp://guest:guest@127.0.0.1:5672/other", broker.settings.clone());
    let two = builder(&db, group(&broker, &amqp_url()), &redis_url()).group(elsewhere).consume(false).start().await;
    two.expect("a queue of the same name in another vhost is another queue").stop().await;
}

#[tokio::test]
async fn a_message_type_registered_twice_is_refused_at_start() {
    let db = database(true).await;
    let broker = TestBroker::new(&amqp_url(), Backoff { initial_ms: 200, max_ms: 200 });
    let twice = group(&broker, &amqp_url()).transactional("ORDER.PAY", RecordEffect);
    let err = refused(builder(&db, twice, &redis_url())).await;
    assert!(
        matches!(err, EngineError::DuplicateHandler { ref message_type, .. } if message_type == "ORDER.PAY"),
        "{err}"
    );
    // Through a registry too.
    let mut registry = HandlerRegistry::new();
    registry.register("ORDER.PAY", Handler::Transactional(Arc::new(RecordEffect)));
    let merged = group(&broker, &amqp_url()).handlers(&registry);
    assert!(matches!(refused(builder(&db, merged, &redis_url())).await, EngineError::DuplicateHandler { .. }));
}

#[cfg(feature = "http")]
#[tokio::test]
async fn an_http_handler_whose_timeout_outlasts_the_lease_is_refused_at_start() {
    let db = database(true).await;
    let broker = TestBroker::new(&amqp_url(), Backoff { initial_ms: 200, max_ms: 200 });
    use dedup_engine::http::{HttpHandler, HttpSettings};
    let settings = HttpSettings { timeout_ms: 5_000, ..HttpSettings::new("http://127.0.0.1:9/hook") };
    let http = HttpHandler::new(&settings).unwrap();
    let short = group(&broker, &amqp_url()).lease(Duration::from_secs(5)).http("ORDER.SHIP", http);
    let err = refused(builder(&db, short, &redis_url())).await;
    assert!(matches!(err, EngineError::LeaseTooShort { lease_ms: 5_000, longest_ms: 5_000, .. }), "{err}");
    assert!(err.to_string().contains("raise lease_ms"), "{err}");
}
