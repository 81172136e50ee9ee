//! The overview's aggregates: counts by status (`record_counts`), the stuck count,
//! traffic and duplicate rates (`stats_minute`), dedup-table growth and size over time
//! (`stats_minute`, `table_samples`), duplicate delays (`duplicate_delays`), and the lists of
//! consumer groups and message types the filters offer.

use chrono::{DateTime, NaiveDate, Utc};
use sqlx::{PgExecutor, PgPool};

use super::QueryError;
use crate::record::RecordStatus;

/// Records of one status in one consumer group.
#[derive(Debug, Clone, PartialEq, Eq, sqlx::FromRow)]
pub struct StatusCount {
    /// Consumer group.
    pub consumer_group: String,
    /// Status.
    #[sqlx(try_from = "String")]
    pub status: RecordStatus,
    /// Exact count (sum of the counter's delta rows).
    pub count: i64,
}

/// Exact record counts by (group, status), from `record_counts`; groups and statuses with no
/// records are left out.
///
/// Errors: [`QueryError::Database`].
pub async fn status_counts<'e>(db: impl PgExecutor<'e>) -> Result<Vec<StatusCount>, QueryError> {
    Ok(sqlx::query_as(
        "SELECT consumer_group, status, sum(n)::bigint AS count FROM record_counts
         GROUP BY consumer_group, status HAVING sum(n) <> 0 ORDER BY consumer_group, status",
    )
    .fetch_all(db)
    .await?)
}

/// Records with an attempt whose effect ran after its lease was lost (partial index
/// `record_attempts_late_effect_idx`).
///
/// Errors: [`QueryError::Database`].
pub async fn double_effect_count<'e>(db: impl PgExecutor<'e>) -> Result<i64, QueryError> {
    Ok(sqlx::query_scalar("SELECT count(DISTINCT record_id) FROM record_attempts WHERE late_effect")
        .fetch_one(db)
        .await?)
}

/// Late duplicates of the last [`crate::actions::cleanup::late::WINDOW_DAYS`] days: records
/// created by copies that came back after cleanup deleted their record.
///
/// Errors: [`QueryError::Database`].
pub async fn late_duplicate_count<'e>(db: impl PgExecutor<'e>) -> Result<i64, QueryError> {
    Ok(sqlx::query_scalar("SELECT count(*) FROM late_duplicates WHERE seen_at > now() - make_interval(days => $1)")
        .bind(crate::actions::cleanup::late::WINDOW_DAYS)
        .fetch_one(db)
        .await?)
}

/// Conflicting copies not requeued yet (the records filter `flag=conflict` lists their records;
/// [`crate::console::actions::conflicts`]).
///
/// Errors: [`QueryError::Database`].
pub async fn conflict_count<'e>(db: impl PgExecutor<'e>) -> Result<i64, QueryError> {
    Ok(sqlx::query_scalar("SELECT count(*) FROM record_conflicts WHERE settled_at IS NULL").fetch_one(db).await?)
}

/// Stuck records: `processing` with `lease_expires_at < now()` (database clock).
///
/// Errors: [`QueryError::Database`].
pub async fn stuck_count<'e>(db: impl PgExecutor<'e>) -> Result<i64, QueryError> {
    Ok(sqlx::query_scalar(
        "SELECT count(*) FROM dedup_records WHERE status = 'processing' AND lease_expires_at < now()",
    )
    .fetch_one(db)
    .await?)
}

/// What the engine counted over a time window (all groups).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, sqlx::FromRow)]
pub struct Traffic {
    /// Deliveries received.
    pub deliveries: i64,
    /// New dedup records.
    pub created: i64,
    /// Duplicates caught by the Redis marker.
    pub duplicates_redis: i64,
    /// Duplicates caught by the database.
    pub duplicates_db: i64,
    /// Redis lookups that found a marker.
    pub redis_hits: i64,
    /// Redis lookups that found none.
    pub redis_misses: i64,
    /// Lookups that fell back to the database (Redis down or slow).
    pub redis_fallbacks: i64,
    /// Copies sent back through the retry path.
    pub retries: i64,
    /// Failed attempts.
    pub failed: i64,
    /// Records that became dead.
    pub dead: i64,
}

