//! A seed run's load on MySQL/MariaDB ([`SeedBooks`] on `MySqlPool`, the engine's pool: its
//! connections use the engine's database and read committed). sqlx has no `COPY` for MySQL, so
//! the rows go in as multi-row `INSERT`s with their values written in (`seed/values.rs`),
//! generated a chunk ahead of the load.
//!
//! - **Ids**: reserved under `LOCK TABLES … WRITE`, which waits for every transaction that
//!   touched the records and lets none start: the first id is `MAX(id) + 1` (no insert is
//!   uncommitted then), and `ALTER TABLE … AUTO_INCREMENT` moves the counter past the block, so
//!   the consumers' inserts take ids after it. The rows carry their ids explicitly: an id is also
//!   the number in its message id and its place in time, and AUTO_INCREMENT promises consecutive
//!   ids to one statement only under `innodb_autoinc_lock_mode` 0 or 1 (MySQL 8's default is 2).
//! - **One transaction** for the rows, their counts (`record_counts` delta rows, one per group
//!   and status, and `message_types`) and the aggregates, as on PostgreSQL: a failed load leaves
//!   nothing but the reserved ids (its rollback takes about as long as the load). The new rows'
//!   locks block no consumer: their ids and message ids are the run's own.
//! - Then, each on its own, `ANALYZE TABLE` and the window's `table_samples` (after the
//!   analysis: MySQL 8 caches `information_schema.TABLES` sizes until then). A failure there
//!   leaves the records loaded and counted, and says so.
//! - The secondary indexes are kept during the load, even into an empty table: InnoDB's keys of
//!   the seed's rows are appended at a few places each (ids, message ids by type and number), and
//!   dropping them would need DDL, which commits the load's transaction (docs/DESIGN.md, "MySQL
//!   store").

mod values;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use sqlx::{Executor, MySqlConnection};
use sqlx::mysql::MySqlPool;

use super::books::retry_type_race;
use super::runtime::{write_delays, write_hours, write_minutes};
use crate::console::QueryError;
use crate::console::seed::{SeedBooks, SeedRun};
use values::InsertRows;

/// The size a statement ends past: 1 MiB, about 3 000 records (on MariaDB 10.11, 300 000 rows
/// loaded in 14.7 s at 1 MiB a statement, 15.0 s at 256 KiB, 16.5 s at 64 KiB, 16.1 s at 4 MiB;
/// docs/DESIGN.md, "Seed"); at most half of `max_allowed_packet`.
const STATEMENT_BYTES: usize = 1 << 20;

/// Counts the records of the id range `?..=?` (the run's) by group and status: one delta row
/// each, as the engine's inserts append theirs.
const COUNT_SEEDED_SQL: &str = "INSERT INTO record_counts (consumer_group, status, n)
 SELECT consumer_group, status, COUNT(*) FROM dedup_records WHERE id BETWEEN ? AND ?
 GROUP BY consumer_group, status";

/// The message types of the id range `?..=?` not yet known (the engine's way: no lock on a known
/// type's row; a race with a consumer's first insert of a type is run again).
const SEEDED_TYPES_SQL: &str = "INSERT INTO message_types (message_type)
 SELECT t.message_type FROM (SELECT DISTINCT message_type FROM dedup_records WHERE id BETWEEN ? AND ?) t
 WHERE NOT EXISTS (SELECT 1 FROM message_types m WHERE m.message_type = t.message_type)";

/// Rebuilds `table_samples` every 10 minutes of the window from `?` on, from the cumulative
/// `created` counts, scaling the table's current sizes by the share of records then (PostgreSQL's
/// statement; buckets by seconds since the epoch, never `UNIX_TIMESTAMP`, which follows the
/// session's zone).
const SAMPLES_SQL: &str = "INSERT INTO table_samples (sampled_at, total_records, table_bytes, index_bytes)
 SELECT c.at, c.total, CAST(s.table_bytes * c.total / s.records AS SIGNED),
        CAST(s.index_bytes * c.total / s.records AS SIGNED)
 FROM (SELECT p.at, SUM(p.created) OVER (ORDER BY p.at) AS total
       FROM (SELECT TIMESTAMPADD(SECOND, (TIMESTAMPDIFF(SECOND, TIMESTAMP'1970-01-01 00:00:00', minute) DIV 600 + 1) * 600,
                                 TIMESTAMP'1970-01-01 00:00:00') AS at,
                    SUM(created) AS created
             FROM stats_minute GROUP BY at) p) c
 CROSS JOIN (SELECT COALESCE(t.data_length, 0) AS table_bytes, COALESCE(t.index_length, 0) AS index_bytes,
                    GREATEST(COALESCE((SELECT SUM(n) FROM record_counts), 0), 1) AS records
             FROM information_schema.TABLES t
             WHERE t.table_schema = DATABASE() AND t.table_name = 'dedup_records') s
 WHERE c.at >= ? AND c.at <= UTC_TIMESTAMP()
 ON DUPLICATE KEY UPDATE total_records = VALUES(total_records), table_bytes = VALUES(table_bytes),
     index_bytes = VALUES(index_bytes)";

