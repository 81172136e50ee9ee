//! MySQL's overview reads ([`OverviewReads`]): the same sums and counts as PostgreSQL's over
//! the indexes of migration `20261205000007_overview_indexes`; the growth chart without
//! `date_bin`, `generate_series` or `LATERAL` (MariaDB has none): the buckets are made here from
//! the database's clock, the records created summed per bucket in one statement, and each
//! bucket's last table sample probed in one `UNION ALL` statement.

use std::collections::HashMap;

use async_trait::async_trait;
use chrono::{DateTime, NaiveDateTime, Utc};
use sqlx::mysql::MySqlPool;
use sqlx::{MySql, QueryBuilder};

use crate::console::QueryError;
use crate::console::overview::{
    DelayBucket, GrowthPoint, GrowthRange, OverviewReads, StatusCount, Traffic, delays_since,
};

/// Seconds since the Unix epoch of a `DATETIME` column in UTC, whatever the session's zone.
macro_rules! epoch_seconds {
    ($column:literal) => {
        concat!("TIMESTAMPDIFF(SECOND, '1970-01-01 00:00:00', ", $column, ")")
    };
}

/// A time as a `DATETIME` parameter (UTC).
fn utc(t: DateTime<Utc>) -> NaiveDateTime {
    t.naive_utc()
}

#[async_trait]
impl OverviewReads for MySqlPool {
    async fn now(&self) -> Result<DateTime<Utc>, QueryError> {
        let now: NaiveDateTime = sqlx::query_scalar("SELECT UTC_TIMESTAMP(6)").fetch_one(self).await?;
        Ok(now.and_utc())
    }

    async fn status_counts(&self) -> Result<Vec<StatusCount>, QueryError> {
        // Ordered by the columns (bytes), not the `AS CHAR` aliases: those compare by the
        // connection's case-insensitive collation, which interleaves `orders` and `Orders`.
        Ok(sqlx::query_as(
            "SELECT CAST(consumer_group AS CHAR) AS consumer_group, CAST(status AS CHAR) AS status,
                    CAST(SUM(n) AS SIGNED) AS count
             FROM record_counts GROUP BY consumer_group, status HAVING SUM(n) <> 0
             ORDER BY record_counts.consumer_group, record_counts.status",
        )
        .fetch_all(self)
        .await?)
    }

    async fn double_effect_count(&self) -> Result<i64, QueryError> {
        Ok(sqlx::query_scalar("SELECT COUNT(DISTINCT record_id) FROM record_attempts WHERE late_effect = TRUE")
            .fetch_one(self)
            .await?)
    }

    async fn late_duplicate_count(&self) -> Result<i64, QueryError> {
        Ok(sqlx::query_scalar("SELECT COUNT(*) FROM late_duplicates WHERE seen_at > UTC_TIMESTAMP(6) - INTERVAL ? DAY")
            .bind(crate::actions::cleanup::late::WINDOW_DAYS)
            .fetch_one(self)
            .await?)
    }

    async fn conflict_count(&self) -> Result<i64, QueryError> {
        Ok(sqlx::query_scalar("SELECT COUNT(*) FROM record_conflicts WHERE settled_at IS NULL").fetch_one(self).await?)
    }

    async fn stuck_count(&self) -> Result<i64, QueryError> {
        // dedup_records_unsettled_idx: the `processing` range, then each one's lease.
        Ok(sqlx::query_scalar(
            "SELECT COUNT(*) FROM dedup_records
             WHERE unsettled_status = 'processing' AND lease_expires_at < UTC_TIMESTAMP(6)",
        )
        .fetch_one(self)
        .await?)
    }

    async fn traffic(&self, seconds: i64) -> Result<Traffic, QueryError> {
        let sum = |c: &str| format!("CAST(COALESCE(SUM({c}), 0) AS SIGNED) AS {c}");
        let columns = [
            "deliveries",
            "created",
            "duplicates_redis",
            "duplicates_db",
            "redis_hits",
            "redis_misses",
            "redis_fallbacks",
            "retries",
            "failed",
            "dead",
        ]
        .map(sum)
        .join(", ");
        Ok(sqlx::query_as(&format!(
            "SELECT {columns} FROM stats_minute WHERE minute > UTC_TIMESTAMP() - INTERVAL ? SECOND"
        ))
        .bind(seconds)
        .fetch_one(self)
        .await?)
    }

