//! PostgreSQL's bulk requeue jobs ([`RequeueJobBooks`]): the selection frozen by one
//! `INSERT … SELECT`, a batch's records locked in the consumers' claim order, the items' verdicts
//! written by one `UPDATE … FROM unnest(…)`, the status counts following by trigger, and one
//! runner per job by a session advisory lock (`pg_try_advisory_lock(RUNNER_LOCK_KEY, job id)`).
//! A batch locks its pending items (`FOR UPDATE`), so two batches of one job never share one.

use async_trait::async_trait;
use sqlx::{PgPool, Postgres, QueryBuilder, Transaction};

use super::named_lock;
use super::operator_tx::PgOperatorTx;
use super::record_books::make_claimable;
use super::records::push_filter;
use crate::actions::bulk::{
    FrozenJob, FrozenSelection, ItemVerdict, JobChange, LockedCandidate, NewRequeueJob, PendingItem, RequeueBatch,
    RequeueJob, RequeueJobBooks, RunnerView,
};
use crate::actions::NamedLock;
use crate::actions::republish::StoredMessage;
use crate::console::filter::RecordFilter;

/// Why a matched record is not requeued (`NULL`: it is), evaluated on `dedup_records` rows.
const SKIP_REASON_SQL: &str = "CASE
    WHEN status = 'succeeded' THEN 'already succeeded'
    WHEN status = 'processing' AND lease_expires_at >= now() THEN 'lease live'
    WHEN status = 'processing' THEN 'stuck: release it first'
    WHEN poison THEN 'poison message'
    WHEN payload IS NULL OR payload_truncated THEN 'payload missing'
END";

/// First key of the advisory locks the job runners hold (`pg_try_advisory_lock(key, job id)`).
pub(crate) const RUNNER_LOCK_KEY: i32 = 0x5251_4a42; // "RQJB"

const JOB_COLUMNS: &str = "id, created_at, created_by, reason, filter, state, paused_reason, rate_per_sec, canary_size,
    failure_threshold, total, done, skipped, failed, started_at, finished_at,
    extract(epoch FROM COALESCE(finished_at, now()) - started_at)::float8 AS elapsed_secs";

