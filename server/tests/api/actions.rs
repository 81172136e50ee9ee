//! The operator actions of the REST API: JSON errors with 400/404/409 (a body that is not a JSON
//! object, a path under /api/ that no route takes), the audit trail, bulk
//! requeue preview and job, cleanup schedules (invalid cron, dry run, run), and the OpenAPI
//! document listing every new route.

use std::time::Duration;

use dedup_engine::Backoff;
use dedup_engine::console::accounts::Role;
use dedup_engine::testing::{TestBroker, amqp_url};
use serde_json::{Value, json};

use crate::helpers::{TestApp, spawn_app};

/// POST as an admin (every action's role), with the admin's API token.
async fn post(app: &TestApp, path: &str, body: Value) -> (u16, Value) {
    let response =
        app.bearer(Role::Admin).post(format!("{}{path}", app.address)).json(&body).send().await.expect("request sent");
    let status = response.status().as_u16();
    (status, response.json().await.expect("JSON body"))
}

async fn get(app: &TestApp, path: &str) -> Value {
    app.get(path).await.json().await.expect("JSON body")
}

/// A stuck record (lease expired) of a test's own exchange; returns (id, lease token).
async fn stuck_record(app: &TestApp, exchange: &str) -> (i64, String) {
    sqlx::query_as::<_, (i64, uuid::Uuid)>(
        "INSERT INTO dedup_records (consumer_group, message_id, message_type, status, handler_mode, attempts,
             max_attempts, lease_owner, lease_token, lease_expires_at, payload_hash, payload, headers, content_type,
             source_broker, source_exchange, source_routing_key)
         VALUES ('order-service', 'ORDER.NOTIFY.1:1', 'ORDER.NOTIFY', 'processing', 'leased', 1, 5, 'w', gen_random_uuid(),
                 now() - interval '1 minute', '\\x00', convert_to('{}', 'UTF8'), '{}', 'application/json',
                 'rabbitmq', $1, 'order.notify')
         RETURNING id, lease_token",
    )
    .bind(exchange)
    .fetch_one(&app._db.pool)
    .await
    .map(|(id, token)| (id, token.to_string()))
    .unwrap()
}

#[tokio::test]
async fn record_actions_answer_json_errors_and_are_audited() {
    let app = spawn_app().await;
    let broker = TestBroker::new(&amqp_url(), Backoff { initial_ms: 1000, max_ms: 1000 });
    broker.connector().publisher().await.expect("RabbitMQ");
    let (id, token) = stuck_record(&app, &broker.settings.exchange).await;

    let response =
        app.bearer(Role::Admin).post(format!("{}/api/v1/records/{id}/release", app.address)).send().await.unwrap();
    assert_eq!(response.status().as_u16(), 400, "no JSON body");
    let (status, body) = post(&app, "/api/v1/records/999999/release", json!({"reason": "x"})).await;
    assert_eq!((status, body["error"].as_str()), (404, Some("not_found")));
    let (status, body) = post(&app, &format!("/api/v1/records/{id}/release"), json!({"lease_token": token})).await;
    assert_eq!((status, body["error"].as_str()), (400, Some("bad_request")));
    assert!(body["message"].as_str().unwrap().contains("reason"), "{body}");
    let stale = json!({"lease_token": uuid::Uuid::new_v4().to_string(), "reason": "worker died"});
    let (status, body) = post(&app, &format!("/api/v1/records/{id}/release"), stale).await;
    assert_eq!((status, body["error"].as_str()), (409, Some("conflict")), "{body}");

    let shown = get(&app, &format!("/api/v1/records/{id}")).await["version"].as_i64().expect("a version");
    let ok = json!({"lease_token": token, "reason": "worker died", "expected_status": "processing", "requeue": true});
    let (status, body) = post(&app, &format!("/api/v1/records/{id}/release"), ok.clone()).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!((body["status"].as_str(), body["republished"].as_bool()), (Some("failed"), Some(true)));
    let (status, _) = post(&app, &format!("/api/v1/records/{id}/release"), ok).await;
    assert_eq!(status, 409, "the same release again is refused");
    let (status, body) = post(&app, &format!("/api/v1/records/{id}/mark-succeeded"), json!({})).await;
    assert_eq!(status, 400, "{body}");
    // A requeue of the record as it was shown before the release: it changed since.
    let (status, body) = post(&app, &format!("/api/v1/records/{id}/requeue"), json!({"expected_version": shown})).await;
    assert_eq!((status, body["error"].as_str()), (409, Some("conflict")), "{body}");
    assert!(body["message"].as_str().unwrap().contains("changed since it was shown"), "{body}");
    let now = get(&app, &format!("/api/v1/records/{id}")).await["version"].as_i64().unwrap();
    assert_ne!(now, shown, "the release changed the version");
    let (status, body) = post(&app, &format!("/api/v1/records/{id}/requeue"), json!({"expected_version": now})).await;
    assert_eq!(status, 200, "{body}");

    let audit = get(&app, "/api/v1/audit?action=record.").await;
    let outcomes: Vec<&str> =
        audit["entries"].as_array().unwrap().iter().map(|e| e["outcome"].as_str().unwrap()).collect();
    assert_eq!(outcomes, ["ok", "refused", "refused", "refused", "ok", "refused", "refused", "refused"]);
    let ok_only = get(&app, "/api/v1/audit?outcome=ok").await;
    assert_eq!(ok_only["entries"][0]["actor"], "user:admin");
    let (status, _) = (app.get("/api/v1/audit?outcome=maybe").await.status().as_u16(), ());
    assert_eq!(status, 400);
}

