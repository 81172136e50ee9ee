//! Wire types of the background operator actions: bulk requeue, cleanup schedules, duplicate
//! drills, and the audit log.

use serde::{Deserialize, Serialize};

use super::records::RecordsQuery;

/// Records a bulk requeue would skip for one reason.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "ssr", derive(utoipa::ToSchema))]
pub struct SkipCountView {
    /// `already succeeded`, `lease live`, `stuck: release it first`, `poison message`, `payload missing`.
    pub reason: String,
    /// Records.
    pub count: i64,
}

/// What a bulk requeue of a filter would do now.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "ssr", derive(utoipa::ToSchema))]
pub struct RequeuePreviewView {
    /// Records the filter matches now.
    pub matched: i64,
    /// Records that would be requeued (confirm this number).
    pub would_requeue: i64,
    /// Records that would be skipped, by reason.
    pub skipped: Vec<SkipCountView>,
}

/// The body of `POST /api/v1/requeue/jobs`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "ssr", derive(utoipa::ToSchema))]
#[serde(default, deny_unknown_fields)]
pub struct RequeueStartRequest {
    /// Which records: the records page's filter (status, group, type, error class, time range...).
    pub filter: RecordsQuery,
    /// Messages per second (default 50, at most 10 000).
    pub rate_per_sec: Option<f64>,
    /// Canary batch size (default 10): these must all publish before the rest run.
    pub canary_size: Option<i32>,
    /// Pause when the share of failed publishes among recent ones passes this (default 0.2).
    pub failure_threshold: Option<f64>,
    /// The preview's `would_requeue` the operator confirmed; refused with 409 if the selection
    /// has another count now.
    pub expected_count: Option<i64>,
    /// Why.
    pub reason: Option<String>,
}

/// A bulk requeue job and its progress.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "ssr", derive(utoipa::ToSchema))]
pub struct RequeueJobView {
    /// Job id.
    pub id: i64,
    /// When it was confirmed, RFC 3339.
    pub created_at: String,
    /// Who confirmed it.
    pub created_by: String,
    /// Why.
    pub reason: Option<String>,
    /// The filter, as JSON text.
    pub filter: String,
    /// `running`, `paused`, `cancelled` or `completed`.
    pub state: String,
    /// Why it paused.
    pub paused_reason: Option<String>,
    /// Messages per second asked for.
    pub rate_per_sec: f64,
    /// Canary batch size.
    pub canary_size: i32,
    /// Failure threshold (0..1].
    pub failure_threshold: f64,
    /// Records in the frozen selection.
    pub total: i64,
    /// Requeued.
    pub done: i64,
    /// Skipped.
    pub skipped: i64,
    /// Publish failed.
    pub failed: i64,
    /// Not handled yet.
    pub pending: i64,
    /// Publishes per second so far.
    pub observed_rate: f64,
    /// Seconds left at the job's rate (running jobs).
    pub eta_secs: Option<f64>,
    /// When it completed or was cancelled, RFC 3339.
    pub finished_at: Option<String>,
}

/// `pause`, `resume` or `cancel` of a job.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[cfg_attr(feature = "ssr", derive(utoipa::ToSchema))]
pub enum JobControlKind {
    /// Running → paused.
    Pause,
    /// Paused → running.
    Resume,
    /// Running or paused → cancelled.
    Cancel,
}

/// The body of `POST /api/v1/cleanup/schedules` (create) and `PUT .../{id}` (edit).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "ssr", derive(utoipa::ToSchema))]
#[serde(default, deny_unknown_fields)]
pub struct ScheduleRequest {
    /// Unique name.
    pub name: String,
    /// Five-field cron expression, UTC (e.g. `0 3 * * *`).
    pub cron: String,
    /// Delete records older than this many days (default 30).
    pub retention_days: i32,
    /// Records per delete batch (default 5000).
    pub batch_size: i32,
    /// Statuses deleted (default `["succeeded"]`; `failed`, `dead` only when asked for).
    pub statuses: Vec<String>,
    /// Only this consumer group (empty: all).
    pub consumer_group: Option<String>,
    /// Whether the scheduler runs it.
    pub enabled: bool,
    /// Days to keep the fingerprints of deleted records, by which late duplicates are known
    /// (0 to 36500; 0 keeps none). Empty: ten times the retention.
    pub fingerprint_days: Option<i32>,
}

impl Default for ScheduleRequest {
    fn default() -> Self {
        Self {
            name: String::new(),
            cron: "0 3 * * *".to_owned(),
            retention_days: 30,
            batch_size: 5000,
            statuses: vec!["succeeded".to_owned()],
            consumer_group: None,
            enabled: true,
            fingerprint_days: None,
        }
    }
}

/// A cleanup schedule with its retention warning.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "ssr", derive(utoipa::ToSchema))]
pub struct ScheduleView {
    /// Id.
    pub id: i64,
    /// The stored settings.
    pub settings: ScheduleRequest,
    /// The tick of the last scheduled run, RFC 3339.
    pub last_run_for: Option<String>,
    /// The next tick, RFC 3339.
    pub next_run_at: Option<String>,
    /// Set when the retention is shorter than the advice.
    pub retention_warning: Option<String>,
    /// Days it keeps fingerprints (its setting, or ten times the retention).
    pub fingerprint_horizon_days: i32,
}