    async fn growth(&self, range: GrowthRange) -> Result<Vec<GrowthPoint>, QueryError> {
        let (span, width) = range.seconds();
        let now = self.now().await?.timestamp();
        // PostgreSQL's date_bin(width, now - span, epoch) and generate_series(start, now, width).
        let start = (now - span).div_euclid(width) * width;
        let starts: Vec<i64> = (start..=now).step_by(usize::try_from(width).unwrap_or(1)).collect();
        let at = |seconds: i64| DateTime::from_timestamp(seconds, 0).unwrap_or_default();

        let created_sql = if width % 3600 == 0 {
            concat!("SELECT CAST(FLOOR(", epoch_seconds!("hour"), " / ?) AS SIGNED) AS bucket, CAST(SUM(created) AS SIGNED)
                     FROM stats_hour WHERE hour >= ? GROUP BY bucket")
        } else {
            concat!("SELECT CAST(FLOOR(", epoch_seconds!("minute"), " / ?) AS SIGNED) AS bucket, CAST(SUM(created) AS SIGNED)
                     FROM stats_minute WHERE minute >= ? GROUP BY bucket")
        };
        let created: HashMap<i64, i64> =
            sqlx::query_as(created_sql).bind(width).bind(utc(at(start))).fetch_all(self).await?.into_iter().collect();

        let mut q: QueryBuilder<'_, MySql> = QueryBuilder::new("");
        for (i, &bucket) in starts.iter().enumerate() {
            if i > 0 {
                q.push(" UNION ALL ");
            }
            q.push("(SELECT ").push_bind(bucket);
            q.push(" AS bucket, total_records, table_bytes, index_bytes FROM table_samples WHERE sampled_at >= ");
            q.push_bind(utc(at(bucket))).push(" AND sampled_at < ").push_bind(utc(at(bucket + width)));
            q.push(" ORDER BY sampled_at DESC LIMIT 1)");
        }
        let samples: HashMap<i64, (i64, i64, i64)> = q
            .build_query_as::<(i64, i64, i64, i64)>()
            .fetch_all(self)
            .await?
            .into_iter()
            .map(|(bucket, total, table, index)| (bucket, (total, table, index)))
            .collect();

        Ok(starts
            .into_iter()
            .map(|bucket| {
                let sample = samples.get(&bucket);
                GrowthPoint {
                    at: at(bucket),
                    created: created.get(&(bucket / width)).copied().unwrap_or(0),
                    total_records: sample.map(|s| s.0),
                    table_bytes: sample.map(|s| s.1),
                    index_bytes: sample.map(|s| s.2),
                }
            })
            .collect())
    }

    async fn duplicate_delays(&self, days: i32) -> Result<Vec<DelayBucket>, QueryError> {
        Ok(sqlx::query_as(
            "SELECT le_ms, CAST(SUM(count) AS SIGNED) AS count, MAX(max_delay_ms) AS max_delay_ms
             FROM duplicate_delays WHERE day >= ? GROUP BY le_ms ORDER BY le_ms",
        )
        .bind(delays_since(days))
        .fetch_all(self)
        .await?)
    }

    async fn consumer_groups(&self) -> Result<Vec<String>, QueryError> {
        Ok(sqlx::query_scalar(
            "SELECT CAST(consumer_group AS CHAR) FROM record_counts GROUP BY consumer_group HAVING SUM(n) > 0
             ORDER BY consumer_group",
        )
        .fetch_all(self)
        .await?)
    }

    async fn message_types(&self) -> Result<Vec<String>, QueryError> {
        Ok(sqlx::query_scalar("SELECT CAST(message_type AS CHAR) FROM message_types ORDER BY message_type")
            .fetch_all(self)
            .await?)
    }
}
