//! Settling claimed records on MySQL: completions and failures (a locking read of the claims
//! still held under the lease token, then the update: with no `RETURNING`, the read says which
//! rows the update settles, and its row locks keep that exact), poison records, and the
//! duplicates the fast path caught.

use std::collections::{BTreeMap, BTreeSet};

use chrono::{DateTime, Utc};
use sqlx::types::Json;
use sqlx::{MySqlConnection, Row};
use uuid::Uuid;

use super::leases::Held;
use super::{MySqlStore, sql, text};
use crate::db::storable::{self, Storable};
use crate::message::IdSourceKind;
use crate::record::{HandlerMode, RecordStatus};
use crate::store::{
    ClaimedRecord, FailureOutcome, FailureReport, Lease, PoisonRecord, PoisonStored, StoreError,
};

/// Entries of one group per fast-path duplicates statement.
const FAST_PATH_CHUNK: usize = 1000;

impl MySqlStore {
    /// The claims among `ids` still `processing` under `token`, locked until the transaction
    /// ends.
    async fn held(&self, conn: &mut MySqlConnection, ids: &[i64], token: Uuid) -> Result<Vec<Held>, StoreError> {
        let sql = self.render(&sql::held(ids.len()));
        let mut query = sqlx::query(&sql);
        for id in ids {
            query = query.bind(*id);
        }
        let rows = query.bind(token).fetch_all(&mut *conn).await?;
        rows.iter()
            .map(|row| Ok((row.try_get("id")?, row.try_get("attempts")?, text(row, "consumer_group")?)))
            .collect::<Result<_, sqlx::Error>>()
            .map_err(StoreError::from)
    }

    /// [`crate::store::DedupStore::complete_many`]: the claims still held under `lease` become
    /// `succeeded`; retries get their attempt row (a first try none). Returns the ids completed.
    pub(super) async fn complete_claims(
        &self,
        conn: &mut MySqlConnection,
        claims: &[&ClaimedRecord],
        lease: &Lease,
    ) -> Result<Vec<i64>, StoreError> {
        if claims.is_empty() {
            return Ok(Vec::new());
        }
        let ids: Vec<i64> = claims.iter().map(|c| c.id).collect();
        let held = self.held(conn, &ids, lease.token).await?;
        if held.is_empty() {
            return Ok(Vec::new());
        }
        let done: Vec<i64> = held.iter().map(|h| h.0).collect();
        let sql = self.render(&sql::complete(done.len()));
        let mut query = sqlx::query(&sql);
        for id in &done {
            query = query.bind(*id);
        }
        query.execute(&mut *conn).await?;
        self.count_moved(conn, &held, "succeeded").await?;
        let started = claims[0].claimed_at;
        let retries: Vec<(&ClaimedRecord, DateTime<Utc>)> = claims
            .iter()
            .filter(|c| c.attempt > 1 && done.contains(&c.id))
            .map(|c| (*c, started))
            .collect();
        self.add_attempts(conn, &lease.owner, &retries, "succeeded", None).await?;
        Ok(done)
    }

    /// [`crate::store::DedupStore::fail_claimed`] of a transactional claim: `failed` with the
    /// retry due time, or `dead` at max attempts or for a permanent error, the delivery kept,
    /// the attempt row written.
    pub(super) async fn fail_claim(
        &self,
        conn: &mut MySqlConnection,
        failure: &FailureReport<'_>,
    ) -> Result<FailureOutcome, StoreError> {
        let claim = failure.claim;
        let status = failure.status();
        let settled = |done: bool| match (done, status) {
            (false, _) => FailureOutcome::Superseded,
            (true, RecordStatus::Dead) => FailureOutcome::Dead,
            (true, _) => FailureOutcome::Failed,
        };
        if failure.mode == HandlerMode::Leased {
            return Ok(settled(self.fail_leased(conn, failure, status.as_str()).await?));
        }
        let held = self.held(conn, &[claim.id], claim.lease_token).await?;
        if held.is_empty() {
            return Ok(FailureOutcome::Superseded);
        }
        let m = Storable::of(failure.message);
        let error = storable::text(failure.error);
        sqlx::query(&self.render(sql::FAIL_TX))
            .bind(status.as_str())
            .bind(&*error)
            .bind(storable::text(failure.error_class))
            .bind(failure.retry_delay_ms)
            .bind(&failure.message.payload)
            .bind(Json(&m.headers))
            .bind(m.content_type.as_deref())
            .bind(m.type_property.as_deref())
            .bind(claim.id)
            .execute(&mut *conn)
            .await?;
        self.count_moved(conn, &held, status.as_str()).await?;
        self.add_attempts(conn, &failure.lease.owner, &[(claim, claim.claimed_at)], status.as_str(), Some(&error))
            .await?;
        Ok(settled(true))
    }

