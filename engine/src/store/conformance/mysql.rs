//! The MySQL/MariaDB harness: a fresh database per case
//! ([`crate::testing::mysql::TestMySqlDatabase`]) and a [`MySqlStore`] on it. Text stored as
//! bytes (`VARBINARY`, `_bin`) is read through `CAST(… AS CHAR)`: sqlx reads binary columns as
//! bytes only.

use async_trait::async_trait;
use sqlx::Row;
use uuid::Uuid;

use super::{Fixtures, Harness, RecordRow, sorted};
use crate::db::Schema;
use crate::store::mysql::MySqlStore;
use crate::testing::mysql::TestMySqlDatabase;

/// [`Harness`] of [`MySqlStore`].
pub struct MySqlHarness {
    db: TestMySqlDatabase,
    store: MySqlStore,
}

#[async_trait(?Send)]
impl Harness for MySqlHarness {
    type Store = MySqlStore;
    const NAME: &'static str = "mysql";

    async fn fresh() -> Self {
        let db = TestMySqlDatabase::create().await;
        let schema = Schema::parse(db.name.clone()).expect("a test database's name is a schema name");
        let store = MySqlStore::new(db.pool.clone(), &schema);
        Self { db, store }
    }

    fn store(&self) -> &MySqlStore {
        &self.store
    }
}

#[async_trait(?Send)]
impl Fixtures for MySqlHarness {
    async fn record(&self, group: &str, message_id: &str) -> Option<RecordRow> {
        let row = sqlx::query(
            "SELECT id, CAST(status AS CHAR) AS status, CAST(message_type AS CHAR) AS message_type, attempts,
                    max_attempts, version, duplicate_count, payload_conflicts, reentries, lease_token,
                    (lease_owner IS NOT NULL AND lease_token IS NOT NULL AND lease_expires_at IS NOT NULL) AS leased,
                    payload IS NOT NULL AS has_payload, CAST(last_error AS CHAR) AS last_error,
                    CAST(error_class AS CHAR) AS error_class, next_attempt_at IS NOT NULL AS retry_due,
                    completed_at IS NOT NULL AS completed, parked_at IS NOT NULL AS parked,
                    CAST(id_source AS CHAR) AS id_source
             FROM dedup_records WHERE consumer_group = ? AND message_id = ?",
        )
        .bind(group)
        .bind(message_id)
        .fetch_optional(&self.db.pool)
        .await
        .unwrap()?;
        Some(RecordRow {
            id: row.get("id"),
            status: row.get("status"),
            message_type: row.get("message_type"),
            attempts: row.get("attempts"),
            max_attempts: row.get("max_attempts"),
            version: row.get("version"),
            duplicate_count: row.get("duplicate_count"),
            payload_conflicts: row.get("payload_conflicts"),
            reentries: row.get("reentries"),
            lease_token: row.get::<Option<Uuid>, _>("lease_token"),
            leased: row.get("leased"),
            has_payload: row.get("has_payload"),
            last_error: row.get("last_error"),
            error_class: row.get("error_class"),
            retry_due: row.get("retry_due"),
            completed: row.get("completed"),
            parked: row.get("parked"),
            id_source: row.get("id_source"),
        })
    }

    async fn expire_lease(&self, id: i64) {
        sqlx::query("UPDATE dedup_records SET lease_expires_at = TIMESTAMPADD(SECOND, -1, UTC_TIMESTAMP(6)) WHERE id = ?")
            .bind(id)
            .execute(&self.db.pool)
            .await
            .unwrap();
    }

    async fn counted(&self) -> Vec<(String, String, i64)> {
        sorted(
            sqlx::query_as(
                "SELECT CAST(consumer_group AS CHAR), CAST(status AS CHAR), CAST(SUM(n) AS SIGNED) FROM record_counts
                 GROUP BY consumer_group, status HAVING SUM(n) <> 0",
            )
            .fetch_all(&self.db.pool)
            .await
            .unwrap(),
        )
    }

    async fn actual(&self) -> Vec<(String, String, i64)> {
        sorted(
            sqlx::query_as(
                "SELECT CAST(consumer_group AS CHAR), CAST(status AS CHAR), COUNT(*) FROM dedup_records
                 GROUP BY consumer_group, status",
            )
            .fetch_all(&self.db.pool)
            .await
            .unwrap(),
        )
    }

    async fn message_types(&self) -> Vec<String> {
        sorted(
            sqlx::query_scalar("SELECT CAST(message_type AS CHAR) FROM message_types")
                .fetch_all(&self.db.pool)
                .await
                .unwrap(),
        )
    }

    async fn attempt_rows(&self, id: i64) -> Vec<(i32, Option<String>)> {
        sqlx::query_as(
            "SELECT attempt, CAST(outcome AS CHAR) FROM record_attempts WHERE record_id = ? ORDER BY attempt, id",
        )
        .bind(id)
        .fetch_all(&self.db.pool)
        .await
        .unwrap()
    }

    async fn late_effects(&self, id: i64) -> Vec<i32> {
        sqlx::query_scalar("SELECT attempt FROM record_attempts WHERE record_id = ? AND late_effect ORDER BY attempt")
            .bind(id)
            .fetch_all(&self.db.pool)
            .await
            .unwrap()
    }

    async fn lease_remaining_ms(&self, id: i64) -> f64 {
        sqlx::query_scalar(
            "SELECT CAST(TIMESTAMPDIFF(MICROSECOND, UTC_TIMESTAMP(6), lease_expires_at) AS DOUBLE) / 1000
             FROM dedup_records WHERE id = ?",
        )
        .bind(id)
        .fetch_one(&self.db.pool)
        .await
        .unwrap()
    }
}
