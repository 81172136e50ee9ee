//! `EnginePool::connect` (the database chosen by the URL's scheme) and
//! `EnginePool::open_engine_pool` (the engine's tables migrated, its pool opened) on PostgreSQL
//! and MariaDB, and an engine started on a pool opened by URL from a spawned task.

use std::time::Duration;

use dedup_engine::console::console_store;
use dedup_engine::testing::TestDatabase;
use dedup_engine::testing::mysql::{TestMySqlDatabase, admin_url as mysql_admin_url};
use dedup_engine::{ConnectError, Engine, EngineError, EnginePool, PoolSettings, Schema, Service};

fn settings() -> PoolSettings {
    PoolSettings { max_connections: 2, acquire_timeout: Duration::from_secs(3), ..PoolSettings::default() }
}

/// The URL of the MySQL database `name` on the test server, with `scheme`.
fn mysql_url(scheme: &str, name: &str) -> String {
    let admin = mysql_admin_url();
    let (base, _) = admin.rsplit_once('/').expect("a URL with a database");
    let (_, rest) = base.split_once("://").expect("a URL with a scheme");
    format!("{scheme}://{rest}/{name}")
}

#[tokio::test]
async fn connect_opens_the_database_the_urls_scheme_names() {
    let pg = TestDatabase::create_unmigrated().await;
    let pool = EnginePool::connect(&pg.url, &settings()).await.expect("PostgreSQL by URL");
    assert_eq!(pool.database(), "PostgreSQL");
    assert!(pool.postgres().is_some() && pool.mysql().is_none(), "{pool:?}");
    pool.close().await;

    let my = TestMySqlDatabase::create().await;
    for scheme in ["mysql", "mariadb", "MySQL"] {
        let pool = EnginePool::connect(&mysql_url(scheme, &my.name), &settings()).await.expect("MySQL by URL");
        assert_eq!(pool.database(), "MySQL", "{scheme}");
        let mysql = pool.mysql().expect("a MySQL pool");
        assert!(pool.postgres().is_none(), "{scheme}");
        let database: Option<String> = sqlx::query_scalar("SELECT DATABASE()").fetch_one(mysql).await.unwrap();
        assert_eq!(database.as_deref(), Some(my.name.as_str()), "{scheme}");
        pool.close().await;
    }
}

#[tokio::test]
async fn connect_names_the_database_that_did_not_answer() {
    let cases = [
        ("postgres://postgres:secret@127.0.0.1:1/nothing", Service::PostgreSql),
        ("PostgreSQL://postgres:secret@127.0.0.1:1/nothing", Service::PostgreSql),
        ("mysql://root:secret@127.0.0.1:1/nothing", Service::MySql),
        ("mariadb://root:secret@127.0.0.1:1/nothing", Service::MySql),
    ];
    for (url, service) in cases {
        let error = EnginePool::connect(url, &settings()).await.expect_err(url);
        let ConnectError::Unreachable(unreachable) = &error else { panic!("{url}: {error}") };
        assert_eq!(unreachable.service, service, "{url}: {error}");
        assert!(!error.to_string().contains("secret") && error.to_string().contains("***"), "{url}: {error}");
    }
}

/// A URL whose scheme names no database is refused, not read as PostgreSQL's (whose parser
/// ignores the scheme: `jdbc:mysql://…` once created a PostgreSQL database of that name), and
/// says what it takes; a password in it is not shown.
#[tokio::test]
async fn connect_refuses_a_url_whose_scheme_names_no_database() {
    for url in [
        "jdbc:mysql://root:secret@127.0.0.1:3306/shop",
        "localhost:5432/shop",
        "http://postgres:secret@127.0.0.1:5432/shop",
        "/var/run/postgresql",
        "",
    ] {
        let error = EnginePool::connect(url, &settings()).await.expect_err(url);
        assert!(matches!(error, ConnectError::UnknownScheme { .. }), "{url}: {error}");
        let shown = error.to_string();
        assert!(shown.contains("postgres://") && shown.contains("mysql://"), "{url}: {shown}");
        assert!(!shown.contains("secret"), "{url}: {shown}");
    }
}

#[tokio::test]
async fn open_engine_pool_migrates_the_engines_tables_on_postgres() {
    let pg = TestDatabase::create_unmigrated().await;
    let host = EnginePool::connect(&pg.url, &settings()).await.unwrap();
    let schema = Schema::parse("pool_test_engine").unwrap();
    let engine = host.open_engine_pool(&schema, 2).await.expect("migrated");
    assert!(console_store(&engine).user_list().await.expect("the engine's tables").is_empty());
    let migrated: bool = sqlx::query_scalar("SELECT to_regclass('pool_test_engine.dedup_records') IS NOT NULL")
        .fetch_one(host.postgres().unwrap())
        .await
        .unwrap();
    assert!(migrated, "dedup_records in the engine's schema");
    engine.close().await;
    host.close().await;
}

#[tokio::test]
async fn open_engine_pool_migrates_the_engines_database_on_mysql_and_refuses_the_teams() {
    let team = TestMySqlDatabase::create().await;
    let host = EnginePool::connect(&mysql_url("mysql", &team.name), &settings()).await.unwrap();
    let own = Schema::parse(&team.name).unwrap();
    let refused = host.open_engine_pool(&own, 2).await.expect_err("the team's database");
    assert!(matches!(refused, EngineError::EngineDatabaseIsTheTeams { .. }), "{refused}");

    let schema = Schema::parse(format!("{}_engine", team.name)).unwrap();
    let engine = host.open_engine_pool(&schema, 2).await.expect("migrated");
    let users = console_store(&engine).user_list().await;
    let database: Option<String> =
        sqlx::query_scalar("SELECT DATABASE()").fetch_one(engine.mysql().unwrap()).await.unwrap();
    engine.close().await;
    sqlx::query(&format!("DROP DATABASE {}", schema.as_str())).execute(host.mysql().unwrap()).await.unwrap();
    host.close().await;
    assert!(users.expect("the engine's tables").is_empty());
    assert_eq!(database.as_deref(), Some(schema.as_str()), "the engine's pool uses the engine's database");
}

/// A host may start its engine from a task of its own: the start is `Send` on either database
/// (each database's start is boxed as `Send`; an async block borrowing in PostgreSQL's
/// migration once kept it from being one).
#[tokio::test]
async fn an_engine_opened_by_url_starts_and_stops_from_a_spawned_task() {
    let pg = TestDatabase::create_unmigrated().await;
    let my = TestMySqlDatabase::create().await;
    let engine_database = format!("{}_engine", my.name);
    for (url, schema) in [(pg.url.clone(), "dedup"), (mysql_url("mysql", &my.name), engine_database.as_str())] {
        let pool = EnginePool::connect(&url, &settings()).await.unwrap();
        let schema = Schema::parse(schema).unwrap();
        let started = tokio::spawn(Engine::builder(pool.clone()).schema(schema).consume(false).start());
        let engine = started.await.expect("the start task").expect("started");
        assert_eq!(engine.handle().pool().database(), pool.database());
        engine.stop().await;
        if let Some(mysql) = pool.mysql() {
            sqlx::query(&format!("DROP DATABASE {engine_database}")).execute(mysql).await.unwrap();
        }
        pool.close().await;
    }
}
