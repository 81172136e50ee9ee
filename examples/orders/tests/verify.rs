//! `verify` (issue 17): a run that has recorded no message yet is not "OK", and records parked
//! under `hold` are counted on their own, not as settled.

use std::time::Duration;

use dedup_engine::testing::TestDatabase;
use dedup_example_orders::verify::verify;

async fn database() -> TestDatabase {
    let db = TestDatabase::create().await;
    dedup_example_orders::migrate(&db.pool).await.unwrap();
    db
}

async fn run(db: &TestDatabase, finished: bool) -> i64 {
    sqlx::query_scalar(
        "INSERT INTO shop.simulation_runs (parameters, finished_at)
         VALUES ('{\"orders\": 1, \"order_prefix\": \"T-\"}', CASE WHEN $1 THEN now() END) RETURNING id",
    )
    .bind(finished)
    .fetch_one(&db.pool)
    .await
    .unwrap()
}

#[tokio::test]
async fn a_run_that_recorded_no_message_is_a_violation_not_ok() {
    let db = database().await;
    let id = run(&db, false).await;
    let report = verify(&db.pool, &db.schema, Some(id), Duration::from_secs(1)).await.unwrap();
    assert!(!report.ok, "{report:?}");
    assert_eq!(report.messages, 0);
    assert!(report.violations.iter().any(|v| v.contains("recorded no message")), "{:?}", report.violations);
}

#[tokio::test]
async fn records_parked_under_hold_are_counted_apart() {
    let db = database().await;
    let id = run(&db, true).await;
    sqlx::query(
        "INSERT INTO shop.simulation_messages (run_id, consumer_group, message_id, poison, copies)
         VALUES ($1, 'notify-service', 'ORDER.NOTIFY.T-1:3', false, 2)",
    )
    .bind(id)
    .execute(&db.pool)
    .await
    .unwrap();
    sqlx::query(
        "INSERT INTO dedup_records (consumer_group, message_id, message_type, status, handler_mode, attempts,
             max_attempts, lease_owner, lease_token, lease_expires_at, payload_hash, source_broker, parked_at)
         VALUES ('notify-service', 'ORDER.NOTIFY.T-1:3', 'ORDER.NOTIFY', 'processing', 'leased', 1, 5, 'w',
                 gen_random_uuid(), now() - interval '1 minute', '\\x00', 'rabbitmq', now())",
    )
    .execute(&db.pool)
    .await
    .unwrap();
    let report = verify(&db.pool, &db.schema, Some(id), Duration::from_secs(1)).await.unwrap();
    assert_eq!((report.messages, report.parked, report.processing), (1, 1, 0), "{report:?}");
}
