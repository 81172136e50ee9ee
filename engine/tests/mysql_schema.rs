//! The MySQL store's schema and errors on the local MariaDB 10.11 (issue 25): what the claims
//! rely on — the dedup key is the only unique key beside the primary key
//! (`ON DUPLICATE KEY UPDATE` fires on any), a lease exists exactly while a record is
//! processing, the stand-in for the partial index holds the records not succeeded — and the
//! database's errors read as the engine's `DbErrorKind`.

use std::time::Duration;

use dedup_engine::store::DbErrorKind;
use dedup_engine::testing::mysql::TestMySqlDatabase;
use sqlx::mysql::MySqlConnectOptions;
use sqlx::{ConnectOptions, Connection, MySqlPool};

/// Inserts a minimal record (status `succeeded` unless given), returning the statement's result.
async fn insert(pool: &MySqlPool, id: &str, status: &str) -> Result<(), sqlx::Error> {
    sqlx::query(
        "INSERT INTO dedup_records (consumer_group, message_id, message_type, status, max_attempts, payload_hash,
                                    source_broker)
         VALUES ('g', ?, 'ORDER.PAY', ?, 5, UNHEX(SHA2(?, 256)), 'rabbitmq')",
    )
    .bind(id)
    .bind(status)
    .bind(id)
    .execute(pool)
    .await
    .map(drop)
}

/// The kind of the error `result` must be.
fn kind<T>(result: Result<T, sqlx::Error>) -> DbErrorKind {
    DbErrorKind::of(&result.err().expect("the statement fails"))
}

#[tokio::test]
async fn the_dedup_key_is_the_only_unique_key_beside_the_primary_key() {
    let db = TestMySqlDatabase::create().await;
    // That it compares bytes (case, trailing spaces, accents) is the conformance suite's
    // `keys_compare_bytes`, through the store's claims.
    insert(&db.pool, "ORDER.PAY.A-1:1", "succeeded").await.unwrap();
    let again = insert(&db.pool, "ORDER.PAY.A-1:1", "succeeded").await.expect_err("the same key twice");
    let db_error = again.as_database_error().expect("a database error");
    assert_eq!(db_error.kind(), sqlx::error::ErrorKind::UniqueViolation, "{db_error}");

    let unique: Vec<(String, String)> = sqlx::query_as(
        "SELECT index_name, GROUP_CONCAT(column_name ORDER BY seq_in_index) FROM information_schema.statistics
         WHERE table_schema = DATABASE() AND table_name = 'dedup_records' AND non_unique = 0
         GROUP BY index_name ORDER BY index_name",
    )
    .fetch_all(&db.pool)
    .await
    .unwrap();
    let mut unique = unique;
    unique.sort();
    assert_eq!(
        unique,
        [
            ("PRIMARY".to_owned(), "id".to_owned()),
            ("dedup_records_group_message_key".to_owned(), "consumer_group,message_id".to_owned())
        ]
    );
}

#[tokio::test]
async fn a_lease_exists_exactly_while_processing_and_the_unsettled_column_holds_the_rest() {
    let db = TestMySqlDatabase::create().await;
    let refused = insert(&db.pool, "ORDER.PAY.1:1", "processing").await.expect_err("processing without a lease");
    assert!(refused.to_string().contains("dedup_records_lease_check"), "{refused}");
    for (id, status) in [("ORDER.PAY.2:1", "succeeded"), ("ORDER.PAY.3:1", "failed"), ("ORDER.PAY.4:1", "dead")] {
        insert(&db.pool, id, status).await.unwrap();
    }
    let unsettled: Vec<(String, Option<String>)> = sqlx::query_as(
        "SELECT CAST(message_id AS CHAR), CAST(unsettled_status AS CHAR) FROM dedup_records ORDER BY id",
    )
    .fetch_all(&db.pool)
    .await
    .unwrap();
    assert_eq!(
        unsettled,
        [
            ("ORDER.PAY.2:1".to_owned(), None),
            ("ORDER.PAY.3:1".to_owned(), Some("failed".to_owned())),
            ("ORDER.PAY.4:1".to_owned(), Some("dead".to_owned()))
        ]
    );
    // The store's connections run READ COMMITTED in UTC.
    let (isolation, zone): (String, String) =
        sqlx::query_as("SELECT @@tx_isolation, @@time_zone").fetch_one(&db.pool).await.unwrap();
    assert_eq!((isolation.as_str(), zone.as_str()), ("READ-COMMITTED", "+00:00"));
    // Migrating again applies nothing.
    dedup_engine::store::mysql::MIGRATOR.run(&db.pool).await.unwrap();
}

