//! `serve --demo` on PostgreSQL, on a database without the order example's tables: it creates
//! them, and its traffic, published to the world's exchange and consumed by the server itself,
//! leaves records the console lists and orders in the shop (MariaDB's twin: `mysql.rs`).

use std::time::{Duration, Instant};

use crate::support::World;

#[tokio::test]
async fn serve_demo_on_postgresql_publishes_orders_whose_records_the_console_lists() {
    let world = World::new().await;
    sqlx::query("DROP SCHEMA shop CASCADE").execute(&world.db.pool).await.unwrap();
    let server = world.serve_demo("demo").await;
    let token = world.operator_token().await;
    let started = Instant::now();
    loop {
        let page = server.call(&token, reqwest::Method::GET, "/api/v1/records", None).await;
        if page["rows"].as_array().is_some_and(|rows| !rows.is_empty()) {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(90),
            "the console lists no record of the demo's traffic; log: {}",
            server.log_text()
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let orders: i64 = world.wait_for(Duration::from_secs(30), "SELECT COUNT(*) FROM shop.orders", |n| *n > 0).await;
    assert!(orders > 0, "the demo's handlers wrote orders in the shop it created");
    let (status, _, log) = server.terminate().await;
    assert!(status.success(), "clean exit after SIGTERM; log: {log}");
}
