//! The console's read API (`/api/v1`), its OpenAPI document, the live event stream, and the
//! server-rendered pages, on a small seeded data set.

use dedup_engine::console::seed::{SeedParams, seed_records};
use dedup_example_orders::seed::order_domain;
use serde_json::Value;

use crate::helpers::{TestApp, spawn_app};

/// An app with `n` seeded records.
async fn seeded_app(n: u64) -> TestApp {
    let app = spawn_app().await;
    let params = SeedParams { records: n, days: 3, batch: 1000 };
    seed_records(&app._db.pool, &params, &order_domain(), |_, _| {}).await.expect("seed");
    app
}

async fn json(app: &TestApp, path: &str) -> (u16, Value) {
    let response = app.get(path).await;
    let status = response.status().as_u16();
    (status, response.json().await.expect("JSON body"))
}

/// A record id with a payload holding markup, for the escaping checks.
async fn markup_record(app: &TestApp) -> i64 {
    sqlx::query_scalar(
        "INSERT INTO dedup_records (consumer_group, message_id, message_type, status, attempts, max_attempts,
             payload_hash, payload, headers, content_type, source_broker, last_error, error_class)
         VALUES ('order-service', 'ORDER.PAY.XSS:1', 'ORDER.PAY', 'dead', 5, 5, '\\x00',
                 convert_to('{\"note\": \"<script>alert(1)</script>\"}', 'UTF8'), '{}', 'application/json',
                 'rabbitmq', 'boom <b>', 'X: boom')
         RETURNING id",
    )
    .fetch_one(&app._db.pool)
    .await
    .unwrap()
}

#[tokio::test]
async fn records_api_filters_pages_and_refuses_bad_filters() {
    let app = seeded_app(3000).await;
    let (status, page) = json(&app, "/api/v1/records?status=failed&limit=5").await;
    assert_eq!(status, 200, "{page}");
    let rows = page["rows"].as_array().unwrap();
    assert!(!rows.is_empty() && rows.len() <= 5);
    assert!(rows.iter().all(|r| r["status"] == "failed"));

    let (_, first) = json(&app, "/api/v1/records?limit=20").await;
    let next = first["next"].as_str().expect("a next page");
    assert!(first["prev"].is_null());
    let (_, second) = json(&app, &format!("/api/v1/records?limit=20&after={next}")).await;
    assert_ne!(first["rows"][0]["id"], second["rows"][0]["id"]);
    let prev = second["prev"].as_str().expect("a previous page");
    let (_, back) = json(&app, &format!("/api/v1/records?limit=20&before={prev}")).await;
    assert_eq!(back["rows"], first["rows"], "back to the same first page");

    let id = first["rows"][0]["message_id"].as_str().unwrap().to_owned();
    let (_, exact) = json(&app, &format!("/api/v1/records?id={id}")).await;
    assert_eq!(exact["rows"].as_array().unwrap().len(), 1);
    let (_, prefix) = json(&app, "/api/v1/records?prefix=ORDER.PAY.&limit=500").await;
    assert!(
        prefix["rows"].as_array().unwrap().iter().all(|r| r["message_id"].as_str().unwrap().starts_with("ORDER.PAY."))
    );

    for (query, says) in [
        ("status=done", "unknown status"),
        (&format!("prefix={}", "x".repeat(600)) as &str, "limit is 512"),
        ("from=yesterday", "not a time"),
        ("after=garbage", "cursor"),
        ("limit=100000", "limit"),
    ] {
        let (status, body) = json(&app, &format!("/api/v1/records?{query}")).await;
        assert_eq!(status, 400, "{query}: {body}");
        assert_eq!(body["error"], "bad_request");
        assert!(body["message"].as_str().unwrap().contains(says), "{query}: {body}");
    }
    let (status, body) = json(&app, "/api/v1/aggregates/growth?range=2y").await;
    assert_eq!((status, body["error"].as_str()), (400, Some("bad_request")));
}