#[tokio::test]
async fn mariadb_errors_are_read_as_their_kinds() {
    let db = TestMySqlDatabase::create().await;
    let pool = &db.pool;

    let mut conn = pool.acquire().await.unwrap();
    sqlx::query("SET SESSION max_statement_time = 0.05").execute(&mut *conn).await.unwrap();
    assert_eq!(kind(sqlx::query("SELECT SLEEP(2)").execute(&mut *conn).await), DbErrorKind::StatementTimeout);
    conn.detach().close().await.unwrap(); // not back to the pool with its statement timeout

    assert_eq!(
        kind(sqlx::query(&format!("CREATE DATABASE {}", db.name)).execute(pool).await),
        DbErrorKind::DatabaseExists
    );
    let missing: MySqlConnectOptions = db.options.clone().database("dct_no_such_database_at_all");
    assert_eq!(kind(missing.connect().await), DbErrorKind::UnknownDatabase);
    let refused: MySqlConnectOptions = "mysql://root@127.0.0.1:1/x".parse().unwrap();
    assert_eq!(kind(refused.connect().await), DbErrorKind::ConnectionLost);
    assert_eq!(kind(sqlx::query("SELEC 1").execute(pool).await), DbErrorKind::Other);

    // A row lock not granted within the lock wait timeout: the statement fails, not retried.
    sqlx::query("CREATE TABLE pair (id INT PRIMARY KEY) ENGINE = InnoDB").execute(pool).await.unwrap();
    sqlx::query("INSERT INTO pair VALUES (1), (2)").execute(pool).await.unwrap();
    let mut a = pool.begin().await.unwrap();
    sqlx::query("SELECT id FROM pair WHERE id = 1 FOR UPDATE").execute(&mut *a).await.unwrap();
    let mut waiter = pool.acquire().await.unwrap();
    sqlx::query("SET SESSION innodb_lock_wait_timeout = 1").execute(&mut *waiter).await.unwrap();
    let waited = kind(sqlx::query("SELECT id FROM pair WHERE id = 1 FOR UPDATE").execute(&mut *waiter).await);
    assert_eq!(waited, DbErrorKind::LockWaitTimeout);
    assert!(!waited.is_transient());
    waiter.detach().close().await.unwrap();

    // Two transactions locking two rows in opposite orders: InnoDB picks one as the victim.
    let mut b = pool.begin().await.unwrap();
    sqlx::query("SELECT id FROM pair WHERE id = 2 FOR UPDATE").execute(&mut *b).await.unwrap();
    let second = tokio::spawn(async move {
        let result = sqlx::query("SELECT id FROM pair WHERE id = 1 FOR UPDATE").execute(&mut *b).await.map(drop);
        (result, b)
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    let first = sqlx::query("SELECT id FROM pair WHERE id = 2 FOR UPDATE").execute(&mut *a).await.map(drop);
    let (second, b) = second.await.unwrap();
    // Ended now: a dropped transaction rolls back only when its connection is used again, and
    // its locks would hold the test database's DROP.
    a.rollback().await.unwrap();
    b.rollback().await.unwrap();
    let victims: Vec<DbErrorKind> =
        [first, second].into_iter().filter_map(Result::err).map(|e| DbErrorKind::of(&e)).collect();
    assert_eq!(victims, [DbErrorKind::Deadlock], "one of the two is the deadlock's victim");
    assert!(victims[0].is_transient());
}
