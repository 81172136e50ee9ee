//! PostgreSQL black-holed under a running `serve` (DESIGN.md, "Database waits"): SIGTERM still
//! stops it within its stop bound, and the delivery it was working on is neither lost nor doubled.
//! A slow link: the consumer goes on, slowly, and the console answers within its bounds.
//! A long lock on the dedup table: the consumer's statements end at their bound, the group is not
//! ready while its batches fail, and it resumes by itself when the lock ends.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};

use crate::support::World;

/// A TCP forwarder of the test's own on a port of its own, between the product and PostgreSQL.
/// Once cut, it forwards nothing in either direction but keeps every connection open, as a
/// network that drops packets does; once slowed, it holds every chunk for a while first.
struct Link {
    port: u16,
    cut: Arc<AtomicBool>,
    delay_ms: Arc<AtomicU64>,
}

impl Link {
    async fn new(target: String) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let (cut, delay_ms) = (Arc::new(AtomicBool::new(false)), Arc::new(AtomicU64::new(0)));
        let (c, d) = (cut.clone(), delay_ms.clone());
        tokio::spawn(async move {
            while let Ok((inbound, _)) = listener.accept().await {
                let Ok(outbound) = TcpStream::connect(&target).await else { continue };
                let ((from_client, to_client), (from_server, to_server)) =
                    (inbound.into_split(), outbound.into_split());
                tokio::spawn(pipe(from_client, to_server, c.clone(), d.clone()));
                tokio::spawn(pipe(from_server, to_client, c.clone(), d.clone()));
            }
        });
        Self { port, cut, delay_ms }
    }

    fn cut(&self) {
        self.cut.store(true, Ordering::SeqCst);
    }

    fn slow(&self, delay: Duration) {
        self.delay_ms.store(delay.as_millis() as u64, Ordering::SeqCst);
    }

    /// `url` (the world's database) through this link.
    fn url(&self, url: &str) -> String {
        let mut url = reqwest::Url::parse(url).unwrap();
        url.set_port(Some(self.port)).unwrap();
        url.to_string()
    }
}

/// Copies `from` to `to` until either closes; drops the bytes while `cut`, holds each chunk
/// `delay_ms` first.
async fn pipe(mut from: OwnedReadHalf, mut to: OwnedWriteHalf, cut: Arc<AtomicBool>, delay_ms: Arc<AtomicU64>) {
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        match from.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) if !cut.load(Ordering::SeqCst) => {
                let delay = delay_ms.load(Ordering::SeqCst);
                if delay > 0 {
                    tokio::time::sleep(Duration::from_millis(delay)).await;
                }
                if to.write_all(&buf[..n]).await.is_err() {
                    return;
                }
            }
            Ok(_) => {}
        }
    }
}

/// The world's PostgreSQL as `host:port`.
fn database_address(world: &World) -> String {
    let url = reqwest::Url::parse(&world.db.url).unwrap();
    format!("{}:{}", url.host_str().unwrap(), url.port().unwrap_or(5432))
}

fn order(order_no: &str) -> serde_json::Value {
    json!({"orderNo": order_no, "sku": "SKU-0001", "quantity": 1, "amountCents": 100, "phone": "+1"})
}

#[tokio::test]
async fn sigterm_stops_within_the_bound_while_postgresql_is_black_holed_and_nothing_is_lost() {
    let world = World::new().await;
    let proxy = Link::new(database_address(&world)).await;
    let url = proxy.url(&world.db.url);
    let a = world
        .serve(
            "a",
            &[
                ("DATABASE_URL", &url),
                ("DEDUP_SHUTDOWN_TIMEOUT_MS", "3000"),
                ("DEDUP_REQUEST_TIMEOUT_MS", "3000"),
                ("DEDUP_CONSOLE__STATEMENT_TIMEOUT_MS", "1000"),
            ],
        )
        .await;
    let token = world.operator_token().await;
    let status_of =
        |id: &str| format!("SELECT COALESCE((SELECT status FROM dedup_records WHERE message_id = '{id}'), 'none')");
    world.publish("ORDER.CREATE.BH1:1", "order.create", order("BH1")).await;
    let first: String =
        world.wait_for(Duration::from_secs(20), &status_of("ORDER.CREATE.BH1:1"), |s| s == "succeeded").await;
    assert_eq!(first, "succeeded", "consumed through the proxy before the cut");

    proxy.cut();
    world.publish("ORDER.CREATE.BH2:1", "order.create", order("BH2")).await;
    tokio::time::sleep(Duration::from_secs(2)).await; // its claim now waits on the black hole

    // The console still answers, within its bounds: no statement can time out on a server that
    // is not reached, so the request timeout ends the call; the probe says the database is down.
    let asked = std::time::Instant::now();
    let response = reqwest::Client::new().get(a.url("/api/v1/aggregates")).bearer_auth(&token).send().await.unwrap();
    assert_eq!(response.status(), 503, "{:?}", response.text().await);
    assert!(asked.elapsed() < Duration::from_secs(6), "answered after {:?}, bound 3 s", asked.elapsed());
    let asked = std::time::Instant::now();
    let response = reqwest::get(a.url("/readyz")).await.unwrap();
    assert_eq!(response.status(), 503);
    let body: serde_json::Value = response.json().await.unwrap();
    assert_eq!(body["database"]["up"], false, "{body}");
    assert!(asked.elapsed() < Duration::from_secs(5), "readyz answered after {:?}", asked.elapsed());
    let (status, took, log) = a.terminate().await;
    assert!(status.success(), "exits cleanly: {status}; log: {log}");
    assert!(took < Duration::from_secs(7), "stopped {took:?} after SIGTERM, bound 3 s; log: {log}");
    assert!(log.contains("did not stop within the stop bound"), "the stuck batch was cut, not waited for: {log}");

    // Not acked without a commit: the broker redelivers it to the next process, once.
    let b = world.serve("b", &[]).await;
    let second: String =
        world.wait_for(Duration::from_secs(30), &status_of("ORDER.CREATE.BH2:1"), |s| s == "succeeded").await;
    assert_eq!(second, "succeeded", "the delivery in flight at the stop is not lost");
    let reservations: i64 =
        sqlx::query_scalar("SELECT count(*) FROM shop.inventory_reservations WHERE order_no IN ('BH1', 'BH2')")
            .fetch_one(&world.db.pool)
            .await
            .unwrap();
    assert_eq!(reservations, 2, "each order reserved once");
    b.stop().await;
}

