//! The runtime's books on MySQL/MariaDB ([`RuntimeBooks`]; migration `20261205000004`): the
//! engine's keys, the aggregates, the record counts' fold, table samples and the instances'
//! heartbeat rows. On the engine's pool, whose connections use the engine's database, so the
//! statements name its tables unqualified.
//!
//! Where PostgreSQL's statements lean on its features, these say it in MySQL's terms: rows go in
//! as multi-row `INSERT … ON DUPLICATE KEY UPDATE` (no `unnest`), `stats_hour` is written beside
//! `stats_minute` in the flush's transaction (no rollup trigger), and the fold sums and deletes
//! exactly the delta rows it has locked (no advisory lock: a second folder skips the first's
//! locked rows, as it skips a claim's uncommitted one).

use std::collections::BTreeMap;

use async_trait::async_trait;
use chrono::{DateTime, DurationRound, TimeDelta, Utc};
use sqlx::mysql::MySqlPool;
use sqlx::{MySql, MySqlConnection, QueryBuilder, Row};

use super::text;
use crate::instances::{Instance, InstanceConsumer};
use crate::runtime::books::{HeartbeatRow, RuntimeBooks};
use crate::stats::{Counters, DelayCounts, LateCounts, MinuteCounts};

/// Rows per multi-row statement: 17 values a `stats_minute` row stay far below MySQL's 65 535
/// placeholders.
const ROWS_PER_STATEMENT: usize = 1000;

/// Most delta rows one fold takes (the next flush folds the rest).
const FOLD_ROWS: i64 = 10_000;

/// `stats_minute`'s counter columns, in [`crate::stats::ALL_EVENTS`]' order.
const COUNTER_COLUMNS: [&str; 15] = [
    "deliveries",
    "created",
    "claimed",
    "succeeded",
    "failed",
    "dead",
    "poison",
    "parked",
    "duplicates_redis",
    "duplicates_db",
    "redis_hits",
    "redis_misses",
    "redis_fallbacks",
    "lease_takeovers",
    "retries",
];

/// [`RuntimeBooks`] on the engine's MySQL pool.
pub(crate) struct MySqlRuntimeBooks {
    pool: MySqlPool,
}

impl MySqlRuntimeBooks {
    /// The books on `pool`, the engine's pool (its connections use the engine's database).
    pub(crate) fn new(pool: MySqlPool) -> Self {
        Self { pool }
    }
}

#[async_trait]
impl RuntimeBooks for MySqlRuntimeBooks {
    async fn engine_key(&self, name: &str) -> Result<[u8; 32], sqlx::Error> {
        let fresh: [u8; 32] = rand::random();
        sqlx::query("INSERT INTO engine_keys (name, `key`) VALUES (?, ?) ON DUPLICATE KEY UPDATE name = name")
            .bind(name)
            .bind(fresh.as_slice())
            .execute(&self.pool)
            .await?;
        let key: Vec<u8> =
            sqlx::query_scalar("SELECT `key` FROM engine_keys WHERE name = ?").bind(name).fetch_one(&self.pool).await?;
        key.try_into().map_err(|_| sqlx::Error::Protocol(format!("engine key {name:?} is not 32 bytes")))
    }

    async fn write_stats(
        &self,
        minutes: &MinuteCounts,
        delays: &DelayCounts,
        late: &LateCounts,
    ) -> Result<(), sqlx::Error> {
        if minutes.is_empty() && delays.is_empty() && late.is_empty() {
            return Ok(());
        }
        let mut tx = self.pool.begin().await?;
        write_minutes(&mut tx, minutes).await?;
        write_hours(&mut tx, minutes).await?;
        write_delays(&mut tx, delays).await?;
        write_late(&mut tx, late).await?;
        tx.commit().await
    }

