//! The pipeline on MariaDB (issue 25, store-seam.md 3.7 step 9): a batch of transactional
//! MySQL handlers (writing a business row in the claim's transaction) and leased handlers runs
//! on `MySqlStore` as on PostgreSQL; simultaneous deliveries of one message, and overlapping
//! batches of several workers, make each effect once, a deadlock (InnoDB 1213, which loses the
//! whole transaction) being run again and counted in `dedup_store_retries_total`. The roles
//! beyond the claims work as on PostgreSQL: a copy with another payload is kept and
//! acknowledged, a late duplicate (a fingerprint inserted here: nothing writes them on MySQL
//! yet) is held or noted, an operator's pause holds its handler's deliveries.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use dedup_engine::actions::cleanup::late::RetentionWatch;
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
use dedup_engine::testing::{deadlock_reruns, redis_url};
use dedup_engine::{FastPathSettings, LateDuplicatePolicy, LeaseExpiryPolicy, Schema, async_trait};
use sqlx::{MySql, MySqlConnection, MySqlPool};

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
        self.pipeline_with(LateDuplicatePolicy::Process)
    }

    /// [`Harness::pipeline`] whose group treats late duplicates as `late` says.
    fn pipeline_with(&self, late: LateDuplicatePolicy) -> Pipeline<MySqlStore> {
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
            late_duplicates: late,
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

/// Text columns of the engine's tables (bytes, `_bin`) read as text, rows sorted.
async fn texts(pool: &MySqlPool, sql: &str) -> Vec<Vec<String>> {
    let rows: Vec<sqlx::mysql::MySqlRow> = sqlx::query(sql).fetch_all(pool).await.unwrap();
    let mut rows: Vec<Vec<String>> = rows
        .iter()
        .map(|row| {
            use sqlx::Row;
            (0..row.len())
                .map(|i| match row.try_get::<Option<Vec<u8>>, _>(i) {
                    Ok(bytes) => bytes.map(|b| String::from_utf8(b).unwrap()).unwrap_or_default(),
                    Err(_) => row.get::<i64, _>(i).to_string(),
                })
                .collect()
        })
        .collect();
    rows.sort();
    rows
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_copy_with_another_payload_is_acknowledged_with_its_copy_kept() {
    let h = Harness::new().await;
    let pipeline = h.pipeline();
    assert_eq!(pipeline.process("a", &[pay(1), notify(1)]).await, vec![Disposition::Ack(AckReason::Processed); 2]);
    // The same ids with another payload (a producer reusing them): duplicates of their records
    // by the database's judgement (Redis's marker holds the first payload's hash), each copy
    // kept — the transactional one in the batch's transaction, the leased one on the pool.
    let other = [
        delivery("ORDER.PAY.1:1", r#"{"orderNo":"1","amount":2}"#),
        delivery("ORDER.NOTIFY.1:1", r#"{"orderNo":"1","sms":"again"}"#),
    ];
    assert_eq!(pipeline.process("b", &other).await, vec![Disposition::Ack(AckReason::DuplicateDatabase); 2]);
    let kept = texts(
        h.pool(),
        "SELECT message_id, kind, message_type, payload, CAST(copies AS SIGNED) FROM record_conflicts WHERE settled_at IS NULL",
    )
    .await;
    assert_eq!(
        kept,
        [
            ["ORDER.NOTIFY.1:1", "payload", "ORDER.NOTIFY", r#"{"orderNo":"1","sms":"again"}"#, "1"],
            ["ORDER.PAY.1:1", "payload", "ORDER.PAY", r#"{"orderNo":"1","amount":2}"#, "1"],
        ]
    );
    assert_eq!(h.payments().await, HashMap::from([("ORDER.PAY.1:1".into(), 1)]), "no second payment");
    assert_eq!(h.notify.counts().values().sum::<u32>(), 1, "no second notification");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn eight_workers_keeping_copies_of_one_record_at_once_keep_at_most_five_payloads() {
    let h = Harness::new().await;
    // A table of some size, analysed: on an empty one InnoDB's plans differ.
    for chunk in (0..3000).collect::<Vec<usize>>().chunks(250) {
        let batch: Vec<_> = chunk.iter().map(|i| delivery(&format!("ORDER.PAY.F{i}:1"), "{}")).collect();
        h.pipeline().process("filler", &batch).await;
    }
    sqlx::query("ANALYZE TABLE dedup_records").execute(h.pool()).await.unwrap();
    let first: Vec<_> = (0..40).flat_map(|n| [pay(n), notify(n)]).collect();
    assert!(h.pipeline().process("a", &first).await.iter().all(|d| *d == Disposition::Ack(AckReason::Processed)));
    // Eight workers at once, each with its own payload for the same 40 transactional and 40
    // leased records, in its own order, four rounds: 32 payloads per record, of which 5 are kept
    // open (the leased copies are kept alone, on the pool; the transactional ones in the
    // claim's transaction, whose row locks serialize them anyway).
    for round in 0..4 {
        let barrier = Arc::new(tokio::sync::Barrier::new(8));
        let runs: Vec<_> = (0..8)
            .map(|w| {
                let (pipeline, barrier) = (h.pipeline(), barrier.clone());
                tokio::spawn(async move {
                    let mut order: Vec<usize> = (0..40).map(|i| (5 * w + i) % 40).collect();
                    if w % 2 == 1 {
                        order.reverse();
                    }
                    let copy = |kind: &str, n: usize| {
                        delivery(&format!("ORDER.{kind}.{n}:1"), &format!(r#"{{"orderNo":"{n}","w":"{round}.{w}"}}"#))
                    };
                    let batch: Vec<_> = order.iter().flat_map(|&n| [copy("PAY", n), copy("NOTIFY", n)]).collect();
                    barrier.wait().await;
                    pipeline.process(&format!("w{w}"), &batch).await
                })
            })
            .collect();
        for run in runs {
            let dispositions = run.await.unwrap();
            assert!(
                dispositions.iter().all(|d| *d == Disposition::Ack(AckReason::DuplicateDatabase)),
                "{dispositions:?}"
            );
        }
    }
    let most: i64 = sqlx::query_scalar(
        "SELECT CAST(MAX(n) AS SIGNED) FROM (SELECT COUNT(*) AS n FROM record_conflicts
         WHERE settled_at IS NULL AND kind = 'payload' GROUP BY record_id) open_rows",
    )
    .fetch_one(h.pool())
    .await
    .unwrap();
    assert_eq!(most, 5, "open payload conflicts of the most copied record (without the records' lock: 6-8)");
    assert_eq!(h.notify.counts().values().sum::<u32>(), 40, "no second notification");
    assert_eq!(h.payments().await.len(), 3040, "no second payment");
}

/// Keeps the fingerprints of `ids` (message type, message id) of the group `orders`, first seen
/// 40 days ago, as cleanup does when it deletes their records (which it does not on MySQL yet).
async fn keep_fingerprints(pool: &MySqlPool, ids: &[(&str, &str)]) {
    for (message_type, message_id) in ids {
        sqlx::query(
            "INSERT INTO dedup_fingerprints (fingerprint, first_seen_at, forget_at)
             VALUES (UNHEX(LEFT(MD5(CONCAT('orders', CHAR(10), ?, CHAR(10), ?)), 16)),
                     TIMESTAMPADD(DAY, -40, UTC_TIMESTAMP(6)), TIMESTAMPADD(YEAR, 1, UTC_TIMESTAMP(6)))",
        )
        .bind(message_type)
        .bind(message_id)
        .execute(pool)
        .await
        .unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_late_duplicate_is_held_for_an_operator_under_hold_and_noted_under_process() {
    let h = Harness::new().await;
    keep_fingerprints(h.pool(), &[("ORDER.PAY", "ORDER.PAY.1:1"), ("ORDER.NOTIFY", "ORDER.NOTIFY.1:1")]).await;
    keep_fingerprints(h.pool(), &[("ORDER.PAY", "ORDER.PAY.2:1")]).await;
    let watch = Arc::new(RetentionWatch::keeping_fingerprints());

    let hold = h.pipeline_with(LateDuplicatePolicy::Hold).with_retention(watch.clone());
    assert_eq!(hold.process("a", &[pay(1), notify(1)]).await, vec![Disposition::Ack(AckReason::Parked); 2]);
    let held = texts(
        h.pool(),
        "SELECT r.message_id, r.status, r.error_class, CAST(r.parked_at IS NOT NULL AS SIGNED), CAST(l.held AS SIGNED),
                CAST(l.delay_ms DIV 86400000 AS SIGNED)
         FROM dedup_records r JOIN late_duplicates l ON l.record_id = r.id",
    )
    .await;
    assert_eq!(
        held,
        [
            ["ORDER.NOTIFY.1:1", "processing", "LATE_DUPLICATE", "1", "1", "40"],
            ["ORDER.PAY.1:1", "processing", "LATE_DUPLICATE", "1", "1", "40"],
        ]
    );
    assert_eq!(h.payments().await, HashMap::new(), "no handler ran");
    assert_eq!(h.notify.counts(), HashMap::new(), "no handler ran");

    // Under `process` the handler runs, and the copy is noted once its batch committed; a
    // message without a fingerprint is no late duplicate.
    let process = h.pipeline().with_retention(watch);
    assert_eq!(process.process("b", &[pay(2), pay(3)]).await, vec![Disposition::Ack(AckReason::Processed); 2]);
    let noted = texts(
        h.pool(),
        "SELECT message_id, CAST(held AS SIGNED) FROM late_duplicates WHERE message_id LIKE 'ORDER.PAY.%'",
    )
    .await;
    assert_eq!(noted, [["ORDER.PAY.1:1", "1"], ["ORDER.PAY.2:1", "0"]]);
    assert_eq!(h.payments().await, HashMap::from([("ORDER.PAY.2:1".into(), 1), ("ORDER.PAY.3:1".into(), 1)]));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_operators_pause_holds_its_handlers_deliveries_while_the_others_run() {
    let h = Harness::new().await;
    assert_eq!(h.pipeline().process("a", &[pay(1), notify(1)]).await, vec![Disposition::Ack(AckReason::Processed); 2]);
    let registered = "SELECT message_type, state, kind FROM handler_pauses";
    assert_eq!(
        texts(h.pool(), registered).await,
        [["ORDER.NOTIFY", "running", "leased"], ["ORDER.PAY", "running", "transactional"]]
    );
    // What the Handlers page's pause writes (the operator actions run on PostgreSQL only yet).
    sqlx::query(
        "UPDATE handler_pauses SET state = 'operator', changed_by = 'user:ann', reason = 'maintenance',
                since = UTC_TIMESTAMP(6), version = version + 1
         WHERE message_type = 'ORDER.PAY'",
    )
    .execute(h.pool())
    .await
    .unwrap();
    // Another process (its first reading is now).
    let dispositions = h.pipeline().process("b", &[pay(2), notify(2)]).await;
    assert!(matches!(dispositions[0], Disposition::Held { .. }), "{dispositions:?}");
    assert_eq!(dispositions[1], Disposition::Ack(AckReason::Processed));
    assert_eq!(h.payments().await, HashMap::from([("ORDER.PAY.1:1".into(), 1)]));
    let records: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM dedup_records WHERE message_id = 'ORDER.PAY.2:1'")
        .fetch_one(h.pool())
        .await
        .unwrap();
    assert_eq!(records, 0, "nothing written for a held delivery");
}
