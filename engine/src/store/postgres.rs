//! The PostgreSQL dedup store.
//!
//! PostgreSQL aborts the whole transaction on a unique violation, so a claim never inserts and
//! catches the error: it is one `INSERT ... ON CONFLICT (consumer_group, message_id) DO UPDATE
//! ... WHERE <claimable> RETURNING`. `ON CONFLICT DO UPDATE` locks the conflicting row even when
//! the `WHERE` is false, so a concurrent duplicate waits for the holder's transaction and then
//! judges the committed state.

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use sqlx::types::Json;
use sqlx::{PgConnection, PgPool, Postgres, Row};

use super::{
    ClaimOutcome, ClaimRequest, ClaimedRecord, DedupStore, ExistingRecord, FailureOutcome, FailureReport, Lease,
    PoisonRecord, StoreError,
};
use crate::record::{HandlerMode, RecordStatus};

/// The PostgreSQL implementation of [`DedupStore`]. Cheap to clone.
#[derive(Debug, Clone)]
pub struct PgStore {
    pool: PgPool,
}

impl PgStore {
    /// A store on `pool` (migrated with [`crate::db::migrate`]).
    pub fn new(pool: PgPool) -> Self {
        Self { pool }
    }
}

/// Claim: insert, or take over a claimable record; for leased handlers the same statement
/// opens the attempt row (a transactional attempt is written when it ends, in its transaction).
/// `$17` says whether an expired lease may be reclaimed. `prior` reads the status the statement
/// started from, only to tell a lease takeover apart for metrics.
macro_rules! claim_sql {
    ($attempt_cte:literal) => {
        concat!(
            r#"
WITH prior AS (
    SELECT status FROM dedup_records WHERE consumer_group = $1 AND message_id = $2
), claimed AS (
    INSERT INTO dedup_records AS r (
        consumer_group, message_id, message_type, status, handler_mode, attempts, max_attempts,
        lease_owner, lease_token, lease_expires_at, payload_hash, payload, headers, content_type,
        source_broker, source_exchange, source_routing_key, source_queue)
    VALUES ($1, $2, $3, 'processing', $4, 1, $5,
            $6, $7, now() + $8 * interval '1 millisecond', $9, $10, $11, $12,
            $13, $14, $15, $16)
    ON CONFLICT (consumer_group, message_id) DO UPDATE SET
        status = 'processing',
        attempts = r.attempts + 1,
        reentries = r.reentries + CASE WHEN r.status = 'processing' THEN 1 ELSE 0 END,
        handler_mode = EXCLUDED.handler_mode,
        lease_owner = EXCLUDED.lease_owner,
        lease_token = EXCLUDED.lease_token,
        lease_expires_at = EXCLUDED.lease_expires_at,
        next_attempt_at = NULL,
        parked_at = NULL,
        updated_at = now()
    WHERE (r.status = 'failed' AND r.attempts < r.max_attempts)
       OR ($17 AND r.status = 'processing' AND r.lease_expires_at < now())
    RETURNING r.id, r.attempts, r.max_attempts, (r.xmax = 0) AS created, r.first_seen_at
)"#,
            $attempt_cte,
            r#"
SELECT c.id, c.attempts, c.max_attempts, c.created, c.first_seen_at, now() AS claimed_at,
       COALESCE((SELECT status FROM prior) = 'processing', false) AS took_over
FROM claimed c
"#
        )
    };
}
const CLAIM_TX_SQL: &str = claim_sql!("");
const CLAIM_LEASED_SQL: &str = claim_sql!(
    r#", attempt AS (
    INSERT INTO record_attempts (record_id, attempt, worker, started_at)
    SELECT id, attempts, $6, now() FROM claimed
)"#
);

/// The duplicate check after a claim found nothing claimable: counts the delivery on the
/// record, flags a payload conflict, parks a delivery of a stuck record (the claim would have
/// taken it if reclaim were allowed) and reports the record's state.
const NOTE_DUPLICATE_SQL: &str = r#"
UPDATE dedup_records SET
    duplicate_count = duplicate_count + 1,
    last_duplicate_at = now(),
    payload_conflicts = payload_conflicts + CASE WHEN payload_hash = $3 THEN 0 ELSE 1 END,
    parked_at = CASE WHEN status = 'processing' AND lease_expires_at < now() THEN now() ELSE parked_at END
WHERE consumer_group = $1 AND message_id = $2
RETURNING id, status, lease_expires_at,
          COALESCE(lease_expires_at < now(), false) AS lease_expired,
          payload_hash = $3 AS same_payload,
          (extract(epoch FROM now() - first_seen_at) * 1000)::bigint AS delay_ms,
          (status = 'processing' AND lease_expires_at < now()) AS parked