/// One cleanup run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "ssr", derive(utoipa::ToSchema))]
pub struct CleanupRunView {
    /// Run id.
    pub id: i64,
    /// Schedule id.
    pub schedule_id: i64,
    /// `schedule` or `manual`.
    pub trigger: String,
    /// Who ran it.
    pub actor: String,
    /// Records older than this were deleted, RFC 3339.
    pub cutoff: String,
    /// Start, RFC 3339.
    pub started_at: String,
    /// End, RFC 3339; `None` while running.
    pub finished_at: Option<String>,
    /// Duration so far or in total, seconds.
    pub seconds: Option<f64>,
    /// Records deleted.
    pub rows_deleted: i64,
    /// Delete batches.
    pub batches: i32,
    /// Why it stopped early.
    pub error: Option<String>,
}

/// The cleanup page: schedules, recent runs, the retention advice.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "ssr", derive(utoipa::ToSchema))]
pub struct CleanupView {
    /// Schedules by name.
    pub schedules: Vec<ScheduleView>,
    /// The latest runs of all schedules.
    pub runs: Vec<CleanupRunView>,
    /// Longest delay observed, ms: of a duplicate after the first delivery, or of a late delivery
    /// (last 30 days) after it was sent; `None` before any.
    pub longest_duplicate_delay_ms: Option<i64>,
    /// Retention should be at least this factor × that delay.
    pub safety_factor: f64,
    /// That minimum, ms.
    pub minimum_retention_ms: Option<i64>,
    /// Per group, the deliveries of the last 30 days that arrived older than the retention
    /// (by their own timestamp) and found no record: most likely duplicates of records cleanup
    /// had deleted, whose handlers ran again.
    pub late_deliveries: Vec<LateDeliveriesView>,
    /// Per group, the late duplicates of the last 30 days: new records whose message id matched
    /// the fingerprint of a record cleanup had deleted.
    pub late_duplicates: Vec<LateDuplicatesView>,
}

/// Late duplicates of one consumer group.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "ssr", derive(utoipa::ToSchema))]
pub struct LateDuplicatesView {
    /// The group.
    pub consumer_group: String,
    /// How many.
    pub count: i64,
    /// Of them, held for an operator (`late_duplicates = "hold"`).
    pub held: i64,
    /// The longest delay after the first delivery of the same message id, ms.
    pub longest_delay_ms: i64,
    /// The latest, RFC 3339.
    pub last_seen_at: String,
}

/// Late deliveries of one consumer group.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "ssr", derive(utoipa::ToSchema))]
pub struct LateDeliveriesView {
    /// The group.
    pub consumer_group: String,
    /// How many.
    pub count: i64,
    /// The oldest, ms after it was sent.
    pub max_age_ms: i64,
}

/// The body of `POST /api/v1/drills`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "ssr", derive(utoipa::ToSchema))]
#[serde(default, deny_unknown_fields)]
pub struct DrillRequest {
    /// A succeeded record's id; or give `message_type`.
    pub record_id: Option<i64>,
    /// Drill the latest succeeded record of this type.
    pub message_type: Option<String>,
    /// The original payload (text), if known: checked against the record's SHA-256; then the
    /// Redis fast path can catch the copy. Empty: a drill payload (the database catches it).
    pub original_payload: Option<String>,
}

/// A drill and what has been seen since.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "ssr", derive(utoipa::ToSchema))]
pub struct DrillView {
    /// Drill id.
    pub id: i64,
    /// The record.
    pub record_id: i64,
    /// Its message id.
    pub message_id: String,
    /// When the copy was published, RFC 3339.
    pub published_at: String,
    /// Whether the Redis marker existed then.
    pub marker_present: bool,
    /// `redis` or `database`; `None` while the copy is in flight.
    pub caught_by: Option<String>,
    /// Duplicates added to the record since.
    pub duplicates_added: i64,
    /// Handler attempts added since (0 expected).
    pub attempts_added: i64,
    /// The record's status now.
    pub status: Option<String>,
    /// Caught, no new attempt, still succeeded: the handler did not run again.
    pub passed: bool,
}

/// Filters of the audit log (query string of `/audit` and `GET /api/v1/audit`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "ssr", derive(utoipa::IntoParams, utoipa::ToSchema))]
#[cfg_attr(feature = "ssr", into_params(parameter_in = Query))]
#[serde(default)]
pub struct AuditQuery {
    /// Actor, exact (`console`, `cli:alice`, `scheduler`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub actor: Option<String>,
    /// Action prefix (`record.`, `bulk.requeue`, `cleanup.`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub action: Option<String>,
    /// `ok`, `refused` or `failed`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub outcome: Option<String>,
    /// At or after (RFC 3339 or `YYYY-MM-DDTHH:MM`, UTC).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub from: Option<String>,
    /// Before.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub to: Option<String>,
    /// Next page: entries older than this id (the `next` of the current page).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub before: Option<String>,
}

/// One audit entry.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "ssr", derive(utoipa::ToSchema))]
pub struct AuditEntryView {
    /// Entry id.
    pub id: i64,
    /// When, RFC 3339.
    pub at: String,
    /// Who.
    pub actor: String,
    /// Dotted verb.
    pub action: String,
    /// `ok`, `refused` or `failed`.
    pub outcome: String,
    /// Why.
    pub reason: Option<String>,
    /// Consumer group.
    pub consumer_group: Option<String>,
    /// Records by message id (the first 20; `message_count` says how many).
    pub message_ids: Vec<String>,
    /// All records named.
    pub message_count: usize,
    /// Filter, counts, errors (JSON text).
    pub detail: String,
}

/// One page of the audit log, newest first.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "ssr", derive(utoipa::ToSchema))]
pub struct AuditPageView {
    /// The entries.
    pub entries: Vec<AuditEntryView>,
    /// Pass as `before` for the next (older) page; `None` on the last.
    pub next: Option<String>,
}
