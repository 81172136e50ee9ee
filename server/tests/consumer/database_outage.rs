//! PostgreSQL black-holed under a running `serve` (DESIGN.md, "Database waits"): SIGTERM still
//! stops it within its stop bound, and the delivery it was working on is neither lost nor doubled.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};

use crate::support::World;

/// A TCP forwarder of the test's own on a port of its own; once cut, it forwards nothing in
/// either direction but keeps every connection open, as a network that drops packets does.
struct BlackHole {
    port: u16,
    cut: Arc<AtomicBool>,
}

impl BlackHole {
    async fn new(target: String) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let cut = Arc::new(AtomicBool::new(false));
        let flag = cut.clone();
        tokio::spawn(async move {
            while let Ok((inbound, _)) = listener.accept().await {
                let Ok(outbound) = TcpStream::connect(&target).await else { continue };
                let ((from_client, to_client), (from_server, to_server)) =
                    (inbound.into_split(), outbound.into_split());
                tokio::spawn(pipe(from_client, to_server, flag.clone()));
                tokio::spawn(pipe(from_server, to_client, flag.clone()));
            }
        });
        Self { port, cut }
    }

    fn cut(&self) {
        self.cut.store(true, Ordering::SeqCst);
    }
}

/// Copies `from` to `to` until either closes; drops the bytes while `cut`.
async fn pipe(mut from: OwnedReadHalf, mut to: OwnedWriteHalf, cut: Arc<AtomicBool>) {
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        match from.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) if !cut.load(Ordering::SeqCst) => {
                if to.write_all(&buf[..n]).await.is_err() {
                    return;
                }
            }
            Ok(_) => {}
        }
    }
}

fn order(order_no: &str) -> serde_json::Value {
    json!({"orderNo": order_no, "sku": "SKU-0001", "quantity": 1, "amountCents": 100, "phone": "+1"})
}

#[tokio::test]
async fn sigterm_stops_within_the_bound_while_postgresql_is_black_holed_and_nothing_is_lost() {
    let world = World::new().await;
    let mut url = reqwest::Url::parse(&world.db.url).unwrap();
    let target = format!("{}:{}", url.host_str().unwrap(), url.port().unwrap_or(5432));
    let proxy = BlackHole::new(target).await;
    url.set_port(Some(proxy.port)).unwrap();
    let a = world.serve("a", &[("DATABASE_URL", url.as_str()), ("DEDUP_SHUTDOWN_TIMEOUT_MS", "3000")]).await;
    let status_of =
        |id: &str| format!("SELECT COALESCE((SELECT status FROM dedup_records WHERE message_id = '{id}'), 'none')");
    world.publish("ORDER.CREATE.BH1:1", "order.create", order("BH1")).await;
    let first: String =
        world.wait_for(Duration::from_secs(20), &status_of("ORDER.CREATE.BH1:1"), |s| s == "succeeded").await;
    assert_eq!(first, "succeeded", "consumed through the proxy before the cut");

    proxy.cut();
    world.publish("ORDER.CREATE.BH2:1", "order.create", order("BH2")).await;
    tokio::time::sleep(Duration::from_secs(2)).await; // its claim now waits on the black hole
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