impl Traffic {
    /// Duplicates over deliveries (0 without deliveries).
    pub fn duplicate_rate(&self) -> f64 {
        ratio(self.duplicates_redis + self.duplicates_db, self.deliveries)
    }

    /// Redis hits over lookups that got an answer (0 without lookups).
    pub fn redis_hit_ratio(&self) -> f64 {
        ratio(self.redis_hits, self.redis_hits + self.redis_misses)
    }
}

fn ratio(part: i64, whole: i64) -> f64 {
    if whole <= 0 { 0.0 } else { part as f64 / whole as f64 }
}

/// Traffic over the last `seconds` (whole minutes of `stats_minute`, the current one included).
///
/// Errors: [`QueryError::Database`].
pub async fn traffic<'e>(db: impl PgExecutor<'e>, seconds: i64) -> Result<Traffic, QueryError> {
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
    .fetch_one(db)
    .await?)
}

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

/// The ranges of the growth chart.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum GrowthRange {
    /// The last hour, per minute.
    Hour,
    /// The last 24 hours, per 20 minutes.
    #[default]
    Day,
    /// The last 7 days, per 2 hours.
    Week,
    /// The last 30 days, per 12 hours.
    Month,
}

impl GrowthRange {
    /// All ranges, shortest first.
    pub const ALL: [GrowthRange; 4] = [GrowthRange::Hour, GrowthRange::Day, GrowthRange::Week, GrowthRange::Month];

    /// The URL name: `1h`, `24h`, `7d`, `30d`.
    pub fn as_str(self) -> &'static str {
        match self {
            GrowthRange::Hour => "1h",
            GrowthRange::Day => "24h",
            GrowthRange::Week => "7d",
            GrowthRange::Month => "30d",
        }
    }

    /// (range, bucket width) in seconds.
    pub fn seconds(self) -> (i64, i64) {
        match self {
            GrowthRange::Hour => (3600, 60),
            GrowthRange::Day => (86_400, 1200),
            GrowthRange::Week => (7 * 86_400, 7200),
            GrowthRange::Month => (30 * 86_400, 43_200),
        }
    }

    /// Parses a URL name; an absent or empty one is [`GrowthRange::Day`].
    pub fn parse(text: Option<&str>) -> Result<Self, QueryError> {
        match text.map(str::trim).filter(|t| !t.is_empty()) {
            None => Ok(GrowthRange::default()),
            Some(t) => GrowthRange::ALL.into_iter().find(|r| r.as_str() == t).ok_or_else(|| {
                QueryError::BadFilter(format!(
                    "unknown range {:?}; expected 1h, 24h, 7d or 30d",
                    t.chars().take(20).collect::<String>()
                ))
            }),
        }
    }
}

/// One bucket of the growth chart.
#[derive(Debug, Clone, PartialEq, Eq, sqlx::FromRow)]
pub struct GrowthPoint {
    /// Bucket start.
    pub at: DateTime<Utc>,
    /// Records created in the bucket.
    pub created: i64,
    /// Total records at the bucket's last table sample; `None` without a sample.
    pub total_records: Option<i64>,
    /// Table size on disk then, bytes.
    pub table_bytes: Option<i64>,
    /// Index size on disk then, bytes.
    pub index_bytes: Option<i64>,
}

/// The growth chart: one point per bucket of `range` (every bucket present, oldest first).
/// Records created come from `stats_hour` when the buckets are whole hours (7 d, 30 d), else from
/// `stats_minute`; each bucket's size is its last `table_samples` row (one index probe each).
///
/// Errors: [`QueryError::Database`].
pub async fn growth<'e>(db: impl PgExecutor<'e>, range: GrowthRange) -> Result<Vec<GrowthPoint>, QueryError> {
    let (span, width) = range.seconds();
    let sql = if width % 3600 == 0 { growth_sql!("stats_hour", "hour") } else { growth_sql!("stats_minute", "minute") };
    Ok(sqlx::query_as(sql).bind(span).bind(width).fetch_all(db).await?)
}

