//! Handlers in the REST API: the list, an operator's pause and resume (audited, refused when
//! the state does not allow it or changed since shown), a viewer's 403, an unknown handler's
//! 404, and the Handlers page.

use dedup_engine::console::accounts::Role;
use serde_json::{Value, json};

use crate::helpers::{TestApp, spawn_app};

const PAUSE: &str = "/api/v1/handlers/order-service/ORDER.PAID/pause";
const RESUME: &str = "/api/v1/handlers/order-service/ORDER.PAID/resume";

async fn post(app: &TestApp, role: Role, path: &str, body: Value) -> (u16, Value) {
    let response = app.bearer(role).post(app.url(path)).json(&body).send().await.expect("request sent");
    let status = response.status().as_u16();
    (status, response.json().await.unwrap_or(Value::Null))
}

#[tokio::test]
async fn operators_pause_and_resume_a_handler_viewers_get_403_and_every_try_is_audited() {
    let app = spawn_app().await;
    // What a running engine registers for its HTTP handler.
    sqlx::query("INSERT INTO handler_pauses (consumer_group, message_type, kind) VALUES ('order-service', 'ORDER.PAID', 'http')")
        .execute(&app._db.pool)
        .await
        .unwrap();
    let list: Value = app.get("/api/v1/handlers").await.json().await.unwrap();
    assert_eq!(list[0]["state"], "running");
    assert_eq!(list[0]["kind"], "http");
    let version = list[0]["version"].as_i64().unwrap();

    let (status, body) = post(&app, Role::Viewer, PAUSE, json!({"reason": "x"})).await;
    assert_eq!(status, 403, "{body}");
    let (status, body) = post(&app, Role::Operator, PAUSE, json!({})).await;
    assert_eq!((status, body["error"].as_str()), (400, Some("bad_request")), "a reason is required");
    let (status, body) =
        post(&app, Role::Operator, PAUSE, json!({"reason": "<b>migration</b>", "expected_version": version})).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!((body["state"].as_str(), body["reason"].as_str()), (Some("operator"), Some("<b>migration</b>")));
    let (status, body) = post(&app, Role::Operator, PAUSE, json!({"reason": "again"})).await;
    assert_eq!((status, body["error"].as_str()), (409, Some("conflict")), "{body}");
    let (status, _) = post(&app, Role::Operator, RESUME, json!({"reason": "stale", "expected_version": version})).await;
    assert_eq!(status, 409, "changed since shown");
    let (status, _) =
        post(&app, Role::Operator, "/api/v1/handlers/order-service/NO.SUCH/pause", json!({"reason": "x"})).await;
    assert_eq!(status, 404);
    let (status, _) =
        post(&app, Role::Operator, "/api/v1/handlers/order-service/ORDER.PAID/stop", json!({"reason": "x"})).await;
    assert_eq!(status, 400, "only pause and resume");

    // The Handlers page shows who paused it and why, escaped.
    let viewer = app.session(Role::Viewer).await.client;
    let page = viewer.get(app.url("/handlers")).send().await.unwrap().text().await.unwrap();
    assert!(page.contains("paused by an operator") && page.contains("&lt;b&gt;migration&lt;/b&gt;"), "{page}");
    assert!(!page.contains("<b>migration</b>"));

    let (status, body) =
        post(&app, Role::Operator, RESUME, json!({"reason": "done", "expected_version": version + 1})).await;
    assert_eq!((status, body["state"].as_str()), (200, Some("running")), "{body}");

    let audit: Vec<(String, String, String)> =
        sqlx::query_as("SELECT action, outcome, actor FROM audit_log WHERE action LIKE 'handler.%' ORDER BY id")
            .fetch_all(&app._db.pool)
            .await
            .unwrap();
    let operator = format!("user:{}", app.user(Role::Operator).name);
    let outcomes: Vec<(&str, &str)> = audit.iter().map(|(a, o, _)| (a.as_str(), o.as_str())).collect();
    assert_eq!(
        outcomes,
        [
            ("handler.pause", "refused"),
            ("handler.pause", "ok"),
            ("handler.pause", "refused"),
            ("handler.resume", "refused"),
            ("handler.pause", "refused"),
            ("handler.resume", "ok"),
        ]
    );
    assert!(audit.iter().all(|(_, _, actor)| *actor == operator), "{audit:?}");
}
