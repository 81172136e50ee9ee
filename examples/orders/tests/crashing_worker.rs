//! The demo's crashing worker dies as a killed process does (DESIGN.md, "Two handler modes"): the
//! NOTIFY record it held stays `processing` under its lease until the lease runs out (stuck),
//! nothing is completed or recorded as failed, and its delivery goes back to the queue
//! unacknowledged — with nothing in the engine for it.

use std::sync::Arc;
use std::time::{Duration, Instant};

use dedup_engine::consumer::ConsumerSettings;
use dedup_engine::group::Group;
use dedup_engine::retry::Backoff;
use dedup_engine::runtime::Engine;
use dedup_engine::source::rabbitmq::properties_for;
use dedup_engine::testing::{TestBroker, TestDatabase, amqp_url, redis_url};
use dedup_example_orders::OrderSettings;
use dedup_example_orders::crashing_worker::{StartEngine, spawn_crashing_worker};
use tokio_util::sync::CancellationToken;

async fn eventually<F: Future<Output = bool>>(within: Duration, what: &str, mut check: impl FnMut() -> F) {
    let started = Instant::now();
    while !check().await {
        assert!(started.elapsed() < within, "{what}: not within {within:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test]
async fn a_killed_worker_leaves_its_record_stuck_and_its_delivery_back_in_the_queue() {
    let db = TestDatabase::create().await;
    dedup_example_orders::migrate(&db.pool).await.unwrap();
    let broker = TestBroker::new(&amqp_url(), Backoff { initial_ms: 100, max_ms: 100 });
    let queue = broker.settings.queue.clone();
    let orders = OrderSettings { notify_crash_rate: 1.0, sms_latency_ms: 1, ..OrderSettings::default() };
    let (rabbit, schema) = (broker.settings.clone(), db.schema.clone());
    let start: StartEngine = Arc::new(move |pool, handlers| {
        let (rabbit, schema) = (rabbit.clone(), schema.clone());
        Box::pin(async move {
            let group = Group::rabbitmq("notify-service", amqp_url(), rabbit)
                .lease(Duration::from_secs(2))
                .workers(ConsumerSettings { concurrency: 1, ..ConsumerSettings::default() })
                .handlers(&handlers);
            Ok(Engine::builder(pool).schema(schema).redis(redis_url()).group(group).start().await?)
        })
    });
    let stop = CancellationToken::new();
    let shop = dedup_example_orders::ShopPool::Postgres(db.pool.clone());
    let worker = spawn_crashing_worker(shop, orders, start, stop.clone()).unwrap();
    eventually(Duration::from_secs(20), "the worker consumes", || async {
        broker.queue_state(&queue).await.is_some_and(|(_, consumers)| consumers == 1)
    })
    .await;

    let id = format!("ORDER.NOTIFY.CW{}:3", rand::random::<u32>());
    let body = serde_json::json!({"orderNo": "CW", "kind": "PAID", "phone": "+1", "text": "paid"});
    let publisher = broker.connector().publisher().await.unwrap();
    let props = properties_for(Some(&id), &Default::default(), Some("application/json"));
    publisher
        .publish(&broker.settings.exchange, "order.notify", &serde_json::to_vec(&body).unwrap(), props)
        .await
        .unwrap();

    eventually(Duration::from_secs(20), "killed, its delivery given back", || async {
        broker.queue_state(&queue).await == Some((1, 0))
    })
    .await;
    let stuck = || async {
        sqlx::query_as::<_, (String, i32, bool, bool)>(
            "SELECT status, attempts, lease_owner IS NOT NULL, lease_expires_at < now() FROM dedup_records
             WHERE message_id = $1",
        )
        .bind(&id)
        .fetch_one(&db.pool)
        .await
        .unwrap()
    };
    eventually(Duration::from_secs(10), "the lease runs out", || async { stuck().await.3 }).await;
    let (status, attempts, leased, _) = stuck().await;
    assert_eq!((status.as_str(), attempts, leased), ("processing", 1, true), "stuck: neither completed nor failed");
    let (attempt_rows, open): (i64, i64) = sqlx::query_as(
        "SELECT count(*), count(*) FILTER (WHERE ended_at IS NULL AND outcome IS NULL) FROM record_attempts",
    )
    .fetch_one(&db.pool)
    .await
    .unwrap();
    assert_eq!((attempt_rows, open), (1, 1), "its attempt never ended");

    stop.cancel();
    tokio::task::spawn_blocking(move || worker.join()).await.unwrap().unwrap();
}