    /// [`crate::store::DedupStore::record_poison`]: one ODKU with the nonce-first pattern, read
    /// back by the dedup key (the row is locked by it).
    pub(super) async fn store_poison(
        &self,
        conn: &mut MySqlConnection,
        p: &PoisonRecord<'_>,
    ) -> Result<PoisonStored, StoreError> {
        let payload = &p.message.payload;
        let truncated = payload.len() > p.keep_payload_bytes;
        let kept = &payload[..payload.len().min(p.keep_payload_bytes)];
        let m = Storable::of(p.message);
        let nonce = Uuid::new_v4();
        sqlx::query(&self.render(&sql::poison()))
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
            .bind(p.id_source.map(|k| char::from(u8::try_from(IdSourceKind::code(k)).unwrap_or(b'?')).to_string()))
            .bind(nonce)
            .execute(&mut *conn)
            .await?;
        let row = sqlx::query(&self.render(&sql::poison_stored()))
            .bind(nonce)
            .bind(p.message_type)
            .bind(p.payload_hash)
            .bind(p.group.as_str())
            .bind(p.message_id.as_str())
            .fetch_one(&mut *conn)
            .await?;
        let ours: bool = row.try_get("ours")?;
        let created = ours && row.try_get::<bool, _>("fresh")?;
        let mut deltas = BTreeMap::new();
        if ours {
            deltas.insert("dead", 1);
            if !created {
                // Dead again: a requeued NO_HANDLER record, `failed` until now.
                deltas.insert("failed", -1);
            }
            self.add_counts(conn, p.group.as_str(), &deltas).await?;
            self.add_types(conn, &BTreeSet::from([p.message_type])).await?;
        }
        let other_type: bool = row.try_get("other_type")?;
        Ok(PoisonStored {
            id: row.try_get("id")?,
            dead_lettered: ours,
            reused_of: if !created && !p.poison && other_type { Some(text(&row, "message_type")?) } else { None },
        })
    }

    /// [`crate::store::DedupStore::add_fast_path_duplicates`], sorted by key (one lock order for
    /// every writer of these rows), one statement per group, in one transaction (all or none).
    pub(super) async fn fast_path_duplicates(
        &self,
        entries: &[(String, String, i32, DateTime<Utc>)],
    ) -> Result<(), StoreError> {
        if entries.is_empty() {
            return Ok(());
        }
        let mut sorted: Vec<_> = entries.iter().collect();
        sorted.sort_by(|a, b| (&a.0, &a.1).cmp(&(&b.0, &b.1)));
        // The same key twice counts one entry, as PostgreSQL's `UPDATE … FROM` does.
        sorted.dedup_by(|a, b| (&a.0, &a.1) == (&b.0, &b.1));
        // MySQL takes at most 65 535 binds per statement; a flush holds whatever the fast path
        // caught since the last one, so a group's entries go 1 000 (5 001 binds) at a time.
        let mut tx = self.pool.begin().await?;
        for group in sorted.chunk_by(|a, b| a.0 == b.0).flat_map(|g| g.chunks(FAST_PATH_CHUNK)) {
            let sql = self.render(&sql::fast_path_duplicates(group.len()));
            let mut query = sqlx::query(&sql);
            for (_, id, copies, _) in group {
                query = query.bind(id.as_str()).bind(*copies);
            }
            for (_, id, _, at) in group {
                query = query.bind(id.as_str()).bind(*at).bind(*at);
            }
            query = query.bind(group[0].0.as_str());
            for (_, id, _, _) in group {
                query = query.bind(id.as_str());
            }
            query.execute(&mut *tx).await?;
        }
        tx.commit().await?;
        Ok(())
    }
}
