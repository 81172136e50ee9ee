//! Records that need an operator: stuck claims, retries in progress and dead letters grouped by
//! cause.

use chrono::{DateTime, Utc};
use sqlx::PgExecutor;

use super::QueryError;
use super::endpoints::DeadLetterClass;
use super::records::RecordRow;

/// A stuck record re-entered processing this many times after an expired lease: it keeps
/// crashing its worker (or outliving its lease) instead of failing, so retries never count it
/// towards dead.
pub(crate) const CRASH_LOOP_REENTRIES: i32 = 2;

/// A `processing` record whose lease has expired (database clock).
#[derive(Debug, Clone, PartialEq, sqlx::FromRow)]
pub struct StuckRecord {
    /// Record id.
    pub id: i64,
    /// Consumer group.
    pub consumer_group: String,
    /// Message id.
    pub message_id: String,
    /// Message type.
    pub message_type: String,
    /// `transactional` or `leased`.
    pub handler_mode: Option<String>,
    /// The worker that held the lease.
    pub lease_owner: Option<String>,
    /// The lease token an operator action must present.
    pub lease_token: uuid::Uuid,
    /// When the lease expired.
    pub lease_expires_at: DateTime<Utc>,
    /// Seconds since the lease expired.
    pub stuck_secs: i64,
    /// Last change (the claim), database clock.
    pub updated_at: DateTime<Utc>,
    /// Attempts so far.
    pub attempts: i32,
    /// Attempts allowed.
    pub max_attempts: i32,
    /// Re-entries into processing after an expired lease.
    pub reentries: i32,
    /// `reentries >= CRASH_LOOP_REENTRIES`: the record keeps re-entering processing.
    pub crash_loop: bool,
    /// When a redelivery was parked on it (`hold`), if one was.
    pub parked_at: Option<DateTime<Utc>>,
}

/// Stuck records, longest stuck first, and how many there are.
#[derive(Debug, Clone, PartialEq)]
pub struct StuckList {
    /// All stuck records.
    pub total: i64,
    /// The first `limit` of them.
    pub rows: Vec<StuckRecord>,
}

/// The stuck records (at most `limit`), longest stuck first, with the total.
///
/// Errors: [`QueryError::Database`].
pub async fn stuck_records(pool: &sqlx::PgPool, limit: i64) -> Result<StuckList, QueryError> {
    let rows = sqlx::query_as(
        "SELECT id, consumer_group, message_id, message_type, handler_mode, lease_owner, lease_token, lease_expires_at,
                extract(epoch FROM now() - lease_expires_at)::bigint AS stuck_secs, updated_at, attempts,
                max_attempts, reentries, reentries >= $2 AS crash_loop, parked_at
         FROM dedup_records WHERE status = 'processing' AND lease_expires_at < now()
         ORDER BY lease_expires_at, id LIMIT $1",
    )
    .bind(limit)
    .bind(CRASH_LOOP_REENTRIES)
    .fetch_all(pool);
    let (rows, total) = tokio::try_join!(map_db(rows), super::overview::OverviewReads::stuck_count(pool))?;
    Ok(StuckList { total, rows })
}

/// How many failed records have made a given number of attempts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AttemptsBucket {
    /// Attempts made.
    pub attempts: i32,
    /// Failed records with that many.
    pub records: i64,
}

/// Retries of one message type among failed records.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TypeRetries {
    /// Message type.
    pub message_type: String,
    /// Failed records of the type.
    pub records: i64,
    /// Their attempts, summed.
    pub attempts: i64,
    /// The most attempts of one of them.
    pub max_attempts: i32,
}

/// The retries page: failed records, which will be tried again when their copy returns.
#[derive(Debug, Clone, PartialEq)]
pub struct RetryOverview {
    /// Failed records by attempts made, fewest first.
    pub distribution: Vec<AttemptsBucket>,
    /// Message types with the most failed records' attempts, most first (at most 10).
    pub top_types: Vec<TypeRetries>,
    /// The soonest `next_attempt_at` among failed records.
    pub next_retry_at: Option<DateTime<Utc>>,
    /// The most retried failed records (most attempts first).
    pub most_retried: Vec<RecordRow>,
}

/// Most retried message types listed.
const TOP_TYPES: usize = 10;