#[async_trait]
impl RequeueJobBooks for PgPool {
    async fn requeue_counts(&self, filter: &RecordFilter, limit: i64) -> Result<Vec<(Option<String>, i64)>, sqlx::Error> {
        let mut q: QueryBuilder<'_, Postgres> = QueryBuilder::new(format!(
            "SELECT skip, count(*) AS n FROM (SELECT {SKIP_REASON_SQL} AS skip FROM dedup_records"
        ));
        push_filter(&mut q, filter);
        q.push(" LIMIT ").push_bind(limit).push(") s GROUP BY skip");
        q.build_query_as().fetch_all(self).await
    }

    async fn requeue_job(&self, id: i64) -> Result<Option<RequeueJob>, sqlx::Error> {
        sqlx::query_as(&format!("SELECT {JOB_COLUMNS} FROM requeue_jobs WHERE id = $1"))
            .bind(id)
            .fetch_optional(self)
            .await
    }

    async fn requeue_jobs(&self, limit: i64) -> Result<Vec<RequeueJob>, sqlx::Error> {
        sqlx::query_as(&format!("SELECT {JOB_COLUMNS} FROM requeue_jobs ORDER BY id DESC LIMIT $1"))
            .bind(limit)
            .fetch_all(self)
            .await
    }

    async fn freeze_requeue_job(
        &self,
        job: &NewRequeueJob<'_>,
        limit: i64,
    ) -> Result<(FrozenSelection, Box<dyn FrozenJob>), sqlx::Error> {
        let mut tx = self.begin().await?;
        let id: i64 = sqlx::query_scalar(
            "INSERT INTO requeue_jobs (created_by, reason, filter, rate_per_sec, canary_size, failure_threshold, total)
             VALUES ($1, $2, $3, $4, $5, $6, 0) RETURNING id",
        )
        .bind(job.actor)
        .bind(job.reason)
        .bind(job.filter_json)
        .bind(job.rate_per_sec)
        .bind(job.canary_size)
        .bind(job.failure_threshold)
        .fetch_one(&mut *tx)
        .await?;
        let mut q: QueryBuilder<'_, Postgres> = QueryBuilder::new(
            "INSERT INTO requeue_job_items (job_id, seq, record_id, state, detail, record_version)
             SELECT ",
        );
        q.push_bind(id).push(format!(
            ", row_number() OVER (ORDER BY id), id, CASE WHEN skip IS NULL THEN 'pending' ELSE 'skipped' END, skip, version
             FROM (SELECT id, {SKIP_REASON_SQL} AS skip, version FROM dedup_records"
        ));
        push_filter(&mut q, job.filter);
        q.push(" ORDER BY id LIMIT ").push_bind(limit).push(") s");
        q.build().execute(&mut *tx).await?;
        let (total, skipped): (i64, i64) = sqlx::query_as(
            "UPDATE requeue_jobs j SET total = c.total, skipped = c.skipped
             FROM (SELECT count(*) AS total, count(*) FILTER (WHERE state = 'skipped') AS skipped
                   FROM requeue_job_items WHERE job_id = $1) c
             WHERE j.id = $1 RETURNING c.total, c.skipped",
        )
        .bind(id)
        .fetch_one(&mut *tx)
        .await?;
        Ok((FrozenSelection { id, total, skipped }, Box::new(PgOperatorTx(tx))))
    }

    async fn begin_job_change(&self) -> Result<Box<dyn JobChange>, sqlx::Error> {
        Ok(Box::new(PgOperatorTx(self.begin().await?)))
    }

    async fn runner_view(&self, id: i64) -> Result<Option<RunnerView>, sqlx::Error> {
        sqlx::query_as(
            "SELECT state, created_by, rate_per_sec, canary_size, failure_threshold, done, failed
             FROM requeue_jobs WHERE id = $1",
        )
        .bind(id)
        .fetch_optional(self)
        .await
    }

    async fn pending_sources(&self, id: i64) -> Result<Vec<(String, String)>, sqlx::Error> {
        sqlx::query_as(
            "SELECT DISTINCT r.consumer_group, r.source_broker
             FROM requeue_job_items i JOIN dedup_records r ON r.id = i.record_id
             WHERE i.job_id = $1 AND i.state = 'pending'",
        )
        .bind(id)
        .fetch_all(self)
        .await
    }

    async fn begin_batch(
        &self,
        id: i64,
        limit: i64,
    ) -> Result<(Vec<PendingItem>, Vec<LockedCandidate>, Box<dyn RequeueBatch>), sqlx::Error> {
        let mut tx = self.begin().await?;
        let items: Vec<PendingItem> = sqlx::query_as(
            "SELECT seq, record_id, record_version FROM requeue_job_items
             WHERE job_id = $1 AND state = 'pending' ORDER BY seq LIMIT $2 FOR UPDATE",
        )
        .bind(id)
        .bind(limit)
        .fetch_all(&mut *tx)
        .await?;
        let record_ids: Vec<i64> = items.iter().map(|i| i.record_id).collect();
        // Lock order of the consumers' claims (group, message id), so neither waits in a cycle.
        let rows: Vec<LockedCandidate> = sqlx::query_as(&format!(
            "SELECT {SKIP_REASON_SQL} AS skip, version, {} FROM dedup_records WHERE id = ANY($1)
             ORDER BY consumer_group, message_id FOR UPDATE",
            StoredMessage::COLUMNS
        ))
        .bind(&record_ids)
        .fetch_all(&mut *tx)
        .await?;
        Ok((items, rows, Box::new(PgRequeueBatch(tx))))
    }

    async fn pause_running_job(&self, id: i64, why: &str) -> Result<bool, sqlx::Error> {
        let paused = sqlx::query(
            "UPDATE requeue_jobs SET state = 'paused', paused_reason = $2, updated_at = now()
             WHERE id = $1 AND state = 'running'",
        )
        .bind(id)
        .bind(why)
        .execute(self)
        .await?;
        Ok(paused.rows_affected() == 1)
    }

    async fn complete_running_job(&self, id: i64) -> Result<(), sqlx::Error> {
        sqlx::query(
            "UPDATE requeue_jobs SET state = 'completed', finished_at = now(), updated_at = now()
             WHERE id = $1 AND state = 'running'
               AND NOT EXISTS (SELECT 1 FROM requeue_job_items WHERE job_id = $1 AND state = 'pending')",
        )
        .bind(id)
        .execute(self)
        .await
        .map(drop)
    }

    async fn running_job_ids(&self) -> Result<Vec<i64>, sqlx::Error> {
        sqlx::query_scalar("SELECT id FROM requeue_jobs WHERE state = 'running' ORDER BY id").fetch_all(self).await
    }

    async fn lock_job_runner(&self, id: i64) -> Result<Option<Box<dyn NamedLock>>, sqlx::Error> {
        named_lock::try_lock(self, RUNNER_LOCK_KEY, id).await
    }
}

