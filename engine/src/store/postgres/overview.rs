//! PostgreSQL's overview reads ([`OverviewReads`]): sums of the aggregates the engine keeps,
//! counts over partial indexes, and the growth chart in one statement (`date_bin`,
//! `generate_series`, a `LATERAL` probe of `table_samples` per bucket).

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use sqlx::PgPool;

use crate::console::QueryError;
use crate::console::overview::{
    DelayBucket, GrowthPoint, GrowthRange, OverviewReads, StatusCount, Traffic, delays_since,
};

/// The growth query over a per-interval stats table (`$1` range and `$2` bucket width, seconds).
macro_rules! growth_sql {
    ($table:literal, $column:literal) => {
        concat!(
            "WITH bounds AS (
                 SELECT date_bin($2 * interval '1 second', now() - $1 * interval '1 second', 'epoch') AS start,
                        $2 * interval '1 second' AS width
             ), created AS (
                 SELECT date_bin(b.width, s.",
            $column,
            ", 'epoch') AS at, sum(s.created)::bigint AS created
                 FROM ",
            $table,
            " s, bounds b WHERE s.",
            $column,
            " >= b.start GROUP BY 1
             )
             SELECT g.at, COALESCE(c.created, 0)::bigint AS created, t.total_records, t.table_bytes, t.index_bytes
             FROM bounds b
             CROSS JOIN generate_series(b.start, now(), b.width) AS g(at)
             LEFT JOIN created c ON c.at = g.at
             LEFT JOIN LATERAL (
                 SELECT total_records, table_bytes, index_bytes FROM table_samples
                 WHERE sampled_at >= g.at AND sampled_at < g.at + b.width ORDER BY sampled_at DESC LIMIT 1
             ) t ON true
             ORDER BY g.at"
        )
    };
}

#[async_trait]
impl OverviewReads for PgPool {
    async fn now(&self) -> Result<DateTime<Utc>, QueryError> {
        Ok(sqlx::query_scalar("SELECT now()").fetch_one(self).await?)
    }

    async fn status_counts(&self) -> Result<Vec<StatusCount>, QueryError> {
        Ok(sqlx::query_as(
            "SELECT consumer_group, status, sum(n)::bigint AS count FROM record_counts
             GROUP BY consumer_group, status HAVING sum(n) <> 0 ORDER BY consumer_group, status",
        )
        .fetch_all(self)
        .await?)
    }

    async fn double_effect_count(&self) -> Result<i64, QueryError> {
        // The partial index record_attempts_late_effect_idx.
        Ok(sqlx::query_scalar("SELECT count(DISTINCT record_id) FROM record_attempts WHERE late_effect")
            .fetch_one(self)
            .await?)
    }

    async fn late_duplicate_count(&self) -> Result<i64, QueryError> {
        Ok(sqlx::query_scalar("SELECT count(*) FROM late_duplicates WHERE seen_at > now() - make_interval(days => $1)")
            .bind(crate::actions::cleanup::late::WINDOW_DAYS)
            .fetch_one(self)
            .await?)
    }

    async fn conflict_count(&self) -> Result<i64, QueryError> {
        Ok(sqlx::query_scalar("SELECT count(*) FROM record_conflicts WHERE settled_at IS NULL").fetch_one(self).await?)
    }

    async fn stuck_count(&self) -> Result<i64, QueryError> {
        Ok(sqlx::query_scalar(
            "SELECT count(*) FROM dedup_records WHERE status = 'processing' AND lease_expires_at < now()",
        )
        .fetch_one(self)
        .await?)
    }

    async fn traffic(&self, seconds: i64) -> Result<Traffic, QueryError> {
        Ok(sqlx::query_as(
            "SELECT COALESCE(sum(deliveries), 0)::bigint AS deliveries, COALESCE(sum(created), 0)::bigint AS created,
                    COALESCE(sum(duplicates_redis), 0)::bigint AS duplicates_redis,
                    COALESCE(sum(duplicates_db), 0)::bigint AS duplicates_db,
                    COALESCE(sum(redis_hits), 0)::bigint AS redis_hits, COALESCE(sum(redis_misses), 0)::bigint AS redis_misses,
                    COALESCE(sum(redis_fallbacks), 0)::bigint AS redis_fallbacks,
                    COALESCE(sum(retries), 0)::bigint AS retries, COALESCE(sum(failed), 0)::bigint AS failed,
                    COALESCE(sum(dead), 0)::bigint AS dead
             FROM stats_minute WHERE minute > now() - $1 * interval '1 second'",
        )
        .bind(seconds)
        .fetch_one(self)
        .await?)
    }

    async fn growth(&self, range: GrowthRange) -> Result<Vec<GrowthPoint>, QueryError> {
        let (span, width) = range.seconds();
        let sql = if width % 3600 == 0 { growth_sql!("stats_hour", "hour") } else { growth_sql!("stats_minute", "minute") };
        Ok(sqlx::query_as(sql).bind(span).bind(width).fetch_all(self).await?)
    }

    async fn duplicate_delays(&self, days: i32) -> Result<Vec<DelayBucket>, QueryError> {
        Ok(sqlx::query_as(
            "SELECT le_ms, sum(count)::bigint AS count, max(max_delay_ms) AS max_delay_ms
             FROM duplicate_delays WHERE day >= $1 GROUP BY le_ms ORDER BY le_ms",
        )
        .bind(delays_since(days))
        .fetch_all(self)
        .await?)
    }

    async fn consumer_groups(&self) -> Result<Vec<String>, QueryError> {
        Ok(sqlx::query_scalar(
            "SELECT consumer_group FROM record_counts GROUP BY consumer_group HAVING sum(n) > 0 ORDER BY 1",
        )
        .fetch_all(self)
        .await?)
    }

    async fn message_types(&self) -> Result<Vec<String>, QueryError> {
        Ok(sqlx::query_scalar("SELECT message_type FROM message_types ORDER BY 1").fetch_all(self).await?)
    }
}
