//! Overview wire types: counts, traffic, growth, consumer state, live snapshots.

use serde::{Deserialize, Serialize};

/// Records by status (all consumer groups, or one).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "ssr", derive(utoipa::ToSchema))]
pub struct StatusTotals {
    /// Claimed, lease held (or expired: stuck).
    pub processing: i64,
    /// Done; duplicates are skipped.
    pub succeeded: i64,
    /// Last attempt failed; retried when its copy returns.
    pub failed: i64,
    /// Attempts exhausted or poison; waits for an operator.
    pub dead: i64,
    /// All of them.
    pub total: i64,
}

/// One consumer group and its records by status.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "ssr", derive(utoipa::ToSchema))]
pub struct GroupView {
    /// Consumer group.
    pub name: String,
    /// Its records by status.
    pub counts: StatusTotals,
}

/// What the engine counted over a window.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "ssr", derive(utoipa::ToSchema))]
pub struct TrafficView {
    /// Deliveries received.
    pub deliveries: i64,
    /// New dedup records.
    pub created: i64,
    /// Duplicates caught (Redis and database).
    pub duplicates: i64,
    /// Duplicates over deliveries, 0–1.
    pub duplicate_rate: f64,
    /// Redis lookups that found a marker.
    pub redis_hits: i64,
    /// Redis lookups that found none.
    pub redis_misses: i64,
    /// Hits over answered lookups, 0–1.
    pub redis_hit_ratio: f64,
    /// Lookups that fell back to the database (Redis down or slow).
    pub redis_fallbacks: i64,
    /// Copies sent through the retry path.
    pub retries: i64,
    /// Failed attempts.
    pub failed: i64,
    /// Records that became dead.
    pub dead: i64,
}

/// The live numbers, pushed by `/api/v1/events` about every second.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "ssr", derive(utoipa::ToSchema))]
pub struct LiveView {
    /// Database time of the reading, RFC 3339 (UTC).
    pub at: String,
    /// Records by status, all groups.
    pub totals: StatusTotals,
    /// Processing records whose lease expired.
    pub stuck: i64,
    /// Records whose effect may have run twice: a leased attempt's effect ran after its lease
    /// was lost (taken over, or released).
    pub double_effects: i64,
    /// Late duplicates of the last 30 days: records created by copies that came back after
    /// cleanup deleted their record.
    pub late_duplicates: i64,
    /// Copies of deliveries whose message id was a record's while their type (a reused id) or
    /// payload was not, not requeued yet.
    pub conflicts: i64,
    /// Traffic of the last minute.
    pub last_minute: TrafficView,
}

/// One consumer group of the engine and its workers' state.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "ssr", derive(utoipa::ToSchema))]
pub struct ConsumerView {
    /// Whether its workers run (off when the server serves the console only).
    pub enabled: bool,
    /// Consumer group.
    pub group: String,
    /// The message types it has handlers for.
    pub types: Vec<String>,
    /// The broker consumed from: `rabbitmq` or `kafka`.
    pub broker: String,
    /// Whether the broker connection is up.
    pub connected: bool,
    /// Workers holding an open source.
    pub running_workers: u64,
    /// Deliveries taken and not yet settled.
    pub in_flight: u64,
    /// Messages ready in the work queue (RabbitMQ) or the group's lag over its topics (Kafka);
    /// `None` when the broker did not say.
    pub queue_depth: Option<u64>,
    /// The last connection or settlement error, with its time.
    pub last_error: Option<String>,
    /// Why the broker refuses the group's topology, while it does (an exchange of another
    /// type, a queue with other arguments, a missing one): it consumes nothing meanwhile and
    /// `/readyz` is not ready.
    #[serde(default)]
    pub topology_refused: Option<String>,
    /// Batches given back to the broker unjudged (database trouble) since the engine started.
    #[serde(default)]
    pub failed_batches: u64,
    /// While every batch is given back: `<n> batches given back since <time>`; `/readyz` is
    /// not ready meanwhile.
    #[serde(default)]
    pub failing: Option<String>,
    /// The last such run that ended: `resumed <time> after <seconds> s (<n> batches given
    /// back)`.
    #[serde(default)]
    pub last_recovery: Option<String>,
}

/// One engine process that consumes, as its last heartbeat described it (every process that
/// shares the database, not only the one serving the page).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "ssr", derive(utoipa::ToSchema))]
pub struct InstanceView {
    /// `<host>:<pid>:<8 random hex digits>`.
    pub instance_id: String,
    /// Host name and process id, as `<host>:<pid>`.
    pub name: String,
    /// When it started (RFC 3339).
    pub started_at: String,
    /// Its last heartbeat (RFC 3339); one is written every 5 s.
    pub last_seen_at: String,
    /// True when the last heartbeat is older than 30 s: stopped without saying so (killed, a
    /// lost host) or cut off from the database.
    pub gone: bool,
    /// Whether it is the process that served this answer (its consumers as they are now, not
    /// as its last heartbeat wrote them).
    pub this_process: bool,
    /// Its consumer groups.
    pub consumers: Vec<InstanceConsumerView>,
}

