//! An engine on MariaDB (issue 25, store-seam.md 3.7 step 4): `Engine::builder(mysql_pool)`
//! migrates the engine's database, consumes from RabbitMQ through MySQL transactional handlers,
//! and keeps the runtime's books there — its keys, the aggregates (with `stats_hour` beside
//! `stats_minute`), the folded record counts, its heartbeat row — as on PostgreSQL. A pool whose
//! connections are not `READ COMMITTED` in UTC is refused at start.

use std::collections::HashMap;
use std::future::Future;
use std::time::{Duration, Instant};

use dedup_engine::fastpath::FastPathSettings;
use dedup_engine::group::Group;
use dedup_engine::handler::{HandlerError, HandlerInput, TransactionalHandler};
use dedup_engine::retry::Backoff;
use dedup_engine::runtime::{Engine, EngineError};
use dedup_engine::source::rabbitmq::{RabbitConnector, properties_for};
use dedup_engine::testing::mysql::TestMySqlDatabase;
use dedup_engine::testing::{TestBroker, amqp_url, redis_url};
use dedup_engine::{Schema, async_trait};
use sqlx::{MySql, MySqlConnection, MySqlPool};

const GROUP: &str = "orders";

/// Writes the business row of an `ORDER.PAY` in the claim's transaction.
struct Pay;

#[async_trait]
impl TransactionalHandler<MySql> for Pay {
    async fn handle(&self, input: &HandlerInput<'_>, tx: &mut MySqlConnection) -> Result<(), HandlerError> {
        sqlx::query("INSERT INTO payments (message_id) VALUES (?)").bind(input.message_id.as_str()).execute(tx).await?;
        Ok(())
    }
}

/// A fresh database holding the team's `payments` (no unique key: a second effect would show).
async fn database() -> TestMySqlDatabase {
    let db = TestMySqlDatabase::create().await;
    sqlx::query("CREATE TABLE payments (message_id VARCHAR(128) NOT NULL)").execute(&db.pool).await.unwrap();
    db
}

/// The engine's own database beside the team's `db`: created by the engine, dropped by this
/// value.
struct EngineDatabase {
    name: String,
    pool: MySqlPool,
}

impl EngineDatabase {
    fn beside(db: &TestMySqlDatabase) -> Self {
        Self { name: format!("{}_engine", db.name), pool: db.pool.clone() }
    }

    /// `sql` with `{e}` naming the engine's database.
    async fn scalar(&self, sql: &str) -> i64 {
        scalar(&self.pool, &sql.replace("{e}", &self.name)).await
    }

    async fn drop(self) {
        sqlx::query(&format!("DROP DATABASE IF EXISTS {}", self.name)).execute(&self.pool).await.unwrap();
    }
}

fn engine(
    db: &TestMySqlDatabase,
    engine_db: &EngineDatabase,
    broker: &TestBroker,
    prefix: &str,
) -> dedup_engine::EngineBuilder {
    Engine::builder(db.pool.clone())
        .schema(Schema::parse(engine_db.name.clone()).unwrap())
        .redis(redis_url())
        .fast_path(FastPathSettings { prefix: prefix.to_owned(), ..FastPathSettings::default() })
        .stats_flush(Duration::from_millis(100))
        .group(
            Group::rabbitmq(GROUP, amqp_url(), broker.settings.clone())
                .backoff(broker.backoff.clone())
                .transactional_on::<MySql, _>("ORDER.PAY", Pay),
        )
}

async fn publish(broker: &TestBroker, ids: &[String]) {
    let connector = RabbitConnector::new(&amqp_url(), broker.settings.clone(), broker.backoff.clone());
    let publisher = connector.publisher().await.unwrap();
    for id in ids {
        let body = serde_json::to_vec(&serde_json::json!({ "orderNo": id })).unwrap();
        let properties = properties_for(Some(id), &Default::default(), Some("application/json"));
        publisher.publish(&broker.settings.exchange, "order.pay", &body, properties).await.unwrap();
    }
}

