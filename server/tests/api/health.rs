use crate::helpers::{spawn_app, spawn_app_with};

#[tokio::test]
async fn healthz_answers_ok() {
    let app = spawn_app().await;
    let response = app.get("/healthz").await;
    assert_eq!(response.status(), 200);
    assert_eq!(response.text().await.unwrap(), "ok");
}

#[tokio::test]
async fn readyz_reports_all_three_dependencies_up() {
    let app = spawn_app().await;
    let response = app.get("/readyz").await;
    assert_eq!(response.status(), 200);
    let body: serde_json::Value = response.json().await.unwrap();
    assert_eq!(body["ready"], true);
    for key in ["database", "redis", "broker"] {
        assert_eq!(body[key]["up"], true, "{key}: {body}");
        assert!(body[key]["latency_ms"].as_f64().unwrap() >= 0.0);
    }
    assert_eq!(body["broker"]["url"], "amqp://guest:***@127.0.0.1:5672/%2f", "password redacted");
}

#[tokio::test]
async fn readyz_is_503_naming_redis_when_redis_is_down_and_pages_still_render() {
    // Nothing listens on port 1: the same as a stopped Redis, without disturbing other tests.
    let app = spawn_app_with(|s| s.redis_url = "redis://127.0.0.1:1".into()).await;
    let response = app.get("/readyz").await;
    assert_eq!(response.status(), 503);
    let body: serde_json::Value = response.json().await.unwrap();
    assert_eq!(body["ready"], false);
    assert_eq!(body["redis"]["up"], false);
    let error = body["redis"]["error"].as_str().unwrap();
    assert!(error.starts_with("Redis is down"), "{error}");
    assert!(error.contains("redis-server"), "names how to start it: {error}");
    assert_eq!(body["database"]["up"], true);
    assert_eq!(body["broker"]["up"], true);

    let page = app.get("/").await;
    assert_eq!(page.status(), 200);
    let html = page.text().await.unwrap();
    assert!(html.contains("data-dependency=\"redis\" data-state=\"down\""), "overview shows Redis down");
}

#[tokio::test]
async fn every_response_carries_a_request_id() {
    let app = spawn_app().await;
    let response = app.get("/healthz").await;
    let id = response.headers().get("x-request-id").expect("request id set").to_str().unwrap();
    assert_eq!(id.len(), 36, "a UUID: {id}");

    let echoed =
        app.client.get(format!("{}/healthz", app.address)).header("x-request-id", "abc-123").send().await.unwrap();
    assert_eq!(echoed.headers()["x-request-id"], "abc-123");
}
