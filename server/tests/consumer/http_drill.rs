//! Issue 22's exactly-once drill for HTTP handlers: 5 000 messages, a fifth of them duplicates,
//! through two `serve` processes to one HTTP service that records every call; the service is
//! killed mid-run and started again on its port, and one `serve` is SIGKILLed. Every key
//! succeeds once, no key is called after its success was recorded, and every call a crash
//! repeated shows as an attempt of its own (the documented at-least-once window of a leased
//! handler, docs/DESIGN.md "Two handler modes").

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::extract::State;
use axum::http::HeaderMap;
use chrono::{DateTime, Utc};
use dedup_engine::rabbitmq::properties_for;
use serde_json::json;

use crate::support::{ConfigFile, World};

const KEYS: usize = 4_000;
/// Every fourth key is published twice: 1 000 duplicates, a fifth of the 5 000 messages.
const MESSAGES: usize = KEYS + KEYS / 4;

/// Every call the service received: its `Idempotency-Key` and when it arrived.
type Calls = Arc<Mutex<Vec<(String, DateTime<Utc>)>>>;

async fn charge(State(calls): State<Calls>, headers: HeaderMap) -> &'static str {
    let key = headers.get("idempotency-key").map(|v| v.to_str().unwrap().to_owned()).unwrap_or_default();
    calls.lock().unwrap().push((key, Utc::now()));
    tokio::time::sleep(Duration::from_millis(50)).await; // some work: calls in flight when a process dies
    "charged"
}

/// The team's service, on a runtime of its own so that killing it drops every connection at
/// once, as a killed process would.
struct Service {
    runtime: Option<tokio::runtime::Runtime>,
}

impl Service {
    async fn start(address: SocketAddr, calls: Calls) -> Self {
        let runtime =
            tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("a runtime");
        let (bound, listening) = tokio::sync::oneshot::channel();
        runtime.spawn(async move {
            let socket = tokio::net::TcpSocket::new_v4().unwrap();
            socket.set_reuseaddr(true).unwrap(); // the port again, right after the kill
            socket.bind(address).unwrap();
            let listener = socket.listen(1024).unwrap();
            bound.send(()).unwrap();
            let app = axum::Router::new().route("/charge", axum::routing::post(charge)).with_state(calls);
            axum::serve(listener, app).await
        });
        listening.await.expect("the service listens");
        Self { runtime: Some(runtime) }
    }

    fn kill(mut self) {
        self.runtime.take().expect("running").shutdown_background();
    }
}

