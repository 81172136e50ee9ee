//! The statements of leased handlers on MySQL ([`LeaseStore`]): each runs in a short transaction
//! of its own (a savepoint inside the caller's, if any), reads the records still `processing`
//! with `FOR UPDATE`, keeps those whose lease token is the claim's, and settles those by primary
//! key, writing its count deltas and attempt rows.

use std::collections::BTreeMap;
use std::time::Duration;

use async_trait::async_trait;
use sqlx::{Connection, MySqlConnection, Row};
use uuid::Uuid;

use super::{MySqlStore, sql, text};
use crate::db::storable;
use crate::handler::EffectAnswer;
use crate::store::{ClaimedRecord, FailureReport, LeaseStore, StoreError, answer_columns};

/// A held leased claim: record id, attempt, group.
pub(super) type Held = (i64, i32, String);

impl MySqlStore {
    /// The `claims` (record id, lease token) whose record is still `processing` under that token,
    /// locked until the transaction ends.
    pub(super) async fn held_by_token(
        &self,
        conn: &mut MySqlConnection,
        claims: &[(i64, Uuid)],
    ) -> Result<Vec<Held>, StoreError> {
        if claims.is_empty() {
            return Ok(Vec::new());
        }
        let sql = self.render(&sql::processing(claims.len()));
        let mut query = sqlx::query(&sql);
        for (id, _) in claims {
            query = query.bind(*id);
        }
        let mut held = Vec::new();
        for row in query.fetch_all(&mut *conn).await? {
            let id: i64 = row.try_get("id")?;
            let token: Option<Uuid> = row.try_get("lease_token")?;
            if claims.iter().any(|(c, t)| *c == id && Some(*t) == token) {
                held.push((id, row.try_get("attempts")?, text(&row, "consumer_group")?));
            }
        }
        Ok(held)
    }

    /// Count deltas of `held` records moving from `processing` to `to`.
    pub(super) async fn count_moved(
        &self,
        conn: &mut MySqlConnection,
        held: &[Held],
        to: &str,
    ) -> Result<(), StoreError> {
        let mut groups: BTreeMap<&str, i64> = BTreeMap::new();
        for (_, _, group) in held {
            *groups.entry(group.as_str()).or_default() += 1;
        }
        for (group, n) in groups {
            self.add_counts(conn, group, &BTreeMap::from([("processing", -n), (to, n)])).await?;
        }
        Ok(())
    }

    /// Closes the open attempt `attempt` of record `id` with `outcome` and the effect's answer.
    #[expect(clippy::too_many_arguments, reason = "one column each")]
    async fn close_attempt(
        &self,
        conn: &mut MySqlConnection,
        id: i64,
        attempt: i32,
        outcome: &str,
        error: Option<&str>,
        answer: Option<&EffectAnswer>,
        in_progress: bool,
    ) -> Result<(), StoreError> {
        let (status, latency, summary) = answer_columns(answer);
        sqlx::query(&self.render(sql::CLOSE_ATTEMPT))
            .bind(outcome)
            .bind(error)
            .bind(status)
            .bind(latency)
            .bind(summary)
            .bind(in_progress)
            .bind(id)
            .bind(attempt)
            .execute(&mut *conn)
            .await?;
        Ok(())
    }

    /// A leased claim's failure ([`crate::store::DedupStore::fail_claimed`]): the record as a
    /// transactional failure leaves it, less the delivery (the claim stored it), and the attempt
    /// the claim opened closed with the effect's answer. `status` is `failed` or `dead`. False
    /// when the lease was lost.
    pub(super) async fn fail_leased(
        &self,
        conn: &mut MySqlConnection,
        failure: &FailureReport<'_>,
        status: &str,
    ) -> Result<bool, StoreError> {
        let claim = failure.claim;
        let mut tx = conn.begin().await?;
        let held = self.held_by_token(&mut tx, &[(claim.id, claim.lease_token)]).await?;
        if held.is_empty() {
            // Ended now: a dropped transaction rolls back only when its connection is next used,
            // and its row lock would stay with a connection the caller keeps.
            tx.rollback().await?;
            return Ok(false);
        }
        let error = storable::text(failure.error);
        sqlx::query(&self.render(sql::FAIL_LEASED))
            .bind(status)
            .bind(&*error)
            .bind(storable::text(failure.error_class))
            .bind(failure.retry_delay_ms)
            .bind(claim.id)
            .execute(&mut *tx)
            .await?;
        self.count_moved(&mut tx, &held, status).await?;
        let attempt = held[0].1;
        self.close_attempt(&mut tx, claim.id, attempt, status, Some(&error), failure.answer, failure.in_progress).await?;
        tx.commit().await?;
        Ok(true)
    }

    /// Runs the statement `sql` builds for n ids (its record ids bound after `first`, if any) on
    /// the records of `claims` still held; the ids it ran on.
    async fn on_held(
        &self,
        conn: &mut MySqlConnection,
        claims: &[&ClaimedRecord],
        sql: fn(usize) -> String,
        first: Option<i64>,
    ) -> Result<(Vec<Held>, Vec<i64>), StoreError> {
        let pairs: Vec<(i64, Uuid)> = claims.iter().map(|c| (c.id, c.lease_token)).collect();
        let held = self.held_by_token(conn, &pairs).await?;
        let ids: Vec<i64> = held.iter().map(|h| h.0).collect();
        if !ids.is_empty() {
            let sql = self.render(&sql(ids.len()));
            let mut query = sqlx::query(&sql);
            if let Some(v) = first {
                query = query.bind(v);
            }
            for id in &ids {
                query = query.bind(*id);
            }
            query.execute(&mut *conn).await?;
        }
        Ok((held, ids))
    }
}

