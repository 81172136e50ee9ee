//! PostgreSQL's cleanup schedules ([`CleanupBooks`]): a delete batch is a transaction of two
//! statements (the batch locked `FOR UPDATE SKIP LOCKED`, then `DELETE … RETURNING` with the
//! fingerprints kept by `INSERT … ON CONFLICT`), the status counts following by trigger; one
//! runner per schedule by a session advisory lock (`pg_try_advisory_lock(CLEANUP_LOCK_KEY,
//! schedule id)`).

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use sqlx::PgPool;

use super::audit;
use super::named_lock;
use super::records::ARRIVAL_SLACK;
use crate::actions::cleanup::late::{LateDeliveries, LateDuplicates};
use crate::actions::cleanup::{
    CleanupBooks, CleanupRun, CleanupSchedule, DeleteBatch, RunEnd, ScheduleRow,
};
use crate::actions::NamedLock;
use crate::audit::NewAuditEntry;

const SCHEDULE_COLUMNS: &str = "id, name, cron, retention_days, batch_size, statuses, consumer_group, enabled, \
                                fingerprint_days, last_run_for, next_run_at, created_by, updated_at";

const RUN_COLUMNS: &str =
    "id, schedule_id, trigger, tick_at, actor, cutoff, started_at, finished_at, rows_deleted, batches, error";

/// First key of the schedules' advisory locks (`pg_try_advisory_lock(key, schedule id)`).
pub(crate) const CLEANUP_LOCK_KEY: i32 = 0x434c_4e52; // "CLNR"

/// Cleanup keeps a record while a conflicting copy of its message id waits for an operator
/// (`record_conflicts`): the record page is where the copy is settled.
const KEEPS_OPEN_CONFLICTS: &str =
    "AND NOT EXISTS (SELECT 1 FROM record_conflicts c WHERE c.record_id = dedup_records.id AND c.settled_at IS NULL)";

/// The age column of a status, a condition that narrows the records to an index, and the
/// order batches take them in. `succeeded` records (no index of their own since migration
/// `..._lean_write_path`): by id, below the first id seen after the cutoff (a record completes
/// after it was first seen; `dedup_records_id_at`); failed and dead ones on
/// `dedup_records_cleanup_unsettled_idx` by `updated_at`.
fn age_column(status: &str) -> (&'static str, String, &'static str) {
    if status == "succeeded" {
        ("completed_at", format!("AND id < (SELECT dedup_records_id_at($2 + {ARRIVAL_SLACK}))"), "id")
    } else {
        ("updated_at", String::new(), "updated_at")
    }
}

#[async_trait]
impl CleanupBooks for PgPool {
    async fn cleanup_schedules(&self) -> Result<Vec<CleanupSchedule>, sqlx::Error> {
        sqlx::query_as(&format!("SELECT {SCHEDULE_COLUMNS} FROM cleanup_schedules ORDER BY name")).fetch_all(self).await
    }

    async fn cleanup_schedule(&self, id: i64) -> Result<Option<CleanupSchedule>, sqlx::Error> {
        sqlx::query_as(&format!("SELECT {SCHEDULE_COLUMNS} FROM cleanup_schedules WHERE id = $1"))
            .bind(id)
            .fetch_optional(self)
            .await
    }

    async fn cleanup_runs(&self, schedule: Option<i64>, limit: i64) -> Result<Vec<CleanupRun>, sqlx::Error> {
        sqlx::query_as(&format!(
            "SELECT {RUN_COLUMNS} FROM cleanup_runs WHERE ($1::bigint IS NULL OR schedule_id = $1) ORDER BY id DESC LIMIT $2"
        ))
        .bind(schedule)
        .bind(limit)
        .fetch_all(self)
        .await
    }

