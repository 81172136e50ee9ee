//! The PostgreSQL harness: a fresh database per case ([`crate::testing::TestDatabase`]) and a
//! [`PgStore`] on it.

use async_trait::async_trait;
use sqlx::Row;

use chrono::{DateTime, Utc};

use crate::runtime::EnginePool;
use super::PgStore;
use crate::store::conformance::{ConflictRow, Fixtures, Harness, PauseRowRead, RecordRow, sorted};
use crate::testing::TestDatabase;

/// [`Harness`] of [`PgStore`]. Its pool's `search_path` finds the engine's tables unqualified.
pub struct PgHarness {
    db: TestDatabase,
    store: PgStore,
}

#[async_trait(?Send)]
impl Harness for PgHarness {
    type Store = PgStore;
    const NAME: &'static str = "postgres";

    async fn fresh() -> Self {
        let db = TestDatabase::create().await;
        let store = PgStore::new(db.pool.clone(), &db.schema);
        Self { db, store }
    }

    fn store(&self) -> &PgStore {
        &self.store
    }

    fn engine_pool(&self) -> EnginePool {
        self.db.pool.clone().into()
    }
}

impl PgHarness {
    /// Terminates the session holding the advisory lock of `class` and `id`; returns once the
    /// lock is free.
    async fn lose_lock(&self, class: i32, id: i64) {
        let key = crate::store::postgres::named_lock::lock_key(id);
        let ended: Vec<bool> = sqlx::query_scalar(
            "SELECT pg_terminate_backend(pid) FROM pg_locks
             WHERE locktype = 'advisory' AND granted AND classid = $1::bigint::oid AND objid = $2::bigint::oid
               AND objsubid = 2 AND database = (SELECT oid FROM pg_database WHERE datname = current_database())",
        )
        .bind(i64::from(class))
        .bind(i64::from(key))
        .fetch_all(&self.db.pool)
        .await
        .unwrap();
        assert_eq!(ended, [true], "one session held lock ({class}, {id})");
        for _ in 0..500 {
            let held: bool = sqlx::query_scalar(
                "SELECT EXISTS (SELECT 1 FROM pg_locks WHERE locktype = 'advisory' AND classid = $1::bigint::oid
                                  AND objid = $2::bigint::oid AND objsubid = 2)",
            )
            .bind(i64::from(class))
            .bind(i64::from(key))
            .fetch_one(&self.db.pool)
            .await
            .unwrap();
            if !held {
                return;
            }
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        panic!("lock ({class}, {id}) outlived its session");
    }
}

