//! An HTTP handler as a team declares it — `[consumer.http."ORDER.PAID"]` in the configuration,
//! no Rust written: `serve` takes the messages off RabbitMQ and calls the team's service (a real
//! HTTP server the test runs) once per key, duplicates absorbed, the records succeeded in the
//! API, and the service's token in none of the log, the API's answers or the audit log.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::extract::State;
use axum::http::HeaderMap;
use reqwest::Method;
use serde_json::json;

use crate::support::{ConfigFile, World};

/// Calls per `Idempotency-Key`, and the `Authorization` headers seen.
#[derive(Default)]
struct Seen {
    calls: HashMap<String, usize>,
    authorization: Vec<String>,
}

async fn charge(State(seen): State<Arc<Mutex<Seen>>>, headers: HeaderMap) -> &'static str {
    let mut seen = seen.lock().unwrap();
    let key = headers.get("idempotency-key").map(|v| v.to_str().unwrap().to_owned()).unwrap_or_default();
    *seen.calls.entry(key).or_default() += 1;
    if let Some(auth) = headers.get("authorization") {
        seen.authorization.push(auth.to_str().unwrap().to_owned());
    }
    "charged"
}

#[tokio::test]
async fn a_configured_http_handler_calls_the_service_once_per_key() {
    const KEYS: usize = 60;
    const TOKEN: &str = "Bearer billing-s3cret-token";
    const LITERAL: &str = "literal-s3cret-key";
    let world = World::new().await;
    let seen = Arc::new(Mutex::new(Seen::default()));
    let service = axum::Router::new().route("/charge", axum::routing::post(charge)).with_state(seen.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, service).await.unwrap() });
    let config = ConfigFile::new(
        &world,
        &format!(
            r#"
[consumer]
group = "billing-gateway"

[consumer.http."ORDER.PAID"]
url = "http://{address}/charge"
timeout_ms = 5000
concurrency = 8
headers = {{ Authorization = {{ env = "BILLING_TOKEN" }}, X-Api-Key = "{LITERAL}" }}
"#
        ),
    );
    // At info, the start-up log prints the settings.
    let env = [("DEDUP_CONFIG", config.path()), ("BILLING_TOKEN", TOKEN), ("RUST_LOG", "info")];
    let server = world.serve("http", &env).await;
    for i in 0..KEYS {
        // Every third message twice, as a producer retrying after a lost confirm.
        for _ in 0..(if i % 3 == 0 { 2 } else { 1 }) {
            world.publish(&format!("ORDER.PAID.{i:04}:1"), "order.paid", json!({"orderNo": i, "amount": 10})).await;
        }
    }
    let n = KEYS as i64;
    let succeeded =
        "SELECT count(*) FROM dedup_records WHERE consumer_group = 'billing-gateway' AND status = 'succeeded'";
    assert_eq!(world.wait_for(Duration::from_secs(60), succeeded, |v: &i64| *v == n).await, n);
    let duplicates = "SELECT COALESCE(sum(duplicate_count), 0)::bigint FROM dedup_records";
    let twice = KEYS.div_ceil(3) as i64;
    assert_eq!(world.wait_for(Duration::from_secs(30), duplicates, |v: &i64| *v == twice).await, twice, "absorbed");
    {
        let seen = seen.lock().unwrap();
        assert_eq!(seen.calls.len(), KEYS, "every key called");
        assert!(seen.calls.values().all(|&c| c == 1), "once each: {:?}", seen.calls);
        assert!(seen.calls.contains_key("\"ORDER.PAID.0000:1\""), "the key is the message id");
        assert!(seen.authorization.iter().all(|a| a == TOKEN), "the configured header, from the environment");
    }

    let token = world.operator_token().await;
    let id: i64 = sqlx::query_scalar("SELECT id FROM dedup_records WHERE message_id = 'ORDER.PAID.0003:1'")
        .fetch_one(&world.db.pool)
        .await
        .unwrap();
    let record = server.call(&token, Method::GET, &format!("/api/v1/records/{id}"), None).await;
    assert_eq!(record["record"]["status"], "succeeded", "{record}");
    assert_eq!(record["record"]["handler_mode"], "leased");
    let audit = server.call(&token, Method::GET, "/api/v1/audit", None).await;
    let overview = server.call(&token, Method::GET, "/api/v1/aggregates", None).await;
    let log = server.log_text();
    let secret = TOKEN.trim_start_matches("Bearer ");
    assert!(log.contains("starting dedup-console"), "the start-up log prints the settings: {log}");
    let answers = [
        ("the log", log),
        ("a record", record.to_string()),
        ("the audit log", audit.to_string()),
        ("the overview", overview.to_string()),
    ];
    for (place, text) in &answers {
        assert!(!text.contains(secret) && !text.contains(LITERAL), "a secret is in {place}");
    }
    server.stop().await;
}