#[async_trait]
impl LeaseStore for MySqlStore {
    async fn complete_many_leased(
        &self,
        conn: &mut MySqlConnection,
        done: &[(&ClaimedRecord, Option<&EffectAnswer>)],
    ) -> Result<Vec<i64>, StoreError> {
        if done.is_empty() {
            return Ok(Vec::new());
        }
        let claims: Vec<&ClaimedRecord> = done.iter().map(|(c, _)| *c).collect();
        let mut tx = conn.begin().await?;
        let (held, ids) = self.on_held(&mut tx, &claims, sql::complete, None).await?;
        self.count_moved(&mut tx, &held, "succeeded").await?;
        for (id, attempt, _) in &held {
            let answer = done.iter().find(|(c, _)| c.id == *id).and_then(|(_, a)| *a);
            self.close_attempt(&mut tx, *id, *attempt, "succeeded", None, answer, false).await?;
        }
        tx.commit().await?;
        Ok(ids)
    }

    async fn defer_claimed(
        &self,
        conn: &mut MySqlConnection,
        failure: &FailureReport<'_>,
        within: Option<Duration>,
    ) -> Result<bool, StoreError> {
        let claim = failure.claim;
        let mut tx = conn.begin().await?;
        let held = self.held_by_token(&mut tx, &[(claim.id, claim.lease_token)]).await?;
        if held.is_empty() {
            // Ended now: a dropped transaction rolls back only when its connection is next used,
            // and its row lock would stay with a connection the caller keeps.
            tx.rollback().await?;
            return Ok(false);
        }
        let ms = within.map(|w| i64::try_from(w.as_millis()).unwrap_or(i64::MAX));
        let within: bool = sqlx::query_scalar(&self.render(sql::DEFER_WITHIN))
            .bind(ms)
            .bind(claim.id)
            .bind(ms)
            .fetch_one(&mut *tx)
            .await?;
        if !within {
            tx.rollback().await?;
            return Ok(false);
        }
        let error = storable::text(failure.error);
        sqlx::query(&self.render(sql::DEFER))
            .bind(&*error)
            .bind(storable::text(failure.error_class))
            .bind(failure.retry_delay_ms)
            .bind(claim.id)
            .execute(&mut *tx)
            .await?;
        self.count_moved(&mut tx, &held, "failed").await?;
        self.close_attempt(&mut tx, claim.id, held[0].1, "deferred", Some(&error), failure.answer, failure.in_progress)
            .await?;
        tx.commit().await?;
        Ok(true)
    }

    async fn extend_leases(
        &self,
        conn: &mut MySqlConnection,
        claims: &[&ClaimedRecord],
        lease: &crate::store::Lease,
    ) -> Result<Vec<i64>, StoreError> {
        let mut tx = conn.begin().await?;
        let (_, ids) = self.on_held(&mut tx, claims, sql::extend, Some(lease.millis())).await?;
        tx.commit().await?;
        Ok(ids)
    }

    async fn mark_effects_started(
        &self,
        conn: &mut MySqlConnection,
        claims: &[&ClaimedRecord],
    ) -> Result<Vec<i64>, StoreError> {
        let mut tx = conn.begin().await?;
        let (_, ids) = self.on_held(&mut tx, claims, sql::mark_started, None).await?;
        tx.commit().await?;
        Ok(ids)
    }

    async fn release_unstarted(
        &self,
        conn: &mut MySqlConnection,
        claims: &[&ClaimedRecord],
        retry_delay_ms: i64,
    ) -> Result<Vec<i64>, StoreError> {
        let mut tx = conn.begin().await?;
        let (held, ids) = self.on_held(&mut tx, claims, sql::release, Some(retry_delay_ms)).await?;
        if !held.is_empty() {
            self.count_moved(&mut tx, &held, "failed").await?;
            let sql = self.render(&sql::unopen(held.len()));
            let mut query = sqlx::query(&sql);
            for (id, attempt, _) in &held {
                query = query.bind(*id).bind(*attempt);
            }
            query.execute(&mut *tx).await?;
        }
        tx.commit().await?;
        Ok(ids)
    }

    async fn attempt_outcome(
        &self,
        conn: &mut MySqlConnection,
        id: i64,
        attempt: i32,
    ) -> Result<Option<String>, StoreError> {
        let sql = self.render(
            "SELECT outcome FROM {s}.record_attempts WHERE record_id = ? AND attempt = ? AND outcome IS NOT NULL",
        );
        let row = sqlx::query(&sql).bind(id).bind(attempt).fetch_optional(&mut *conn).await?;
        Ok(row.map(|row| text(&row, "outcome")).transpose()?)
    }

    async fn note_late_effect(
        &self,
        conn: &mut MySqlConnection,
        claim: &ClaimedRecord,
        answer: Option<&EffectAnswer>,
    ) -> Result<(), StoreError> {
        let (status, latency, summary) = answer_columns(answer);
        sqlx::query(&self.render(sql::LATE_EFFECT))
            .bind(status)
            .bind(latency)
            .bind(summary)
            .bind(claim.id)
            .bind(claim.attempt)
            .execute(&mut *conn)
            .await?;
        Ok(())
    }
}
