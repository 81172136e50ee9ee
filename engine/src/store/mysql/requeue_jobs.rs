//! MySQL's bulk requeue jobs ([`RequeueJobBooks`]): the selection frozen by one `INSERT …
//! SELECT` (a consistent read under `READ COMMITTED`: no record is locked), the job's id by
//! `LAST_INSERT_ID()` where PostgreSQL has `RETURNING`; a batch's pending items locked (`FOR
//! UPDATE`, so two batches of one job never share one) and its records locked through the
//! dedup key, one consumer group at a time, in the consumers' claim order; the items' verdicts
//! written by one `INSERT … ON DUPLICATE KEY UPDATE` on their primary key (no `unnest`); the
//! status counts' delta rows beside the records' change (no triggers); and one runner per job by
//! `GET_LOCK` on a connection of its own.

use std::collections::BTreeMap;

use async_trait::async_trait;
use sqlx::mysql::MySqlPool;
use sqlx::{MySql, QueryBuilder, Transaction};

use super::named_lock;
use super::operator_tx::MySqlOperatorTx;
use super::record_books::{STORED_MESSAGE, make_claimable};
use super::arrival::ArrivalIds;
use super::records::push_filter;
use super::sql::repeat;
use crate::actions::bulk::{
    FrozenJob, FrozenSelection, ItemVerdict, JobChange, LockedCandidate, NewRequeueJob, PendingItem, RequeueBatch,
    RequeueJob, RequeueJobBooks, RunnerView,
};
use crate::actions::NamedLock;
use crate::console::filter::RecordFilter;

/// Why a matched record is not requeued (`NULL`: it is), evaluated on `dedup_records` rows;
/// PostgreSQL's rule, on the database's UTC clock.
const SKIP_REASON_SQL: &str = "CASE
    WHEN status = 'succeeded' THEN 'already succeeded'
    WHEN status = 'processing' AND lease_expires_at >= UTC_TIMESTAMP(6) THEN 'lease live'
    WHEN status = 'processing' THEN 'stuck: release it first'
    WHEN poison THEN 'poison message'
    WHEN payload IS NULL OR payload_truncated THEN 'payload missing'
END";

/// A job's columns as [`RequeueJob`] reads them (`_bin` text `AS CHAR`, the filter as JSON text).
const JOB_COLUMNS: &str = "id, created_at, CAST(created_by AS CHAR) AS created_by, CAST(reason AS CHAR) AS reason,
    CAST(filter AS CHAR) AS filter, CAST(state AS CHAR) AS state, CAST(paused_reason AS CHAR) AS paused_reason,
    rate_per_sec, canary_size, failure_threshold, total, done, skipped, failed, started_at, finished_at,
    TIMESTAMPDIFF(MICROSECOND, started_at, COALESCE(finished_at, UTC_TIMESTAMP(6))) / 1e6 AS elapsed_secs";

/// The prefix of a job runner's lock name ([`named_lock::LOCK_NAME`]).
pub(crate) const RUNNER_LOCK: &str = "requeue_job.";

