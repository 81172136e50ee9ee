//! A database created before the engine had a schema of its own (`fixtures/legacy-main.sql`,
//! made by `fixtures/legacy-main.sh` from main at a1bd28e: every table in `public`) upgrades in
//! place by what `dedup-console migrate` runs, with no row lost.

use dedup_console::config::Settings;
use dedup_console::example_database::open_example_database;
use dedup_engine::console::overview::OverviewReads;
use dedup_engine::testing::TestDatabase;
use sqlx::{Connection, PgConnection, PgPool};

/// The engine's tables of the legacy layout (they move to `dedup`).
const ENGINE_TABLES: &[&str] =
    &["dedup_records", "record_counts", "record_attempts", "audit_log", "users", "drills", "cleanup_schedules"];
/// The order example's tables (they move to `shop`).
const ORDER_TABLES: &[&str] =
    &["inventory", "orders", "inventory_reservations", "payments", "notifications", "simulation_runs"];

async fn count(pool: &PgPool, table: &str) -> i64 {
    sqlx::query_scalar(&format!("SELECT count(*) FROM {table}")).fetch_one(pool).await.unwrap()
}

async fn exists(pool: &PgPool, relation: &str) -> bool {
    sqlx::query_scalar("SELECT to_regclass($1) IS NOT NULL").bind(relation).fetch_one(pool).await.unwrap()
}

#[tokio::test]
async fn a_database_from_before_schemas_upgrades_in_place_with_no_row_lost() {
    let db = TestDatabase::create_unmigrated().await;
    let mut conn = PgConnection::connect(&db.url).await.unwrap();
    sqlx::raw_sql(include_str!("../fixtures/legacy-main.sql")).execute(&mut conn).await.expect("fixture loads");
    conn.close().await.unwrap();
    let pool = &db.pool;
    let mut before = Vec::new();
    for table in ENGINE_TABLES.iter().chain(ORDER_TABLES) {
        let n = count(pool, &format!("public.{table}")).await;
        assert!(n > 0, "the fixture has rows in {table}");
        before.push(n);
    }

    let settings = Settings { database_url: db.url.as_str().into(), ..Settings::default() };
    for run in 0..2 {
        let upgraded = open_example_database(&settings).await.unwrap_or_else(|e| panic!("migrate run {run}: {e:#}"));
        upgraded.close().await;
    }

    let mut after = Vec::new();
    for table in ENGINE_TABLES {
        after.push(count(pool, &format!("dedup.{table}")).await);
        assert!(!exists(pool, &format!("public.{table}")).await, "public.{table} moved");
    }
    for table in ORDER_TABLES {
        after.push(count(pool, &format!("shop.{table}")).await);
        assert!(!exists(pool, &format!("public.{table}")).await, "public.{table} moved");
    }
    assert_eq!(after, before, "every row of every table is kept");
    assert!(!exists(pool, "public._sqlx_migrations").await, "the legacy history left public");
    let versions: Vec<i64> = sqlx::query_scalar("SELECT version FROM dedup._sqlx_migrations ORDER BY version")
        .fetch_all(pool)
        .await
        .unwrap();
    let expected: Vec<i64> = dedup_engine::store::postgres::MIGRATOR.iter().map(|m| m.version).collect();
    assert_eq!(versions, expected, "the engine's history: its own migrations only, all applied");

    // The legacy records, as the engine sees them now.
    let poison: Vec<(String, bool)> = sqlx::query_as(
        "SELECT message_type, poison FROM dedup.dedup_records WHERE status = 'dead' ORDER BY message_type",
    )
    .fetch_all(pool)
    .await
    .unwrap();
    let expected = [("ORDER.SHIP".to_owned(), false), ("POISON".to_owned(), true)];
    assert_eq!(poison, expected, "a dead letter without handler is requeueable, real poison is not");
    // Counting triggers work from a connection that does not see the engine's schema.
    let plain = sqlx::postgres::PgPoolOptions::new().max_connections(1).connect(&db.url).await.unwrap();
    sqlx::query(
        "UPDATE dedup.dedup_records SET status = 'dead', handler_mode = 'transactional' WHERE status = 'failed'",
    )
    .execute(&plain)
    .await
    .expect("a record changes status from a plain connection");
    let engine = dedup_engine::console::engine_pool(&plain, &db.schema, 1);
    sqlx::query_scalar::<_, i64>("SELECT record_counts_fold()").fetch_one(&engine).await.unwrap();
    let counts = engine.status_counts().await.unwrap();
    let by_status = |s: &str| counts.iter().filter(|c| c.status.as_str() == s).map(|c| c.count).sum::<i64>();
    assert_eq!((by_status("succeeded"), by_status("failed"), by_status("dead")), (3, 0, 3), "{counts:?}");
    let shop_history: i64 = count(pool, "shop._sqlx_migrations").await;
    assert_eq!(shop_history as usize, dedup_example_orders::MIGRATOR.iter().count(), "the example's own history");
}