    async fn save_cleanup_schedule(
        &self,
        actor: &str,
        id: Option<i64>,
        row: &ScheduleRow<'_>,
    ) -> Result<Option<CleanupSchedule>, sqlx::Error> {
        let sql = match id {
            None => format!(
                "INSERT INTO cleanup_schedules (name, cron, retention_days, batch_size, statuses, consumer_group,
                     enabled, next_run_at, fingerprint_days, created_by)
                 VALUES ($2, $3, $4, $5, $6, $7, $8, $9, $10, $1) RETURNING {SCHEDULE_COLUMNS}"
            ),
            Some(_) => format!(
                "UPDATE cleanup_schedules SET name = $2, cron = $3, retention_days = $4, batch_size = $5,
                     statuses = $6, consumer_group = $7, enabled = $8, next_run_at = $9, fingerprint_days = $10,
                     updated_at = now()
                 WHERE id = $1 RETURNING {SCHEDULE_COLUMNS}"
            ),
        };
        let query = sqlx::query_as::<_, CleanupSchedule>(&sql);
        let query = match id {
            None => query.bind(actor),
            Some(id) => query.bind(id),
        };
        query
            .bind(row.name)
            .bind(row.cron)
            .bind(row.retention_days)
            .bind(row.batch_size)
            .bind(row.statuses)
            .bind(row.consumer_group)
            .bind(row.enabled)
            .bind(row.next_run_at)
            .bind(row.fingerprint_days)
            .fetch_optional(self)
            .await
    }

    async fn cleanup_cutoff(&self, retention_days: i32) -> Result<DateTime<Utc>, sqlx::Error> {
        sqlx::query_scalar("SELECT now() - make_interval(days => $1)").bind(retention_days).fetch_one(self).await
    }

    async fn count_deletable(&self, status: &str, cutoff: DateTime<Utc>, group: Option<&str>) -> Result<i64, sqlx::Error> {
        let (column, narrow, _) = age_column(status);
        sqlx::query_scalar(&format!(
            "SELECT count(*) FROM dedup_records WHERE status = $1 AND {column} < $2 {narrow}
               AND ($3::text IS NULL OR consumer_group = $3) {KEEPS_OPEN_CONFLICTS}"
        ))
        .bind(status)
        .bind(cutoff)
        .bind(group)
        .fetch_one(self)
        .await
    }

    /// Two statements in one transaction: the batch is chosen and locked (`FOR UPDATE SKIP
    /// LOCKED`: a record whose conflicting copy is being kept is locked by its keeper, and
    /// skipped), then deleted by a statement whose snapshot follows the locks, so it sees a copy
    /// committed before them and keeps that record. One statement would read `record_conflicts`
    /// as of its start and delete a record whose copy committed while it ran. Fingerprints are
    /// written in fingerprint order (one lock order for concurrent runs) and grouped, since two
    /// records may share one; a fingerprint kept already keeps its earliest sighting and its
    /// latest horizon.
    async fn delete_batch(&self, batch: &DeleteBatch<'_>) -> Result<i64, sqlx::Error> {
        let (column, narrow, order) = age_column(batch.status);
        let mut tx = self.begin().await?;
        let locked: Vec<i64> = sqlx::query_scalar(&format!(
            "SELECT id FROM dedup_records WHERE status = $1 AND {column} < $2 {narrow}
               AND ($3::text IS NULL OR consumer_group = $3) {KEEPS_OPEN_CONFLICTS}
             ORDER BY {order} LIMIT $4 FOR UPDATE SKIP LOCKED"
        ))
        .bind(batch.status)
        .bind(batch.cutoff)
        .bind(batch.group)
        .bind(i64::from(batch.limit))
        .fetch_all(&mut *tx)
        .await?;
        if locked.is_empty() {
            return Ok(0);
        }
        let deleted = sqlx::query_scalar(&format!(
            "WITH gone AS (
                 DELETE FROM dedup_records WHERE id = ANY($1) {KEEPS_OPEN_CONFLICTS}
                 RETURNING consumer_group, message_type, message_id, first_seen_at
             ), kept AS (
                 INSERT INTO dedup_fingerprints AS f (fingerprint, first_seen_at, forget_at)
                 SELECT dedup_fingerprint(consumer_group, message_type, message_id), min(first_seen_at),
                        now() + make_interval(days => $2)
                 FROM gone WHERE $3 GROUP BY 1 ORDER BY 1
                 ON CONFLICT (fingerprint) DO UPDATE SET
                     first_seen_at = LEAST(f.first_seen_at, EXCLUDED.first_seen_at),
                     forget_at = GREATEST(f.forget_at, EXCLUDED.forget_at)
             )
             SELECT count(*) FROM gone"
        ))
        .bind(&locked)
        .bind(batch.fingerprint_days)
        .bind(batch.keeps_fingerprints())
        .fetch_one(&mut *tx)
        .await?;
        tx.commit().await?;
        Ok(deleted)
    }

    async fn forget_fingerprints(&self, limit: i32) -> Result<i64, sqlx::Error> {
        let gone = sqlx::query(
            "DELETE FROM dedup_fingerprints WHERE fingerprint IN (
                 SELECT fingerprint FROM dedup_fingerprints WHERE forget_at < now() LIMIT $1)",
        )
        .bind(i64::from(limit))
        .execute(self)
        .await?;
        Ok(gone.rows_affected() as i64)
    }

    async fn forget_notes(&self, days: i32) -> Result<(), sqlx::Error> {
        sqlx::query("DELETE FROM late_duplicates WHERE seen_at < now() - make_interval(days => $1)")
            .bind(days)
            .execute(self)
            .await?;
        sqlx::query("DELETE FROM record_conflicts WHERE settled_at < now() - make_interval(days => $1)")
            .bind(days)
            .execute(self)
            .await?;
        Ok(())
    }

    async fn run_progress(&self, run_id: i64, rows_deleted: i64, batches: i32) -> Result<(), sqlx::Error> {
        sqlx::query("UPDATE cleanup_runs SET rows_deleted = $2, batches = $3 WHERE id = $1")
            .bind(run_id)
            .bind(rows_deleted)
            .bind(batches)
            .execute(self)
            .await
            .map(drop)
    }

    async fn finish_run(&self, end: &RunEnd<'_>, entry: &NewAuditEntry<'_>) -> Result<(), sqlx::Error> {
        let mut tx = self.begin().await?;
        sqlx::query(
            "UPDATE cleanup_runs SET rows_deleted = $2, batches = $3, error = $4, finished_at = now() WHERE id = $1",
        )
        .bind(end.run_id)
        .bind(end.rows_deleted)
        .bind(end.batches)
        .bind(end.error)
        .execute(&mut *tx)
        .await?;
        audit::insert(&mut *tx, entry).await?;
        tx.commit().await
    }

    async fn due_schedules(&self) -> Result<Vec<CleanupSchedule>, sqlx::Error> {
        sqlx::query_as(&format!(
            "SELECT {SCHEDULE_COLUMNS} FROM cleanup_schedules WHERE enabled AND next_run_at <= now() ORDER BY id"
        ))
        .fetch_all(self)
        .await
    }

    async fn claim_tick(
        &self,
        id: i64,
        tick: DateTime<Utc>,
        next: DateTime<Utc>,
        actor: &str,
        cutoff: DateTime<Utc>,
    ) -> Result<Option<i64>, sqlx::Error> {
        let mut tx = self.begin().await?;
        let claimed = sqlx::query(
            "UPDATE cleanup_schedules SET last_run_for = next_run_at, next_run_at = $3
             WHERE id = $1 AND enabled AND next_run_at = $2",
        )
        .bind(id)
        .bind(tick)
        .bind(next)
        .execute(&mut *tx)
        .await?;
        if claimed.rows_affected() == 0 {
            return Ok(None);
        }
        let run_id: Option<i64> = sqlx::query_scalar(
            "INSERT INTO cleanup_runs (schedule_id, trigger, tick_at, actor, cutoff) VALUES ($1, 'schedule', $2, $3, $4)
             ON CONFLICT (schedule_id, tick_at) DO NOTHING RETURNING id",
        )
        .bind(id)
        .bind(tick)
        .bind(actor)
        .bind(cutoff)
        .fetch_optional(&mut *tx)
        .await?;
        tx.commit().await?;
        Ok(run_id)
    }

    async fn start_manual_run(&self, id: i64, actor: &str, cutoff: DateTime<Utc>) -> Result<i64, sqlx::Error> {
        sqlx::query_scalar(
            "INSERT INTO cleanup_runs (schedule_id, trigger, actor, cutoff) VALUES ($1, 'manual', $2, $3) RETURNING id",
        )
        .bind(id)
        .bind(actor)
        .bind(cutoff)
        .fetch_one(self)
        .await
    }

    async fn lock_schedule(&self, id: i64) -> Result<Option<Box<dyn NamedLock>>, sqlx::Error> {
        named_lock::try_lock(self, CLEANUP_LOCK_KEY, id).await
    }

    async fn retention_by_group(&self) -> Result<(bool, Vec<(Option<String>, i64)>), sqlx::Error> {
        let kept: bool = sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM dedup_fingerprints)").fetch_one(self).await?;
        let rows = sqlx::query_as(
            "SELECT consumer_group, min(retention_days)::bigint * 86400000 FROM cleanup_schedules
             WHERE enabled AND 'succeeded' = ANY(statuses) GROUP BY consumer_group",
        )
        .fetch_all(self)
        .await?;
        Ok((kept, rows))
    }

    async fn late_deliveries(&self, days: i32) -> Result<Vec<LateDeliveries>, sqlx::Error> {
        Ok(sqlx::query_as::<_, (String, i64, i64)>(
            "SELECT consumer_group, sum(count)::bigint, max(max_age_ms) FROM late_deliveries
             WHERE day > current_date - $1 GROUP BY consumer_group ORDER BY consumer_group",
        )
        .bind(days)
        .fetch_all(self)
        .await?
        .into_iter()
        .map(|(consumer_group, count, max_age_ms)| LateDeliveries { consumer_group, count, max_age_ms })
        .collect())
    }

    async fn late_duplicates(&self, days: i32) -> Result<Vec<LateDuplicates>, sqlx::Error> {
        sqlx::query_as(
            "SELECT consumer_group, count(*) AS count, count(*) FILTER (WHERE held) AS held,
                    max(delay_ms) AS longest_delay_ms, max(seen_at) AS last_seen_at
             FROM late_duplicates WHERE seen_at > now() - make_interval(days => $1)
             GROUP BY consumer_group ORDER BY consumer_group",
        )
        .bind(days)
        .fetch_all(self)
        .await
    }

    async fn longest_delay(&self, days: i32) -> Result<Option<i64>, sqlx::Error> {
        sqlx::query_scalar(
            "SELECT GREATEST((SELECT max(max_delay_ms) FROM duplicate_delays),
                             (SELECT max(delay_ms) FROM late_duplicates WHERE seen_at > now() - make_interval(days => $1)),
                             (SELECT max(max_age_ms) FROM late_deliveries WHERE day > current_date - $1))",
        )
        .bind(days)
        .fetch_one(self)
        .await
    }
}
