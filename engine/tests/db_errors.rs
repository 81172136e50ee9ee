//! Database errors read as the engine's `DbErrorKind` from the errors a real PostgreSQL raises:
//! what the retry rules (transient or not), the console's timeout answer and the start-up's
//! database creation go by.

use std::time::Duration;

use dedup_engine::store::DbErrorKind;
use dedup_engine::testing::TestDatabase;
use sqlx::{Connection, PgConnection};

/// The kind of the error `result` must be.
fn kind<T>(result: Result<T, sqlx::Error>) -> DbErrorKind {
    DbErrorKind::of(&result.err().expect("the statement fails"))
}

#[tokio::test]
async fn postgres_errors_are_read_as_their_kinds() {
    let db = TestDatabase::create().await;
    let pool = &db.pool;

    let mut conn = pool.acquire().await.unwrap();
    sqlx::query("SET statement_timeout = 50").execute(&mut *conn).await.unwrap();
    let timeout = kind(sqlx::query("SELECT pg_sleep(2)").execute(&mut *conn).await);
    assert_eq!(timeout, DbErrorKind::StatementTimeout);
    assert!(!timeout.is_transient(), "a statement timeout is the console's answer, not a retry");

    let exists = kind(sqlx::query(&format!("CREATE DATABASE \"{}\"", db.name)).execute(pool).await);
    assert_eq!(exists, DbErrorKind::DatabaseExists);

    let missing_url = db.url.replace(&db.name, "dct_no_such_database_at_all");
    assert_eq!(kind(PgConnection::connect(&missing_url).await), DbErrorKind::UnknownDatabase);

    let refused = kind(PgConnection::connect("postgres://postgres@127.0.0.1:1/x").await);
    assert_eq!(refused, DbErrorKind::ConnectionLost);
    assert!(refused.is_transient());

    let syntax = kind(sqlx::query("SELEC 1").execute(pool).await);
    assert_eq!(syntax, DbErrorKind::Other);
    assert!(!syntax.is_transient());

    // Two transactions locking two rows in opposite orders: PostgreSQL picks one as the victim.
    sqlx::query("CREATE TABLE pair (id int PRIMARY KEY)").execute(pool).await.unwrap();
    sqlx::query("INSERT INTO pair VALUES (1), (2)").execute(pool).await.unwrap();
    let (mut a, mut b) = (pool.begin().await.unwrap(), pool.begin().await.unwrap());
    sqlx::query("SELECT 1 FROM pair WHERE id = 1 FOR UPDATE").execute(&mut *a).await.unwrap();
    sqlx::query("SELECT 1 FROM pair WHERE id = 2 FOR UPDATE").execute(&mut *b).await.unwrap();
    let second = tokio::spawn(async move {
        let result = sqlx::query("SELECT 1 FROM pair WHERE id = 1 FOR UPDATE").execute(&mut *b).await.map(drop);
        (result, b)
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    let first = sqlx::query("SELECT 1 FROM pair WHERE id = 2 FOR UPDATE").execute(&mut *a).await.map(drop);
    let (second, _b) = second.await.unwrap();
    let victims: Vec<DbErrorKind> =
        [first, second].into_iter().filter_map(Result::err).map(|e| DbErrorKind::of(&e)).collect();
    assert_eq!(victims, [DbErrorKind::Deadlock], "one of the two is the deadlock's victim");
    assert!(victims[0].is_transient());
}