#[async_trait]
impl RequeueJobBooks for MySqlPool {
    async fn requeue_counts(&self, filter: &RecordFilter, limit: i64) -> Result<Vec<(Option<String>, i64)>, sqlx::Error> {
        let mut q: QueryBuilder<'_, MySql> = QueryBuilder::new(format!(
            "SELECT skip, COUNT(*) AS n FROM (SELECT {SKIP_REASON_SQL} AS skip FROM dedup_records d"
        ));
        push_filter(&mut q, filter, ArrivalIds::of(self, filter).await?);
        q.push(" LIMIT ").push_bind(limit).push(") s GROUP BY skip");
        q.build_query_as().fetch_all(self).await
    }

    async fn requeue_job(&self, id: i64) -> Result<Option<RequeueJob>, sqlx::Error> {
        sqlx::query_as(&format!("SELECT {JOB_COLUMNS} FROM requeue_jobs WHERE id = ?"))
            .bind(id)
            .fetch_optional(self)
            .await
    }

    async fn requeue_jobs(&self, limit: i64) -> Result<Vec<RequeueJob>, sqlx::Error> {
        sqlx::query_as(&format!("SELECT {JOB_COLUMNS} FROM requeue_jobs ORDER BY id DESC LIMIT ?"))
            .bind(limit)
            .fetch_all(self)
            .await
    }

    async fn freeze_requeue_job(
        &self,
        job: &NewRequeueJob<'_>,
        limit: i64,
    ) -> Result<(FrozenSelection, Box<dyn FrozenJob>), sqlx::Error> {
        let ids = ArrivalIds::of(self, job.filter).await?;
        let mut tx = self.begin().await?;
        let id = sqlx::query(
            "INSERT INTO requeue_jobs (created_by, reason, filter, rate_per_sec, canary_size, failure_threshold, total)
             VALUES (?, ?, ?, ?, ?, ?, 0)",
        )
        .bind(job.actor)
        .bind(job.reason)
        .bind(job.filter_json.to_string())
        .bind(job.rate_per_sec)
        .bind(job.canary_size)
        .bind(job.failure_threshold)
        .execute(&mut *tx)
        .await?
        .last_insert_id();
        let id = i64::try_from(id).map_err(|e| sqlx::Error::Decode(e.into()))?;
        let mut q: QueryBuilder<'_, MySql> = QueryBuilder::new(
            "INSERT INTO requeue_job_items (job_id, seq, record_id, state, detail, record_version)
             SELECT ",
        );
        q.push_bind(id).push(format!(
            ", ROW_NUMBER() OVER (ORDER BY id), id, IF(skip IS NULL, 'pending', 'skipped'), skip, version
             FROM (SELECT d.id, {SKIP_REASON_SQL} AS skip, d.version FROM dedup_records d"
        ));
        push_filter(&mut q, job.filter, ids);
        q.push(" ORDER BY d.id LIMIT ").push_bind(limit).push(") s");
        q.build().execute(&mut *tx).await?;
        let (total, skipped): (i64, i64) = sqlx::query_as(
            "SELECT COUNT(*), COUNT(IF(state = 'skipped', 1, NULL)) FROM requeue_job_items WHERE job_id = ?",
        )
        .bind(id)
        .fetch_one(&mut *tx)
        .await?;
        sqlx::query("UPDATE requeue_jobs SET total = ?, skipped = ? WHERE id = ?")
            .bind(total)
            .bind(skipped)
            .bind(id)
            .execute(&mut *tx)
            .await?;
        Ok((FrozenSelection { id, total, skipped }, Box::new(MySqlOperatorTx(tx))))
    }

    async fn begin_job_change(&self) -> Result<Box<dyn JobChange>, sqlx::Error> {
        Ok(Box::new(MySqlOperatorTx(self.begin().await?)))
    }

    async fn runner_view(&self, id: i64) -> Result<Option<RunnerView>, sqlx::Error> {
        sqlx::query_as(
            "SELECT CAST(state AS CHAR) AS state, CAST(created_by AS CHAR) AS created_by, rate_per_sec, canary_size,
                    failure_threshold, done, failed
             FROM requeue_jobs WHERE id = ?",
        )
        .bind(id)
        .fetch_optional(self)
        .await
    }

    async fn pending_sources(&self, id: i64) -> Result<Vec<(String, String)>, sqlx::Error> {
        sqlx::query_as(
            "SELECT DISTINCT CAST(r.consumer_group AS CHAR), CAST(r.source_broker AS CHAR)
             FROM requeue_job_items i JOIN dedup_records r ON r.id = i.record_id
             WHERE i.job_id = ? AND i.state = 'pending'",
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
             WHERE job_id = ? AND state = 'pending' ORDER BY seq LIMIT ? FOR UPDATE",
        )
        .bind(id)
        .bind(limit)
        .fetch_all(&mut *tx)
        .await?;
        let rows = if items.is_empty() { Vec::new() } else { lock_candidates(&mut tx, &items).await? };
        Ok((items, rows, Box::new(MySqlRequeueBatch(tx))))
    }

    async fn pause_running_job(&self, id: i64, why: &str) -> Result<bool, sqlx::Error> {
        let paused = sqlx::query(
            "UPDATE requeue_jobs SET state = 'paused', paused_reason = ?, updated_at = UTC_TIMESTAMP(6)
             WHERE id = ? AND state = 'running'",
        )
        .bind(why)
        .bind(id)
        .execute(self)
        .await?;
        Ok(paused.rows_affected() == 1)
    }

    async fn complete_running_job(&self, id: i64) -> Result<(), sqlx::Error> {
        sqlx::query(
            "UPDATE requeue_jobs SET state = 'completed', finished_at = UTC_TIMESTAMP(6), updated_at = UTC_TIMESTAMP(6)
             WHERE id = ? AND state = 'running'
               AND NOT EXISTS (SELECT 1 FROM requeue_job_items WHERE job_id = ? AND state = 'pending')",
        )
        .bind(id)
        .bind(id)
        .execute(self)
        .await
        .map(drop)
    }

    async fn running_job_ids(&self) -> Result<Vec<i64>, sqlx::Error> {
        sqlx::query_scalar("SELECT id FROM requeue_jobs WHERE state = 'running' ORDER BY id").fetch_all(self).await
    }

    async fn lock_job_runner(&self, id: i64) -> Result<Option<Box<dyn NamedLock>>, sqlx::Error> {
        named_lock::try_lock(self, RUNNER_LOCK, id).await
    }
}

