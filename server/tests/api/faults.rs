//! Faults found by trying to break the console (issue 17, part 4), each pinned by a test: server
//! functions answer with the status of their error, long reasons, names and cron texts get a
//! clear 400 instead of being cut or echoed, a failed action keeps its cause for the log and the
//! audit, the CSRF check compares the scheme too, and durations read in the unit that fits; and
//! (part 3) a possible double effect of a leased handler shows on the record, in the API and on
//! the overview.

use dedup_engine::console::accounts::Role;
use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::helpers::{Session, TestApp, spawn_app, spawn_app_with};

/// A `failed` record with a stored payload (so release, mark succeeded and requeue apply).
async fn failed_record(app: &TestApp) -> i64 {
    sqlx::query_scalar(
        "INSERT INTO dedup_records (consumer_group, message_id, message_type, status, attempts, max_attempts,
             payload_hash, payload, headers, source_broker)
         VALUES ('order-service', 'ORDER.PAY.F1:1', 'ORDER.PAY', 'failed', 1, 5, '\\x00',
                 convert_to('{}', 'UTF8'), '{}', 'rabbitmq')
         RETURNING id",
    )
    .fetch_one(&app._db.pool)
    .await
    .unwrap()
}

/// Calls the `act_on_record` server function as the signed-in admin; returns status and body.
async fn act(app: &TestApp, session: &Session, body: Value) -> (StatusCode, String) {
    let response = session
        .client
        .post(app.url("/api/fn/act_on_record"))
        .header("x-csrf-token", &session.csrf)
        .json(&body)
        .send()
        .await
        .unwrap();
    (response.status(), response.text().await.unwrap())
}

#[tokio::test]
async fn server_functions_answer_with_the_status_of_their_error() {
    let app = spawn_app().await;
    let session = app.session(Role::Admin).await;
    let id = failed_record(&app).await;

    let (status, body) = act(&app, &session, json!({"id": 999_999, "action": "requeue", "request": {}})).await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{body}");
    let (status, body) =
        act(&app, &session, json!({"id": id, "action": "release", "request": {"reason": "stuck?"}})).await;
    assert_eq!(status, StatusCode::CONFLICT, "a failed record cannot be released: {body}");
    assert!(body.contains("release applies to processing records"), "{body}");
    let (status, body) = act(&app, &session, json!({"id": id, "action": "mark_succeeded", "request": {}})).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "no reason: {body}");
    // Arguments the function cannot decode: the caller's fault, not the server's.
    let (status, body) = act(&app, &session, json!({"id": "seven", "action": "requeue"})).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    let (status, body) = act(&app, &session, json!({"id": id, "action": "explode", "request": {}})).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    let viewer = app.session(Role::Viewer).await;
    let (status, body) = act(&app, &viewer, json!({"id": id, "action": "requeue", "request": {}})).await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{body}");
}

