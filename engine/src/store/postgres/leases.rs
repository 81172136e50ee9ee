//! The leased handlers' statements of [`PgStore`] ([`LeaseStore`]): completions with the
//! effect's answer, deferrals, the heartbeat, effect-start marks, releases of unstarted calls and
//! late effects, each fenced by the record's own lease token.

use std::time::Duration;

use async_trait::async_trait;
use sqlx::PgConnection;

use super::{PgStore, storable};
use crate::store::answer_columns;
use crate::handler::EffectAnswer;
use crate::store::{ClaimedRecord, FailureReport, Lease, LeaseStore, StoreError};

impl PgStore {
    /// Runs `sql`, a statement over leased claims fenced each by its own lease token (`$1` ids,
    /// `$2` tokens, `$3` the `millis` when given), returning the ids it found held. The ids go
    /// in one lock order (ascending) for every writer of a batch of these rows.
    async fn fenced_many(
        &self,
        conn: &mut PgConnection,
        sql: &str,
        claims: &[&ClaimedRecord],
        millis: Option<i64>,
    ) -> Result<Vec<i64>, StoreError> {
        if claims.is_empty() {
            return Ok(Vec::new());
        }
        let mut sorted = claims.to_vec();
        sorted.sort_by_key(|claim| claim.id);
        let query = sqlx::query_scalar(sql)
            .bind(sorted.iter().map(|claim| claim.id).collect::<Vec<_>>())
            .bind(sorted.iter().map(|claim| claim.lease_token).collect::<Vec<_>>());
        let query = match millis {
            Some(ms) => query.bind(ms),
            None => query,
        };
        Ok(query.fetch_all(&mut *conn).await?)
    }
}

#[async_trait]
impl LeaseStore for PgStore {
    #[tracing::instrument(level = "debug", name = "complete", skip_all, fields(count = done.len(), mode = "leased"))]
    async fn complete_many_leased(
        &self,
        conn: &mut PgConnection,
        done: &[(&ClaimedRecord, Option<&EffectAnswer>)],
    ) -> Result<Vec<i64>, StoreError> {
        if done.is_empty() {
            return Ok(Vec::new());
        }
        let mut sorted = done.to_vec();
        // One lock order (the record id) for every writer of a batch of these rows.
        sorted.sort_by_key(|(claim, _)| claim.id);
        let answers: Vec<_> = sorted.iter().map(|(_, answer)| answer_columns(*answer)).collect();
        Ok(sqlx::query_scalar(&self.sql.complete_many_leased)
            .bind(sorted.iter().map(|(claim, _)| claim.id).collect::<Vec<_>>())
            .bind(sorted.iter().map(|(claim, _)| claim.lease_token).collect::<Vec<_>>())
            .bind(answers.iter().map(|a| a.0).collect::<Vec<_>>())
            .bind(answers.iter().map(|a| a.1).collect::<Vec<_>>())
            .bind(answers.into_iter().map(|a| a.2).collect::<Vec<_>>())
            .fetch_all(&mut *conn)
            .await?)
    }

    #[tracing::instrument(level = "debug", name = "defer", skip_all, fields(record = failure.claim.id))]
    async fn defer_claimed(
        &self,
        conn: &mut PgConnection,
        failure: &FailureReport<'_>,
        within: Option<Duration>,
    ) -> Result<bool, StoreError> {
        let (status, latency, summary) = answer_columns(failure.answer);
        let count: i64 = sqlx::query_scalar(&self.sql.defer)
            .bind(failure.claim.id)
            .bind(failure.claim.lease_token)
            .bind(storable::text(failure.error))
            .bind(storable::text(failure.error_class))
            .bind(failure.retry_delay_ms)
            .bind(within.map(|w| i64::try_from(w.as_millis()).unwrap_or(i64::MAX)))
            .bind(status)
            .bind(latency)
            .bind(summary)
            .bind(failure.in_progress)
            .fetch_one(&mut *conn)
            .await?;
        Ok(count == 1)
    }

    #[tracing::instrument(level = "debug", name = "extend_lease", skip_all, fields(count = claims.len()))]
    async fn extend_leases(
        &self,
        conn: &mut PgConnection,
        claims: &[&ClaimedRecord],
        lease: &Lease,
    ) -> Result<Vec<i64>, StoreError> {
        self.fenced_many(conn, &self.sql.extend_leases, claims, Some(lease.millis())).await
    }

    #[tracing::instrument(level = "debug", name = "mark_effects_started", skip_all, fields(count = claims.len()))]
    async fn mark_effects_started(
        &self,
        conn: &mut PgConnection,
        claims: &[&ClaimedRecord],
    ) -> Result<Vec<i64>, StoreError> {
        self.fenced_many(conn, &self.sql.mark_effects_started, claims, None).await
    }

    #[tracing::instrument(level = "debug", name = "release_unstarted", skip_all, fields(count = claims.len()))]
    async fn release_unstarted(
        &self,
        conn: &mut PgConnection,
        claims: &[&ClaimedRecord],
        retry_delay_ms: i64,
    ) -> Result<Vec<i64>, StoreError> {
        self.fenced_many(conn, &self.sql.release_unstarted, claims, Some(retry_delay_ms)).await
    }

    async fn attempt_outcome(&self, conn: &mut PgConnection, id: i64, attempt: i32) -> Result<Option<String>, StoreError> {
        let sql = self.render("SELECT outcome FROM {s}.record_attempts WHERE record_id = $1 AND attempt = $2");
        let outcome = sqlx::query_scalar(&sql).bind(id).bind(attempt).fetch_optional(&mut *conn).await?;
        Ok(outcome.flatten())
    }

    #[tracing::instrument(level = "debug", name = "note_late_effect", skip_all, fields(record = claim.id))]
    async fn note_late_effect(
        &self,
        conn: &mut PgConnection,
        claim: &ClaimedRecord,
        answer: Option<&EffectAnswer>,
    ) -> Result<(), StoreError> {
        let (status, latency, summary) = answer_columns(answer);
        sqlx::query(&self.sql.late_effect)
            .bind(claim.id)
            .bind(claim.attempt)
            .bind(status)
            .bind(latency)
            .bind(summary)
            .execute(&mut *conn)
            .await?;
        Ok(())
    }
}