#[async_trait]
impl FrozenJob for PgOperatorTx {
    async fn pending_message_ids(&mut self, id: i64, limit: i64) -> Result<Vec<String>, sqlx::Error> {
        sqlx::query_scalar(
            "SELECT r.message_id FROM requeue_job_items i JOIN dedup_records r ON r.id = i.record_id
             WHERE i.job_id = $1 AND i.state = 'pending' ORDER BY i.seq LIMIT $2",
        )
        .bind(id)
        .bind(limit)
        .fetch_all(&mut *self.0)
        .await
    }
}

#[async_trait]
impl JobChange for PgOperatorTx {
    async fn lock_job(&mut self, id: i64) -> Result<Option<String>, sqlx::Error> {
        sqlx::query_scalar("SELECT state FROM requeue_jobs WHERE id = $1 FOR UPDATE")
            .bind(id)
            .fetch_optional(&mut *self.0)
            .await
    }

    async fn set_job_state(&mut self, id: i64, to: &str, paused_reason: Option<&str>) -> Result<(), sqlx::Error> {
        sqlx::query(
            "UPDATE requeue_jobs SET state = $2, paused_reason = $3, updated_at = now(),
                    finished_at = CASE WHEN $2 = 'cancelled' THEN now() END
             WHERE id = $1",
        )
        .bind(id)
        .bind(to)
        .bind(paused_reason)
        .execute(&mut *self.0)
        .await
        .map(drop)
    }
}

/// A runner's batch on PostgreSQL.
struct PgRequeueBatch(Transaction<'static, Postgres>);

#[async_trait]
impl RequeueBatch for PgRequeueBatch {
    async fn finish(mut self: Box<Self>, id: i64, claimable: &[i64], verdicts: &[ItemVerdict]) -> Result<(), sqlx::Error> {
        let tx = &mut self.0;
        make_claimable(tx, claimable).await?;
        let seqs: Vec<i32> = verdicts.iter().map(|v| v.seq).collect();
        let states: Vec<&str> = verdicts.iter().map(|v| v.state).collect();
        let details: Vec<Option<&str>> = verdicts.iter().map(|v| v.detail.as_deref()).collect();
        sqlx::query(
            "UPDATE requeue_job_items i SET state = v.state, detail = v.detail
             FROM unnest($2::int[], $3::text[], $4::text[]) AS v(seq, state, detail)
             WHERE i.job_id = $1 AND i.seq = v.seq",
        )
        .bind(id)
        .bind(&seqs)
        .bind(&states)
        .bind(&details)
        .execute(&mut **tx)
        .await?;
        let count = |s: &str| verdicts.iter().filter(|v| v.state == s).count() as i64;
        sqlx::query(
            "UPDATE requeue_jobs SET done = done + $2, skipped = skipped + $3, failed = failed + $4, updated_at = now(),
                    state = CASE WHEN state = 'running' AND NOT EXISTS (
                        SELECT 1 FROM requeue_job_items WHERE job_id = $1 AND state = 'pending') THEN 'completed' ELSE state END,
                    finished_at = CASE WHEN state = 'running' AND NOT EXISTS (
                        SELECT 1 FROM requeue_job_items WHERE job_id = $1 AND state = 'pending') THEN now() ELSE finished_at END
             WHERE id = $1",
        )
        .bind(id)
        .bind(count("done"))
        .bind(count("skipped"))
        .bind(count("failed"))
        .execute(&mut **tx)
        .await?;
        self.0.commit().await
    }
}