#[tokio::test]
async fn long_reasons_names_and_cron_texts_are_refused_with_a_clear_400_not_cut() {
    let app = spawn_app().await;
    let admin = app.bearer(Role::Admin);
    let id = failed_record(&app).await;
    let post = |path: String, body: Value| {
        let admin = admin.clone();
        async move {
            let response = admin.post(path).json(&body).send().await.unwrap();
            let status = response.status();
            (status, response.json::<Value>().await.unwrap())
        }
    };

    let long_reason = "r".repeat(1001);
    let (status, body) =
        post(app.url(&format!("/api/v1/records/{id}/mark-succeeded")), json!({ "reason": long_reason })).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    assert!(body["message"].as_str().unwrap().contains("at most 1000 characters; this one has 1001"), "{body}");
    let (status, body) =
        post(app.url(&format!("/api/v1/records/{id}/requeue")), json!({ "reason": long_reason })).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "an optional reason is bounded too: {body}");
    let (status, body) =
        post(app.url(&format!("/api/v1/records/{id}/mark-succeeded")), json!({ "reason": "a\u{0}b" })).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "a NUL is refused, not a database error: {body}");
    assert!(body["message"].as_str().unwrap().contains("control characters"), "{body}");
    let (status, body) = post(
        app.url("/api/v1/requeue/jobs"),
        json!({"filter": {"status": "failed"}, "rate_per_sec": 10.0, "reason": long_reason}),
    )
    .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    let status: String = sqlx::query_scalar("SELECT status FROM dedup_records WHERE id = $1")
        .bind(id)
        .fetch_one(&app._db.pool)
        .await
        .unwrap();
    assert_eq!(status, "failed", "nothing changed");
    let stored: Option<i32> =
        sqlx::query_scalar("SELECT max(length(reason)) FROM audit_log").fetch_one(&app._db.pool).await.unwrap();
    assert!(stored.unwrap_or(0) <= 1000, "no audit entry keeps the refused reason: {stored:?}");
    // A reason of exactly the limit is taken whole.
    let (status, body) = post(
        app.url(&format!("/api/v1/records/{id}/mark-succeeded")),
        json!({ "reason": "r".repeat(1000), "expected_status": "failed" }),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{body}");

    let schedule = |name: String, cron: String| {
        json!({"name": name, "cron": cron, "retention_days": 30, "batch_size": 10, "statuses": ["succeeded"],
               "consumer_group": null, "enabled": true})
    };
    let (status, body) =
        post(app.url("/api/v1/cleanup/schedules"), schedule("n".repeat(101), "0 3 * * *".into())).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    assert!(body["message"].as_str().unwrap().contains("1 to 100 characters, got 101"), "{body}");
    let cron = format!("0 3 * * {}", "1,".repeat(5000));
    let (status, body) = post(app.url("/api/v1/cleanup/schedules"), schedule("nightly".into(), cron)).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    let message = body["message"].as_str().unwrap();
    assert!(message.contains("at most 200 characters"), "{message}");
    assert!(message.len() < 300, "the text is not echoed back: {} bytes", message.len());
    let (status, body) =
        post(app.url("/api/v1/cleanup/schedules"), schedule("a\u{0}b".into(), "0 3 * * *".into())).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    let mut group = schedule("nightly".into(), "0 3 * * *".into());
    group["consumer_group"] = json!("g".repeat(129));
    let (status, body) = post(app.url("/api/v1/cleanup/schedules"), group).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
}

#[tokio::test]
async fn a_failed_action_keeps_its_cause_for_the_audit_and_tells_the_operator_only_that_it_failed() {
    let app = spawn_app().await;
    let id = failed_record(&app).await;
    // The database refuses the transition (as a full disk or a broken trigger would).
    sqlx::query(
        "ALTER TABLE dedup_records ADD CONSTRAINT test_refuses_success CHECK (status <> 'succeeded') NOT VALID",
    )
    .execute(&app._db.pool)
    .await
    .unwrap();
    let response = app
        .bearer(Role::Admin)
        .post(app.url(&format!("/api/v1/records/{id}/mark-succeeded")))
        .json(&json!({"reason": "verified by hand"}))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::INTERNAL_SERVER_ERROR);
    let body: Value = response.json().await.unwrap();
    assert!(!body.to_string().contains("test_refuses_success"), "no database text for the operator: {body}");

    let audit: Value = app.get("/api/v1/audit?action=record.mark_succeeded").await.json().await.expect("JSON body");
    let entry = &audit["entries"][0];
    assert_eq!(entry["outcome"], "failed");
    let detail = entry["detail"].as_str().unwrap();
    assert!(detail.contains("operator action: database error"), "{detail}");
    assert!(detail.contains("test_refuses_success"), "the cause: {detail}");
}