#[async_trait(?Send)]
impl Fixtures for PgHarness {
    async fn record(&self, group: &str, message_id: &str) -> Option<RecordRow> {
        let row = sqlx::query(
            "SELECT id, status, message_type, attempts, max_attempts, version, duplicate_count, payload_conflicts, reentries,
                    lease_token, (lease_owner IS NOT NULL AND lease_token IS NOT NULL
                                  AND lease_expires_at IS NOT NULL) AS leased,
                    payload IS NOT NULL AS has_payload, last_error, error_class,
                    next_attempt_at IS NOT NULL AS retry_due, completed_at IS NOT NULL AS completed,
                    parked_at IS NOT NULL AS parked, id_source::text AS id_source
             FROM dedup_records WHERE consumer_group = $1 AND message_id = $2",
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
            lease_token: row.get("lease_token"),
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
        sqlx::query("UPDATE dedup_records SET lease_expires_at = now() - interval '1 second' WHERE id = $1")
            .bind(id)
            .execute(&self.db.pool)
            .await
            .unwrap();
    }

    async fn counted(&self) -> Vec<(String, String, i64)> {
        sorted(
            sqlx::query_as(
                "SELECT consumer_group, status, sum(n)::bigint FROM record_counts GROUP BY 1, 2 HAVING sum(n) <> 0",
            )
            .fetch_all(&self.db.pool)
            .await
            .unwrap(),
        )
    }

    async fn actual(&self) -> Vec<(String, String, i64)> {
        sorted(
            sqlx::query_as("SELECT consumer_group, status, count(*) FROM dedup_records GROUP BY 1, 2")
                .fetch_all(&self.db.pool)
                .await
                .unwrap(),
        )
    }

    async fn message_types(&self) -> Vec<String> {
        sorted(sqlx::query_scalar("SELECT message_type FROM message_types").fetch_all(&self.db.pool).await.unwrap())
    }

    async fn attempt_rows(&self, id: i64) -> Vec<(i32, Option<String>)> {
        sqlx::query_as("SELECT attempt, outcome FROM record_attempts WHERE record_id = $1 ORDER BY attempt, id")
            .bind(id)
            .fetch_all(&self.db.pool)
            .await
            .unwrap()
    }

    async fn late_effects(&self, id: i64) -> Vec<i32> {
        sqlx::query_scalar("SELECT attempt FROM record_attempts WHERE record_id = $1 AND late_effect ORDER BY attempt")
            .bind(id)
            .fetch_all(&self.db.pool)
            .await
            .unwrap()
    }

    async fn lease_remaining_ms(&self, id: i64) -> f64 {
        sqlx::query_scalar(
            "SELECT (extract(epoch FROM lease_expires_at - clock_timestamp()) * 1000)::float8 FROM dedup_records
             WHERE id = $1",
        )
        .bind(id)
        .fetch_one(&self.db.pool)
        .await
        .unwrap()
    }

    async fn conflicts(&self, record_id: i64) -> Vec<ConflictRow> {
        let rows = sqlx::query(
            "SELECT kind, message_type, id_source, payload, headers::text AS headers, source_broker, copies,
                    settled_at IS NULL AS open
             FROM record_conflicts WHERE record_id = $1",
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
            "UPDATE record_conflicts SET settled_at = now(), settled_by = 'user:conformance'
             WHERE record_id = $1 AND settled_at IS NULL",
        )
        .bind(record_id)
        .execute(&self.db.pool)
        .await
        .unwrap();
    }

    async fn keep_fingerprint(&self, fingerprint: i64, first_seen_at: DateTime<Utc>) {
        sqlx::query(
            "INSERT INTO dedup_fingerprints (fingerprint, first_seen_at, forget_at) VALUES ($1, $2, now() + interval '1 year')",
        )
        .bind(fingerprint)
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
            "UPDATE handler_pauses SET state = $3, since = now(), changed_by = 'user:conformance', version = version + 1
             WHERE consumer_group = $1 AND message_type = $2",
        )
        .bind(group)
        .bind(message_type)
        .bind(state)
        .execute(&self.db.pool)
        .await
        .unwrap();
    }

    async fn pause_row(&self, group: &str, message_type: &str) -> Option<PauseRowRead> {
        let row = sqlx::query(
            "SELECT state, kind, version, changed_by, error_class, http_status FROM handler_pauses
             WHERE consumer_group = $1 AND message_type = $2",
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
        self.lose_lock(crate::store::postgres::requeue_jobs::RUNNER_LOCK_KEY, job_id).await;
    }

    async fn lose_schedule_lock(&self, id: i64) {
        self.lose_lock(crate::store::postgres::cleanup::CLEANUP_LOCK_KEY, id).await;
    }

    async fn age_record(&self, id: i64, days: i32) {
        sqlx::query(
            "UPDATE dedup_records SET first_seen_at = first_seen_at - make_interval(days => $2),
                 updated_at = updated_at - make_interval(days => $2), completed_at = completed_at - make_interval(days => $2)
             WHERE id = $1",
        )
        .bind(id)
        .bind(days)
        .execute(&self.db.pool)
        .await
        .unwrap();
    }

    async fn make_schedule_due(&self, id: i64) {
        sqlx::query("UPDATE cleanup_schedules SET next_run_at = now() - interval '1 second' WHERE id = $1")
            .bind(id)
            .execute(&self.db.pool)
            .await
            .unwrap();
    }
}