async fn eventually<F: Future<Output = bool>>(within: Duration, mut check: impl FnMut() -> F) {
    let started = Instant::now();
    while !check().await {
        assert!(started.elapsed() < within, "condition not met within {within:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn scalar(pool: &MySqlPool, sql: &str) -> i64 {
    sqlx::query_scalar::<_, i64>(sql).fetch_one(pool).await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_engines_on_mariadb_make_each_effect_once_and_keep_their_books_there() {
    let db = database().await;
    let e = EngineDatabase::beside(&db);
    let broker = TestBroker::new(&amqp_url(), Backoff { initial_ms: 500, max_ms: 500 });
    let prefix = format!("test-{}", uuid::Uuid::new_v4().simple());
    // Both start at once, and create and migrate the engine's database (sqlx's GET_LOCK): its
    // records are written there, in the transactions of the team's database's connections.
    let (a, b) = tokio::time::timeout(
        Duration::from_secs(30),
        futures::future::join(engine(&db, &e, &broker, &prefix).start(), engine(&db, &e, &broker, &prefix).start()),
    )
    .await
    .expect("both start within 30 s");
    let (a, b) = (a.expect("the first starts"), b.expect("the second starts"));
    assert_eq!(a.handle().pool().database(), "MySQL");
    assert!(a.handle().pool().postgres().is_none(), "no PostgreSQL pool for the console to misuse");

    // 30 orders; 10 of them delivered twice more (a producer's retries).
    let mut ids: Vec<String> = (0..30).map(|n| format!("ORDER.PAY.{n}:1")).collect();
    ids.extend((0..10).flat_map(|n| [format!("ORDER.PAY.{n}:1"), format!("ORDER.PAY.{n}:1")]));
    publish(&broker, &ids).await;
    let pool = &db.pool;
    eventually(Duration::from_secs(30), || async {
        e.scalar("SELECT CAST(COUNT(*) AS SIGNED) FROM {e}.dedup_records WHERE status = 'succeeded'").await == 30
    })
    .await;
    let payments: Vec<(Vec<u8>, i64)> =
        sqlx::query_as("SELECT message_id, CAST(COUNT(*) AS SIGNED) FROM payments GROUP BY message_id")
            .fetch_all(pool)
            .await
            .unwrap();
    let payments: HashMap<String, i64> =
        payments.into_iter().map(|(id, n)| (String::from_utf8(id).unwrap(), n)).collect();
    assert_eq!(payments.len(), 30, "every order paid");
    assert!(payments.values().all(|n| *n == 1), "no order paid twice: {payments:?}");

    // The aggregates: every delivery and every new record counted once, the hour beside the
    // minute; the record counts folded to one row per (group, status) and still 30 succeeded.
    eventually(Duration::from_secs(10), || async {
        e.scalar("SELECT CAST(COALESCE(SUM(deliveries), 0) AS SIGNED) FROM {e}.stats_minute").await == 50
    })
    .await;
    assert_eq!(e.scalar("SELECT CAST(SUM(created) AS SIGNED) FROM {e}.stats_minute").await, 30);
    assert_eq!(e.scalar("SELECT CAST(SUM(created) AS SIGNED) FROM {e}.stats_hour").await, 30);
    assert_eq!(
        e.scalar("SELECT CAST(SUM(duplicates_redis + duplicates_db) AS SIGNED) FROM {e}.stats_minute").await,
        20,
        "every copy counted as a duplicate"
    );
    eventually(Duration::from_secs(10), || async {
        e.scalar("SELECT CAST(COUNT(*) AS SIGNED) FROM {e}.record_counts").await
            == e.scalar("SELECT CAST(COUNT(DISTINCT consumer_group, status) AS SIGNED) FROM {e}.record_counts").await
    })
    .await;
    assert_eq!(
        e.scalar("SELECT CAST(SUM(n) AS SIGNED) FROM {e}.record_counts WHERE status = 'succeeded'").await,
        30,
        "the fold keeps the sum"
    );
    assert_eq!(e.scalar("SELECT CAST(SUM(n) AS SIGNED) FROM {e}.record_counts").await, 30, "nothing else counted");
    assert_eq!(e.scalar("SELECT CAST(COUNT(*) AS SIGNED) FROM {e}.engine_keys").await, 2, "one key each, shared");
    assert!(e.scalar("SELECT CAST(COUNT(*) AS SIGNED) FROM {e}.table_samples").await >= 1, "sampled at start");

    // Both instances beat; a stopped one deletes its row.
    eventually(Duration::from_secs(10), || async {
        e.scalar("SELECT CAST(COUNT(*) AS SIGNED) FROM {e}.consumer_instances").await == 2
    })
    .await;
    let listed = a.handle().instances().await.unwrap();
    assert_eq!(listed.len(), 2, "{listed:?}");
    assert_eq!(listed.iter().filter(|i| i.this_process).count(), 1, "{listed:?}");
    assert!(listed.iter().all(|i| !i.gone && i.consumers.iter().any(|c| c.group == GROUP)), "{listed:?}");
    b.stop().await;
    assert_eq!(e.scalar("SELECT CAST(COUNT(*) AS SIGNED) FROM {e}.consumer_instances").await, 1);
    a.stop().await;
    assert_eq!(e.scalar("SELECT CAST(COUNT(*) AS SIGNED) FROM {e}.consumer_instances").await, 0);
    e.drop().await;
}

#[tokio::test]
async fn an_engine_refuses_a_mysql_pool_that_is_not_read_committed() {
    let db = database().await;
    let broker = TestBroker::new(&amqp_url(), Backoff { initial_ms: 500, max_ms: 500 });
    // MySQL's default isolation, REPEATABLE READ, would take gap locks the store does not expect.
    let pool = sqlx::mysql::MySqlPoolOptions::new().max_connections(2).connect_with(db.options.clone()).await.unwrap();
    let refused = Engine::builder(pool)
        .schema(Schema::parse(db.name.clone()).unwrap())
        .group(
            Group::rabbitmq(GROUP, amqp_url(), broker.settings.clone()).transactional_on::<MySql, _>("ORDER.PAY", Pay),
        )
        .start()
        .await
        .err();
    match refused {
        Some(EngineError::MySqlSession { isolation, utc_offset_seconds }) => {
            assert_eq!((isolation.as_str(), utc_offset_seconds), ("REPEATABLE-READ", 0));
        }
        other => panic!("expected MySqlSession, got {other:?}"),
    }
}

#[tokio::test]
async fn an_engine_refuses_the_teams_own_database_and_one_holding_others_migrations() {
    let db = database().await;
    let broker = TestBroker::new(&amqp_url(), Backoff { initial_ms: 500, max_ms: 500 });
    let start = |schema: &str| {
        Engine::builder(db.pool.clone())
            .schema(Schema::parse(schema.to_owned()).unwrap())
            .group(
                Group::rabbitmq(GROUP, amqp_url(), broker.settings.clone())
                    .transactional_on::<MySql, _>("ORDER.PAY", Pay),
            )
            .start()
    };
    // The database the team's pool connects to: the engine's tables would sit among the team's.
    match start(&db.name).await.err() {
        Some(EngineError::EngineDatabaseIsTheTeams { database }) => assert_eq!(database, db.name),
        other => panic!("expected EngineDatabaseIsTheTeams, got {other:?}"),
    }
    // A database of its own whose history holds a version the engine does not know (another
    // tool migrates there: each MySQL database keeps one `_sqlx_migrations`).
    let other = EngineDatabase::beside(&db);
    for sql in [
        format!("CREATE DATABASE {}", other.name),
        format!("CREATE TABLE {}._sqlx_migrations LIKE {}._sqlx_migrations", other.name, db.name),
        format!(
            "INSERT INTO {}._sqlx_migrations (version, description, success, checksum, execution_time)
             VALUES (1, 'payments', TRUE, x'00', 1)",
            other.name
        ),
    ] {
        sqlx::query(&sql).execute(&db.pool).await.unwrap();
    }
    match start(&other.name).await.err() {
        Some(EngineError::SharedMigrationHistory { database, .. }) => assert_eq!(database, other.name),
        other => panic!("expected SharedMigrationHistory, got {other:?}"),
    }
    other.drop().await;
}

#[tokio::test]
async fn two_processes_migrate_a_database_with_a_long_name_one_after_the_other() {
    let db = database().await;
    // Past 53 characters the migration lock is named by a digest (MySQL 8 refuses lock names
    // over 64 characters); two at once still take turns and both succeed.
    let long =
        EngineDatabase { name: format!("{}_{}", db.name, "l".repeat(60 - db.name.len() - 1)), pool: db.pool.clone() };
    assert_eq!(long.name.len(), 60);
    let schema = Schema::parse(long.name.clone()).unwrap();
    let (a, b) = tokio::join!(
        dedup_engine::mysql::migrate_engine(&db.pool, &schema),
        dedup_engine::mysql::migrate_engine(&db.pool, &schema)
    );
    a.unwrap();
    b.unwrap();
    assert!(long.scalar("SELECT CAST(COUNT(*) AS SIGNED) FROM {e}._sqlx_migrations WHERE success").await > 0);
    long.drop().await;
}
