//! MySQL's cleanup schedules ([`CleanupBooks`]; PostgreSQL's rules, migration …12). A delete
//! batch is one transaction of a few statements where PostgreSQL has one (no `DELETE … USING`,
//! no `RETURNING`, no trigger): the batch's ids selected `FOR UPDATE SKIP LOCKED` (a consumer's
//! row is skipped, never waited for), then, by those ids, the status counts' delta rows, the
//! fingerprints of the deleted `succeeded` records (`INSERT … ON DUPLICATE KEY UPDATE`), and the
//! delete. `succeeded` records have no index of their own: a batch reads them in primary-key
//! order below the first id seen after the cutoff (a binary search over the primary key, as
//! PostgreSQL's `dedup_records_id_at`, in the engine: no stored function); failed and dead ones
//! through `dedup_records_unsettled_idx`. Times are the database's `UTC_TIMESTAMP(6)`. One
//! runner per schedule holds `GET_LOCK` on a connection of its own.

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use sqlx::mysql::MySqlPool;
use sqlx::{FromRow, MySql, MySqlConnection, QueryBuilder};

use super::arrival::{ARRIVAL_SLACK, first_id_seen_at};
use super::audit;
use super::named_lock;
use super::sql::fingerprint;
use crate::actions::cleanup::late::{LateDeliveries, LateDuplicates};
use crate::actions::cleanup::{
    CleanupBooks, CleanupRun, CleanupSchedule, DeleteBatch, RunEnd, ScheduleRow,
};
use crate::actions::NamedLock;
use crate::audit::NewAuditEntry;

const SCHEDULE_COLUMNS: &str = "id, CAST(name AS CHAR) AS name, CAST(cron AS CHAR) AS cron, retention_days, batch_size,
    CAST(statuses AS CHAR) AS statuses, CAST(consumer_group AS CHAR) AS consumer_group, enabled, fingerprint_days,
    last_run_for, next_run_at, CAST(created_by AS CHAR) AS created_by, updated_at";

const RUN_COLUMNS: &str = "id, schedule_id, CAST(`trigger` AS CHAR) AS `trigger`, tick_at, CAST(actor AS CHAR) AS actor,
    cutoff, started_at, finished_at, rows_deleted, batches, CAST(error AS CHAR) AS error";

/// The prefix of a schedule's lock name ([`named_lock::LOCK_NAME`]).
pub(crate) const SCHEDULE_LOCK: &str = "cleanup_schedule.";

/// Ids per statement of a batch's count deltas, fingerprints and delete: MySQL 8 plans a longer
/// `IN` list past its `range_optimizer_max_mem_size` (8 MB, about 230 bytes a value) as a full
/// scan.
const IDS_PER_STATEMENT: usize = 5_000;

/// Tries of a delete batch chosen as a deadlock victim ([`CleanupBooks::delete_batch`]).
const DEADLOCK_TRIES: u32 = 3;

/// A schedule's row as MySQL returns it: its statuses are a `SET`, read as `dead,succeeded`.
#[derive(FromRow)]
struct ScheduleRead {
    id: i64,
    name: String,
    cron: String,
    retention_days: i32,
    batch_size: i32,
    statuses: String,
    consumer_group: Option<String>,
    enabled: bool,
    fingerprint_days: Option<i32>,
    last_run_for: Option<DateTime<Utc>>,
    next_run_at: Option<DateTime<Utc>>,
    created_by: String,
    updated_at: DateTime<Utc>,
}

impl From<ScheduleRead> for CleanupSchedule {
    fn from(r: ScheduleRead) -> Self {
        Self {
            id: r.id,
            name: r.name,
            cron: r.cron,
            retention_days: r.retention_days,
            batch_size: r.batch_size,
            statuses: r.statuses.split(',').filter(|s| !s.is_empty()).map(str::to_owned).collect(),
            consumer_group: r.consumer_group,
            enabled: r.enabled,
            fingerprint_days: r.fingerprint_days,
            last_run_for: r.last_run_for,
            next_run_at: r.next_run_at,
            created_by: r.created_by,
            updated_at: r.updated_at,
        }
    }
}

