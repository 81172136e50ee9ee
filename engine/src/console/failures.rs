//! Records that need an operator: stuck claims, retries in progress and dead letters grouped by
//! cause. Read by one [`FailureReads`] per database on its pool (`store/postgres/failures.rs`,
//! `store/mysql/failures.rs`), reached through [`super::ConsoleStore`].

use async_trait::async_trait;
use chrono::{DateTime, Utc};

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

/// Failed records of one message type that have made one number of attempts.
#[derive(Debug, Clone, PartialEq, Eq, sqlx::FromRow)]
pub struct RetryCell {
    /// Attempts made.
    pub attempts: i32,
    /// Message type.
    pub message_type: String,
    /// Failed records.
    pub records: i64,
}

/// The failure pages' reads on one database. Errors: [`QueryError::Database`].
#[async_trait]
pub trait FailureReads: Send + Sync {
    /// The stuck records (`processing` with the lease expired, database clock; at most
    /// `limit`), longest stuck first, with the total.
    async fn stuck_records(&self, limit: i64) -> Result<StuckList, QueryError>;

    /// The failed records per (attempts, message type), in no order, and the soonest
    /// `next_attempt_at` among them.
    async fn retry_cells(&self) -> Result<(Vec<RetryCell>, Option<DateTime<Utc>>), QueryError>;

    /// Dead letters grouped by error class (at most `limit` groups): the classes HTTP handlers
    /// write first, so that their answer classes are always whole, then the largest group
    /// first, then by class; each group's message types sorted.
    async fn dead_letter_groups(&self, limit: i64) -> Result<Vec<DeadLetterGroup>, QueryError>;
}

/// Reads the retries page; `limit` bounds the list of most retried records, read from the
/// records list (`records`). The distribution and the types are [`FailureReads::retry_cells`]
/// folded here.
///
/// Errors: [`QueryError::Database`].
pub async fn retries(
    reads: &dyn FailureReads,
    records: &dyn super::records::RecordReads,
    limit: i64,
) -> Result<RetryOverview, QueryError> {
    let params = super::filter::RecordListParams {
        filter: super::filter::RecordFilter { status: Some(crate::record::RecordStatus::Failed), ..Default::default() },
        sort: super::filter::SortKey::Attempts,
        limit,
        ..Default::default()
    };
    let ((cells, next_retry_at), most_retried) =
        tokio::try_join!(reads.retry_cells(), super::records::records_list(records, &params))?;
    let (distribution, top_types) = fold_retry_cells(&cells);
    Ok(RetryOverview { distribution, top_types, next_retry_at, most_retried: most_retried.rows })
}

/// Folds (attempts, type, records) cells into the attempts distribution (fewest first) and the
/// types with the most attempts (most first, then by name; at most [`TOP_TYPES`]).
fn fold_retry_cells(cells: &[RetryCell]) -> (Vec<AttemptsBucket>, Vec<TypeRetries>) {
    let mut by_attempts = std::collections::BTreeMap::<i32, i64>::new();
    let mut by_type = std::collections::BTreeMap::<&str, TypeRetries>::new();
    for RetryCell { attempts, message_type, records } in cells {
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