/// One bucket of the duplicate-delay histogram, summed over groups and days.
#[derive(Debug, Clone, PartialEq, Eq, sqlx::FromRow)]
pub struct DelayBucket {
    /// Upper bound in ms (`i64::MAX`: the overflow bucket).
    pub le_ms: i64,
    /// Duplicates whose delay fell in the bucket.
    pub count: i64,
    /// Largest delay seen in it, ms.
    pub max_delay_ms: i64,
}

/// Duplicate arrival delays (arrival minus first seen) over the last `days` days.
///
/// Errors: [`QueryError::Database`].
pub async fn duplicate_delays<'e>(db: impl PgExecutor<'e>, days: i32) -> Result<Vec<DelayBucket>, QueryError> {
    let since: NaiveDate = (Utc::now() - chrono::TimeDelta::days(i64::from(days))).date_naive();
    Ok(sqlx::query_as(
        "SELECT le_ms, sum(count)::bigint AS count, max(max_delay_ms) AS max_delay_ms
         FROM duplicate_delays WHERE day >= $1 GROUP BY le_ms ORDER BY le_ms",
    )
    .bind(since)
    .fetch_all(db)
    .await?)
}

/// Consumer groups that have records (from `record_counts`), sorted.
///
/// Errors: [`QueryError::Database`].
pub async fn consumer_groups<'e>(db: impl PgExecutor<'e>) -> Result<Vec<String>, QueryError> {
    Ok(sqlx::query_scalar(
        "SELECT consumer_group FROM record_counts GROUP BY consumer_group HAVING sum(n) > 0 ORDER BY 1",
    )
    .fetch_all(db)
    .await?)
}

/// Message types ever stored, sorted: `message_types`, which the engine's insert statements
/// keep (types whose records were all deleted stay).
///
/// Errors: [`QueryError::Database`].
pub async fn message_types<'e>(db: impl PgExecutor<'e>) -> Result<Vec<String>, QueryError> {
    Ok(sqlx::query_scalar("SELECT message_type FROM message_types ORDER BY 1").fetch_all(db).await?)
}

/// The numbers the live feed pushes: cheap enough to read every second.
#[derive(Debug, Clone, PartialEq)]
pub struct LiveSnapshot {
    /// Database time of the reading.
    pub at: DateTime<Utc>,
    /// Counts by group and status.
    pub counts: Vec<StatusCount>,
    /// Stuck records.
    pub stuck: i64,
    /// Records whose effect may have run twice (a leased attempt's effect ran after its lease
    /// was lost).
    pub double_effects: i64,
    /// Late duplicates of the last 30 days ([`late_duplicate_count`]).
    pub late_duplicates: i64,
    /// Conflicting copies not requeued yet ([`conflict_count`]).
    pub conflicts: i64,
    /// Traffic of the last minute.
    pub last_minute: Traffic,
}

/// Reads a [`LiveSnapshot`].
///
/// Errors: [`QueryError::Database`].
pub async fn live_snapshot(pool: &PgPool) -> Result<LiveSnapshot, QueryError> {
    let (at, counts, stuck, double_effects, late_duplicates, conflicts, last_minute) = tokio::try_join!(
        async { Ok::<DateTime<Utc>, QueryError>(sqlx::query_scalar("SELECT now()").fetch_one(pool).await?) },
        status_counts(pool),
        stuck_count(pool),
        double_effect_count(pool),
        late_duplicate_count(pool),
        conflict_count(pool),
        traffic(pool, 60),
    )?;
    Ok(LiveSnapshot { at, counts, stuck, double_effects, late_duplicates, conflicts, last_minute })
}
