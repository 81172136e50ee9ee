//! The overview's aggregates: counts by status (`record_counts`), the stuck count,
//! traffic and duplicate rates (`stats_minute`), dedup-table growth and size over time
//! (`stats_minute`, `table_samples`), duplicate delays (`duplicate_delays`), and the lists of
//! consumer groups and message types the filters offer. Read by one [`OverviewReads`] per
//! database on its pool (`store/postgres/overview.rs`, `store/mysql/overview.rs`), reached
//! through [`super::ConsoleStore`].

use async_trait::async_trait;
use chrono::{DateTime, Utc};

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
    /// Late duplicates of the last 30 days ([`OverviewReads::late_duplicate_count`]).
    pub late_duplicates: i64,
    /// Conflicting copies not requeued yet ([`OverviewReads::conflict_count`]).
    pub conflicts: i64,
    /// Traffic of the last minute.
    pub last_minute: Traffic,
}

/// The overview's reads on one database. Errors: [`QueryError::Database`].
#[async_trait]
pub trait OverviewReads: Send + Sync {
    /// The database's clock.
    async fn now(&self) -> Result<DateTime<Utc>, QueryError>;

    /// Exact record counts by (group, status), from `record_counts`, by group and status;
    /// groups and statuses with no records are left out.
    async fn status_counts(&self) -> Result<Vec<StatusCount>, QueryError>;

    /// Records with an attempt whose effect ran after its lease was lost.
    async fn double_effect_count(&self) -> Result<i64, QueryError>;

    /// Late duplicates of the last [`crate::actions::cleanup::late::WINDOW_DAYS`] days: records
    /// created by copies that came back after cleanup deleted their record.
    async fn late_duplicate_count(&self) -> Result<i64, QueryError>;

    /// Conflicting copies not requeued yet (the records filter `flag=conflict` lists their
    /// records; [`crate::console::actions::conflicts`]).
    async fn conflict_count(&self) -> Result<i64, QueryError>;

    /// Stuck records: `processing` with its lease expired (database clock).
    async fn stuck_count(&self) -> Result<i64, QueryError>;

    /// Traffic over the last `seconds` (whole minutes of `stats_minute`, the current one
    /// included).
    async fn traffic(&self, seconds: i64) -> Result<Traffic, QueryError>;

    /// The growth chart: one point per bucket of `range` (every bucket present, oldest first,
    /// buckets aligned to the Unix epoch). Records created come from `stats_hour` when the
    /// buckets are whole hours (7 d, 30 d), else from `stats_minute`; each bucket's size is its
    /// last `table_samples` row (one index probe each).
    async fn growth(&self, range: GrowthRange) -> Result<Vec<GrowthPoint>, QueryError>;

    /// Duplicate arrival delays (arrival minus first seen) over the last `days` days, by bucket.
    async fn duplicate_delays(&self, days: i32) -> Result<Vec<DelayBucket>, QueryError>;

    /// Consumer groups that have records (from `record_counts`), sorted.
    async fn consumer_groups(&self) -> Result<Vec<String>, QueryError>;

    /// Message types ever stored, sorted: `message_types`, which the engine's insert
    /// statements keep (types whose records were all deleted stay).
    async fn message_types(&self) -> Result<Vec<String>, QueryError>;
}

/// The first day of the last `days` days (UTC), as [`OverviewReads::duplicate_delays`] reads.
pub(crate) fn delays_since(days: i32) -> chrono::NaiveDate {
    (Utc::now() - chrono::TimeDelta::days(i64::from(days))).date_naive()
}

/// Reads a [`LiveSnapshot`].
///
/// Errors: [`QueryError::Database`].
pub async fn live_snapshot(reads: &dyn OverviewReads) -> Result<LiveSnapshot, QueryError> {
    let (at, counts, stuck, double_effects, late_duplicates, conflicts, last_minute) = tokio::try_join!(
        reads.now(),
        reads.status_counts(),
        reads.stuck_count(),
        reads.double_effect_count(),
        reads.late_duplicate_count(),
        reads.conflict_count(),
        reads.traffic(60),
    )?;
    Ok(LiveSnapshot { at, counts, stuck, double_effects, late_duplicates, conflicts, last_minute })
}