#[tokio::test]
async fn bulk_requeue_previews_then_runs_in_the_background() {
    let app = spawn_app().await;
    let broker = TestBroker::new(&amqp_url(), Backoff { initial_ms: 1000, max_ms: 1000 });
    broker.connector().publisher().await.expect("RabbitMQ");
    sqlx::query(
        "INSERT INTO dedup_records (consumer_group, message_id, message_type, status, handler_mode, attempts,
             max_attempts, payload_hash, payload, headers, source_broker, source_exchange, source_routing_key, error_class)
         SELECT 'order-service', 'ORDER.PAY.' || i || ':1', 'ORDER.PAY', 'dead', 'transactional', 5, 5, '\\x00',
                CASE WHEN i > 1 THEN convert_to('{}', 'UTF8') END, '{}', 'rabbitmq', $1, 'order.pay', 'E: x'
         FROM generate_series(1, 30) AS i",
    )
    .bind(&broker.settings.exchange)
    .execute(&app._db.pool)
    .await
    .unwrap();
    // serde reads a struct from an array too: `[]` used to pass as the empty filter, all records.
    for not_an_object in [json!([]), json!(["dead"]), json!("dead"), json!(null)] {
        let (status, body) = post(&app, "/api/v1/requeue/preview", not_an_object.clone()).await;
        assert_eq!((status, body["error"].as_str()), (400, Some("bad_request")), "{not_an_object}: {body}");
        assert!(body["message"].as_str().unwrap().contains("JSON object"), "{body}");
    }
    let filter = json!({"status": "dead", "error_class": "E: x"});
    let (status, preview) = post(&app, "/api/v1/requeue/preview", filter.clone()).await;
    assert_eq!(status, 200, "{preview}");
    assert_eq!((preview["matched"].as_i64(), preview["would_requeue"].as_i64()), (Some(30), Some(29)));
    assert_eq!(preview["skipped"][0]["reason"], "payload missing");

    let start = json!({"filter": filter, "rate_per_sec": 100.0, "canary_size": 5, "expected_count": 28});
    let (status, body) = post(&app, "/api/v1/requeue/jobs", start).await;
    assert_eq!((status, body["error"].as_str()), (409, Some("conflict")), "{body}");
    let start = json!({"filter": filter, "rate_per_sec": 100.0, "canary_size": 5, "expected_count": 29});
    let (status, job) = post(&app, "/api/v1/requeue/jobs", start).await;
    assert_eq!(status, 200, "{job}");
    let id = job["id"].as_i64().unwrap();
    let mut job = job;
    for _ in 0..100 {
        job = get(&app, &format!("/api/v1/requeue/jobs/{id}")).await;
        if job["state"] == "completed" {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(
        (job["state"].as_str(), job["done"].as_i64(), job["skipped"].as_i64()),
        (Some("completed"), Some(29), Some(1))
    );
    let (status, body) = post(&app, &format!("/api/v1/requeue/jobs/{id}/resume"), json!({})).await;
    assert_eq!((status, body["error"].as_str()), (409, Some("conflict")));
}

#[tokio::test]
async fn cleanup_schedules_validate_cron_dry_run_and_run() {
    let app = spawn_app().await;
    let pool = &app._db.pool;
    sqlx::query(
        "INSERT INTO dedup_records (consumer_group, message_id, message_type, status, attempts, max_attempts,
             payload_hash, source_broker, first_seen_at, completed_at)
         SELECT 'order-service', 'ORDER.PAY.' || i || ':1', 'ORDER.PAY', 'succeeded', 1, 5, '\\x00', 'rabbitmq', t, t
         FROM generate_series(1, 40) AS i,
              LATERAL (SELECT now() - CASE WHEN i <= 25 THEN interval '40 days' ELSE interval '1 day' END AS t) age",
    )
    .execute(pool)
    .await
    .unwrap();
    let bad = json!({"name": "nightly", "cron": "0 25 * * *", "retention_days": 30, "batch_size": 10,
                     "statuses": ["succeeded"], "consumer_group": null, "enabled": true});
    let (status, body) = post(&app, "/api/v1/cleanup/schedules", bad).await;
    assert_eq!(status, 400, "{body}");
    assert!(body["message"].as_str().unwrap().contains("invalid cron expression \"0 25 * * *\""), "{body}");
    let good = json!({"name": "nightly", "cron": "0 3 * * *", "retention_days": 30, "batch_size": 10,
                      "statuses": ["succeeded"], "consumer_group": null, "enabled": true});
    let (status, schedule) = post(&app, "/api/v1/cleanup/schedules", good.clone()).await;
    assert_eq!(status, 200, "{schedule}");
    let (status, _) = post(&app, "/api/v1/cleanup/schedules", good).await;
    assert_eq!(status, 409, "names are unique");
    let id = schedule["id"].as_i64().unwrap();
    let (_, dry) = post(&app, &format!("/api/v1/cleanup/schedules/{id}/dry-run"), json!({})).await;
    assert_eq!(dry["would_delete"], 25);
    let (status, run) = post(&app, &format!("/api/v1/cleanup/schedules/{id}/run"), json!({})).await;
    assert_eq!(status, 200, "{run}");
    let mut view = Value::Null;
    for _ in 0..50 {
        view = get(&app, "/api/v1/cleanup").await;
        if view["runs"][0]["finished_at"].is_string() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!((view["runs"][0]["rows_deleted"].as_i64(), view["runs"][0]["batches"].as_i64()), (Some(25), Some(3)));
    let left: i64 = sqlx::query_scalar("SELECT count(*) FROM dedup_records").fetch_one(pool).await.unwrap();
    assert_eq!(left, 15);
}

#[tokio::test]
async fn the_openapi_document_lists_the_action_routes() {
    let app = spawn_app().await;
    let doc = get(&app, "/api/openapi.json").await;
    for path in [
        "/api/v1/records/{id}/release",
        "/api/v1/records/{id}/mark-succeeded",
        "/api/v1/records/{id}/dead-letter",
        "/api/v1/records/{id}/requeue",
        "/api/v1/requeue/preview",
        "/api/v1/requeue/jobs",
        "/api/v1/requeue/jobs/{id}/{control}",
        "/api/v1/cleanup/schedules",
        "/api/v1/cleanup/schedules/{id}/run",
        "/api/v1/drills",
        "/api/v1/audit",
    ] {
        assert!(doc["paths"][path].is_object(), "{path} missing from the OpenAPI document");
    }
}

#[tokio::test]
async fn an_unknown_api_path_answers_the_apis_json_404_not_a_page() {
    let app = spawn_app().await;
    for path in ["/api/v1/nope", "/api/v1/records/1/explode", "/api/v2/records", "/api"] {
        for client in [app.anonymous(), app.bearer(Role::Viewer)] {
            let response = client.get(app.url(path)).send().await.expect("request sent");
            assert_eq!(response.status().as_u16(), 404, "{path}");
            let kind = response.headers()["content-type"].to_str().unwrap().to_owned();
            assert!(kind.starts_with("application/json"), "{path}: {kind}");
            let body: Value = response.json().await.expect("JSON body");
            assert_eq!(body["error"], "not_found", "{path}: {body}");
            assert!(body["message"].as_str().unwrap().contains(path), "{body}");
        }
    }
    let (status, body) = post(&app, "/api/v1/records/1/explode", json!({})).await;
    assert_eq!((status, body["error"].as_str()), (404, Some("not_found")), "a POST too");
    // A page path that does not exist is still the console's HTML 404 page.
    let page = app.anonymous().get(app.url("/no-such-page")).send().await.unwrap();
    assert_eq!(page.status().as_u16(), 404);
    assert!(page.headers()["content-type"].to_str().unwrap().starts_with("text/html"));
}
