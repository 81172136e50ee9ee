//! The pipeline on MariaDB (issue 25, store-seam.md 3.7 step 9): a batch of transactional
//! MySQL handlers (writing a business row in the claim's transaction) and leased handlers runs
//! on `MySqlStore` as on PostgreSQL; simultaneous deliveries of one message, and overlapping
//! batches of several workers, make each effect once, a deadlock (InnoDB 1213, which loses the
//! whole transaction) being run again and counted in `dedup_store_retries_total`.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use dedup_engine::fastpath::FastPath;
use dedup_engine::handler::{
    Handler, HandlerError, HandlerInput, HandlerRegistry, LeaseGuard, LeasedHandler, TransactionalHandler,
};
use dedup_engine::message::{IdPolicy, TypePolicy};
use dedup_engine::pipeline::{AckReason, Disposition, Pipeline, PipelineSettings};
use dedup_engine::record::ConsumerGroup;
use dedup_engine::retry::Backoff;
use dedup_engine::stats::Stats;
use dedup_engine::store::conformance::delivery;
use dedup_engine::store::mysql::MySqlStore;
use dedup_engine::testing::mysql::TestMySqlDatabase;
use dedup_engine::testing::redis_url;
use dedup_engine::{FastPathSettings, LeaseExpiryPolicy, Schema, async_trait};
use sqlx::{MySql, MySqlConnection, MySqlPool};

/// `dedup_store_retries_total{reason="deadlock"}`, summed over the binary's tests.
static DEADLOCK_RERUNS: OnceLock<Arc<AtomicU64>> = OnceLock::new();

/// Counts the deadlock reruns (every other metric is dropped).
struct Recorder(Arc<AtomicU64>);

impl metrics::Recorder for Recorder {
    fn describe_counter(&self, _: metrics::KeyName, _: Option<metrics::Unit>, _: metrics::SharedString) {}
    fn describe_gauge(&self, _: metrics::KeyName, _: Option<metrics::Unit>, _: metrics::SharedString) {}
    fn describe_histogram(&self, _: metrics::KeyName, _: Option<metrics::Unit>, _: metrics::SharedString) {}

    fn register_counter(&self, key: &metrics::Key, _: &metrics::Metadata<'_>) -> metrics::Counter {
        let deadlock = key.labels().any(|l| l.key() == "reason" && l.value() == "deadlock");
        if key.name() == "dedup_store_retries_total" && deadlock {
            metrics::Counter::from_arc(self.0.clone())
        } else {
            metrics::Counter::noop()
        }
    }

    fn register_gauge(&self, _: &metrics::Key, _: &metrics::Metadata<'_>) -> metrics::Gauge {
        metrics::Gauge::noop()
    }

    fn register_histogram(&self, _: &metrics::Key, _: &metrics::Metadata<'_>) -> metrics::Histogram {
        metrics::Histogram::noop()
    }
}

/// The deadlock reruns counted so far.
fn deadlock_reruns() -> u64 {
    DEADLOCK_RERUNS
        .get_or_init(|| {
            let count = Arc::new(AtomicU64::new(0));
            metrics::set_global_recorder(Recorder(count.clone())).expect("the only recorder of this binary");
            count
        })
        .load(Ordering::SeqCst)
}

/// Writes the business row of an `ORDER.PAY` in the claim's transaction.
struct Pay;

#[async_trait]
impl TransactionalHandler<MySql> for Pay {
    async fn handle(&self, input: &HandlerInput<'_>, tx: &mut MySqlConnection) -> Result<(), HandlerError> {
        sqlx::query("INSERT INTO payments (message_id) VALUES (?)").bind(input.message_id.as_str()).execute(tx).await?;
        Ok(())
    }
}

/// An `ORDER.NOTIFY` effect outside the database: counted per message id.
#[derive(Clone, Default)]
struct Notify(Arc<Mutex<HashMap<String, u32>>>);

#[async_trait]
impl LeasedHandler for Notify {
    async fn handle(&self, input: &HandlerInput<'_>, lease: &LeaseGuard) -> Result<(), HandlerError> {
        lease.check()?;
        tokio::time::sleep(Duration::from_millis(20)).await;
        *self.0.lock().unwrap().entry(input.message_id.as_str().to_owned()).or_default() += 1;
        Ok(())
    }
}

impl Notify {
    fn counts(&self) -> HashMap<String, u32> {
        self.0.lock().unwrap().clone()
    }
}