#[tokio::test]
async fn aggregates_groups_and_failure_endpoints_answer_from_the_same_queries() {
    let app = seeded_app(2000).await;
    let (status, agg) = json(&app, "/api/v1/aggregates").await;
    assert_eq!(status, 200, "{agg}");
    assert_eq!(agg["live"]["totals"]["total"], 2000);
    let day = agg["last_day"]["created"].as_i64().unwrap();
    assert!(day > 300 && day < 1200, "about a third of 3 days of records: {day}");
    assert_eq!(agg["consumers"][0]["group"], "order-service", "{agg}");
    assert_eq!(agg["consumers"][0]["enabled"], true);
    assert_eq!(agg["consumers"][0]["broker"], "rabbitmq");
    assert_eq!(agg["consumers"][0]["types"], serde_json::json!(["ORDER.CREATE", "ORDER.NOTIFY", "ORDER.PAY"]));

    let (_, groups) = json(&app, "/api/v1/groups").await;
    let sum: i64 = groups.as_array().unwrap().iter().map(|g| g["counts"]["total"].as_i64().unwrap()).sum();
    assert_eq!(sum, 2000);

    let (_, growth) = json(&app, "/api/v1/aggregates/growth?range=7d").await;
    assert_eq!(growth["range"], "7d");
    let created: i64 = growth["points"].as_array().unwrap().iter().map(|p| p["created"].as_i64().unwrap()).sum();
    assert_eq!(created, 2000);

    let (_, stuck) = json(&app, "/api/v1/stuck").await;
    assert_eq!(stuck["total"].as_i64().unwrap(), stuck["rows"].as_array().unwrap().len() as i64);
    let (_, retries) = json(&app, "/api/v1/retries").await;
    assert!(retries["distribution"].is_array() && retries["top_types"].is_array());
    let (_, dead) = json(&app, "/api/v1/dead-letters").await;
    let dead_total: i64 = dead.as_array().unwrap().iter().map(|g| g["records"].as_i64().unwrap()).sum();
    assert_eq!(dead_total, agg["live"]["totals"]["dead"].as_i64().unwrap());
    let (_, types) = json(&app, "/api/v1/message-types").await;
    assert!(types.as_array().unwrap().iter().any(|t| t == "ORDER.PAY"));
}

#[tokio::test]
async fn record_detail_api_and_page_show_the_payload_as_escaped_text() {
    let app = spawn_app().await;
    let id = markup_record(&app).await;
    let (status, detail) = json(&app, &format!("/api/v1/records/{id}")).await;
    assert_eq!(status, 200, "{detail}");
    assert_eq!(detail["payload"]["format"], "json");
    assert!(detail["payload"]["text"].as_str().unwrap().contains("<script>alert(1)</script>"));
    assert_eq!(detail["marker"]["state"], "absent");

    let (status, missing) = json(&app, &format!("/api/v1/records/{}", id + 1000)).await;
    assert_eq!((status, missing["error"].as_str()), (404, Some("not_found")));
    let (status, _) = json(&app, "/api/v1/records/abc").await;
    assert_eq!(status, 400);

    let html = app.get(&format!("/records/{id}")).await.text().await.unwrap();
    assert!(html.contains("data-testid=\"record-payload\""), "payload rendered on the server");
    assert!(html.contains("&lt;script&gt;alert(1)&lt;/script&gt;"), "escaped");
    assert!(!html.contains("<script>alert(1)</script>"), "never as markup");
    assert!(!html.contains("boom <b>"), "errors escaped too");
}

#[tokio::test]
async fn every_page_renders_on_the_server() {
    let app = seeded_app(500).await;
    for (path, marker) in [
        ("/", "data-testid=\"live-total\""),
        ("/records?status=dead", "data-testid=\"records-table\""),
        ("/stuck", "Stuck"),
        ("/retries", "data-testid=\"attempts-distribution\""),
        ("/dead-letters", "data-testid=\"dead-letter-groups\""),
    ] {
        let response = app.get(path).await;
        assert_eq!(response.status(), 200, "{path}");
        let html = response.text().await.unwrap();
        assert!(html.contains(marker), "{path} shows {marker}");
    }
    let html = app.get("/records?status=done").await.text().await.unwrap();
    assert!(html.contains("unknown status"), "a bad filter is explained on the page");
}