#[tokio::test]
async fn the_csrf_check_compares_the_scheme_too() {
    let post = |app: &TestApp, session: &Session, origin: String, forwarded: Option<&str>| {
        let mut request = session
            .client
            .post(app.url("/api/fn/create_token"))
            .header("x-csrf-token", &session.csrf)
            .header("origin", origin)
            .form(&[("name", "t")]);
        if let Some(proto) = forwarded {
            request = request.header("x-forwarded-proto", proto);
        }
        request.send()
    };
    let app = spawn_app().await;
    let session = app.session(Role::Admin).await;
    let host = app.address.trim_start_matches("http://").to_owned();
    let refused = post(&app, &session, format!("https://{host}"), None).await.unwrap();
    assert_eq!(refused.status(), StatusCode::FORBIDDEN, "served over http: an https page is another origin");
    let ok = post(&app, &session, format!("http://{host}"), None).await.unwrap();
    assert_eq!(ok.status(), StatusCode::OK);
    // Behind a TLS proxy that says so.
    let ok = post(&app, &session, format!("https://{host}"), Some("https")).await.unwrap();
    assert_eq!(ok.status(), StatusCode::OK);
    let refused = post(&app, &session, format!("http://{host}"), Some("https")).await.unwrap();
    assert_eq!(refused.status(), StatusCode::FORBIDDEN, "a plain-http page of the same host");

    // Served over HTTPS (secure cookies): only https origins. The test client speaks plain HTTP,
    // so the session is signed in by API token, and the page's token is not needed.
    let app = spawn_app_with(|s| s.auth.secure_cookies = true).await;
    let host = app.address.trim_start_matches("http://").to_owned();
    let admin = app.bearer(Role::Admin);
    let list = |origin: String| admin.post(app.url("/api/fn/list_tokens")).header("origin", origin).send();
    // Bearer tokens skip the check entirely (not cookies); show it stays so.
    assert_eq!(list(format!("http://{host}")).await.unwrap().status(), StatusCode::OK);
    let login = |origin: String| {
        app.anonymous()
            .post(app.url("/login"))
            .header("origin", origin)
            .form(&[("username", "admin"), ("password", crate::helpers::PASSWORD)])
            .send()
    };
    assert_eq!(login(format!("http://{host}")).await.unwrap().status(), StatusCode::FORBIDDEN);
    assert_eq!(login(format!("https://{host}")).await.unwrap().status(), StatusCode::NO_CONTENT);
}

#[tokio::test]
async fn durations_read_in_the_unit_that_fits() {
    let app = spawn_app().await;
    // The longest duplicate delay seen: 32 s.
    sqlx::query(
        "INSERT INTO duplicate_delays (day, consumer_group, le_ms, count, max_delay_ms)
         VALUES (current_date, 'order-service', 60000, 1, 32000)",
    )
    .execute(&app._db.pool)
    .await
    .unwrap();
    let html = app.get("/cleanup").await.text().await.unwrap();
    assert!(!html.contains("0.0 days"), "no duration rounds to nothing");
    assert!(
        html.contains(
            "Longest delay observed (duplicates, late deliveries): 32s. Keep records at least 1m 4s (2× that)."
        ),
        "{html}"
    );
    let api: Value = app.get("/api/v1/cleanup").await.json().await.unwrap();
    assert_eq!(api["minimum_retention_ms"], 64_000, "the API says ms");
}

/// A succeeded leased record of `notify-service`. With `late_effect` given, worker A held it
/// until its lease ran out and B took it over and completed it, A's effect having run after all
/// (its completion refused: `late_effect` true) or not; without, it succeeded at the first try.
async fn leased_record(app: &TestApp, message_id: &str, late_effect: Option<bool>) -> i64 {
    let id: i64 = sqlx::query_scalar(
        "INSERT INTO dedup_records (consumer_group, message_id, message_type, status, handler_mode, attempts,
             max_attempts, payload_hash, source_broker, completed_at)
         VALUES ('notify-service', $1, 'ORDER.NOTIFY', 'succeeded', 'leased', $2, 5, '\\x00', 'rabbitmq', now())
         RETURNING id",
    )
    .bind(message_id)
    .bind(if late_effect.is_some() { 2 } else { 1 })
    .fetch_one(&app._db.pool)
    .await
    .unwrap();
    if let Some(late_effect) = late_effect {
        sqlx::query(
            "INSERT INTO record_attempts (record_id, attempt, worker, started_at, ended_at, outcome, taken_over_by,
                 late_effect)
             VALUES ($1, 1, 'host-a:1:0', now() - interval '5 seconds', now() - interval '3 seconds', 'lease_lost',
                     'host-b:2:0', $2),
                    ($1, 2, 'host-b:2:0', now() - interval '3 seconds', now() - interval '2 seconds', 'succeeded',
                     NULL, false)",
        )
        .bind(id)
        .bind(late_effect)
        .execute(&app._db.pool)
        .await
        .unwrap();
    }
    id
}