/// A MariaDB database with a `payments` table (no unique key: a second effect would show), a
/// Redis prefix of its own, and the two handlers.
struct Harness {
    db: TestMySqlDatabase,
    store: MySqlStore,
    fast_path: Arc<FastPath>,
    notify: Notify,
}

impl Harness {
    async fn new() -> Self {
        deadlock_reruns();
        let db = TestMySqlDatabase::create().await;
        sqlx::query("CREATE TABLE payments (message_id VARCHAR(128) NOT NULL)").execute(&db.pool).await.unwrap();
        let schema = Schema::parse(db.name.clone()).unwrap();
        let store = MySqlStore::new(db.pool.clone(), &schema);
        let prefix = format!("test-{}", uuid::Uuid::new_v4().simple());
        let fast_path =
            Arc::new(FastPath::new(&redis_url(), FastPathSettings { prefix, ..FastPathSettings::default() }));
        Self { db, store, fast_path, notify: Notify::default() }
    }

    fn pool(&self) -> &MySqlPool {
        &self.db.pool
    }

    /// A pipeline of its own (a worker of another process), on the shared database and Redis.
    fn pipeline(&self) -> Pipeline<MySqlStore> {
        let mut handlers = HandlerRegistry::new();
        handlers.register("ORDER.PAY", Handler::transactional_on::<MySql, _>(Pay));
        handlers.register(
            "ORDER.NOTIFY",
            Handler::Leased { handler: Arc::new(self.notify.clone()), on_lease_expiry: LeaseExpiryPolicy::Hold },
        );
        let settings = PipelineSettings {
            group: ConsumerGroup::parse("orders").unwrap(),
            max_attempts: 5,
            lease: Duration::from_secs(30),
            backoff: Backoff { initial_ms: 1000, max_ms: 8000 },
            id_policy: IdPolicy::default(),
            type_policy: TypePolicy::default(),
            keep_poison_payload_bytes: 1024,
            late_duplicates: dedup_engine::LateDuplicatePolicy::Process,
        };
        Pipeline::new(self.store.clone(), self.fast_path.clone(), Arc::new(Stats::default()), handlers, settings)
    }

    /// Payments written, per message id.
    async fn payments(&self) -> HashMap<String, i64> {
        // The test database's text may come back as bytes (its default character set).
        let rows: Vec<(Vec<u8>, i64)> =
            sqlx::query_as("SELECT message_id, CAST(count(*) AS SIGNED) FROM payments GROUP BY message_id")
                .fetch_all(self.pool())
                .await
                .unwrap();
        rows.into_iter().map(|(id, n)| (String::from_utf8(id).unwrap(), n)).collect()
    }

    /// `(status, attempts)` of the record of `message_id`.
    async fn record(&self, message_id: &str) -> (String, i32) {
        let (status, attempts): (Vec<u8>, i32) =
            sqlx::query_as("SELECT status, attempts FROM dedup_records WHERE message_id = ?")
                .bind(message_id)
                .fetch_one(self.pool())
                .await
                .unwrap();
        (String::from_utf8(status).unwrap(), attempts)
    }
}