/// Appends the records a batch of `status` may delete (`d`): older than `cutoff` (`succeeded`:
/// by `completed_at`, below the first id seen after the cutoff and its slack; the others by
/// `updated_at`), of `group` unless `None`, without an open conflicting copy.
async fn push_deletable(
    conn: &mut MySqlConnection,
    q: &mut QueryBuilder<'_, MySql>,
    status: &str,
    cutoff: DateTime<Utc>,
    group: Option<&str>,
) -> Result<(), sqlx::Error> {
    if status == "succeeded" {
        let below = first_id_seen_at(conn, cutoff + ARRIVAL_SLACK).await?;
        q.push(" WHERE d.status = 'succeeded' AND d.completed_at < ").push_bind(cutoff);
        q.push(" AND d.id < ").push_bind(below);
    } else {
        q.push(" WHERE d.unsettled_status = ").push_bind(status.to_owned());
        q.push(" AND d.updated_at < ").push_bind(cutoff);
    }
    if let Some(group) = group {
        q.push(" AND d.consumer_group = ").push_bind(group.as_bytes().to_vec());
    }
    q.push(" AND NOT EXISTS (SELECT 1 FROM record_conflicts c WHERE c.record_id = d.id AND c.settled_at IS NULL)");
    Ok(())
}

/// `ids` as an SQL list of integer literals (no binds: a batch may hold 100 000).
fn id_list(ids: &[i64]) -> String {
    ids.iter().map(i64::to_string).collect::<Vec<_>>().join(",")
}

#[async_trait]
impl CleanupBooks for MySqlPool {
    async fn cleanup_schedules(&self) -> Result<Vec<CleanupSchedule>, sqlx::Error> {
        let rows: Vec<ScheduleRead> =
            sqlx::query_as(&format!("SELECT {SCHEDULE_COLUMNS} FROM cleanup_schedules ORDER BY name")).fetch_all(self).await?;
        Ok(rows.into_iter().map(Into::into).collect())
    }

    async fn cleanup_schedule(&self, id: i64) -> Result<Option<CleanupSchedule>, sqlx::Error> {
        let row: Option<ScheduleRead> = sqlx::query_as(&format!("SELECT {SCHEDULE_COLUMNS} FROM cleanup_schedules WHERE id = ?"))
            .bind(id)
            .fetch_optional(self)
            .await?;
        Ok(row.map(Into::into))
    }

    async fn cleanup_runs(&self, schedule: Option<i64>, limit: i64) -> Result<Vec<CleanupRun>, sqlx::Error> {
        sqlx::query_as(&format!(
            "SELECT {RUN_COLUMNS} FROM cleanup_runs WHERE (? IS NULL OR schedule_id = ?) ORDER BY id DESC LIMIT ?"
        ))
        .bind(schedule)
        .bind(schedule)
        .bind(limit)
        .fetch_all(self)
        .await
    }

