//! A seed run's load on PostgreSQL ([`SeedBooks`] on `PgPool`): the ids are reserved from the
//! table's identity sequence; then, in one transaction, the rows are streamed with `COPY ...
//! FROM STDIN (FORMAT binary)` (`seed/copy.rs`) while the engine generates the next ones; the
//! loaded records are counted into `record_counts` and their types into `message_types`, as the
//! engine's insert statements do for theirs (no trigger counts inserts). Into an empty table the
//! secondary indexes and the UNIQUE key are built after the load (`seed/indexes.rs`). A failed
//! run leaves nothing behind.

mod copy;
mod indexes;

use std::collections::HashMap;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use sqlx::{PgConnection, PgPool};

use super::runtime::{write_delays, write_minutes};
use crate::console::QueryError;
use crate::console::seed::{SeedBooks, SeedRun};
use crate::stats::{DelayCounts, Event, MinuteCounts};
use copy::{ATTEMPTS_COPY_SQL, COPY_SQL, CopyRows};
use indexes::Deferred;

/// Reserves `$1` consecutive ids (returns the first): the sequence is moved past them, and past
/// any id written explicitly. Run under a SHARE ROW EXCLUSIVE lock on the table, so no insert
/// takes a value from the sequence in between.
const RESERVE_IDS_SQL: &str = r#"
SELECT setval(pg_get_serial_sequence('dedup_records', 'id'),
              GREATEST(nextval(pg_get_serial_sequence('dedup_records', 'id')),
                       (SELECT COALESCE(max(id), 0) + 1 FROM dedup_records)) + $1 - 1) - $1 + 1
"#;

/// The first sighting of the newest record.
const NEWEST_SEEN_SQL: &str = "SELECT first_seen_at FROM dedup_records ORDER BY id DESC LIMIT 1";

/// Rebuilds `table_samples` every 10 minutes of the window from the cumulative `created` counts,
/// scaling the current table and index sizes by the share of records then.
const SAMPLES_SQL: &str = r#"
WITH per AS (
    SELECT date_bin(interval '10 minutes', minute, 'epoch') + interval '10 minutes' AS at, sum(created) AS created
    FROM stats_minute GROUP BY 1
), cumulative AS (
    SELECT at, sum(created) OVER (ORDER BY at) AS total FROM per
), size AS (
    SELECT pg_table_size('dedup_records') AS table_bytes, pg_indexes_size('dedup_records') AS index_bytes,
           GREATEST((SELECT sum(n) FROM record_counts), 1) AS records
)
INSERT INTO table_samples (sampled_at, total_records, table_bytes, index_bytes)
SELECT at, total, (table_bytes * total / records)::bigint, (index_bytes * total / records)::bigint
FROM cumulative, size WHERE at >= $1 AND at <= now()
ON CONFLICT (sampled_at) DO UPDATE SET total_records = EXCLUDED.total_records,
    table_bytes = EXCLUDED.table_bytes, index_bytes = EXCLUDED.index_bytes
"#;

/// Counts the records of the id range `$1..=$2` (the run's) by group and status, and records
/// their message types: what the engine's insert statements do for the records they insert.
const COUNT_SEEDED_SQL: &str = r#"
WITH seeded AS (
    SELECT consumer_group, status, message_type, count(*) AS n FROM dedup_records
    WHERE id BETWEEN $1 AND $2 GROUP BY 1, 2, 3
), counted AS (
    INSERT INTO record_counts (consumer_group, status, n)
    SELECT consumer_group, status, sum(n)::bigint FROM seeded GROUP BY 1, 2
)
INSERT INTO message_types SELECT DISTINCT message_type FROM seeded ON CONFLICT DO NOTHING
"#;

const ROLLUP_OFF_SQL: &str = "ALTER TABLE stats_minute DISABLE TRIGGER stats_minute_rollup_insert, \
    DISABLE TRIGGER stats_minute_rollup_update";
const ROLLUP_ON_SQL: &str = "ALTER TABLE stats_minute ENABLE ALWAYS TRIGGER stats_minute_rollup_insert, \
    ENABLE ALWAYS TRIGGER stats_minute_rollup_update";
/// Adds records created per (hour, group), as the rollup trigger would have.
const HOURS_SQL: &str = "INSERT INTO stats_hour AS h (hour, consumer_group, created) \
    SELECT * FROM unnest($1::timestamptz[], $2::text[], $3::int8[]) \
    ON CONFLICT (hour, consumer_group) DO UPDATE SET created = h.created + EXCLUDED.created";

#[async_trait]
impl SeedBooks for PgPool {
    async fn seed_reserve_ids(&self, n: i64) -> Result<(i64, Option<DateTime<Utc>>), sqlx::Error> {
        let mut tx = self.begin().await?;
        sqlx::query("LOCK TABLE dedup_records IN SHARE ROW EXCLUSIVE MODE").execute(&mut *tx).await?;
        let first = sqlx::query_scalar(RESERVE_IDS_SQL).bind(n).fetch_one(&mut *tx).await?;
        let newest = sqlx::query_scalar(NEWEST_SEEN_SQL).fetch_optional(&mut *tx).await?;
        tx.commit().await?;
        Ok((first, newest))
    }

