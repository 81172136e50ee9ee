//! Conflicting copies in the console (issue 27, part 4): what the engine keeps for a reused id
//! shows on the record and its API, on the overview with a link to the records filter that lists
//! exactly those records, and a requeue is the operator's, once.

use dedup_engine::console::accounts::Role;
use serde_json::Value;

use crate::helpers::{TestApp, spawn_app, succeeded_record};

/// A succeeded CREATE record with a PAY's copy kept under its id; returns (record, conflict).
async fn reused(app: &TestApp, message_id: &str) -> (i64, i64) {
    let record = succeeded_record(app, message_id, "ORDER.CREATE").await;
    let conflict: i64 = sqlx::query_scalar(
        "INSERT INTO record_conflicts (record_id, consumer_group, message_id, kind, message_type, id_source, payload_hash,
             payload, headers, source_broker, source_exchange, source_routing_key, copies)
         VALUES ($1, 'order-service', $2, 'type', 'ORDER.PAY', 'key', '\\x01', convert_to('{\"pay\":\"<b>1</b>\"}', 'UTF8'),
                 '{}', 'rabbitmq', 'orders.events', 'order.pay', 3)
         RETURNING id",
    )
    .bind(record)
    .bind(message_id)
    .fetch_one(&app._db.pool)
    .await
    .unwrap();
    (record, conflict)
}

#[tokio::test]
async fn a_reused_id_shows_on_its_record_the_overview_and_the_filter_and_only_an_operator_requeues_it() {
    let app = spawn_app().await;
    let (record, conflict) = reused(&app, "order-7").await;
    succeeded_record(&app, "order-8", "ORDER.CREATE").await;

    // As a consumer whose ids.from read the Kafka key wrote it.
    sqlx::query("UPDATE dedup_records SET id_source = 'k' WHERE id = $1")
        .bind(record)
        .execute(&app._db.pool)
        .await
        .unwrap();
    let detail: Value = app.get(&format!("/api/v1/records/{record}")).await.json().await.unwrap();
    assert_eq!(detail["source"]["id_from"], "key", "the record says where its own id came from");
    let copy = &detail["conflicts"][0];
    assert_eq!(
        (&copy["kind"], &copy["message_type"], &copy["copies"]),
        (&"type".into(), &"ORDER.PAY".into(), &3.into())
    );
    assert_eq!(copy["payload_excerpt"], r#"{"pay":"<b>1</b>"}"#);
    let page = app.get(&format!("/records/{record}")).await.text().await.unwrap();
    assert!(page.contains("data-testid=\"conflicts\""), "the record page lists them");
    assert!(page.contains("id from key"), "and says where the reused id came from");
    assert!(page.contains("<dt>Id from</dt><dd>key</dd>"), "as the record's own facts do");
    assert!(page.contains("&lt;b&gt;1&lt;/b&gt;") && !page.contains("<b>1</b>"), "a payload is shown as text");

    let listed: Value = app.get("/api/v1/records?flag=conflict").await.json().await.unwrap();
    let ids: Vec<&str> = listed["rows"].as_array().unwrap().iter().map(|r| r["message_id"].as_str().unwrap()).collect();
    assert_eq!(ids, ["order-7"], "exactly the record with an open copy: {listed}");
    let overview = app.get("/").await.text().await.unwrap();
    let stat = overview.split("data-testid=\"live-conflicts\"").nth(1).expect("the overview counts them");
    assert!(stat[..200.min(stat.len())].contains(">1<"), "{}", &stat[..200.min(stat.len())]);
    assert!(stat[..600.min(stat.len())].contains("href=\"/records?flag=conflict\""));

    let url = app.url(&format!("/api/v1/conflicts/{conflict}/requeue"));
    let viewer = app.bearer(Role::Viewer).post(&url).send().await.unwrap();
    assert_eq!(viewer.status(), 403, "a viewer may not requeue");
    let unknown = app.bearer(Role::Operator).post(app.url("/api/v1/conflicts/999999/requeue")).send().await.unwrap();
    assert_eq!(unknown.status(), 404);
    let dismiss = app.url(&format!("/api/v1/conflicts/{conflict}/dismiss"));
    let operator = app.bearer(Role::Operator);
    let no_reason = operator.post(&dismiss).json(&serde_json::json!({ "reason": "" })).send().await.unwrap();
    assert_eq!(no_reason.status(), 400);
    let why = serde_json::json!({ "reason": "the producer's retry; its event ran" });
    assert_eq!(operator.post(&dismiss).json(&why).send().await.unwrap().status(), 204);
    let twice = operator.post(&url).send().await.unwrap();
    assert_eq!(twice.status(), 409, "settled once only");
    let listed: Value = app.get("/api/v1/records?flag=conflict").await.json().await.unwrap();
    assert_eq!(listed["rows"].as_array().unwrap().len(), 0, "a settled copy is no longer open");
    let detail: Value = app.get(&format!("/api/v1/records/{record}")).await.json().await.unwrap();
    let by = format!("user:{}", app.user(Role::Operator).name);
    assert_eq!(detail["conflicts"][0]["settled_by"], by.as_str(), "{detail}");
}