    /// In one transaction: the insert or update, then the row read back by its id
    /// (`LAST_INSERT_ID()` for a new one).
    async fn save_cleanup_schedule(
        &self,
        actor: &str,
        id: Option<i64>,
        row: &ScheduleRow<'_>,
    ) -> Result<Option<CleanupSchedule>, sqlx::Error> {
        let sql = match id {
            None => "INSERT INTO cleanup_schedules (name, cron, retention_days, batch_size, statuses, consumer_group,
                         enabled, next_run_at, fingerprint_days, created_by)
                     VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            Some(_) => "UPDATE cleanup_schedules SET name = ?, cron = ?, retention_days = ?, batch_size = ?,
                         statuses = ?, consumer_group = ?, enabled = ?, next_run_at = ?, fingerprint_days = ?,
                         updated_at = UTC_TIMESTAMP(6)
                     WHERE id = ?",
        };
        let mut tx = self.begin().await?;
        let query = sqlx::query(sql)
            .bind(row.name)
            .bind(row.cron)
            .bind(row.retention_days)
            .bind(row.batch_size)
            .bind(row.statuses.join(","))
            .bind(row.consumer_group.map(|g| g.as_bytes().to_vec()))
            .bind(row.enabled)
            .bind(row.next_run_at)
            .bind(row.fingerprint_days);
        let written = match id {
            None => query.bind(actor),
            Some(id) => query.bind(id),
        }
        .execute(&mut *tx)
        .await?;
        let id = match id {
            None => i64::try_from(written.last_insert_id()).map_err(|e| sqlx::Error::Decode(e.into()))?,
            Some(id) => id,
        };
        let saved: Option<ScheduleRead> =
            sqlx::query_as(&format!("SELECT {SCHEDULE_COLUMNS} FROM cleanup_schedules WHERE id = ?"))
                .bind(id)
                .fetch_optional(&mut *tx)
                .await?;
        tx.commit().await?;
        Ok(saved.map(Into::into))
    }

    async fn cleanup_cutoff(&self, retention_days: i32) -> Result<DateTime<Utc>, sqlx::Error> {
        sqlx::query_scalar("SELECT CAST(UTC_TIMESTAMP(6) - INTERVAL ? DAY AS DATETIME(6))").bind(retention_days).fetch_one(self).await
    }

    async fn count_deletable(&self, status: &str, cutoff: DateTime<Utc>, group: Option<&str>) -> Result<i64, sqlx::Error> {
        let mut conn = self.acquire().await?;
        let mut q = QueryBuilder::new("SELECT COUNT(*) FROM dedup_records d");
        push_deletable(&mut conn, &mut q, status, cutoff, group).await?;
        q.build_query_scalar().fetch_one(&mut *conn).await
    }

    /// The ids locked first (`FOR UPDATE SKIP LOCKED`, in id order); then, by those ids and in
    /// the same transaction, the count deltas (−1 per record, per group), the fingerprints
    /// (grouped, in fingerprint order: one lock order for concurrent runs) and the delete. A
    /// transaction chosen as a deadlock victim is run again, at most `DEADLOCK_TRIES` times in
    /// all, each rerun counted as the pipeline's are (`dedup_store_retries_total{group,
    /// reason="deadlock"}`): the delete locks the rows' secondary index entries, which a
    /// consumer's claim of a late copy may hold while it waits for the row (PostgreSQL's index
    /// entries take no lock).
    async fn delete_batch(&self, batch: &DeleteBatch<'_>) -> Result<i64, sqlx::Error> {
        let mut tries = 1;
        loop {
            match delete_batch_once(self, batch).await {
                Err(e) if tries < DEADLOCK_TRIES && is_deadlock(&e) => {
                    crate::store::count_deadlock_rerun(batch.group.unwrap_or_default());
                    tries += 1;
                }
                done => return done,
            }
        }
    }

    async fn forget_fingerprints(&self, limit: i32) -> Result<i64, sqlx::Error> {
        let gone = sqlx::query("DELETE FROM dedup_fingerprints WHERE forget_at < UTC_TIMESTAMP(6) ORDER BY forget_at LIMIT ?")
            .bind(i64::from(limit))
            .execute(self)
            .await?;
        Ok(gone.rows_affected() as i64)
    }

    async fn forget_notes(&self, days: i32) -> Result<(), sqlx::Error> {
        sqlx::query("DELETE FROM late_duplicates WHERE seen_at < UTC_TIMESTAMP(6) - INTERVAL ? DAY")
            .bind(days)
            .execute(self)
            .await?;
        sqlx::query("DELETE FROM record_conflicts WHERE settled_at < UTC_TIMESTAMP(6) - INTERVAL ? DAY")
            .bind(days)
            .execute(self)
            .await?;
        Ok(())
    }

    async fn run_progress(&self, run_id: i64, rows_deleted: i64, batches: i32) -> Result<(), sqlx::Error> {
        sqlx::query("UPDATE cleanup_runs SET rows_deleted = ?, batches = ? WHERE id = ?")
            .bind(rows_deleted)
            .bind(batches)
            .bind(run_id)
            .execute(self)
            .await
            .map(drop)
    }

    async fn finish_run(&self, end: &RunEnd<'_>, entry: &NewAuditEntry<'_>) -> Result<(), sqlx::Error> {
        let mut tx = self.begin().await?;
        sqlx::query(
            "UPDATE cleanup_runs SET rows_deleted = ?, batches = ?, error = ?, finished_at = UTC_TIMESTAMP(6) WHERE id = ?",
        )
        .bind(end.rows_deleted)
        .bind(end.batches)
        .bind(end.error)
        .bind(end.run_id)
        .execute(&mut *tx)
        .await?;
        audit::insert(&mut tx, entry).await?;
        tx.commit().await
    }

    async fn due_schedules(&self) -> Result<Vec<CleanupSchedule>, sqlx::Error> {
        let rows: Vec<ScheduleRead> = sqlx::query_as(&format!(
            "SELECT {SCHEDULE_COLUMNS} FROM cleanup_schedules WHERE enabled AND next_run_at <= UTC_TIMESTAMP(6) ORDER BY id"
        ))
        .fetch_all(self)
        .await?;
        Ok(rows.into_iter().map(Into::into).collect())
    }

    /// The compare-and-set first (matched rows: sqlx sends `CLIENT_FOUND_ROWS`), then the run;
    /// a run of the tick stored already (the unique key, 1062) leaves the claim committed and
    /// returns `None`, as PostgreSQL's `ON CONFLICT DO NOTHING`.
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
            "UPDATE cleanup_schedules SET last_run_for = next_run_at, next_run_at = ?
             WHERE id = ? AND enabled AND next_run_at = ?",
        )
        .bind(next)
        .bind(id)
        .bind(tick)
        .execute(&mut *tx)
        .await?;
        if claimed.rows_affected() == 0 {
            return Ok(None);
        }
        let inserted = sqlx::query(
            "INSERT INTO cleanup_runs (schedule_id, `trigger`, tick_at, actor, cutoff) VALUES (?, 'schedule', ?, ?, ?)",
        )
        .bind(id)
        .bind(tick)
        .bind(actor)
        .bind(cutoff)
        .execute(&mut *tx)
        .await;
        let run_id = match inserted {
            Ok(done) => Some(i64::try_from(done.last_insert_id()).map_err(|e| sqlx::Error::Decode(e.into()))?),
            Err(sqlx::Error::Database(e)) if e.kind() == sqlx::error::ErrorKind::UniqueViolation => None,
            Err(e) => return Err(e),
        };
        tx.commit().await?;
        Ok(run_id)
    }

    async fn start_manual_run(&self, id: i64, actor: &str, cutoff: DateTime<Utc>) -> Result<i64, sqlx::Error> {
        let done = sqlx::query("INSERT INTO cleanup_runs (schedule_id, `trigger`, actor, cutoff) VALUES (?, 'manual', ?, ?)")
            .bind(id)
            .bind(actor)
            .bind(cutoff)
            .execute(self)
            .await?;
        i64::try_from(done.last_insert_id()).map_err(|e| sqlx::Error::Decode(e.into()))
    }

    async fn lock_schedule(&self, id: i64) -> Result<Option<Box<dyn NamedLock>>, sqlx::Error> {
        named_lock::try_lock(self, SCHEDULE_LOCK, id).await
    }

    async fn retention_by_group(&self) -> Result<(bool, Vec<(Option<String>, i64)>), sqlx::Error> {
        let kept: i64 = sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM dedup_fingerprints)").fetch_one(self).await?;
        let rows = sqlx::query_as(
            "SELECT CAST(consumer_group AS CHAR), CAST(MIN(retention_days) AS SIGNED) * 86400000 FROM cleanup_schedules
             WHERE enabled AND FIND_IN_SET('succeeded', statuses) > 0 GROUP BY consumer_group",
        )
        .fetch_all(self)
        .await?;
        Ok((kept != 0, rows))
    }

    async fn late_deliveries(&self, days: i32) -> Result<Vec<LateDeliveries>, sqlx::Error> {
        Ok(sqlx::query_as::<_, (String, i64, i64)>(
            "SELECT CAST(consumer_group AS CHAR), CAST(SUM(count) AS SIGNED), MAX(max_age_ms) FROM late_deliveries
             WHERE day > UTC_DATE() - INTERVAL ? DAY GROUP BY consumer_group ORDER BY consumer_group",
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
            "SELECT CAST(consumer_group AS CHAR) AS consumer_group, COUNT(*) AS count, CAST(SUM(held) AS SIGNED) AS held,
                    MAX(delay_ms) AS longest_delay_ms, MAX(seen_at) AS last_seen_at
             FROM late_duplicates WHERE seen_at > UTC_TIMESTAMP(6) - INTERVAL ? DAY
             GROUP BY consumer_group ORDER BY consumer_group",
        )
        .bind(days)
        .fetch_all(self)
        .await
    }

    /// Three reads in one statement, their greatest taken in the engine: MySQL's `GREATEST` is
    /// `NULL` when any argument is (PostgreSQL's ignores them).
    async fn longest_delay(&self, days: i32) -> Result<Option<i64>, sqlx::Error> {
        let (a, b, c): (Option<i64>, Option<i64>, Option<i64>) = sqlx::query_as(
            "SELECT (SELECT MAX(max_delay_ms) FROM duplicate_delays),
                    (SELECT MAX(delay_ms) FROM late_duplicates WHERE seen_at > UTC_TIMESTAMP(6) - INTERVAL ? DAY),
                    (SELECT MAX(max_age_ms) FROM late_deliveries WHERE day > UTC_DATE() - INTERVAL ? DAY)",
        )
        .bind(days)
        .bind(days)
        .fetch_one(self)
        .await?;
        Ok([a, b, c].into_iter().flatten().max())
    }
}