    async fn seed_load(&self, mut run: SeedRun<'_>) -> Result<(), QueryError> {
        let mut tx = self.begin().await?;
        // Building the indexes of millions of rows takes longer than any statement timeout the
        // pool's connections carry.
        sqlx::query("SET LOCAL statement_timeout = 0").execute(&mut *tx).await?;
        let deferred = Deferred::drop_if_empty(self, &mut tx).await?;
        let mut rows = run.rows(CopyRows::new);
        while let Some(chunk) = rows.next().await {
            copy(&mut tx, COPY_SQL, chunk.rows.records.finish()).await?;
            if chunk.rows.attempts.rows() > 0 {
                copy(&mut tx, ATTEMPTS_COPY_SQL, chunk.rows.attempts.finish()).await?;
            }
        }
        let totals = rows.finish().await?;
        run.phase_done("rows copied");
        deferred.rebuild(&mut tx).await?;
        run.phase_done("indexes built");
        sqlx::query(COUNT_SEEDED_SQL).bind(run.first()).bind(run.last()).execute(&mut *tx).await?;
        run.phase_done("records counted");
        let (minutes, delays) = totals.into_counts(&run.group_names());
        write_totals(&mut tx, &minutes, &delays).await?;
        // The window's samples are rebuilt from the seeded counts; a sample taken before the seed
        // (a server that started on the empty table) would read as the table shrinking.
        sqlx::query("DELETE FROM table_samples WHERE sampled_at >= $1").bind(run.start()).execute(&mut *tx).await?;
        sqlx::query(SAMPLES_SQL).bind(run.start()).execute(&mut *tx).await?;
        tx.commit().await?;
        run.phase_done("aggregates written");
        // Fresh statistics, and a visibility map for the index-only scans of the overview, the
        // retries and the dead letters (without it, at 10 M records, the retries page took 200 ms
        // and the dead letters 130 ms until autovacuum came by; 15-20 ms after).
        let mut conn = self.acquire().await?;
        sqlx::query("SET statement_timeout = 0").execute(&mut *conn).await?;
        sqlx::query("VACUUM ANALYZE stats_minute").execute(&mut *conn).await?;
        sqlx::query("VACUUM ANALYZE dedup_records").execute(&mut *conn).await?;
        sqlx::query("RESET statement_timeout").execute(&mut *conn).await?;
        run.phase_done("analyzed");
        Ok(())
    }
}

/// One `COPY ... FROM STDIN` of `data`.
async fn copy(conn: &mut PgConnection, sql: &str, data: Vec<u8>) -> Result<u64, sqlx::Error> {
    let mut copy = conn.copy_in_raw(sql).await?;
    copy.send(data).await?;
    copy.finish().await
}

/// Adds the run's counts to `stats_minute`, `stats_hour` and `duplicate_delays`, in the caller's
/// transaction.
///
/// `stats_hour` is written here, one row per hour and group, with the minutes' rollup
/// triggers disabled for the minute write: through them each hour's row would be updated 60
/// times (8 s of a 20 s seed of 1 M records). `ALTER TABLE` holds a SHARE ROW EXCLUSIVE
/// lock on `stats_minute` until the transaction ends, so the engine's flushes wait for the
/// seed's commit and nobody sees the triggers disabled; they are enabled again (ALWAYS, as
/// the migration left them) before the commit.
async fn write_totals(conn: &mut PgConnection, minutes: &MinuteCounts, delays: &DelayCounts) -> Result<(), sqlx::Error> {
    let mut hours: HashMap<(DateTime<Utc>, &str), i64> = HashMap::new();
    for ((m, g), c) in minutes {
        if let Some(hour) = DateTime::from_timestamp(m.timestamp().div_euclid(3600) * 3600, 0) {
            *hours.entry((hour, g.as_str())).or_default() += c[Event::Created as usize];
        }
    }
    sqlx::query(ROLLUP_OFF_SQL).execute(&mut *conn).await?;
    write_minutes(&mut *conn, minutes).await?;
    sqlx::query(ROLLUP_ON_SQL).execute(&mut *conn).await?;
    let mut hours: Vec<_> = hours.into_iter().filter(|(_, n)| *n != 0).collect();
    hours.sort_unstable_by(|((h1, g1), _), ((h2, g2), _)| (g1, h1).cmp(&(g2, h2)));
    let (hour, group, created): (Vec<DateTime<Utc>>, Vec<&str>, Vec<i64>) =
        hours.into_iter().map(|((h, g), n)| (h, g, n)).collect();
    sqlx::query(HOURS_SQL).bind(hour).bind(group).bind(created).execute(&mut *conn).await?;
    write_delays(&mut *conn, delays).await
}