#[tokio::test]
async fn openapi_document_lists_the_read_api() {
    let app = spawn_app().await;
    let (status, doc) = json(&app, "/api/openapi.json").await;
    assert_eq!(status, 200);
    assert!(doc["openapi"].as_str().unwrap().starts_with("3."));
    for path in [
        "/api/v1/records",
        "/api/v1/records/{id}",
        "/api/v1/aggregates",
        "/api/v1/groups",
        "/api/v1/stuck",
        "/api/v1/retries",
        "/api/v1/dead-letters",
        "/api/v1/events",
    ] {
        assert!(doc["paths"][path].is_object(), "{path} documented");
    }
    assert!(doc["components"]["schemas"]["RecordPageView"].is_object());
}

#[tokio::test]
async fn the_event_stream_pushes_live_aggregates() {
    use futures::StreamExt;
    let app = spawn_app().await;
    let response = app.get("/api/v1/events").await;
    assert_eq!(response.status(), 200);
    assert_eq!(response.headers()["content-type"], "text/event-stream");
    let mut body = response.bytes_stream();
    let mut text = String::new();
    while !text.contains("\n\n") {
        let chunk = tokio::time::timeout(std::time::Duration::from_secs(5), body.next())
            .await
            .expect("an event within 5 s")
            .expect("stream open")
            .unwrap();
        text.push_str(&String::from_utf8_lossy(&chunk));
    }
    let data = text.lines().find_map(|l| l.strip_prefix("data: ")).expect("a data line");
    let live: Value = serde_json::from_str(data).unwrap();
    assert!(live["totals"]["total"].is_i64() && live["at"].is_string(), "{live}");
}

/// An app whose group calls a service at `ORDER.PAID` (never reached: the app does not consume),
/// with a secret header, and a dead letter of that endpoint: a 422 answered to its one call, and
/// three redeliveries absorbed.
async fn http_app() -> (TestApp, i64) {
    use dedup_engine::http::{HttpSettings, SecretSetting};
    let app = crate::helpers::spawn_app_with(|s| {
        let mut charge = HttpSettings::new("http://127.0.0.1:9/charge?api_key=k");
        charge.headers.insert("Authorization".into(), SecretSetting::value("Bearer panel-s3cret"));
        s.consumer.http.insert("ORDER.PAID".into(), charge);
    })
    .await;
    let id = sqlx::query_scalar(
        "WITH r AS (
             INSERT INTO dedup_records (consumer_group, message_id, message_type, status, handler_mode, attempts,
                 max_attempts, payload_hash, source_broker, last_error, error_class, duplicate_count)
             VALUES ('order-service', 'ORDER.PAID.7:1', 'ORDER.PAID', 'dead', 'leased', 1, 5, '\\x00', 'rabbitmq',
                     'HTTP_CONFLICT: HTTP 422 Unprocessable Entity: the service refused the key', 'HTTP_CONFLICT', 3)
             RETURNING id
         ), a AS (
             INSERT INTO record_attempts (record_id, attempt, worker, started_at, ended_at, outcome, error,
                 answer_status, latency_ms, answer, consumer_group, message_type)
             SELECT id, 1, 'host:1:0', now() - interval '2 seconds', now(), 'dead',
                    'HTTP_CONFLICT: HTTP 422 Unprocessable Entity: the service refused the key', 422, 37,
                    '<script>alert(\"answer\")</script>', 'order-service', 'ORDER.PAID' FROM r
         )
         SELECT id FROM r",
    )
    .fetch_one(&app._db.pool)
    .await
    .unwrap();
    (app, id)
}