/// One try of [`CleanupBooks::delete_batch`].
async fn delete_batch_once(pool: &MySqlPool, batch: &DeleteBatch<'_>) -> Result<i64, sqlx::Error> {
    let mut tx = pool.begin().await?;
    let mut q = QueryBuilder::new("SELECT d.id FROM dedup_records d");
    push_deletable(&mut tx, &mut q, batch.status, batch.cutoff, batch.group).await?;
    q.push(" ORDER BY d.id LIMIT ").push_bind(i64::from(batch.limit)).push(" FOR UPDATE SKIP LOCKED");
    let locked: Vec<i64> = q.build_query_scalar().fetch_all(&mut *tx).await?;
    let ids = without_open_conflicts(&mut tx, locked).await?;
    let keep = batch.keeps_fingerprints();
    for chunk in ids.chunks(IDS_PER_STATEMENT) {
        let list = id_list(chunk);
        sqlx::query(&format!(
            "INSERT INTO record_counts (consumer_group, status, n)
             SELECT consumer_group, status, -COUNT(*) FROM dedup_records WHERE id IN ({list})
             GROUP BY consumer_group, status"
        ))
        .execute(&mut *tx)
        .await?;
        if keep {
            // A derived table: the `ON DUPLICATE KEY UPDATE` of an `INSERT … SELECT … GROUP BY`
            // may not name the select's columns, and `first_seen_at` would be ambiguous.
            sqlx::query(&format!(
                "INSERT INTO dedup_fingerprints (fingerprint, first_seen_at, forget_at)
                 SELECT g.fp, g.seen, UTC_TIMESTAMP(6) + INTERVAL ? DAY
                 FROM (SELECT {fp} AS fp, MIN(first_seen_at) AS seen FROM dedup_records
                       WHERE id IN ({list}) GROUP BY fp) g
                 ORDER BY g.fp
                 ON DUPLICATE KEY UPDATE
                     first_seen_at = LEAST(dedup_fingerprints.first_seen_at, VALUES(first_seen_at)),
                     forget_at = GREATEST(dedup_fingerprints.forget_at, VALUES(forget_at))",
                fp = fingerprint("consumer_group", "message_type", "message_id"),
            ))
            .bind(batch.fingerprint_days)
            .execute(&mut *tx)
            .await?;
        }
        sqlx::query(&format!("DELETE FROM dedup_records WHERE id IN ({list})")).execute(&mut *tx).await?;
    }
    tx.commit().await?;
    Ok(ids.len() as i64)
}

