//! [`DedupStore`] on PostgreSQL: the hot path's claims, completions, failures and poison
//! records, each statement group in its `DEBUG` span (see the module above).

use std::collections::HashMap;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use sqlx::postgres::PgRow;
use sqlx::types::Json;
use sqlx::{PgConnection, PgPool, Postgres, Row};
use tracing::field::Empty;

use super::PgStore;
#[cfg(feature = "testing")]
use crate::store::ClaimRequest;
use crate::store::{
    ClaimAs, ClaimBatch, ClaimOutcome, ClaimedRecord, DedupStore, ExistingRecord, FailureOutcome, FailureReport, Lease,
    PoisonRecord, PoisonStored, StoreError, answer_columns,
};
use crate::db::storable::{self, Storable};
#[cfg(feature = "testing")]
use crate::handler::EffectAnswer;
use crate::message::IdSourceKind;
use crate::record::{HandlerMode, RecordStatus};

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
        calls: row.try_get("attempts")?,
        previous_status: None,
    })
}

/// A leased claim's row: also the runs so far and the previous answer's status.
fn leased_claim_from_row(row: &PgRow, lease: &Lease, took_over: bool) -> Result<ClaimedRecord, sqlx::Error> {
    Ok(ClaimedRecord {
        calls: row.try_get("calls")?,
        previous_status: row.try_get::<Option<i16>, _>("previous_status")?.and_then(|s| u16::try_from(s).ok()),
        ..claimed_from_row(row, lease, took_over)?
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
        same_type: row.try_get("same_type")?,
        delay_ms: row.try_get::<Option<i64>, _>("delay_ms")?.unwrap_or_default(),
        parked: row.try_get::<Option<bool>, _>("parked")?.unwrap_or(false),
    })
}

impl PgStore {
    /// Counts a duplicate delivery on each existing record of the same message type; returns
    /// what it saw, by message id. Ids without a record (deleted meanwhile) are missing.
    async fn note_duplicates(
        &self,
        conn: &mut PgConnection,
        group: &str,
        ids: &[&str],
        hashes: &[&[u8]],
        types: &[&str],
    ) -> Result<HashMap<String, ExistingRecord>, sqlx::Error> {
        let rows = sqlx::query(&self.sql.note_duplicates)
            .bind(group)
            .bind(ids)
            .bind(hashes)
            .bind(types)
            .fetch_all(&mut *conn)
            .await?;
        rows.iter().map(|row| Ok((row.try_get("message_id")?, existing_from_row(row)?))).collect()
    }
}

#[async_trait]
impl DedupStore for PgStore {
    type Db = Postgres;

    fn pool(&self) -> &PgPool {
        &self.pool
    }

    #[cfg(feature = "testing")]
    #[tracing::instrument(level = "debug", name = "claim", skip_all, fields(count = 1, mode = req.mode.as_str()))]
    async fn claim(&self, conn: &mut PgConnection, req: &ClaimRequest<'_>) -> Result<ClaimOutcome, StoreError> {
        let sql = match req.mode {
            HandlerMode::Transactional => &self.sql.claim_tx,
            HandlerMode::Leased => &self.sql.claim_leased,
        };
        let m = Storable::of(req.message);
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
            .bind(&req.message.payload)
            .bind(Json(&m.headers))
            .bind(m.content_type.as_deref())
            .bind(req.message.broker.as_str())
            .bind(m.exchange.as_deref())
            .bind(m.routing_key.as_deref())
            .bind(m.queue.as_deref())
            .bind(req.reclaim_expired)
            .bind(m.type_property.as_deref())
            .fetch_optional(&mut *conn)
            .await?;
        if let Some(row) = row {
            let took_over = row.try_get("took_over")?;
            return Ok(ClaimOutcome::Claimed(match req.mode {
                HandlerMode::Transactional => claimed_from_row(&row, req.lease, took_over)?,
                HandlerMode::Leased => leased_claim_from_row(&row, req.lease, took_over)?,
            }));
        }
        let mut seen =
            self.note_duplicates(conn, req.group.as_str(), &[req.message_id.as_str()], &[req.payload_hash], &[
                req.message_type,
            ])
            .await?;
        match seen.remove(req.message_id.as_str()) {
            Some(existing) => Ok(ClaimOutcome::Existing(existing)),
            // Deleted between the two statements (cleanup of an old succeeded record): the
            // message is new again as far as the table knows; claim afresh.
            None => Box::pin(self.claim(conn, req)).await,
        }
    }