#[tokio::test]
async fn a_possible_double_effect_shows_on_the_record_in_the_api_and_on_the_overview() {
    let app = spawn_app().await;
    // What the engine writes when A's effect had run before its completion was refused.
    let id = leased_record(&app, "ORDER.NOTIFY.7:3", Some(true)).await;

    let record: Value = app.get(&format!("/api/v1/records/{id}")).await.json().await.unwrap();
    assert_eq!(record["possible_double_effect"], true, "{record}");
    assert_eq!(record["takeovers"], 1);
    let first = &record["attempts"][0];
    assert_eq!(
        (&first["outcome"], &first["taken_over_by"], &first["late_effect"]),
        (&json!("lease_lost"), &json!("host-b:2:0"), &json!(true))
    );
    let page = app.get(&format!("/records/{id}")).await.text().await.unwrap();
    assert!(page.contains("data-testid=\"double-effect\""), "the record page flags it");
    assert!(page.contains("taken over by host-b:2:0"), "and says by whom");
    let overview = app.get("/").await.text().await.unwrap();
    let stat = overview.split("data-testid=\"live-double-effects\"").nth(1).expect("the overview counts them");
    assert!(stat[..200.min(stat.len())].contains(">1<"), "one record: {}", &stat[..200.min(stat.len())]);

    // The count links to the records it counts, and the API filter lists exactly those: not a
    // record taken over without a late effect, nor one never taken over.
    assert!(
        stat[..600.min(stat.len())].contains("href=\"/records?flag=double_effect\""),
        "{}",
        &stat[..600.min(stat.len())]
    );
    leased_record(&app, "ORDER.NOTIFY.8:3", Some(false)).await;
    leased_record(&app, "ORDER.NOTIFY.9:3", None).await;
    let listed: Value = app.get("/api/v1/records?flag=double_effect").await.json().await.unwrap();
    let ids: Vec<&Value> = listed["rows"].as_array().unwrap().iter().map(|r| &r["id"]).collect();
    assert_eq!(ids, [&json!(id)], "exactly the flagged record: {listed}");
    let all: Value = app.get("/api/v1/records").await.json().await.unwrap();
    assert_eq!(all["rows"].as_array().unwrap().len(), 3, "without the flag, all three");
    let bad = app.get("/api/v1/records?flag=doubled").await;
    assert_eq!(bad.status(), StatusCode::BAD_REQUEST, "an unknown flag is refused");
    let page = app.get("/records?flag=double_effect").await.text().await.unwrap();
    assert!(page.contains("ORDER.NOTIFY.7:3") && !page.contains("ORDER.NOTIFY.8:3"), "the records page lists it alone");
}

#[tokio::test]
async fn hostile_requests_get_their_own_4xx_and_leave_an_audit_trail() {
    let app = spawn_app().await;
    // A console route asked with a method it does not have: 405 naming the ones it has.
    let wrong = app.anonymous().delete(app.url("/api/v1/records/1")).send().await.unwrap();
    assert_eq!(wrong.status(), StatusCode::METHOD_NOT_ALLOWED);
    assert_eq!(wrong.headers()["allow"], "GET");
    let wrong = app.anonymous().get(app.url("/api/fn/save_schedule")).send().await.unwrap();
    assert_eq!(wrong.status(), StatusCode::METHOD_NOT_ALLOWED);
    // A NUL in a sign-in name is a failed sign-in, audited like any other.
    let (response, _) = app.login_as("ad\0min", "whatever").await;
    assert_eq!(response.status(), StatusCode::UNAUTHORIZED);
    let failed: i64 = sqlx::query_scalar("SELECT count(*) FROM audit_log WHERE action = 'auth.login_failed'")
        .fetch_one(&app._db.pool)
        .await
        .unwrap();
    assert_eq!(failed, 1, "the attempt is in the audit log");
}
