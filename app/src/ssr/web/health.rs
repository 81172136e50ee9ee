//! `/healthz` (the process is alive) and `/readyz` (the dependencies answer).

use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use dedup_engine::{EngineHandle, HealthProbes, HealthReport};

use super::state::AppState;

/// `GET /healthz`: 200 `ok` while the process serves requests. Touches no dependency.
pub async fn healthz() -> &'static str {
    "ok"
}

/// `GET /readyz`: probes PostgreSQL, Redis and the broker (RabbitMQ, or Kafka when
/// `consumer.source = "kafka"`) concurrently, and asks each consumer group whether its broker
/// takes its topology and whether its batches are being judged.
///
/// Body (JSON): `{ "ready": bool, "checked_at": RFC 3339, "database" | "redis" | "broker": {
/// "service", "name", "url" (redacted), "up", "latency_ms", "error" }, "groups": [{ "group",
/// "ready", "error", "failed_batches", "failing", "last_recovery" }] }` (`failing` and
/// `last_recovery`: `{ "since", "batches", "last_at", "resumed_at" }` or null). Status 200 when
/// all are up and every group is ready, 503 otherwise (the body names which, and why: a
/// dependency down, a group whose exchange or queue the broker refuses, or a group whose
/// batches are all given back to the broker unjudged).
pub async fn readyz(State(state): State<AppState>) -> (StatusCode, Json<serde_json::Value>) {
    readiness(&state.console.probes, &state.console.engine).await
}

/// `/readyz`'s answer for `engine` with `probes` (see [`readyz`]).
pub(crate) async fn readiness(probes: &HealthProbes, engine: &EngineHandle) -> (StatusCode, Json<serde_json::Value>) {
    let report: HealthReport = probes.check().await;
    let groups = engine.groups_health();
    let ready = report.all_up() && groups.iter().all(|g| g.ready);
    let status = if ready { StatusCode::OK } else { StatusCode::SERVICE_UNAVAILABLE };
    let mut body = serde_json::to_value(&report).unwrap_or_default();
    body["ready"] = serde_json::Value::Bool(ready);
    body["groups"] = serde_json::to_value(&groups).unwrap_or_default();
    (status, Json(body))
}

/// `GET /metrics` (only when the console was given a Prometheus handle): Prometheus text format
/// (deliveries, claims, duplicates by layer, handler latency histogram, retries, dead letters,
/// Redis fallbacks, lease takeovers, ...).
pub async fn metrics(State(state): State<AppState>) -> ([(axum::http::HeaderName, &'static str); 1], String) {
    prometheus_text(state.config.metrics.as_ref())
}

/// `/metrics`' answer: `handle`'s text (empty without one), as Prometheus' text format.
pub(crate) fn prometheus_text(
    handle: Option<&metrics_exporter_prometheus::PrometheusHandle>,
) -> ([(axum::http::HeaderName, &'static str); 1], String) {
    let text = handle.map(|handle| handle.render()).unwrap_or_default();
    ([(axum::http::header::CONTENT_TYPE, "text/plain; version=0.0.4")], text)
}