    #[tracing::instrument(
        level = "debug",
        name = "claim",
        skip_all,
        fields(count = batch.items.len(), mode = batch.claim_as.mode(), into = batch.claim_as.as_str(), claimed = Empty)
    )]
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
            let stored: Vec<Storable<'_>> = items.iter().map(|it| Storable::of(it.message)).collect();
            let column = |f: &dyn Fn(&Storable<'_>) -> Option<String>| stored.iter().map(f).collect::<Vec<_>>();
            let sql = match batch.claim_as {
                ClaimAs::Processing => &self.sql.claim_many,
                ClaimAs::Succeeded => &self.sql.claim_many_succeeded,
                ClaimAs::Leased => &self.sql.claim_many_leased,
            };
            let query = sqlx::query(sql)
                .bind(batch.group.as_str())
                .bind(batch.max_attempts)
                .bind(&batch.lease.owner)
                .bind(batch.lease.token)
                .bind(batch.lease.millis())
                .bind(items.iter().map(|it| it.message_id.as_str()).collect::<Vec<_>>())
                .bind(items.iter().map(|it| it.message_type).collect::<Vec<_>>())
                .bind(items.iter().map(|it| it.payload_hash).collect::<Vec<_>>())
                .bind(column(&|s| s.content_type.as_deref().map(str::to_owned)))
                .bind(items.iter().map(|it| it.message.broker.as_str()).collect::<Vec<_>>())
                .bind(column(&|s| s.exchange.as_deref().map(str::to_owned)))
                .bind(column(&|s| s.routing_key.as_deref().map(str::to_owned)))
                .bind(column(&|s| s.queue.as_deref().map(str::to_owned)));
            let id_sources = items.iter().map(|it| it.id_source.code()).collect::<Vec<_>>();
            let rows = match batch.claim_as {
                ClaimAs::Processing | ClaimAs::Succeeded => query.bind(id_sources),
                ClaimAs::Leased => query
                    .bind(items.iter().map(|it| it.message.payload.as_slice()).collect::<Vec<_>>())
                    .bind(stored.iter().map(|s| Json(&s.headers)).collect::<Vec<_>>())
                    .bind(column(&|s| s.type_property.as_deref().map(str::to_owned)))
                    .bind(items.iter().filter(|it| it.reclaim_expired).map(|it| it.message_id.as_str()).collect::<Vec<_>>())
                    .bind(items.iter().map(|it| it.starts_at_once).collect::<Vec<_>>())
                    .bind(id_sources),
            }
            .fetch_all(&mut *conn)
            .await?;
            let mut claimed: HashMap<String, ClaimedRecord> = HashMap::with_capacity(rows.len());
            for row in &rows {
                let record = match batch.claim_as {
                    ClaimAs::Processing | ClaimAs::Succeeded => claimed_from_row(row, batch.lease, false)?,
                    ClaimAs::Leased => leased_claim_from_row(row, batch.lease, row.try_get("took_over")?)?,
                };
                claimed.insert(row.try_get("message_id")?, record);
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
            let types: Vec<&str> = rest.iter().map(|&i| batch.items[i].message_type).collect();
            let mut seen = if rest.is_empty() {
                HashMap::new()
            } else {
                self.note_duplicates(conn, batch.group.as_str(), &ids, &hashes, &types).await?
            };
            pending = Vec::new();
            for i in rest {
                match seen.remove(batch.items[i].message_id.as_str()) {
                    Some(existing) => outcomes[i] = Some(ClaimOutcome::Existing(existing)),
                    None => pending.push(i),
                }
            }
        }
        let claimed = outcomes.iter().filter(|o| matches!(o, Some(ClaimOutcome::Claimed(_)))).count();
        tracing::Span::current().record("claimed", claimed);
        outcomes
            .into_iter()
            .map(|o| {
                o.ok_or_else(|| {
                    StoreError::Database(sqlx::Error::Protocol("record vanished twice during a claim".into()))
                })
            })
            .collect()
    }

    #[cfg(feature = "testing")]
    #[tracing::instrument(level = "debug", name = "complete", skip_all, fields(count = 1, mode = mode.as_str()))]
    async fn complete(
        &self,
        conn: &mut PgConnection,
        claim: &ClaimedRecord,
        lease: &Lease,
        mode: HandlerMode,
        answer: Option<&EffectAnswer>,
    ) -> Result<bool, StoreError> {
        let query = match mode {
            HandlerMode::Transactional => sqlx::query_scalar(&self.sql.complete_tx)
                .bind(claim.id)
                .bind(claim.lease_token)
                .bind(&lease.owner)
                .bind(claim.claimed_at),
            HandlerMode::Leased => {
                let (status, latency, summary) = answer_columns(answer);
                sqlx::query_scalar(&self.sql.complete_leased)
                    .bind(claim.id)
                    .bind(claim.lease_token)
                    .bind(status)
                    .bind(latency)
                    .bind(summary)
            }
        };
        let count: i64 = query.fetch_one(&mut *conn).await?;
        Ok(count == 1)
    }

    #[tracing::instrument(level = "debug", name = "complete", skip_all, fields(count = claims.len(), mode = "transactional"))]
    async fn complete_many(
        &self,
        conn: &mut PgConnection,
        claims: &[&ClaimedRecord],
        lease: &Lease,
    ) -> Result<Vec<i64>, StoreError> {
        let Some(first) = claims.first() else { return Ok(Vec::new()) };
        let ids: Vec<i64> = claims.iter().map(|c| c.id).collect();
        Ok(sqlx::query_scalar(&self.sql.complete_many)
            .bind(ids)
            .bind(lease.token)
            .bind(&lease.owner)
            .bind(first.claimed_at)
            .fetch_all(&mut *conn)
            .await?)
    }

    #[tracing::instrument(
        level = "debug",
        name = "record_failure",
        skip_all,
        fields(record = failure.claim.id, mode = failure.mode.as_str())
    )]
    async fn fail_claimed(
        &self,
        conn: &mut PgConnection,
        failure: &FailureReport<'_>,
    ) -> Result<FailureOutcome, StoreError> {
        let status = failure.status();
        let m = Storable::of(failure.message);
        let query = match failure.mode {
            HandlerMode::Transactional => sqlx::query_scalar(&self.sql.fail_tx),
            HandlerMode::Leased => sqlx::query_scalar(&self.sql.fail_leased),
        }
        .bind(failure.claim.id)
        .bind(failure.claim.lease_token)
        .bind(status.as_str())
        .bind(storable::text(failure.error))
        .bind(storable::text(failure.error_class))
        .bind(failure.retry_delay_ms);
        let query = match failure.mode {
            HandlerMode::Transactional => query
                .bind(&failure.message.payload)
                .bind(Json(&m.headers))
                .bind(m.content_type.as_deref())
                .bind(&failure.lease.owner)
                .bind(failure.claim.claimed_at)
                .bind(m.type_property.as_deref()),
            HandlerMode::Leased => {
                let (status, latency, summary) = answer_columns(failure.answer);
                query.bind(status).bind(latency).bind(summary).bind(failure.in_progress)
            }
        };
        let count: i64 = query.fetch_one(&mut *conn).await?;
        Ok(match (count, status) {
            (0, _) => FailureOutcome::Superseded,
            (_, RecordStatus::Dead) => FailureOutcome::Dead,
            _ => FailureOutcome::Failed,
        })
    }

    #[tracing::instrument(level = "debug", name = "record_poison", skip_all, fields(message_id = %p.message_id, poison = p.poison))]
    async fn record_poison(&self, conn: &mut PgConnection, p: &PoisonRecord<'_>) -> Result<PoisonStored, StoreError> {
        let payload = &p.message.payload;
        let truncated = payload.len() > p.keep_payload_bytes;
        let kept = &payload[..payload.len().min(p.keep_payload_bytes)];
        let m = Storable::of(p.message);
        sqlx::query(&self.sql.lock_record)
            .bind(p.group.as_str())
            .bind(p.message_id.as_str())
            .execute(&mut *conn)
            .await?;
        let row = sqlx::query(&self.sql.poison)
            .bind(p.group.as_str())
            .bind(p.message_id.as_str())
            .bind(p.message_type)
            .bind(p.max_attempts)
            .bind(storable::text(p.reason))
            .bind(p.reason_kind)
            .bind(p.payload_hash)
            .bind(kept)
            .bind(truncated)
            .bind(Json(&m.headers))
            .bind(m.content_type.as_deref())
            .bind(p.message.broker.as_str())
            .bind(m.exchange.as_deref())
            .bind(m.routing_key.as_deref())
            .bind(m.queue.as_deref())
            .bind(p.poison)
            .bind(m.type_property.as_deref())
            .bind(p.id_source.map(IdSourceKind::code))
            .fetch_one(&mut *conn)
            .await?;
        Ok(PoisonStored {
            id: row.try_get("id")?,
            dead_lettered: row.try_get("dead_lettered")?,
            reused_of: row.try_get("reused_of")?,
        })
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
        sqlx::query(&self.sql.add_fast_path_duplicates)
            .bind(groups)
            .bind(ids)
            .bind(copies)
            .bind(at)
            .execute(&self.pool)
            .await?;
        Ok(())
    }
}

