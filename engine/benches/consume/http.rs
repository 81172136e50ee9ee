//! The HTTP phase's endpoint, the same calls without the engine (its floor), and the HTTP
//! handler's concurrency.

use std::time::{Duration, Instant};

use crate::BODY;
use crate::phases::Phase;

/// The HTTP phase's endpoint: a local axum server answering 200 with an empty body at once.
/// Returns its URL; it serves until the bench exits.
pub async fn instant_endpoint() -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/hook", listener.local_addr().unwrap());
    let app = axum::Router::new().route("/hook", axum::routing::post(|| async { axum::http::StatusCode::OK }));
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    url
}

/// The machine's floor for the HTTP phase: `total` POSTs of the bench's body to `url` through
/// one pooled keep-alive reqwest client, `in_flight` at a time (the HTTP phase's workers ×
/// its handler's concurrency), with no broker, no pipeline and no database.
pub async fn http_calls_alone(url: &str, total: usize, in_flight: usize) -> Phase {
    use futures::StreamExt;
    let client = reqwest::Client::new();
    let started = Instant::now();
    futures::stream::iter(0..total)
        .map(|i| {
            let request = client
                .post(url)
                .header("content-type", "application/json")
                .header("idempotency-key", format!("\"BENCH.HTTP.{i}:1\""))
                .body(BODY);
            async move { assert!(request.send().await.unwrap().status().is_success()) }
        })
        .buffer_unordered(in_flight)
        .collect::<()>()
        .await;
    Phase {
        name: "HTTP calls alone, no broker or pipeline",
        messages: total,
        elapsed: started.elapsed(),
        pipeline: Duration::ZERO,
    }
}

/// The HTTP handler's `concurrency` (most calls in flight over all workers):
/// `BENCH_HTTP_CONCURRENCY`, default the handler's own default (16).
pub fn http_concurrency() -> usize {
    std::env::var("BENCH_HTTP_CONCURRENCY")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| dedup_engine::http::HttpSettings::new("http://unused").concurrency)
}
