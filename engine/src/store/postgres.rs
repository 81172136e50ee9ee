//! The PostgreSQL dedup store.
//!
//! PostgreSQL aborts the whole transaction on a unique violation, so a claim never inserts and
//! catches the error: it is one `INSERT ... ON CONFLICT (consumer_group, message_id) DO UPDATE
//! ... WHERE <claimable> RETURNING`. `ON CONFLICT DO UPDATE` locks the conflicting row even when
//! the `WHERE` is false, so a concurrent duplicate waits for the holder's transaction and then
//! judges the committed state.

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use std::collections::HashMap;

use sqlx::postgres::PgRow;
use sqlx::types::Json;
use sqlx::{PgConnection, PgPool, Postgres, Row};

use super::{
    ClaimBatch, ClaimItem, ClaimOutcome, ClaimRequest, ClaimedRecord, DedupStore, ExistingRecord, FailureOutcome,
    FailureReport, Lease, PoisonRecord, StoreError,
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

/// The duplicate check after a claim found nothing claimable (set-based: `$2`/`$3` are the
/// message ids and payload hashes): counts the delivery on the record, flags a payload
/// conflict, parks a delivery of a stuck record (the claim would have taken it if reclaim were
/// allowed) and reports the record's state.
const NOTE_DUPLICATES_SQL: &str = r#"
UPDATE dedup_records r SET
    duplicate_count = r.duplicate_count + 1,
    last_duplicate_at = now(),
    payload_conflicts = r.payload_conflicts + CASE WHEN r.payload_hash = d.payload_hash THEN 0 ELSE 1 END,
    parked_at = CASE WHEN r.status = 'processing' AND r.lease_expires_at < now() THEN now() ELSE r.parked_at END
FROM unnest($2::text[], $3::bytea[]) AS d(message_id, payload_hash)
WHERE r.consumer_group = $1 AND r.message_id = d.message_id
RETURNING r.id, r.message_id, r.status, r.lease_expires_at,
          COALESCE(r.lease_expires_at < now(), false) AS lease_expired,
          r.payload_hash = d.payload_hash AS same_payload,
          (extract(epoch FROM now() - r.first_seen_at) * 1000)::bigint AS delay_ms,
          (r.status = 'processing' AND r.lease_expires_at < now()) AS parked
"#;

/// Claims of a transactional batch: one INSERT ... ON CONFLICT for all messages, rows in
/// message-id order. No payload or headers (stored only if the attempt fails).
const CLAIM_MANY_SQL: &str = r#"
INSERT INTO dedup_records AS r (
    consumer_group, message_id, message_type, status, handler_mode, attempts, max_attempts,
    lease_owner, lease_token, lease_expires_at, payload_hash, content_type,
    source_broker, source_exchange, source_routing_key, source_queue)
SELECT $1, i.message_id, i.message_type, 'processing', 'transactional', 1, $2,
       $3, $4, now() + $5 * interval '1 millisecond', i.payload_hash, i.content_type,
       i.broker, i.exchange, i.routing_key, i.queue
FROM unnest($6::text[], $7::text[], $8::bytea[], $9::text[], $10::text[], $11::text[], $12::text[], $13::text[])
     AS i(message_id, message_type, payload_hash, content_type, broker, exchange, routing_key, queue)
ORDER BY i.message_id
ON CONFLICT (consumer_group, message_id) DO UPDATE SET
    status = 'processing',
    attempts = r.attempts + 1,
    handler_mode = EXCLUDED.handler_mode,
    lease_owner = EXCLUDED.lease_owner,
    lease_token = EXCLUDED.lease_token,
    lease_expires_at = EXCLUDED.lease_expires_at,
    next_attempt_at = NULL,
    parked_at = NULL,
    updated_at = now()
WHERE r.status = 'failed' AND r.attempts < r.max_attempts
RETURNING r.id, r.message_id, r.attempts, r.max_attempts, (r.xmax = 0) AS created, r.first_seen_at, now() AS claimed_at
"#;

/// Completions of a transactional batch with their attempt rows; `$3` is the worker, `$4` when
/// the claims were made.
const COMPLETE_MANY_SQL: &str = r#"
WITH done AS (
    UPDATE dedup_records r SET
        status = 'succeeded', lease_owner = NULL, lease_token = NULL, lease_expires_at = NULL,
        completed_at = now(), updated_at = now(), next_attempt_at = NULL, parked_at = NULL,
        payload = NULL, headers = NULL
    FROM unnest($1::bigint[]) AS c(id)
    WHERE r.id = c.id AND r.status = 'processing' AND r.lease_token = $2
    RETURNING r.id, r.attempts
), attempt AS (
    INSERT INTO record_attempts (record_id, attempt, worker, started_at, ended_at, outcome)
    SELECT id, attempts, $3, $4, now(), 'succeeded' FROM done
)
SELECT id FROM done
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

/// A failure, fenced by the lease token. `$7`..`$9`: payload, headers, content type (kept by
/// a transactional failure, whose claim stored none; a leased claim stored them already).
macro_rules! fail_sql {
    ($keep_payload:literal, $attempt_cte:literal) => {
        concat!(
            r#"
WITH failed AS (
    UPDATE dedup_records SET
        status = $3, lease_owner = NULL, lease_token = NULL, lease_expires_at = NULL,
        last_error = $4, error_class = $5,
        next_attempt_at = CASE WHEN $3 = 'failed' THEN now() + $6 * interval '1 millisecond' END,
        updated_at = now()"#,
            $keep_payload,
            r#"
    WHERE id = $1 AND status = 'processing' AND lease_token = $2
    RETURNING id, attempts, lease_owner
), attempt AS ("#,
            $attempt_cte,
            r#")
SELECT count(*) FROM failed
"#
        )
    };
}
/// Transactional: payload kept now, attempt row written now (`$10` worker, `$11` claim time).
const FAIL_TX_SQL: &str = fail_sql!(
    ", payload = $7, headers = $8, content_type = COALESCE($9, content_type)",
    "INSERT INTO record_attempts (record_id, attempt, worker, started_at, ended_at, outcome, error)
     SELECT id, attempts, $10, $11, now(), $3, $4 FROM failed"
);
/// Leased: the claim opened the attempt row.
const FAIL_LEASED_SQL: &str = fail_sql!(
    "",
    "UPDATE record_attempts a SET ended_at = now(), outcome = $3, error = $4
     FROM failed WHERE a.record_id = failed.id AND a.attempt = failed.attempts AND a.ended_at IS NULL"
);

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

fn claimed_from_row(row: &PgRow, lease: &Lease, took_over: bool) -> Result<ClaimedRecord, sqlx::Error> {
    Ok(ClaimedRecord {
        id: row.try_get("id")?,
        attempt: row.try_get("attempts")?,
        max_attempts: row.try_get("max_attempts")?,
        created: row.try_get("created")?,
        took_over,
        first_seen_at: row.try_get("first_seen_at")?,
        claimed_at: row.try_get("claimed_at")?,
        lease_token: lease.token,
    })
}

fn existing_from_row(row: &PgRow) -> Result<ExistingRecord, sqlx::Error> {
    let status: String = row.try_get("status")?;
    Ok(ExistingRecord {
        id: row.try_get("id")?,
        status: status.parse().map_err(|e| sqlx::Error::Decode(Box::new(e)))?,
        lease_expired: row.try_get("lease_expired")?,
        lease_expires_at: row.try_get("lease_expires_at")?,
        same_payload: row.try_get("same_payload")?,
        delay_ms: row.try_get::<Option<i64>, _>("delay_ms")?.unwrap_or_default(),
        parked: row.try_get::<Option<bool>, _>("parked")?.unwrap_or(false),
    })
}

impl PgStore {
    /// Counts a duplicate delivery on each existing record ([`NOTE_DUPLICATES_SQL`]); returns
    /// what it saw, by message id. Ids without a record (deleted meanwhile) are missing.
    async fn note_duplicates(
        conn: &mut PgConnection,
        group: &str,
        ids: &[&str],
        hashes: &[&[u8]],
    ) -> Result<HashMap<String, ExistingRecord>, sqlx::Error> {
        let rows = sqlx::query(NOTE_DUPLICATES_SQL).bind(group).bind(ids).bind(hashes).fetch_all(&mut *conn).await?;
        rows.iter().map(|row| Ok((row.try_get("message_id")?, existing_from_row(row)?))).collect()
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
            let took_over = row.try_get("took_over")?;
            return Ok(ClaimOutcome::Claimed(claimed_from_row(&row, req.lease, took_over)?));
        }
        let mut seen =
            Self::note_duplicates(conn, req.group.as_str(), &[req.message_id.as_str()], &[req.payload_hash]).await?;
        match seen.remove(req.message_id.as_str()) {
            Some(existing) => Ok(ClaimOutcome::Existing(existing)),
            // Deleted between the two statements (cleanup of an old succeeded record): the
            // message is new again as far as the table knows; claim afresh.
            None => Box::pin(self.claim(conn, req)).await,
        }
    }

    async fn claim_many(
        &self,
        conn: &mut PgConnection,
        batch: &ClaimBatch<'_>,
    ) -> Result<Vec<ClaimOutcome>, StoreError> {
        let mut outcomes: Vec<Option<ClaimOutcome>> = vec![None; batch.items.len()];
        let mut pending: Vec<usize> = (0..batch.items.len()).collect();
        // Twice at most: a record deleted between the claim and the duplicate check (cleanup)
        // is claimed afresh by the second pass.
        for _ in 0..2 {
            if pending.is_empty() {
                break;
            }
            let items: Vec<_> = pending.iter().map(|&i| &batch.items[i]).collect();
            let column =
                |f: &dyn Fn(&ClaimItem<'_>) -> Option<String>| items.iter().map(|it| f(it)).collect::<Vec<_>>();
            let rows = sqlx::query(CLAIM_MANY_SQL)
                .bind(batch.group.as_str())
                .bind(batch.max_attempts)
                .bind(&batch.lease.owner)
                .bind(batch.lease.token)
                .bind(batch.lease.millis())
                .bind(items.iter().map(|it| it.message_id.as_str()).collect::<Vec<_>>())
                .bind(items.iter().map(|it| it.message_type).collect::<Vec<_>>())
                .bind(items.iter().map(|it| it.payload_hash).collect::<Vec<_>>())
                .bind(column(&|it| it.message.content_type.clone()))
                .bind(items.iter().map(|it| it.message.broker.as_str()).collect::<Vec<_>>())
                .bind(column(&|it| it.message.source.exchange.clone()))
                .bind(column(&|it| it.message.source.routing_key.clone()))
                .bind(column(&|it| it.message.source.queue.clone()))
                .fetch_all(&mut *conn)
                .await?;
            let mut claimed: HashMap<String, ClaimedRecord> = HashMap::with_capacity(rows.len());
            for row in &rows {
                claimed.insert(row.try_get("message_id")?, claimed_from_row(row, batch.lease, false)?);
            }
            let rest: Vec<usize> = pending
                .iter()
                .copied()
                .filter(|&i| !claimed.contains_key(batch.items[i].message_id.as_str()))
                .collect();
            for &i in &pending {
                if let Some(c) = claimed.remove(batch.items[i].message_id.as_str()) {
                    outcomes[i] = Some(ClaimOutcome::Claimed(c));
                }
            }
            let ids: Vec<&str> = rest.iter().map(|&i| batch.items[i].message_id.as_str()).collect();
            let hashes: Vec<&[u8]> = rest.iter().map(|&i| batch.items[i].payload_hash).collect();
            let mut seen = if rest.is_empty() {
                HashMap::new()
            } else {
                Self::note_duplicates(conn, batch.group.as_str(), &ids, &hashes).await?
            };
            pending = Vec::new();
            for i in rest {
                match seen.remove(batch.items[i].message_id.as_str()) {
                    Some(existing) => outcomes[i] = Some(ClaimOutcome::Existing(existing)),
                    None => pending.push(i),
                }
            }
        }
        outcomes
            .into_iter()
            .map(|o| {
                o.ok_or_else(|| {
                    StoreError::Database(sqlx::Error::Protocol("record vanished twice during a claim".into()))
                })
            })
            .collect()
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

    async fn complete_many(
        &self,
        conn: &mut PgConnection,
        claims: &[&ClaimedRecord],
        lease: &Lease,
    ) -> Result<Vec<i64>, StoreError> {
        let Some(first) = claims.first() else { return Ok(Vec::new()) };
        let ids: Vec<i64> = claims.iter().map(|c| c.id).collect();
        Ok(sqlx::query_scalar(COMPLETE_MANY_SQL)
            .bind(ids)
            .bind(lease.token)
            .bind(&lease.owner)
            .bind(first.claimed_at)
            .fetch_all(&mut *conn)
            .await?)
    }

    async fn fail_claimed(
        &self,
        conn: &mut PgConnection,
        failure: &FailureReport<'_>,
    ) -> Result<FailureOutcome, StoreError> {
        let status = failure_status(failure);
        let m = failure.message;
        let query = match failure.mode {
            HandlerMode::Transactional => sqlx::query_scalar(FAIL_TX_SQL),
            HandlerMode::Leased => sqlx::query_scalar(FAIL_LEASED_SQL),
        }
        .bind(failure.claim.id)
        .bind(failure.claim.lease_token)
        .bind(status.as_str())
        .bind(failure.error)
        .bind(failure.error_class)
        .bind(failure.retry_delay_ms);
        let query = match failure.mode {
            HandlerMode::Transactional => query
                .bind(&m.payload)
                .bind(Json(&m.headers))
                .bind(m.content_type.as_deref())
                .bind(&failure.lease.owner)
                .bind(failure.claim.claimed_at),
            HandlerMode::Leased => query,
        };
        let count: i64 = query.fetch_one(&mut *conn).await?;
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