/// `locked` (ids this transaction has just locked) less those with an open conflicting copy,
/// read again now that the records are locked: the choice's `NOT EXISTS` read `record_conflicts`
/// as of the statement's start (a subquery's read is a consistent one, only the records' rows
/// are read as locked), so a copy kept in between would go with its record. A locking read
/// (`LOCK IN SHARE MODE`) also waits for a copy being kept: it sees the copy once its
/// transaction commits. The records' own conditions (status, age, group) were judged on the rows
/// as locked, which no one changes before this transaction ends; they are not read again.
async fn without_open_conflicts(conn: &mut MySqlConnection, locked: Vec<i64>) -> Result<Vec<i64>, sqlx::Error> {
    let mut open = std::collections::HashSet::new();
    for chunk in locked.chunks(IDS_PER_STATEMENT) {
        let rows: Vec<i64> = sqlx::query_scalar(&format!(
            "SELECT record_id FROM record_conflicts WHERE record_id IN ({}) AND settled_at IS NULL LOCK IN SHARE MODE",
            id_list(chunk)
        ))
        .fetch_all(&mut *conn)
        .await?;
        open.extend(rows);
    }
    Ok(if open.is_empty() { locked } else { locked.into_iter().filter(|id| !open.contains(id)).collect() })
}

/// Whether `e` is InnoDB's choice of this transaction as a deadlock victim (1213).
fn is_deadlock(e: &sqlx::Error) -> bool {
    matches!(crate::store::DbErrorKind::of(e), crate::store::DbErrorKind::Deadlock)
}
