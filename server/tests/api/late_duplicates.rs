//! Late duplicates in the console (issue 27, part 1): what the engine writes for one — a record
//! and its note — shows on the Cleanup page and its API, on the overview with a link to the
//! records filter that lists exactly them, and on the record; schedules say how long they keep
//! fingerprints.

use dedup_engine::console::accounts::Role;
use serde_json::{Value, json};

use crate::helpers::{TestApp, spawn_app, succeeded_record};

/// A record created by a late duplicate held (`held`) or processed, first seen 40 days before
/// it; returns its id.
async fn late_record(app: &TestApp, message_id: &str, held: bool) -> i64 {
    let id = succeeded_record(app, message_id, "ORDER.PAY").await;
    sqlx::query(
        "INSERT INTO late_duplicates (record_id, consumer_group, message_id, first_seen_at, delay_ms, held)
         VALUES ($1, 'order-service', $2, now() - interval '40 days', 40 * 86400000::bigint, $3)",
    )
    .bind(id)
    .bind(message_id)
    .bind(held)
    .execute(&app._db.pool)
    .await
    .unwrap();
    id
}

#[tokio::test]
async fn late_duplicates_show_on_the_cleanup_page_the_overview_the_records_filter_and_the_record() {
    let app = spawn_app().await;
    let late = late_record(&app, "ORDER.PAY.L1:1", false).await;
    late_record(&app, "ORDER.PAY.L2:1", true).await;
    succeeded_record(&app, "ORDER.PAY.N1:1", "ORDER.PAY").await;

    let cleanup: Value = app.get("/api/v1/cleanup").await.json().await.unwrap();
    let group = &cleanup["late_duplicates"][0];
    assert_eq!(
        (&group["consumer_group"], &group["count"], &group["held"]),
        (&json!("order-service"), &json!(2), &json!(1))
    );
    assert_eq!(group["longest_delay_ms"], 40 * 86_400_000i64);
    assert_eq!(cleanup["longest_duplicate_delay_ms"], 40 * 86_400_000i64, "the advice reads them");
    let html = app.get("/cleanup").await.text().await.unwrap();
    assert!(html.contains("2 late duplicates"), "{html}");
    assert!(html.contains("href=\"/records?group=order-service&amp;flag=late_duplicate\""), "{html}");

    let overview = app.get("/").await.text().await.unwrap();
    let stat = overview.split("data-testid=\"live-late-duplicates\"").nth(1).expect("the overview counts them");
    assert!(stat[..200.min(stat.len())].contains(">2<"), "{}", &stat[..200.min(stat.len())]);
    assert!(stat[..600.min(stat.len())].contains("href=\"/records?flag=late_duplicate\""));

    let listed: Value = app.get("/api/v1/records?flag=late_duplicate").await.json().await.unwrap();
    let ids: Vec<&str> = listed["rows"].as_array().unwrap().iter().map(|r| r["message_id"].as_str().unwrap()).collect();
    assert_eq!(ids, ["ORDER.PAY.L2:1", "ORDER.PAY.L1:1"], "exactly the late ones, newest first: {listed}");

    let record: Value = app.get(&format!("/api/v1/records/{late}")).await.json().await.unwrap();
    assert_eq!(record["late_duplicate"]["delay_ms"], 40 * 86_400_000i64, "{record}");
    assert_eq!(record["late_duplicate"]["held"], false);
    let page = app.get(&format!("/records/{late}")).await.text().await.unwrap();
    assert!(page.contains("data-testid=\"late-duplicate\""), "the record page says it");
}

#[tokio::test]
async fn schedules_keep_fingerprints_ten_times_their_retention_unless_told() {
    let app = spawn_app().await;
    let admin = app.bearer(Role::Admin);
    let save = |body: Value| admin.post(app.url("/api/v1/cleanup/schedules")).json(&body).send();
    let default = save(json!({ "name": "nightly", "retention_days": 14 })).await.unwrap();
    assert_eq!(default.status(), 200, "{:?}", default.text().await);
    let own = save(json!({ "name": "short", "fingerprint_days": 0 })).await.unwrap();
    assert_eq!(own.status(), 200);
    let bad = save(json!({ "name": "bad", "fingerprint_days": 40000 })).await.unwrap();
    assert_eq!(bad.status(), 400);
    assert!(bad.text().await.unwrap().contains("fingerprints are kept 0 to 36500 days"));

    let cleanup: Value = app.get("/api/v1/cleanup").await.json().await.unwrap();
    let horizons: Vec<(&str, i64)> = cleanup["schedules"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| (s["settings"]["name"].as_str().unwrap(), s["fingerprint_horizon_days"].as_i64().unwrap()))
        .collect();
    assert_eq!(horizons, [("nightly", 140), ("short", 0)]);
}
