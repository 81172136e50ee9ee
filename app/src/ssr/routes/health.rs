//! `/healthz` (the process is alive) and `/readyz` (the dependencies answer).

use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use dedup_engine::health::HealthReport;

use crate::ssr::routes::AppState;

/// `GET /healthz`: 200 `ok` while the process serves requests. Touches no dependency.
pub async fn healthz() -> &'static str {
    "ok"
}

/// `GET /readyz`: probes PostgreSQL, Redis and the broker (RabbitMQ, or Kafka when
/// `consumer.source = "kafka"`) concurrently.
///
/// Body (JSON): `{ "ready": bool, "checked_at": RFC 3339, "database" | "redis" | "broker": {
/// "service", "name", "url" (redacted), "up", "latency_ms", "error" } }`. Status 200 when all are
/// up, 503 when any is down (the body names which, and how to start it).
pub async fn readyz(State(state): State<AppState>) -> (StatusCode, Json<serde_json::Value>) {
    let report: HealthReport = state.console.probes.check().await;
    let status = if report.all_up() { StatusCode::OK } else { StatusCode::SERVICE_UNAVAILABLE };
    let mut body = serde_json::to_value(&report).unwrap_or_default();
    body["ready"] = serde_json::Value::Bool(report.all_up());
    (status, Json(body))
}

/// `GET /metrics` (only when the console was given a Prometheus handle): Prometheus text format
/// (deliveries, claims, duplicates by layer, handler latency histogram, retries, dead letters,
/// Redis fallbacks, lease takeovers, ...).
pub async fn metrics(State(state): State<AppState>) -> ([(axum::http::HeaderName, &'static str); 1], String) {
    let text = state.config.metrics.as_ref().map(|handle| handle.render()).unwrap_or_default();
    ([(axum::http::header::CONTENT_TYPE, "text/plain; version=0.0.4")], text)
}