impl Drop for Service {
    fn drop(&mut self) {
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_background();
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn five_thousand_messages_through_two_gateways_call_each_key_once_across_a_service_kill_and_a_sigkill() {
    let world = World::new().await;
    let address: SocketAddr = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap();
    let calls: Calls = Arc::default();
    let mut service = Some(Service::start(address, calls.clone()).await);
    let config = ConfigFile::new(
        &world,
        &format!(
            r#"
[consumer]
group = "charge-gateway"
lease_ms = 5000

[consumer.http."ORDER.PAID"]
url = "http://{address}/charge"
timeout_ms = 2000
concurrency = 16
on_lease_expiry = "reclaim"
"#
        ),
    );
    let env = [("DEDUP_CONFIG", config.path())];
    let first = world.serve("drill-a", &env).await;
    let second = world.serve("drill-b", &env).await;

    let published = Arc::new(AtomicUsize::new(0));
    let publishing = {
        let (published, exchange) = (published.clone(), world.broker.settings.exchange.clone());
        let publisher = world.broker.connector().publisher().await.unwrap();
        tokio::spawn(async move {
            let send = |key: usize| {
                let id = format!("ORDER.PAID.{key:05}:1");
                let body = serde_json::to_vec(&json!({"orderNo": key, "amount": 10})).unwrap();
                (id, body)
            };
            let headers = serde_json::Map::new();
            for key in 0..KEYS {
                // A producer's retry: the key two before this one, again.
                let keys = if key % 4 == 3 { vec![key, key - 2] } else { vec![key] };
                for key in keys {
                    let (id, body) = send(key);
                    let props = properties_for(Some(&id), &headers, Some("application/json"));
                    publisher.publish(&exchange, "order.paid", &body, props).await.unwrap();
                    published.fetch_add(1, Ordering::Relaxed);
                    // About 500 a second: the run lasts long enough for the faults below.
                    tokio::time::sleep(Duration::from_millis(2)).await;
                }
            }
        })
    };
    let reached = |n: usize| {
        let published = published.clone();
        async move {
            while published.load(Ordering::Relaxed) < n {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    };
    reached(MESSAGES / 4).await;
    service.take().expect("running").kill();
    tokio::time::sleep(Duration::from_secs(2)).await; // calls fail meanwhile: connection refused
    service = Some(Service::start(address, calls.clone()).await);
    reached(MESSAGES / 2).await;
    let killed = first.pid();
    first.kill().await; // its claims in flight keep their leases until they expire, then reclaimed
    publishing.await.unwrap();

    let succeeded =
        "SELECT count(*) FROM dedup_records WHERE consumer_group = 'charge-gateway' AND status = 'succeeded'";
    let n = KEYS as i64;
    let done = world.wait_for(Duration::from_secs(240), succeeded, |v: &i64| *v == n).await;
    let statuses: Vec<(String, i64)> =
        sqlx::query_as("SELECT status, count(*) FROM dedup_records GROUP BY 1 ORDER BY 1")
            .fetch_all(&world.db.pool)
            .await
            .unwrap();
    assert_eq!(done, n, "every key succeeded once: {statuses:?}");
    assert_eq!(statuses, [("succeeded".to_owned(), n)], "nothing else: no duplicate record, none dead or stuck");

    // Each record: when its success was recorded, and how many attempts (calls) it made.
    let records: Vec<(String, DateTime<Utc>, i64)> = sqlx::query_as(
        "SELECT r.message_id, r.completed_at, (SELECT count(*) FROM record_attempts a WHERE a.record_id = r.id)
         FROM dedup_records r",
    )
    .fetch_all(&world.db.pool)
    .await
    .unwrap();
    let calls = std::mem::take(&mut *calls.lock().unwrap());
    let mut per_key: HashMap<String, Vec<DateTime<Utc>>> = HashMap::new();
    for (key, at) in calls {
        per_key.entry(key.trim_matches('"').to_owned()).or_default().push(at);
    }
    let (mut called_again, mut late) = (Vec::new(), Vec::new());
    for (id, completed_at, attempts) in &records {
        let seen = per_key.get(id).map_or(&[][..], Vec::as_slice);
        assert!(!seen.is_empty(), "{id} succeeded without a call");
        if seen.len() as i64 > *attempts {
            called_again.push(format!("{id}: {} calls, {attempts} attempts", seen.len()));
        }
        if seen.iter().any(|at| at > completed_at) {
            late.push(id.clone());
        }
    }
    assert!(late.is_empty(), "called after its success was recorded: {late:?}");
    assert!(called_again.is_empty(), "calls that no attempt accounts for: {called_again:?}");
    // The faults hit: calls refused while the service was down were retried, and the killed
    // process left claims that the other one took over once their leases expired.
    let (retried, taken_over): (i64, i64) = sqlx::query_as(
        "SELECT (SELECT count(*) FROM dedup_records WHERE attempts > 1),
                (SELECT count(*) FROM record_attempts WHERE worker LIKE '%:' || $1 || ':%' AND outcome IS DISTINCT FROM 'succeeded')",
    )
    .bind(killed.to_string())
    .fetch_one(&world.db.pool)
    .await
    .unwrap();
    assert!(retried > 0, "the service's outage caused retries");
    assert!(taken_over > 0, "the SIGKILLed process had claims in flight");
    let repeated = records.iter().filter(|(id, _, _)| per_key[id].len() > 1).count();
    println!(
        "drill: {MESSAGES} messages, {KEYS} keys succeeded once; {} calls, {repeated} keys called more than once \
         (each with an attempt per call); {retried} records retried, {taken_over} attempts of the killed process \
         not completed by it",
        per_key.values().map(Vec::len).sum::<usize>()
    );
    let started = Instant::now();
    second.stop().await;
    assert!(started.elapsed() < Duration::from_secs(30));
    drop(service);
}