#[tokio::test]
async fn http_endpoints_show_their_calls_on_the_overview_without_secrets() {
    let (app, _) = http_app().await;
    let (status, agg) = json(&app, "/api/v1/aggregates").await;
    assert_eq!(status, 200, "{agg}");
    let e = &agg["endpoints"][0];
    assert_eq!((e["group"].as_str(), e["message_type"].as_str()), (Some("order-service"), Some("ORDER.PAID")));
    assert_eq!((e["method"].as_str(), e["url"].as_str()), (Some("POST"), Some("http://127.0.0.1:9/charge?…")));
    assert_eq!((e["calls"].as_i64(), e["success_rate"].as_f64(), e["p95_ms"].as_i64()), (Some(1), Some(0.0), Some(37)));
    let conflict = e["answers"].as_array().unwrap().iter().find(|a| a["class"] == "conflict").unwrap();
    assert_eq!(conflict["calls"], 1);
    assert_eq!((e["window_secs"].as_i64(), e["sample_calls"].as_i64()), (Some(900), Some(5000)));

    assert_eq!(e["pause_state"], "running", "{e}");
    assert!(e["pause_reason"].is_null());

    let html = app.get("/").await.text().await.unwrap();
    assert!(html.contains("data-testid=\"endpoint\""), "the card is rendered on the server");
    assert!(!html.contains("data-testid=\"endpoint-paused\""), "not paused");
    for text in [agg.to_string(), html] {
        assert!(!text.contains("panel-s3cret") && !text.contains("api_key"), "no header value, no query string");
    }

    // Its circuit breaker paused it (as every process of the group sees it): the card says so,
    // and why, with the reason escaped.
    sqlx::query(
        "INSERT INTO handler_pauses (consumer_group, message_type, state, changed_by, reason, error_class, http_status)
         VALUES ('order-service', 'ORDER.PAID', 'breaker', 'engine', 'HTTP 503 <b>down</b>', 'HTTP_UNAVAILABLE', 503)
         ON CONFLICT (consumer_group, message_type) DO UPDATE SET state = 'breaker', reason = EXCLUDED.reason",
    )
    .execute(&app._db.pool)
    .await
    .unwrap();
    let (_, agg) = json(&app, "/api/v1/aggregates").await;
    let e = &agg["endpoints"][0];
    assert_eq!(
        (e["pause_state"].as_str(), e["pause_reason"].as_str()),
        (Some("breaker"), Some("HTTP 503 <b>down</b>"))
    );
    assert!(e["paused_since"].is_string(), "{e}");
    let html = app.get("/").await.text().await.unwrap();
    assert!(html.contains("paused: circuit breaker") && html.contains("data-testid=\"endpoint-pause-reason\""));
    assert!(html.contains("HTTP 503 &lt;b&gt;down&lt;/b&gt;") && !html.contains("<b>down</b>"), "escaped");
}

#[tokio::test]
async fn http_dead_letters_and_attempts_show_their_answer() {
    let (app, id) = http_app().await;
    let (_, dead) = json(&app, "/api/v1/dead-letters").await;
    assert_eq!(dead[0]["error_class"], "HTTP_CONFLICT", "{dead}");
    assert_eq!(dead[0]["answer_class"], "conflict");
    let html = app.get("/dead-letters").await.text().await.unwrap();
    assert!(html.contains("data-testid=\"dead-letter-answer-classes\"") && html.contains("Conflict (422)"));

    let (status, detail) = json(&app, &format!("/api/v1/records/{id}")).await;
    assert_eq!(status, 200, "{detail}");
    let attempt = &detail["attempts"][0];
    assert_eq!((attempt["answer_status"].as_i64(), attempt["latency_ms"].as_i64()), (Some(422), Some(37)));
    assert_eq!(attempt["answer_class"], "HTTP_CONFLICT");
    assert_eq!(attempt["answer"], "<script>alert(\"answer\")</script>");
    assert_eq!((detail["calls"].as_i64(), detail["record"]["duplicate_count"].as_i64()), (Some(1), Some(3)));

    let html = app.get(&format!("/records/{id}")).await.text().await.unwrap();
    assert!(html.contains("3 redeliveries absorbed; the service was called once"), "absorbed redeliveries said");
    assert!(html.contains("data-testid=\"attempt-answer\" data-status=\"422\""), "the attempt's status");
    assert!(html.contains("&lt;script&gt;alert("), "the answer escaped");
    assert!(!html.contains("<script>alert(\"answer\")"), "never as markup");
}