    async fn fold_record_counts(&self) -> Result<i64, sqlx::Error> {
        // `SKIP LOCKED`: the fold never waits for a claim in flight (its uncommitted delta row
        // is left for the next fold); the engine's sessions read committed, so the fold takes
        // no gap lock a claim's insert would wait for.
        let mut tx = self.pool.begin().await?;
        let rows = sqlx::query(
            "SELECT id, consumer_group, status, n FROM record_counts ORDER BY id LIMIT ? FOR UPDATE SKIP LOCKED",
        )
            .bind(FOLD_ROWS)
            .fetch_all(&mut *tx)
            .await?;
        let mut sums: BTreeMap<(Vec<u8>, String), i64> = BTreeMap::new();
        let mut ids = Vec::with_capacity(rows.len());
        for row in &rows {
            ids.push(row.try_get::<i64, _>("id")?);
            let key = (row.try_get::<Vec<u8>, _>("consumer_group")?, text(row, "status")?);
            *sums.entry(key).or_default() += row.try_get::<i64, _>("n")?;
        }
        if ids.len() <= sums.len() {
            // One row per (group, status) already: nothing to fold; the rows' locks go at once.
            tx.rollback().await?;
            return Ok(0);
        }
        // One delete by primary key per row, sent together: `id IN (…)` on a table this small
        // is read whole, and a delete waits on every row it reads — a claim's uncommitted one too.
        for chunk in ids.chunks(ROWS_PER_STATEMENT) {
            let deletes: String = chunk.iter().map(|id| format!("DELETE FROM record_counts WHERE id = {id};")).collect();
            sqlx::Executor::execute(&mut *tx, deletes.as_str()).await?;
        }
        let sums: Vec<_> = sums.into_iter().filter(|(_, n)| *n != 0).collect();
        if !sums.is_empty() {
            let mut insert = QueryBuilder::<MySql>::new("INSERT INTO record_counts (consumer_group, status, n) ");
            insert.push_values(&sums, |mut row, ((group, status), n)| {
                row.push_bind(group).push_bind(status).push_bind(n);
            });
            insert.build().execute(&mut *tx).await?;
        }
        tx.commit().await?;
        Ok(i64::try_from(ids.len()).unwrap_or(i64::MAX))
    }