"#;

/// Completion: `succeeded`, lease and stored payload cleared, attempt closed.
macro_rules! complete_sql {
    ($attempt_cte:literal) => {
        concat!(
            r#"
WITH done AS (
    UPDATE dedup_records SET
        status = 'succeeded', lease_owner = NULL, lease_token = NULL, lease_expires_at = NULL,
        completed_at = now(), updated_at = now(), next_attempt_at = NULL, parked_at = NULL,
        payload = NULL, headers = NULL
    WHERE id = $1 AND status = 'processing' AND lease_token = $2
    RETURNING id, attempts
), attempt AS ("#,
            $attempt_cte,
            r#")
SELECT count(*) FROM done
"#
        )
    };
}
/// Transactional attempts are written when they end (their claim may be rolled back); `$3` is
/// the worker, `$4` when the claim was made.
const COMPLETE_TX_SQL: &str = complete_sql!(
    "INSERT INTO record_attempts (record_id, attempt, worker, started_at, ended_at, outcome)
     SELECT id, attempts, $3, $4, now(), 'succeeded' FROM done"
);
/// Leased attempts were opened by the claim.
const COMPLETE_LEASED_SQL: &str = complete_sql!(
    "UPDATE record_attempts a SET ended_at = now(), outcome = 'succeeded'
     FROM done WHERE a.record_id = done.id AND a.attempt = done.attempts AND a.ended_at IS NULL"
);

const FAIL_ROLLED_BACK_SQL: &str = r#"
WITH failed AS (
    INSERT INTO dedup_records AS r (
        consumer_group, message_id, message_type, status, handler_mode, attempts, max_attempts,
        last_error, error_class, next_attempt_at, payload_hash, payload, headers, content_type,
        source_broker, source_exchange, source_routing_key, source_queue)
    VALUES ($1, $2, $3, $4, 'transactional', $5, $6, $7, $8,
            CASE WHEN $4 = 'failed' THEN now() + $9 * interval '1 millisecond' END,
            $10, $11, $12, $13, $14, $15, $16, $17)
    ON CONFLICT (consumer_group, message_id) DO UPDATE SET
        status = EXCLUDED.status,
        attempts = EXCLUDED.attempts,
        last_error = EXCLUDED.last_error,
        error_class = EXCLUDED.error_class,
        next_attempt_at = EXCLUDED.next_attempt_at,
        updated_at = now()
    WHERE r.status = 'failed' AND r.attempts = EXCLUDED.attempts - 1
    RETURNING id, attempts, status
), attempt AS (
    INSERT INTO record_attempts (record_id, attempt, worker, started_at, ended_at, outcome, error)
    SELECT id, attempts, $18, $19, now(), status, $7 FROM failed
)
SELECT status FROM failed
"#;

const FAIL_LEASED_SQL: &str = r#"
WITH failed AS (
    UPDATE dedup_records SET
        status = $3, lease_owner = NULL, lease_token = NULL, lease_expires_at = NULL,
        last_error = $4, error_class = $5,
        next_attempt_at = CASE WHEN $3 = 'failed' THEN now() + $6 * interval '1 millisecond' END,
        updated_at = now()
    WHERE id = $1 AND status = 'processing' AND lease_token = $2
    RETURNING id, attempts
), attempt AS (
    UPDATE record_attempts a SET ended_at = now(), outcome = $3, error = $4
    FROM failed WHERE a.record_id = failed.id AND a.attempt = failed.attempts AND a.ended_at IS NULL
)
SELECT count(*) FROM failed
"#;

const POISON_SQL: &str = r#"
INSERT INTO dedup_records AS r (
    consumer_group, message_id, message_type, status, handler_mode, attempts, max_attempts,
    last_error, error_class, payload_hash, payload, payload_truncated, headers, content_type,
    source_broker, source_exchange, source_routing_key, source_queue)
VALUES ($1, $2, $3, 'dead', NULL, 0, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15)
ON CONFLICT (consumer_group, message_id) DO UPDATE SET
    duplicate_count = r.duplicate_count + 1,
    last_duplicate_at = now(),
    payload_conflicts = r.payload_conflicts + CASE WHEN r.payload_hash = EXCLUDED.payload_hash THEN 0 ELSE 1 END
RETURNING id, (xmax = 0) AS created
"#;

/// Whether a failure makes the record dead.
fn failure_status(failure: &FailureReport<'_>) -> RecordStatus {
    if failure.permanent || failure.claim.attempt >= failure.claim.max_attempts {
        RecordStatus::Dead
    } else {
        RecordStatus::Failed
    }
}

#[async_trait]
impl DedupStore for PgStore {
    type Db = Postgres;

    fn pool(&self) -> &PgPool {
        &self.pool
    }

    async fn claim(&self, conn: &mut PgConnection, req: &ClaimRequest<'_>) -> Result<ClaimOutcome, StoreError> {
        let sql = match req.mode {
            HandlerMode::Transactional => CLAIM_TX_SQL,
            HandlerMode::Leased => CLAIM_LEASED_SQL,
        };
        let m = req.message;
        let row = sqlx::query(sql)
            .bind(req.group.as_str())
            .bind(req.message_id.as_str())
            .bind(req.message_type)
            .bind(req.mode.as_str())
            .bind(req.max_attempts)
            .bind(&req.lease.owner)
            .bind(req.lease.token)
            .bind(req.lease.millis())
            .bind(req.payload_hash)
            .bind(&m.payload)
            .bind(Json(&m.headers))
            .bind(m.content_type.as_deref())
            .bind(m.broker.as_str())
            .bind(m.source.exchange.as_deref())
            .bind(m.source.routing_key.as_deref())
            .bind(m.source.queue.as_deref())
            .bind(req.reclaim_expired)
            .fetch_optional(&mut *conn)
            .await?;
        if let Some(row) = row {
            return Ok(ClaimOutcome::Claimed(ClaimedRecord {
                id: row.try_get("id")?,
                attempt: row.try_get("attempts")?,
                max_attempts: row.try_get("max_attempts")?,
                created: row.try_get("created")?,
                took_over: row.try_get("took_over")?,
                first_seen_at: row.try_get("first_seen_at")?,
                claimed_at: row.try_get("claimed_at")?,
                lease_token: req.lease.token,
            }));
        }
        let row = sqlx::query(NOTE_DUPLICATE_SQL)
            .bind(req.group.as_str())
            .bind(req.message_id.as_str())
            .bind(req.payload_hash)
            .fetch_optional(&mut *conn)
            .await?;
        match row {
            Some(row) => {
                let status: String = row.try_get("status")?;
                Ok(ClaimOutcome::Existing(ExistingRecord {
                    id: row.try_get("id")?,
                    status: status.parse().map_err(|e| sqlx::Error::Decode(Box::new(e)))?,
                    lease_expired: row.try_get("lease_expired")?,
                    lease_expires_at: row.try_get("lease_expires_at")?,
                    same_payload: row.try_get("same_payload")?,
                    delay_ms: row.try_get::<Option<i64>, _>("delay_ms")?.unwrap_or_default(),
                    parked: row.try_get::<Option<bool>, _>("parked")?.unwrap_or(false),
                }))
            }
            // Deleted between the two statements (cleanup of an old succeeded record): the
            // message is new again as far as the table knows; claim afresh.
            None => Box::pin(self.claim(conn, req)).await,
        }
    }

    async fn complete(
        &self,
        conn: &mut PgConnection,
        claim: &ClaimedRecord,
        lease: &Lease,
        mode: HandlerMode,
    ) -> Result<bool, StoreError> {
        let query = match mode {
            HandlerMode::Transactional => sqlx::query_scalar(COMPLETE_TX_SQL)
                .bind(claim.id)
                .bind(claim.lease_token)
                .bind(&lease.owner)
                .bind(claim.claimed_at),
            HandlerMode::Leased => sqlx::query_scalar(COMPLETE_LEASED_SQL).bind(claim.id).bind(claim.lease_token),
        };
        let count: i64 = query.fetch_one(&mut *conn).await?;
        Ok(count == 1)
    }

    async fn fail_rolled_back(
        &self,
        conn: &mut PgConnection,
        req: &ClaimRequest<'_>,
        failure: &FailureReport<'_>,
    ) -> Result<FailureOutcome, StoreError> {
        let status = failure_status(failure);
        let m = req.message;
        let stored: Option<String> = sqlx::query_scalar(FAIL_ROLLED_BACK_SQL)
            .bind(req.group.as_str())
            .bind(req.message_id.as_str())
            .bind(req.message_type)
            .bind(status.as_str())
            .bind(failure.claim.attempt)
            .bind(failure.claim.max_attempts)
            .bind(failure.error)
            .bind(failure.error_class)
            .bind(failure.retry_delay_ms)
            .bind(req.payload_hash)
            .bind(&m.payload)
            .bind(Json(&m.headers))
            .bind(m.content_type.as_deref())
            .bind(m.broker.as_str())
            .bind(m.source.exchange.as_deref())
            .bind(m.source.routing_key.as_deref())
            .bind(m.source.queue.as_deref())
            .bind(&failure.lease.owner)
            .bind(failure.claim.claimed_at)
            .fetch_optional(&mut *conn)
            .await?;
        Ok(match stored.as_deref() {
            Some("dead") => FailureOutcome::Dead,
            Some(_) => FailureOutcome::Failed,
            None => FailureOutcome::Superseded,
        })
    }

    async fn fail_leased(
        &self,
        conn: &mut PgConnection,
        failure: &FailureReport<'_>,
    ) -> Result<FailureOutcome, StoreError> {
        let status = failure_status(failure);
        let count: i64 = sqlx::query_scalar(FAIL_LEASED_SQL)
            .bind(failure.claim.id)
            .bind(failure.claim.lease_token)
            .bind(status.as_str())
            .bind(failure.error)
            .bind(failure.error_class)
            .bind(failure.retry_delay_ms)
            .fetch_one(&mut *conn)
            .await?;
        Ok(match (count, status) {
            (0, _) => FailureOutcome::Superseded,
            (_, RecordStatus::Dead) => FailureOutcome::Dead,
            _ => FailureOutcome::Failed,
        })
    }

    async fn extend_lease(
        &self,
        conn: &mut PgConnection,
        claim: &ClaimedRecord,
        lease: &Lease,
    ) -> Result<bool, StoreError> {
        let done = sqlx::query(
            "UPDATE dedup_records SET lease_expires_at = now() + $3 * interval '1 millisecond'
             WHERE id = $1 AND status = 'processing' AND lease_token = $2",
        )
        .bind(claim.id)
        .bind(claim.lease_token)
        .bind(lease.millis())
        .execute(&mut *conn)
        .await?;
        Ok(done.rows_affected() == 1)
    }

    async fn record_poison(&self, conn: &mut PgConnection, p: &PoisonRecord<'_>) -> Result<(i64, bool), StoreError> {
        let m = p.message;
        let truncated = m.payload.len() > p.keep_payload_bytes;
        let kept = &m.payload[..m.payload.len().min(p.keep_payload_bytes)];
        let row = sqlx::query(POISON_SQL)
            .bind(p.group.as_str())
            .bind(p.message_id.as_str())
            .bind(p.message_type)
            .bind(p.max_attempts)
            .bind(p.reason)
            .bind(p.reason_kind)
            .bind(p.payload_hash)
            .bind(kept)
            .bind(truncated)
            .bind(Json(&m.headers))
            .bind(m.content_type.as_deref())
            .bind(m.broker.as_str())
            .bind(m.source.exchange.as_deref())
            .bind(m.source.routing_key.as_deref())
            .bind(m.source.queue.as_deref())
            .fetch_one(&mut *conn)
            .await?;
        Ok((row.try_get("id")?, row.try_get("created")?))
    }

    async fn add_fast_path_duplicates(
        &self,
        entries: &[(String, String, i32, DateTime<Utc>)],
    ) -> Result<(), StoreError> {
        if entries.is_empty() {
            return Ok(());
        }
        let mut sorted: Vec<_> = entries.iter().collect();
        // One lock order for every writer of these rows keeps deadlocks away.
        sorted.sort_by(|a, b| (&a.0, &a.1).cmp(&(&b.0, &b.1)));
        let groups: Vec<&str> = sorted.iter().map(|e| e.0.as_str()).collect();
        let ids: Vec<&str> = sorted.iter().map(|e| e.1.as_str()).collect();
        let copies: Vec<i32> = sorted.iter().map(|e| e.2).collect();
        let at: Vec<DateTime<Utc>> = sorted.iter().map(|e| e.3).collect();
        sqlx::query(
            "UPDATE dedup_records r SET duplicate_count = r.duplicate_count + d.copies,
                    last_duplicate_at = GREATEST(r.last_duplicate_at, d.at)
             FROM unnest($1::text[], $2::text[], $3::int[], $4::timestamptz[]) AS d(consumer_group, message_id, copies, at)
             WHERE r.consumer_group = d.consumer_group AND r.message_id = d.message_id COLLATE \"C\"",
        )
        .bind(groups)
        .bind(ids)
        .bind(copies)
        .bind(at)
        .execute(&self.pool)
        .await?;
        Ok(())
    }
}