/// One consumer group of an instance.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "ssr", derive(utoipa::ToSchema))]
pub struct InstanceConsumerView {
    /// Consumer group.
    pub group: String,
    /// `rabbitmq` or `kafka`.
    pub broker: String,
    /// What it owns: `<topic>[<partition>]` per Kafka partition assigned to it, `queue <name>`
    /// for RabbitMQ; empty while it owns nothing.
    pub owned: Vec<String>,
    /// Workers running.
    pub workers: u64,
    /// Deliveries taken and not yet settled.
    pub in_flight: u64,
    /// Whether its broker connection was up.
    pub connected: bool,
}

/// One bucket of the duplicate-delay histogram.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "ssr", derive(utoipa::ToSchema))]
pub struct DelayBucketView {
    /// Upper bound in ms; `None` for the overflow bucket.
    pub le_ms: Option<i64>,
    /// Duplicates in the bucket.
    pub count: i64,
    /// Largest delay in it, ms.
    pub max_delay_ms: i64,
}

/// Everything the overview shows apart from the chart and the dependency health.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "ssr", derive(utoipa::ToSchema))]
pub struct OverviewView {
    /// Live numbers (as the event stream pushes them).
    pub live: LiveView,
    /// Counts by consumer group.
    pub groups: Vec<GroupView>,
    /// Traffic of the last hour.
    pub last_hour: TrafficView,
    /// Traffic of the last 24 hours.
    pub last_day: TrafficView,
    /// The engine's consumer groups, in the order they were declared.
    pub consumers: Vec<ConsumerView>,
    /// Every instance that consumes from this database, live ones first, then newest start
    /// first (100 at most); a gone one is listed until forgotten an hour after its last heartbeat.
    #[serde(default)]
    pub instances: Vec<InstanceView>,
    /// Duplicate arrival delays over the last 30 days.
    pub duplicate_delays: Vec<DelayBucketView>,
    /// The engine's HTTP endpoints with their recent calls, by group (declared order) and
    /// message type.
    pub endpoints: Vec<EndpointView>,
}

/// Calls of one answer class.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "ssr", derive(utoipa::ToSchema))]
pub struct AnswerCountView {
    /// `succeeded` (a 2xx taken as success), `in_progress` (409), `conflict` (422), `refused`
    /// (another 4xx but 408, 425, 429; a 2xx answering `dead`), `unavailable` (408, 425, 429,
    /// 5xx), `transport` (no answer: timeout, connection error), `other` (a redirect, a 2xx
    /// asking for a retry or naming an unknown outcome, a status outside 200–599).
    pub class: String,
    /// Calls.
    pub calls: i64,
}

/// One HTTP endpoint of the engine (an HTTP handler: consumer group and message type) and its
/// calls of the last `window_secs`, at most its newest `sample_calls`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "ssr", derive(utoipa::ToSchema))]
pub struct EndpointView {
    /// Consumer group.
    pub group: String,
    /// Message type.
    pub message_type: String,
    /// `POST`, `PUT` or `PATCH`.
    pub method: String,
    /// The URL called (never with credentials; a query string shown as `?…`). No header is
    /// ever shown.
    pub url: String,
    /// Whether its group's workers run in this process.
    pub consuming: bool,
    /// The handler's pause state (shared by every process of the group): `running`, `breaker`
    /// (its circuit breaker), `gone` (the service answered 410) or `operator`.
    pub pause_state: String,
    /// While paused: why (the operator's reason, or the failure that paused it) and since when
    /// (RFC 3339).
    pub pause_reason: Option<String>,
    pub paused_since: Option<String>,
    /// The window, seconds (900).
    pub window_secs: i64,
    /// Most calls read (5 000).
    pub sample_calls: i64,
    /// Calls read.
    pub calls: i64,
    /// The endpoint had more calls in the window than were read: the numbers are its newest
    /// `sample_calls`.
    pub sampled: bool,
    /// When the oldest call read started, RFC 3339.
    pub oldest_at: Option<String>,
    /// Calls by answer class, every class, in a fixed order.
    pub answers: Vec<AnswerCountView>,
    /// Succeeded calls over calls, 0–1; `None` without calls.
    pub success_rate: Option<f64>,
    /// Median latency, ms.
    pub p50_ms: Option<i32>,
    /// 95th percentile latency, ms.
    pub p95_ms: Option<i32>,
}

/// One bucket of the growth chart.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "ssr", derive(utoipa::ToSchema))]
pub struct GrowthPointView {
    /// Bucket start, RFC 3339.
    pub at: String,
    /// Records created in the bucket.
    pub created: i64,
    /// Total records at the bucket's last sample.
    pub total_records: Option<i64>,
    /// Table size on disk, bytes.
    pub table_bytes: Option<i64>,
    /// Index size on disk, bytes.
    pub index_bytes: Option<i64>,
}

/// The dedup-table growth chart over one range.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "ssr", derive(utoipa::ToSchema))]
pub struct GrowthView {
    /// `1h`, `24h`, `7d` or `30d`.
    pub range: String,
    /// Bucket width, seconds.
    pub bucket_secs: i64,
    /// Oldest first, every bucket present.
    pub points: Vec<GrowthPointView>,
}

/// The chart ranges, as URL values.
pub const GROWTH_RANGES: [&str; 4] = ["1h", "24h", "7d", "30d"];