    async fn sample_table(&self) -> Result<(), sqlx::Error> {
        sqlx::query(
            "INSERT INTO table_samples (sampled_at, total_records, table_bytes, index_bytes)
             SELECT DATE_FORMAT(UTC_TIMESTAMP(), '%Y-%m-%d %H:%i:00'),
                    COALESCE((SELECT SUM(n) FROM record_counts), 0),
                    COALESCE(t.data_length, 0), COALESCE(t.index_length, 0)
             FROM information_schema.TABLES t
             WHERE t.table_schema = DATABASE() AND t.table_name = 'dedup_records'
             ON DUPLICATE KEY UPDATE total_records = VALUES(total_records),
                 table_bytes = VALUES(table_bytes), index_bytes = VALUES(index_bytes)",
        )
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    async fn write_heartbeat(&self, row: &HeartbeatRow<'_>) -> Result<(), sqlx::Error> {
        let consumers = serde_json::to_string(row.consumers).map_err(|e| sqlx::Error::Encode(Box::new(e)))?;
        sqlx::query("DELETE FROM consumer_instances WHERE last_seen_at < UTC_TIMESTAMP(6) - INTERVAL ? MICROSECOND")
            .bind(row.forget_after_ms.saturating_mul(1000))
            .execute(&self.pool)
            .await?;
        sqlx::query(
            "INSERT INTO consumer_instances (instance_id, host, pid, started_at, consumers) VALUES (?, ?, ?, ?, ?)
             ON DUPLICATE KEY UPDATE last_seen_at = UTC_TIMESTAMP(6), consumers = VALUES(consumers)",
        )
        .bind(row.instance_id)
        .bind(row.host)
        .bind(row.pid)
        .bind(row.started_at)
        .bind(consumers)
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    async fn delete_heartbeat(&self, instance_id: &str) -> Result<(), sqlx::Error> {
        sqlx::query("DELETE FROM consumer_instances WHERE instance_id = ?").bind(instance_id).execute(&self.pool).await?;
        Ok(())
    }

    async fn instances(&self, gone_after_ms: i64, limit: i64) -> Result<Vec<Instance>, sqlx::Error> {
        let rows = sqlx::query(
            "SELECT instance_id, host, pid, started_at, last_seen_at,
                    last_seen_at < UTC_TIMESTAMP(6) - INTERVAL ? MICROSECOND AS gone, consumers
             FROM consumer_instances ORDER BY gone, started_at DESC, instance_id LIMIT ?",
        )
        .bind(gone_after_ms.saturating_mul(1000))
        .bind(limit)
        .fetch_all(&self.pool)
        .await?;
        rows.iter()
            .map(|row| {
                let consumers: Vec<InstanceConsumer> = serde_json::from_str(&text(row, "consumers")?)
                    .map_err(|e| sqlx::Error::Decode(Box::new(e)))?;
                Ok(Instance {
                    instance_id: text(row, "instance_id")?,
                    host: text(row, "host")?,
                    pid: row.try_get("pid")?,
                    started_at: row.try_get("started_at")?,
                    last_seen_at: row.try_get("last_seen_at")?,
                    gone: row.try_get::<i64, _>("gone")? != 0,
                    this_process: false,
                    consumers,
                })
            })
            .collect()
    }

    async fn open_conflicts(&self, group: &str) -> Result<usize, sqlx::Error> {
        let open: i64 = sqlx::query_scalar(
            "SELECT COUNT(*) FROM record_conflicts WHERE settled_at IS NULL AND kind = 'type' AND consumer_group = ?",
        )
        .bind(group)
        .fetch_one(&self.pool)
        .await?;
        Ok(usize::try_from(open).unwrap_or(0))
    }
}

/// Adds the per-(minute, group) counters to `stats_minute`, in (group, minute) order.
pub(super) async fn write_minutes(conn: &mut MySqlConnection, minutes: &MinuteCounts) -> Result<(), sqlx::Error> {
    let mut sorted: Vec<(&(DateTime<Utc>, String), &Counters)> = minutes.iter().collect();
    sorted.sort_unstable_by(|((m1, g1), _), ((m2, g2), _)| (g1, m1).cmp(&(g2, m2)));
    let columns = COUNTER_COLUMNS.join(", ");
    let updates: Vec<String> = COUNTER_COLUMNS.iter().map(|c| format!("{c} = {c} + VALUES({c})")).collect();
    for chunk in sorted.chunks(ROWS_PER_STATEMENT) {
        let mut insert = QueryBuilder::<MySql>::new(format!("INSERT INTO stats_minute (minute, consumer_group, {columns}) "));
        insert.push_values(chunk, |mut row, ((minute, group), counters)| {
            row.push_bind(minute.naive_utc()).push_bind(group.as_str());
            for value in counters.iter() {
                row.push_bind(*value);
            }
        });
        insert.push(" ON DUPLICATE KEY UPDATE ").push(updates.join(", "));
        insert.build().execute(&mut *conn).await?;
    }
    Ok(())
}

/// Adds the minutes' `created` to `stats_hour` per (group, hour), what PostgreSQL's rollup
/// trigger does.
pub(super) async fn write_hours(conn: &mut MySqlConnection, minutes: &MinuteCounts) -> Result<(), sqlx::Error> {
    let created = crate::stats::ALL_EVENTS.iter().position(|e| *e == crate::stats::Event::Created).unwrap_or(1);
    let mut hours: BTreeMap<(&str, DateTime<Utc>), i64> = BTreeMap::new();
    for ((minute, group), counters) in minutes {
        let hour = minute.duration_trunc(TimeDelta::hours(1)).unwrap_or(*minute);
        *hours.entry((group.as_str(), hour)).or_default() += counters[created];
    }
    let rows: Vec<_> = hours.into_iter().filter(|(_, n)| *n != 0).collect();
    for chunk in rows.chunks(ROWS_PER_STATEMENT) {
        let mut insert = QueryBuilder::<MySql>::new("INSERT INTO stats_hour (hour, consumer_group, created) ");
        insert.push_values(chunk, |mut row, ((group, hour), n)| {
            row.push_bind(hour.naive_utc()).push_bind(*group).push_bind(*n);
        });
        insert.push(" ON DUPLICATE KEY UPDATE created = created + VALUES(created)");
        insert.build().execute(&mut *conn).await?;
    }
    Ok(())
}

/// Adds (day, group, bucket) → (count, max delay ms) to `duplicate_delays`, in key order.
pub(super) async fn write_delays(conn: &mut MySqlConnection, delays: &DelayCounts) -> Result<(), sqlx::Error> {
    let sorted: Vec<_> = delays.iter().collect::<BTreeMap<_, _>>().into_iter().collect();
    for chunk in sorted.chunks(ROWS_PER_STATEMENT) {
        let mut insert =
            QueryBuilder::<MySql>::new("INSERT INTO duplicate_delays (day, consumer_group, le_ms, count, max_delay_ms) ");
        insert.push_values(chunk, |mut row, ((day, group, le), (count, max))| {
            row.push_bind(*day).push_bind(group.as_str()).push_bind(*le).push_bind(*count).push_bind(*max);
        });
        insert.push(
            " ON DUPLICATE KEY UPDATE count = count + VALUES(count), max_delay_ms = GREATEST(max_delay_ms, VALUES(max_delay_ms))",
        );
        insert.build().execute(&mut *conn).await?;
    }
    Ok(())
}

/// Adds (day, group) → (count, max age ms) to `late_deliveries`, in key order.
async fn write_late(conn: &mut MySqlConnection, late: &LateCounts) -> Result<(), sqlx::Error> {
    let sorted: Vec<_> = late.iter().collect::<BTreeMap<_, _>>().into_iter().collect();
    for chunk in sorted.chunks(ROWS_PER_STATEMENT) {
        let mut insert = QueryBuilder::<MySql>::new("INSERT INTO late_deliveries (day, consumer_group, count, max_age_ms) ");
        insert.push_values(chunk, |mut row, ((day, group), (count, age))| {
            row.push_bind(*day).push_bind(group.as_str()).push_bind(*count).push_bind(*age);
        });
        insert.push(
            " ON DUPLICATE KEY UPDATE count = count + VALUES(count), max_age_ms = GREATEST(max_age_ms, VALUES(max_age_ms))",
        );
        insert.build().execute(&mut *conn).await?;
    }
    Ok(())
}


#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::mysql::TestMySqlDatabase;

    /// `record_counts` per (group, status): rows and sum.
    async fn counts(pool: &MySqlPool) -> Vec<(String, i64, i64)> {
        let rows: Vec<(Vec<u8>, i64, i64)> = sqlx::query_as(
            "SELECT CAST(status AS BINARY), CAST(COUNT(*) AS SIGNED), CAST(SUM(n) AS SIGNED) FROM record_counts
             GROUP BY status ORDER BY status",
        )
        .fetch_all(pool)
        .await
        .unwrap();
        rows.into_iter().map(|(status, rows, sum)| (String::from_utf8(status).unwrap(), rows, sum)).collect()
    }

    #[tokio::test]
    async fn a_fold_keeps_the_sums_and_leaves_a_folded_table_alone() {
        let db = TestMySqlDatabase::create().await;
        let books = MySqlRuntimeBooks::new(db.pool.clone());
        for (status, n) in [("processing", 1), ("processing", 1), ("processing", 1), ("processing", -1), ("succeeded", 1)]
        {
            sqlx::query("INSERT INTO record_counts (consumer_group, status, n) VALUES ('g', ?, ?)")
                .bind(status)
                .bind(n)
                .execute(&db.pool)
                .await
                .unwrap();
        }
        assert_eq!(books.fold_record_counts().await.unwrap(), 5, "five delta rows folded");
        assert_eq!(counts(&db.pool).await, [("processing".into(), 1, 2), ("succeeded".into(), 1, 1)]);
        assert_eq!(books.fold_record_counts().await.unwrap(), 0, "a folded table is not rewritten");
        assert_eq!(counts(&db.pool).await, [("processing".into(), 1, 2), ("succeeded".into(), 1, 1)]);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn folds_of_several_engines_at_once_while_deltas_arrive_keep_every_count() {
        let db = TestMySqlDatabase::create().await;
        // `rounds` statements of 500 delta rows of +1 each.
        let insert = |pool: MySqlPool, rounds: usize| async move {
            for _ in 0..rounds {
                let mut insert = QueryBuilder::<MySql>::new("INSERT INTO record_counts (consumer_group, status, n) ");
                insert.push_values(0..500, |mut row, _| {
                    row.push_bind("g").push_bind("succeeded").push_bind(1_i64);
                });
                insert.build().execute(&pool).await.unwrap();
            }
        };
        insert(db.pool.clone(), 8).await;
        let start = std::sync::Arc::new(tokio::sync::Barrier::new(5));
        let folds: Vec<_> = (0..4)
            .map(|_| {
                let (books, start) = (MySqlRuntimeBooks::new(db.pool.clone()), start.clone());
                tokio::spawn(async move {
                    start.wait().await;
                    for _ in 0..3 {
                        books.fold_record_counts().await.unwrap();
                    }
                })
            })
            .collect();
        start.wait().await;
        insert(db.pool.clone(), 4).await;
        for fold in folds {
            fold.await.unwrap();
        }
        MySqlRuntimeBooks::new(db.pool.clone()).fold_record_counts().await.unwrap();
        assert_eq!(counts(&db.pool).await, [("succeeded".into(), 1, 6_000)], "no delta lost or counted twice");
    }
}
