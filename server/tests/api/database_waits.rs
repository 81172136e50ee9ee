//! Bounded waits: the console's statements end at its statement timeout on a pool of its own, and
//! the server serves before its dependency probes finish.

use std::time::{Duration, Instant};

use dedup_app::ssr::service::CONSOLE_APPLICATION_NAME;
use serde_json::Value;

use crate::helpers::spawn_app_with;

/// The console's sessions on the test's database waiting for a lock.
async fn lock_waiters(pool: &sqlx::PgPool) -> i64 {
    sqlx::query_scalar(
        "SELECT count(*) FROM pg_stat_activity
         WHERE datname = current_database() AND application_name = $1 AND wait_event_type = 'Lock'",
    )
    .bind(CONSOLE_APPLICATION_NAME)
    .fetch_one(pool)
    .await
    .unwrap()
}

/// A table lock holds every console request: each answers 503 `unavailable` at the statement
/// timeout (not at the request timeout, 20 s here), leaves no query waiting behind the lock, and
/// while they wait the engine's own pool (the `/readyz` probe) still gets its connections.
#[tokio::test]
async fn a_locked_table_ends_console_queries_at_the_statement_timeout_on_a_pool_of_their_own() {
    let app = spawn_app_with(|s| {
        s.request_timeout_ms = 20_000;
        s.console.statement_timeout_ms = 2_000;
        s.console.max_connections = 2;
    })
    .await;
    let mut lock = app._db.pool.begin().await.unwrap();
    sqlx::query("LOCK TABLE dedup_records IN ACCESS EXCLUSIVE MODE").execute(&mut *lock).await.unwrap();

    let started = Instant::now();
    let requests: Vec<_> = (0..10)
        .map(|_| {
            let (client, url) = (app.client.clone(), app.url("/api/v1/records"));
            tokio::spawn(async move { client.get(url).send().await.unwrap() })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(lock_waiters(&app._db.pool).await >= 1, "the console's queries wait for the lock");
    let ready = app.get("/readyz").await;
    assert_eq!(ready.status(), 200, "the engine's pool is not the console's: {}", ready.text().await.unwrap());

    for request in requests {
        let response = request.await.unwrap();
        let status = response.status();
        let body: Value = response.json().await.unwrap();
        assert_eq!(status, 503, "{body}");
        assert_eq!(body["error"], "unavailable", "{body}");
        let message = body["message"].as_str().unwrap();
        assert!(message.contains("did not answer in time"), "{message}");
    }
    assert!(started.elapsed() < Duration::from_secs(10), "answered after {:?}", started.elapsed());
    assert_eq!(lock_waiters(&app._db.pool).await, 0, "no console query is left waiting");

    lock.rollback().await.unwrap();
    assert_eq!(app.get("/api/v1/records").await.status(), 200, "the console reads again once the lock is gone");
}

/// A statement timeout the request timeout would cut first is refused at start, naming both.
#[tokio::test]
async fn a_statement_timeout_not_shorter_than_the_request_timeout_is_refused() {
    let db = dedup_engine::testing::TestDatabase::create().await;
    let mut settings = crate::helpers::local_settings();
    settings.listen = "127.0.0.1:0".parse().unwrap();
    settings.database_url = db.url.as_str().into();
    settings.request_timeout_ms = 5_000;
    settings.console.statement_timeout_ms = 5_000;
    let error = dedup_console::startup::Application::build(settings, false).await.err().expect("refused");
    let error = format!("{error:#}");
    assert!(error.contains("statement timeout (5000 ms)") && error.contains("request timeout (5000 ms)"), "{error}");
}

/// The server serves while its dependency probes are still waiting: Redis here accepts the
/// connection and never answers, so its probe takes the whole probe timeout (20 s).
#[tokio::test]
async fn the_server_serves_before_a_hanging_dependency_probe_ends() {
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap(); // never accepts: a black hole
    let redis = format!("redis://{}", silent.local_addr().unwrap());
    let started = Instant::now();
    let app = spawn_app_with(|s| {
        s.redis_url = redis.as_str().into();
        s.probe_timeout_ms = 20_000;
    })
    .await;
    let response = app.get("/healthz").await;
    assert_eq!(response.status(), 200);
    assert!(started.elapsed() < Duration::from_secs(10), "served after {:?}", started.elapsed());
}
