//! The MySQL/MariaDB harness: a fresh database per case
//! ([`crate::testing::mysql::TestMySqlDatabase`]) and a [`MySqlStore`] on it. Text stored as
//! bytes (`VARBINARY`, `_bin`) is read through `CAST(… AS CHAR)`: sqlx reads binary columns as
//! bytes only.

use async_trait::async_trait;
use sqlx::Row;
use uuid::Uuid;

use chrono::{DateTime, Utc};

use crate::db::Schema;
use crate::runtime::EnginePool;
use super::MySqlStore;
use crate::store::conformance::{ConflictRow, Fixtures, Harness, PauseRowRead, RecordRow, sorted};
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

    fn engine_pool(&self) -> EnginePool {
        self.db.pool.clone().into()
    }
}

impl MySqlHarness {
    /// Kills the session holding the lock of `prefix` and `id`; returns once the lock is free.
    async fn lose_lock(&self, prefix: &str, id: i64) {
        use crate::store::mysql::named_lock::LOCK_NAME;
        let name_of = format!("SELECT CAST(IS_USED_LOCK({LOCK_NAME}) AS SIGNED)");
        let holder: Option<i64> =
            sqlx::query_scalar(&name_of).bind(prefix).bind(id).fetch_one(&self.db.pool).await.unwrap();
        let holder = holder.unwrap_or_else(|| panic!("no session held lock {prefix}{id}"));
        sqlx::query(&format!("KILL CONNECTION {holder}")).execute(&self.db.pool).await.unwrap();
        for _ in 0..500 {
            let held: Option<i64> =
                sqlx::query_scalar(&name_of).bind(prefix).bind(id).fetch_one(&self.db.pool).await.unwrap();
            if held.is_none() {
                return;
            }
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        panic!("lock {prefix}{id} outlived its session");
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

    async fn conflicts(&self, record_id: i64) -> Vec<ConflictRow> {
        let rows = sqlx::query(
            "SELECT CAST(kind AS CHAR) AS kind, CAST(message_type AS CHAR) AS message_type,
                    CAST(id_source AS CHAR) AS id_source, payload, CAST(headers AS CHAR) AS headers,
                    CAST(source_broker AS CHAR) AS source_broker, copies, settled_at IS NULL AS open
             FROM record_conflicts WHERE record_id = ?",
        )
        .bind(record_id)
        .fetch_all(&self.db.pool)
        .await
        .unwrap();
        sorted(
            rows.iter()
                .map(|row| ConflictRow {
                    kind: row.get("kind"),
                    message_type: row.get("message_type"),
                    id_source: row.get("id_source"),
                    payload: row.get("payload"),
                    headers: row.get("headers"),
                    source_broker: row.get("source_broker"),
                    copies: row.get("copies"),
                    open: row.get("open"),
                })
                .collect(),
        )
    }

    async fn settle_conflicts(&self, record_id: i64) {
        sqlx::query(
            "UPDATE record_conflicts SET settled_at = UTC_TIMESTAMP(6), settled_by = 'user:conformance'
             WHERE record_id = ? AND settled_at IS NULL",
        )
        .bind(record_id)
        .execute(&self.db.pool)
        .await
        .unwrap();
    }

    /// The fingerprint as MySQL keeps it: its 8 bytes, big-endian.
    async fn keep_fingerprint(&self, fingerprint: i64, first_seen_at: DateTime<Utc>) {
        sqlx::query(
            "INSERT INTO dedup_fingerprints (fingerprint, first_seen_at, forget_at)
             VALUES (?, ?, TIMESTAMPADD(YEAR, 1, UTC_TIMESTAMP(6)))",
        )
        .bind(fingerprint.to_be_bytes().to_vec())
        .bind(first_seen_at)
        .execute(&self.db.pool)
        .await
        .unwrap();
    }

    async fn late_duplicates(&self) -> Vec<(i64, i64, bool)> {
        sqlx::query_as("SELECT record_id, delay_ms, held FROM late_duplicates ORDER BY record_id")
            .fetch_all(&self.db.pool)
            .await
            .unwrap()
    }

    async fn set_pause_state(&self, group: &str, message_type: &str, state: &str) {
        sqlx::query(
            "UPDATE handler_pauses SET state = ?, since = UTC_TIMESTAMP(6), changed_by = 'user:conformance',
                    version = version + 1
             WHERE consumer_group = ? AND message_type = ?",
        )
        .bind(state)
        .bind(group)
        .bind(message_type)
        .execute(&self.db.pool)
        .await
        .unwrap();
    }

    async fn pause_row(&self, group: &str, message_type: &str) -> Option<PauseRowRead> {
        let row = sqlx::query(
            "SELECT CAST(state AS CHAR) AS state, CAST(kind AS CHAR) AS kind, version,
                    CAST(changed_by AS CHAR) AS changed_by, CAST(error_class AS CHAR) AS error_class, http_status
             FROM handler_pauses WHERE consumer_group = ? AND message_type = ?",
        )
        .bind(group)
        .bind(message_type)
        .fetch_optional(&self.db.pool)
        .await
        .unwrap()?;
        Some(PauseRowRead {
            state: row.get("state"),
            kind: row.get("kind"),
            version: row.get("version"),
            changed_by: row.get("changed_by"),
            error_class: row.get("error_class"),
            http_status: row.get("http_status"),
        })
    }

    async fn token_digests(&self) -> Vec<Vec<u8>> {
        sqlx::query_scalar("SELECT token_sha256 FROM api_tokens ORDER BY id").fetch_all(&self.db.pool).await.unwrap()
    }

    async fn lose_runner_lock(&self, job_id: i64) {
        self.lose_lock(crate::store::mysql::requeue_jobs::RUNNER_LOCK, job_id).await;
    }

    async fn lose_schedule_lock(&self, id: i64) {
        self.lose_lock(crate::store::mysql::cleanup::SCHEDULE_LOCK, id).await;
    }

    async fn age_record(&self, id: i64, days: i32) {
        sqlx::query(
            "UPDATE dedup_records SET first_seen_at = first_seen_at - INTERVAL ? DAY,
                 updated_at = updated_at - INTERVAL ? DAY, completed_at = completed_at - INTERVAL ? DAY
             WHERE id = ?",
        )
        .bind(days)
        .bind(days)
        .bind(days)
        .bind(id)
        .execute(&self.db.pool)
        .await
        .unwrap();
    }

    async fn make_schedule_due(&self, id: i64) {
        sqlx::query("UPDATE cleanup_schedules SET next_run_at = UTC_TIMESTAMP(6) - INTERVAL 1 SECOND WHERE id = ?")
            .bind(id)
            .execute(&self.db.pool)
            .await
            .unwrap();
    }
}