/// Locks the records of `items` that still exist and reads them. InnoDB locks rows in the order
/// it reads them, whatever the `ORDER BY`, so the rows are read through the dedup key
/// (`FORCE INDEX`), one consumer group at a time in key order, as the consumers' claims lock
/// them; their keys are read first, without locking (a record deleted meanwhile is not found).
async fn lock_candidates(
    tx: &mut Transaction<'static, MySql>,
    items: &[PendingItem],
) -> Result<Vec<LockedCandidate>, sqlx::Error> {
    let sql = format!("SELECT consumer_group, message_id FROM dedup_records WHERE id IN ({})", repeat("?", items.len()));
    let mut q = sqlx::query_as::<_, (Vec<u8>, Vec<u8>)>(&sql);
    for item in items {
        q = q.bind(item.record_id);
    }
    let mut by_group: BTreeMap<Vec<u8>, Vec<Vec<u8>>> = BTreeMap::new();
    for (group, message_id) in q.fetch_all(&mut **tx).await? {
        by_group.entry(group).or_default().push(message_id);
    }
    let mut rows = Vec::with_capacity(items.len());
    for (group, mut message_ids) in by_group {
        message_ids.sort();
        let sql = format!(
            "SELECT {SKIP_REASON_SQL} AS skip, version, {STORED_MESSAGE}
             FROM dedup_records FORCE INDEX (dedup_records_group_message_key)
             WHERE consumer_group = ? AND message_id IN ({}) ORDER BY message_id FOR UPDATE",
            repeat("?", message_ids.len())
        );
        let mut q = sqlx::query_as::<_, LockedCandidate>(&sql).bind(group);
        for message_id in message_ids {
            q = q.bind(message_id);
        }
        rows.extend(q.fetch_all(&mut **tx).await?);
    }
    Ok(rows)
}

#[async_trait]
impl FrozenJob for MySqlOperatorTx {
    async fn pending_message_ids(&mut self, id: i64, limit: i64) -> Result<Vec<String>, sqlx::Error> {
        sqlx::query_scalar(
            "SELECT CAST(r.message_id AS CHAR) FROM requeue_job_items i JOIN dedup_records r ON r.id = i.record_id
             WHERE i.job_id = ? AND i.state = 'pending' ORDER BY i.seq LIMIT ?",
        )
        .bind(id)
        .bind(limit)
        .fetch_all(&mut *self.0)
        .await
    }
}

#[async_trait]
impl JobChange for MySqlOperatorTx {
    async fn lock_job(&mut self, id: i64) -> Result<Option<String>, sqlx::Error> {
        sqlx::query_scalar("SELECT CAST(state AS CHAR) FROM requeue_jobs WHERE id = ? FOR UPDATE")
            .bind(id)
            .fetch_optional(&mut *self.0)
            .await
    }

    async fn set_job_state(&mut self, id: i64, to: &str, paused_reason: Option<&str>) -> Result<(), sqlx::Error> {
        sqlx::query(
            "UPDATE requeue_jobs SET state = ?, paused_reason = ?, updated_at = UTC_TIMESTAMP(6),
                    finished_at = IF(? = 'cancelled', UTC_TIMESTAMP(6), NULL)
             WHERE id = ?",
        )
        .bind(to)
        .bind(paused_reason)
        .bind(to)
        .bind(id)
        .execute(&mut *self.0)
        .await
        .map(drop)
    }
}

/// A runner's batch on MySQL.
struct MySqlRequeueBatch(Transaction<'static, MySql>);

#[async_trait]
impl RequeueBatch for MySqlRequeueBatch {
    async fn finish(mut self: Box<Self>, id: i64, claimable: &[i64], verdicts: &[ItemVerdict]) -> Result<(), sqlx::Error> {
        let tx = &mut self.0;
        // The job's row first: the verdicts' upsert checks its foreign key with a shared lock on
        // it, and the counters' `UPDATE` then wants it exclusive; an operator's `lock_job`
        // waiting in between would deadlock with the batch (found by a break review: resumes
        // answered 500 with error 1213).
        sqlx::query("SELECT id FROM requeue_jobs WHERE id = ? FOR UPDATE").bind(id).execute(&mut **tx).await?;
        make_claimable(tx, claimable).await?;
        if !verdicts.is_empty() {
            let mut q: QueryBuilder<'_, MySql> =
                QueryBuilder::new("INSERT INTO requeue_job_items (job_id, seq, record_id, state, detail) ");
            q.push_values(verdicts, |mut row, v| {
                row.push_bind(id).push_bind(v.seq).push_bind(v.record_id).push_bind(v.state).push_bind(v.detail.clone());
            });
            q.push(" ON DUPLICATE KEY UPDATE state = VALUES(state), detail = VALUES(detail)");
            q.build().execute(&mut **tx).await?;
        }
        let count = |s: &str| verdicts.iter().filter(|v| v.state == s).count() as i64;
        // MySQL assigns left to right, each assignment seeing the ones before: `finished_at` is
        // set before `state` changes.
        sqlx::query(
            "UPDATE requeue_jobs SET done = done + ?, skipped = skipped + ?, failed = failed + ?,
                    updated_at = UTC_TIMESTAMP(6),
                    finished_at = IF(state = 'running' AND NOT EXISTS (
                        SELECT 1 FROM requeue_job_items WHERE job_id = ? AND state = 'pending'),
                        UTC_TIMESTAMP(6), finished_at),
                    state = IF(state = 'running' AND NOT EXISTS (
                        SELECT 1 FROM requeue_job_items WHERE job_id = ? AND state = 'pending'), 'completed', state)
             WHERE id = ?",
        )
        .bind(count("done"))
        .bind(count("skipped"))
        .bind(count("failed"))
        .bind(id)
        .bind(id)
        .bind(id)
        .execute(&mut **tx)
        .await?;
        self.0.commit().await
    }
}