/// Reads the retries page; `limit` bounds the list of most retried records. The distribution
/// and the types come from one index-only pass over the failed records, grouped by (attempts,
/// type) and folded here; the next retry is one probe of the failed records' retry-time index.
///
/// Errors: [`QueryError::Database`].
pub async fn retries(pool: &sqlx::PgPool, limit: i64) -> Result<RetryOverview, QueryError> {
    let cells = sqlx::query_as::<_, (i32, String, i64)>(
        "SELECT attempts, message_type, count(*) FROM dedup_records WHERE status = 'failed'
         GROUP BY attempts, message_type",
    )
    .fetch_all(pool);
    let next_retry_at = sqlx::query_scalar(
        "SELECT next_attempt_at FROM dedup_records WHERE status = 'failed' AND next_attempt_at IS NOT NULL
         ORDER BY next_attempt_at LIMIT 1",
    )
    .fetch_optional(pool);
    let params = super::filter::RecordListParams {
        filter: super::filter::RecordFilter { status: Some(crate::record::RecordStatus::Failed), ..Default::default() },
        sort: super::filter::SortKey::Attempts,
        limit,
        ..Default::default()
    };
    let most_retried = super::records::records_list(pool, &params);
    let (cells, next_retry_at, most_retried) = tokio::try_join!(map_db(cells), map_db(next_retry_at), most_retried)?;
    let (distribution, top_types) = fold_retry_cells(&cells);
    Ok(RetryOverview { distribution, top_types, next_retry_at, most_retried: most_retried.rows })
}

/// Folds (attempts, type, records) cells into the attempts distribution (fewest first) and the
/// types with the most attempts (most first, then by name; at most [`TOP_TYPES`]).
fn fold_retry_cells(cells: &[(i32, String, i64)]) -> (Vec<AttemptsBucket>, Vec<TypeRetries>) {
    let mut by_attempts = std::collections::BTreeMap::<i32, i64>::new();
    let mut by_type = std::collections::BTreeMap::<&str, TypeRetries>::new();
    for (attempts, message_type, records) in cells {
        *by_attempts.entry(*attempts).or_default() += records;
        let t = by_type.entry(message_type).or_insert_with(|| TypeRetries {
            message_type: message_type.clone(),
            records: 0,
            attempts: 0,
            max_attempts: 0,
        });
        t.records += records;
        t.attempts += i64::from(*attempts) * records;
        t.max_attempts = t.max_attempts.max(*attempts);
    }
    let distribution =
        by_attempts.into_iter().map(|(attempts, records)| AttemptsBucket { attempts, records }).collect();
    let mut top_types: Vec<TypeRetries> = by_type.into_values().collect();
    top_types.sort_by(|a, b| b.attempts.cmp(&a.attempts).then_with(|| a.message_type.cmp(&b.message_type)));
    top_types.truncate(TOP_TYPES);
    (distribution, top_types)
}

async fn map_db<T>(f: impl Future<Output = Result<T, sqlx::Error>>) -> Result<T, QueryError> {
    Ok(f.await?)
}

/// Dead letters sharing one error class (error kind + first line, numbers masked).
#[derive(Debug, Clone, PartialEq, Eq, sqlx::FromRow)]
pub struct DeadLetterGroup {
    /// The class; `None` for dead records without one.
    pub error_class: Option<String>,
    /// Dead records in the group.
    pub records: i64,
    /// Earliest first-seen among them.
    pub first_seen_at: DateTime<Utc>,
    /// Latest change (when the last of them went dead).
    pub last_seen_at: DateTime<Utc>,
    /// Their message types, sorted.
    pub message_types: Vec<String>,
}

impl DeadLetterGroup {
    /// How an HTTP handler's dead letters came to be; `None` for the error classes of other
    /// handlers.
    pub fn answer_class(&self) -> Option<DeadLetterClass> {
        DeadLetterClass::of(self.error_class.as_deref()?)
    }
}

/// Dead letters grouped by error class (at most `limit` groups): the classes HTTP handlers
/// write first, so that their answer classes are always whole, then largest group first.
/// Grouped by (class, type) first, so no per-group sort of the types is needed; one
/// index-only pass over `dedup_records_dead_class_idx` (error_class, first_seen_at, id)
/// INCLUDE (message_type, updated_at) WHERE dead.
///
/// Errors: [`QueryError::Database`].
pub async fn dead_letter_groups<'e>(db: impl PgExecutor<'e>, limit: i64) -> Result<Vec<DeadLetterGroup>, QueryError> {
    Ok(sqlx::query_as(
        "SELECT error_class, sum(records)::bigint AS records, min(first_seen_at) AS first_seen_at,
                max(last_seen_at) AS last_seen_at, array_agg(message_type ORDER BY message_type) AS message_types
         FROM (SELECT error_class, message_type, count(*) AS records, min(first_seen_at) AS first_seen_at,
                      max(updated_at) AS last_seen_at
               FROM dedup_records WHERE status = 'dead' GROUP BY error_class, message_type) AS by_type
         GROUP BY error_class
         ORDER BY COALESCE(error_class = ANY($2), false) DESC, sum(records) DESC, error_class LIMIT $1",
    )
    .bind(limit)
    .bind(DeadLetterClass::http_error_classes())
    .fetch_all(db)
    .await?)
}