#[async_trait]
impl SeedBooks for MySqlPool {
    async fn seed_reserve_ids(&self, n: i64) -> Result<(i64, Option<DateTime<Utc>>), sqlx::Error> {
        let mut conn = self.acquire().await?;
        // A `LOCK TABLES` waiting for a long transaction would hold up every consumer's claim
        // behind it (a pending table lock goes first): wait at most `RESERVE_WAIT_SECS`.
        conn.execute(format!("SET SESSION lock_wait_timeout = {RESERVE_WAIT_SECS}").as_str()).await?;
        let reserved = reserve_ids(&mut conn, n).await;
        // Unlocked whatever happened; a connection that cannot be is closed, its locks with it.
        let unlocked = match conn.execute("UNLOCK TABLES").await {
            Ok(_) => conn.execute("SET SESSION lock_wait_timeout = DEFAULT").await,
            failed => failed,
        };
        if reserved.is_err() || unlocked.is_err() {
            conn.close_on_drop();
        }
        let reservation = reserved?;
        unlocked?;
        Ok(reservation)
    }

    async fn seed_load(&self, mut run: SeedRun<'_>) -> Result<(), QueryError> {
        let packet: i64 = sqlx::query_scalar("SELECT CAST(@@max_allowed_packet AS SIGNED)").fetch_one(self).await?;
        let limit = STATEMENT_BYTES.min(usize::try_from(packet / 2).unwrap_or(STATEMENT_BYTES));
        let mut tx = self.begin().await?;
        let mut rows = run.rows(move |_| InsertRows::new(limit));
        while let Some(chunk) = rows.next().await {
            let InsertRows { records, attempts } = chunk.rows;
            for statement in records.finish().into_iter().chain(attempts.finish()) {
                tx.execute(statement.as_str()).await?;
            }
        }
        let totals = rows.finish().await?;
        run.phase_done("rows inserted");
        let (first, last) = (run.first(), run.last());
        sqlx::query(COUNT_SEEDED_SQL).bind(first).bind(last).execute(&mut *tx).await?;
        retry_type_race(&mut tx, || sqlx::query(SEEDED_TYPES_SQL).bind(first).bind(last)).await?;
        run.phase_done("records counted");
        let (minutes, delays) = totals.into_counts(&run.group_names());
        write_minutes(&mut tx, &minutes).await?;
        write_hours(&mut tx, &minutes).await?;
        write_delays(&mut tx, &delays).await?;
        tx.commit().await?;
        run.phase_done("aggregates written");
        self.execute("ANALYZE TABLE dedup_records, record_attempts, stats_minute").await?;
        run.phase_done("analyzed");
        write_samples(&mut *self.acquire().await?, &run).await?;
        run.phase_done("samples written");
        Ok(())
    }
}

/// Longest wait for the id reservation's table locks, seconds: past it the seed fails (error
/// 1205) and the consumers go on.
const RESERVE_WAIT_SECS: u32 = 10;

/// Reserves `n` ids under `LOCK TABLES` (the caller unlocks); returns the first.
async fn reserve_ids(conn: &mut MySqlConnection, n: i64) -> Result<(i64, Option<DateTime<Utc>>), sqlx::Error> {
    // The attempts too: on MySQL 8 the ALTER of a table needs the tables whose foreign keys
    // refer to it locked as well.
    conn.execute("LOCK TABLES dedup_records WRITE, record_attempts WRITE").await?;
    let newest: Option<(i64, DateTime<Utc>)> =
        sqlx::query_as("SELECT id, first_seen_at FROM dedup_records ORDER BY id DESC LIMIT 1").fetch_optional(&mut *conn).await?;
    let first = newest.map_or(1, |(id, _)| id + 1);
    // Past the block. A counter already past it (ids of rolled-back inserts) stays there or is
    // lowered to it: either way no id of the block is handed out.
    let next = first.checked_add(n).ok_or_else(|| sqlx::Error::Protocol("no ids left to reserve".to_owned()))?;
    conn.execute(format!("ALTER TABLE dedup_records AUTO_INCREMENT = {next}").as_str()).await?;
    Ok((first, newest.map(|(_, seen)| seen)))
}

/// Rebuilds the window's `table_samples` in a transaction of its own; a sample taken before the
/// seed (a server that started on the empty table) would read as the table shrinking.
async fn write_samples(conn: &mut MySqlConnection, run: &SeedRun<'_>) -> Result<(), sqlx::Error> {
    let start = run.start().naive_utc();
    let mut tx = sqlx::Connection::begin(conn).await?;
    sqlx::query("DELETE FROM table_samples WHERE sampled_at >= ?").bind(start).execute(&mut *tx).await?;
    sqlx::query(SAMPLES_SQL).bind(start).execute(&mut *tx).await?;
    tx.commit().await
}
