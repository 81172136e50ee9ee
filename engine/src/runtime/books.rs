//! The runtime's books (docs/research/store-seam.md 3.7 step 5, "runtime books"): what a running
//! engine writes and reads besides its records — its shared keys at start, the aggregates every
//! flush, the record counts' fold and the table samples, its instance's heartbeat row, and the
//! conflicting copies a group's start warns of. One implementation per database, on the engine's
//! pool (`store/postgres/runtime.rs`, `store/mysql/runtime.rs`; [`crate::EnginePool`] gives it); the runtime holds it as
//! `Arc<dyn RuntimeBooks>`, off the hot path.

use async_trait::async_trait;
use chrono::{DateTime, Utc};

use crate::instances::{Instance, InstanceConsumer};
use crate::stats::{DelayCounts, LateCounts, MinuteCounts};

/// One heartbeat row (`consumer_instances`): an instance's identity and its groups now.
pub(crate) struct HeartbeatRow<'a> {
    /// `<host>:<pid>:<8 hex digits>`.
    pub instance_id: &'a str,
    /// Host name.
    pub host: &'a str,
    /// Process id.
    pub pid: i32,
    /// When the engine started.
    pub started_at: DateTime<Utc>,
    /// Its consumer groups, in their declared order.
    pub consumers: &'a [InstanceConsumer],
    /// Rows of any instance not written for this long are deleted with this write, ms.
    pub forget_after_ms: i64,
}

/// What the runtime writes and reads of its own tables. Errors are the database's.
#[async_trait]
pub(crate) trait RuntimeBooks: Send + Sync {
    /// The engine's shared secret `name` (32 bytes), created at random by the first engine that
    /// asks; every engine on the database reads the same one.
    async fn engine_key(&self, name: &str) -> Result<[u8; 32], sqlx::Error>;

    /// Adds the counters of one flush: per (minute, group) to `stats_minute` (and its `created`
    /// to `stats_hour` with it), per (day, group, delay bucket), and late deliveries per (day,
    /// group), all in one transaction (the flush keeps a failed one's counts for the next).
    /// Each table's rows are written in key order: one lock order for concurrent engines.
    async fn write_stats(
        &self,
        minutes: &MinuteCounts,
        delays: &DelayCounts,
        late: &LateCounts,
    ) -> Result<(), sqlx::Error>;

    /// Folds the record counts' delta rows into one row per (group, status), unless another
    /// engine is folding right now; readers sum the rows, so they see the same counts before
    /// and after. Returns the rows folded (0 when skipped).
    async fn fold_record_counts(&self) -> Result<i64, sqlx::Error>;

    /// Samples the total of records and the dedup table's size on disk (`table_samples`, one
    /// row a minute).
    async fn sample_table(&self) -> Result<(), sqlx::Error>;

    /// Writes `row` (inserted, or its `last_seen_at` and consumers updated) and deletes the rows
    /// not written for `row.forget_after_ms`.
    async fn write_heartbeat(&self, row: &HeartbeatRow<'_>) -> Result<(), sqlx::Error>;

    /// Deletes an instance's row (its clean stop).
    async fn delete_heartbeat(&self, instance_id: &str) -> Result<(), sqlx::Error>;

    /// The instances with a row, live ones first, then newest start first, at most `limit`;
    /// `gone` when the row is older than `gone_after_ms` by the database's clock.
    async fn instances(&self, gone_after_ms: i64, limit: i64) -> Result<Vec<Instance>, sqlx::Error>;

    /// How many conflicting copies of `group`'s deliveries wait for an operator.
    async fn open_conflicts(&self, group: &str) -> Result<usize, sqlx::Error>;
}