#[tokio::test]
async fn a_long_lock_on_the_dedup_table_fails_batches_within_the_bound_and_the_consumer_resumes() {
    let world = World::new().await;
    let a = world.serve("a", &[("DEDUP_DB_STATEMENT_TIMEOUT_MS", "1000")]).await;
    let mut locker = world.db.pool.begin().await.unwrap();
    sqlx::query("LOCK TABLE dedup_records IN ACCESS EXCLUSIVE MODE").execute(&mut *locker).await.unwrap();
    world.publish("ORDER.CREATE.LK1:1", "order.create", order("LK1")).await;

    // Every claim waits on the lock until the statement timeout cancels it: the batch is given
    // back, and the group says so on `/readyz` while it lasts.
    let (status, body) =
        a.readyz_until(Duration::from_secs(20), |_, body| !body["groups"][0]["failing"].is_null()).await;
    assert_eq!(status, 503, "{body}");
    let group = &body["groups"][0];
    assert_eq!(group["ready"], false, "{body}");
    assert!(group["error"].as_str().unwrap().contains("given back to the broker unjudged"), "{body}");
    assert!(group["failing"]["batches"].as_u64() >= Some(1), "{body}");
    tokio::time::sleep(Duration::from_secs(2)).await;
    let longest_wait: f64 = sqlx::query_scalar(
        "SELECT COALESCE(max(extract(epoch FROM clock_timestamp() - query_start)), 0)::float8 FROM pg_stat_activity
         WHERE datname = current_database() AND wait_event_type = 'Lock'",
    )
    .fetch_one(&mut *locker)
    .await
    .unwrap();
    assert!(longest_wait < 2.0, "no statement waits past the 1 s bound: {longest_wait} s");
    locker.rollback().await.unwrap();

    let status_of =
        "SELECT COALESCE((SELECT status FROM dedup_records WHERE message_id = 'ORDER.CREATE.LK1:1'), 'none')";
    let done: String = world.wait_for(Duration::from_secs(30), status_of, |s| s == "succeeded").await;
    assert_eq!(done, "succeeded", "the consumer resumed by itself once the lock ended");
    // The batch's settlement, which ends the run, follows its commit.
    let (status, body) = a.readyz_until(Duration::from_secs(10), |status, _| status == 200).await;
    assert_eq!(status, 200, "{body}");
    let group = &body["groups"][0];
    assert!(group["failing"].is_null() && group["last_recovery"]["resumed_at"].is_string(), "{body}");
    assert!(group["failed_batches"].as_u64() >= Some(1), "{body}");
    let reservations: i64 =
        sqlx::query_scalar("SELECT count(*) FROM shop.inventory_reservations WHERE order_no = 'LK1'")
            .fetch_one(&world.db.pool)
            .await
            .unwrap();
    assert_eq!(reservations, 1, "reserved once");
    a.stop().await;
}

#[tokio::test]
async fn a_slow_database_slows_the_consumer_and_the_console_answers_within_its_bounds() {
    let world = World::new().await;
    let proxy = Link::new(database_address(&world)).await;
    let url = proxy.url(&world.db.url);
    let a = world
        .serve(
            "a",
            &[
                ("DATABASE_URL", &url),
                ("DEDUP_REQUEST_TIMEOUT_MS", "3000"),
                ("DEDUP_CONSOLE__STATEMENT_TIMEOUT_MS", "1000"),
            ],
        )
        .await;
    let token = world.operator_token().await;
    proxy.slow(Duration::from_millis(150));
    for n in 1..=3 {
        world.publish(&format!("ORDER.CREATE.SL{n}:1"), "order.create", order(&format!("SL{n}"))).await;
    }
    // Every console call ends within its bound: data if the slow link brings it in time, 503 if not.
    for path in ["/api/v1/aggregates", "/api/v1/records?limit=20", "/api/v1/stuck"] {
        let asked = std::time::Instant::now();
        let response = reqwest::Client::new().get(a.url(path)).bearer_auth(&token).send().await.unwrap();
        assert!([200, 503].contains(&response.status().as_u16()), "{path}: {}", response.status());
        assert!(asked.elapsed() < Duration::from_secs(6), "{path} answered after {:?}, bound 3 s", asked.elapsed());
    }
    let done: i64 = world
        .wait_for(
            Duration::from_secs(60),
            "SELECT count(*) FROM dedup_records WHERE status = 'succeeded' AND message_id LIKE 'ORDER.CREATE.SL%'",
            |n: &i64| *n == 3,
        )
        .await;
    assert_eq!(done, 3, "the consumer went on, slowly; log: {}", a.log_text());
    let reservations: i64 =
        sqlx::query_scalar("SELECT count(*) FROM shop.inventory_reservations WHERE order_no LIKE 'SL%'")
            .fetch_one(&world.db.pool)
            .await
            .unwrap();
    assert_eq!(reservations, 3, "each order reserved once");
    proxy.slow(Duration::ZERO);
    a.stop().await;
}