fn pay(n: usize) -> dedup_engine::message::InboundMessage {
    delivery(&format!("ORDER.PAY.{n}:1"), &format!(r#"{{"orderNo":"{n}"}}"#))
}

fn notify(n: usize) -> dedup_engine::message::InboundMessage {
    delivery(&format!("ORDER.NOTIFY.{n}:1"), &format!(r#"{{"orderNo":"{n}"}}"#))
}

/// Acknowledged or sent back to be judged later, never redelivered as a failure.
fn settled(d: &Disposition) -> bool {
    matches!(d, Disposition::Ack(_) | Disposition::Retry { .. })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_mixed_batch_runs_once_on_mariadb_and_its_duplicates_are_judged_duplicates() {
    let h = Harness::new().await;
    let pipeline = h.pipeline();
    let batch = [pay(1), notify(1), pay(2), notify(2)];
    let first = pipeline.process("a", &batch).await;
    assert_eq!(first, vec![Disposition::Ack(AckReason::Processed); 4]);
    assert_eq!(h.payments().await, HashMap::from([("ORDER.PAY.1:1".into(), 1), ("ORDER.PAY.2:1".into(), 1)]));
    assert_eq!(h.notify.counts().values().copied().collect::<Vec<_>>(), [1, 1]);
    for id in ["ORDER.PAY.1:1", "ORDER.NOTIFY.2:1"] {
        assert_eq!(h.record(id).await, ("succeeded".to_owned(), 1), "{id}");
    }

    // Again, through another worker (its own Redis lookups find the markers) and after
    // Redis forgot them (the database judges).
    let again = h.pipeline().process("b", &batch).await;
    assert!(
        again.iter().all(|d| matches!(d, Disposition::Ack(AckReason::DuplicateRedis | AckReason::DuplicateDatabase))),
        "{again:?}"
    );
    let fresh_redis = Arc::new(FastPath::new(
        &redis_url(),
        FastPathSettings { prefix: format!("test-{}", uuid::Uuid::new_v4().simple()), ..FastPathSettings::default() },
    ));
    let blind = Harness { fast_path: fresh_redis, ..h };
    let judged = blind.pipeline().process("c", &batch).await;
    assert_eq!(judged, vec![Disposition::Ack(AckReason::DuplicateDatabase); 4]);
    assert_eq!(blind.payments().await.values().sum::<i64>(), 2, "no second payment");
    assert_eq!(blind.notify.counts().values().sum::<u32>(), 2, "no second notification");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn eight_simultaneous_deliveries_of_one_message_make_one_effect_without_an_error() {
    let h = Harness::new().await;
    let before = deadlock_reruns();
    for round in 0..10 {
        let pipelines: Vec<_> = (0..8).map(|_| h.pipeline()).collect();
        let barrier = Arc::new(tokio::sync::Barrier::new(8));
        let runs: Vec<_> = pipelines
            .into_iter()
            .enumerate()
            .map(|(w, pipeline)| {
                let barrier = barrier.clone();
                tokio::spawn(async move {
                    let batch = [pay(round), notify(round)];
                    barrier.wait().await;
                    pipeline.process(&format!("w{w}"), &batch).await
                })
            })
            .collect();
        let mut dispositions = Vec::new();
        for run in runs {
            dispositions.extend(run.await.unwrap());
        }
        assert!(dispositions.iter().all(settled), "round {round}: {dispositions:?}");
        let processed = dispositions.iter().filter(|d| **d == Disposition::Ack(AckReason::Processed)).count();
        assert_eq!(processed, 2, "round {round}: one worker ran each message: {dispositions:?}");
        let payments = h.payments().await;
        assert_eq!(payments.get(&format!("ORDER.PAY.{round}:1")), Some(&1), "round {round}");
        assert_eq!(h.notify.counts().get(&format!("ORDER.NOTIFY.{round}:1")), Some(&1), "round {round}");
    }
    let reruns = deadlock_reruns() - before;
    println!(
        "eight simultaneous deliveries, 10 rounds: {reruns} deadlock reruns counted (this binary's tests together)"
    );
    assert!(reruns <= 10 * 8 * 6, "a rerun is bounded per transaction: {reruns}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn overlapping_batches_of_four_workers_make_every_effect_once() {
    let h = Harness::new().await;
    // Worker w takes 40 of 80 orders starting at 20·w (wrapping), in its own order, each
    // order's payment and notification.
    let runs: Vec<_> = (0..4)
        .map(|w| {
            let pipeline = h.pipeline();
            tokio::spawn(async move {
                let mut orders: Vec<usize> = (0..40).map(|i| (20 * w + i) % 80).collect();
                if w % 2 == 1 {
                    orders.reverse();
                }
                let batch: Vec<_> = orders.iter().flat_map(|&n| [pay(n), notify(n)]).collect();
                pipeline.process(&format!("w{w}"), &batch).await
            })
        })
        .collect();
    let mut dispositions = Vec::new();
    for run in runs {
        dispositions.extend(run.await.unwrap());
    }
    assert!(dispositions.iter().all(settled), "{dispositions:?}");
    let payments = h.payments().await;
    assert_eq!(payments.len(), 80, "every order paid");
    assert!(payments.values().all(|&n| n == 1), "{payments:?}");
    // A notification sent back (its record was being processed by another worker) is the
    // other worker's to run: every one ran, once.
    let notified = h.notify.counts();
    assert_eq!(notified.len(), 80, "every order notified");
    assert!(notified.values().all(|&n| n == 1), "{notified:?}");
    let succeeded: i64 = sqlx::query_scalar("SELECT count(*) FROM dedup_records WHERE status = 'succeeded'")
        .fetch_one(h.pool())
        .await
        .unwrap();
    assert_eq!(succeeded, 160);
}
