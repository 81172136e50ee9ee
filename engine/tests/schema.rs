//! Start-up schema checks against a real PostgreSQL.

use dedup_engine::db::{PoolSettings, SchemaError};
use dedup_engine::store::postgres;
use dedup_engine::testing::{TestDatabase, admin_url, database_url};

#[tokio::test]
async fn migrations_create_the_dedup_table_with_its_unique_key() {
    let db = TestDatabase::create().await;
    postgres::verify_schema(&db.pool, &db.schema).await.expect("fresh schema verifies");
    // Migrating twice is a no-op.
    postgres::migrate(&db.pool, &db.schema).await.expect("second migrate is a no-op");
}

#[tokio::test]
async fn start_up_refuses_a_dedup_table_without_its_unique_constraint() {
    let db = TestDatabase::create().await;
    sqlx::query("ALTER TABLE dedup_records DROP CONSTRAINT dedup_records_group_message_key")
        .execute(&db.pool)
        .await
        .unwrap();
    let err = postgres::verify_schema(&db.pool, &db.schema).await.unwrap_err();
    assert!(matches!(err, SchemaError::MissingUniqueConstraint { .. }), "{err}");
    assert!(err.to_string().contains("refusing to start"), "{err}");

    // A UNIQUE index-backed constraint under another name is accepted.
    sqlx::query("ALTER TABLE dedup_records ADD CONSTRAINT other_name UNIQUE (message_id, consumer_group)")
        .execute(&db.pool)
        .await
        .unwrap();
    postgres::verify_schema(&db.pool, &db.schema).await.expect("constraint found by columns, not by name");
}

#[tokio::test]
async fn a_claim_without_a_lease_is_rejected_by_the_schema() {
    let db = TestDatabase::create().await;
    let err = sqlx::query(
        "INSERT INTO dedup_records (consumer_group, message_id, message_type, status, handler_mode,
                                    max_attempts, payload_hash, source_broker)
         VALUES ('g', 'ORDER.PAY.1:1', 'ORDER.PAY', 'processing', 'leased', 5, '\\x00', 'rabbitmq')",
    )
    .execute(&db.pool)
    .await
    .unwrap_err();
    let code = err.as_database_error().and_then(|e| e.constraint()).map(str::to_owned);
    assert_eq!(code.as_deref(), Some("dedup_records_lease_check"));
}

#[tokio::test]
async fn connect_creates_a_missing_database() {
    let name = format!("dct_missing_{}", uuid::Uuid::new_v4().simple());
    let url = database_url(&admin_url(), &name);
    let pool = postgres::connect(&url, &PoolSettings::default()).await.expect("database created on demand");
    let current: String = sqlx::query_scalar("SELECT current_database()").fetch_one(&pool).await.unwrap();
    assert_eq!(current, name);
    pool.close().await;
    let admin = postgres::connect(&admin_url(), &PoolSettings::default()).await.unwrap();
    sqlx::query(&format!("DROP DATABASE {name} WITH (FORCE)")).execute(&admin).await.unwrap();
}

#[tokio::test]
async fn an_unreachable_database_is_named_with_a_redacted_url() {
    let settings = PoolSettings { acquire_timeout: std::time::Duration::from_secs(2), ..PoolSettings::default() };
    let err = postgres::connect("postgres://app:s3cret@127.0.0.1:1/x", &settings).await.unwrap_err();
    let text = err.to_string();
    assert!(text.starts_with("PostgreSQL is unreachable at postgres://app:***@127.0.0.1:1/x"), "{text}");
    assert!(!text.contains("s3cret"), "{text}");
    assert!(!text.contains("pg_ctlcluster"), "how to start it is the host's to say: {text}");
}
