//! What the pipeline needs of a store beyond [`DedupStore`] and [`LeaseStore`]: role traits,
//! each named for what it holds (store-seam.md 3.1). Crate-private: hosts pick a store
//! ([`PipelineStore`] is sealed by them), they do not implement one.

use std::sync::Arc;

use async_trait::async_trait;
use chrono::{DateTime, Utc};

use super::{ConflictCopy, DedupStore, HeldDelivery, LeaseStore, StoreError};
use crate::record::ConsumerGroup;

/// The connection type of a store's database.
pub(crate) type Conn<S> = <<S as DedupStore>::Db as sqlx::Database>::Connection;

/// The copies of conflicting deliveries (`record_conflicts`, DESIGN.md "Reused ids and payload
/// conflicts").
#[async_trait]
pub(crate) trait ConflictCopies: DedupStore {
    /// Keeps `copies` of `group`'s deliveries on `conn` (two of one record and payload count
    /// as one row with two copies). An error must leave no copy acknowledged without a row:
    /// the pipeline redelivers the deliveries it could not keep.
    ///
    /// Errors: the database's.
    async fn keep_conflicts(
        &self,
        conn: &mut Conn<Self>,
        group: &ConsumerGroup,
        copies: &[ConflictCopy<'_>],
    ) -> Result<(), StoreError>;
}

/// The fingerprints cleanup keeps of deleted records, and the late duplicates they catch
/// (DESIGN.md "Late duplicates"). All on the pool.
#[async_trait]
pub(crate) trait LateFingerprints: DedupStore {
    /// The message ids of `ids` (with their `types`) whose fingerprint is kept for `group`,
    /// with when their deleted record was first seen.
    ///
    /// Errors: the database's.
    async fn fingerprint_matches(
        &self,
        group: &ConsumerGroup,
        ids: &[&str],
        types: &[&str],
    ) -> Result<Vec<(String, DateTime<Utc>)>, StoreError>;

    /// Notes the late duplicates among `matches` (message id, first sighting) whose records a
    /// batch created; returns their delays in ms.
    ///
    /// Errors: the database's.
    async fn note_late_duplicates(
        &self,
        group: &ConsumerGroup,
        matches: &[(String, DateTime<Utc>)],
    ) -> Result<Vec<i64>, StoreError>;

    /// Holds `d` for an operator as a parked record; its record id and delay in ms, or `None`
    /// when its record exists.
    ///
    /// Errors: the database's (the pipeline redelivers the delivery).
    async fn hold_late_duplicate(&self, d: &HeldDelivery<'_>) -> Result<Option<(i64, i64)>, StoreError>;
}

/// The savepoint named `handler` of the transactional pipeline (the same SQL on PostgreSQL
/// and MySQL; a store may send it in one or two round trips).
#[async_trait]
pub(crate) trait HandlerSavepoints: DedupStore {
    /// A deadlock rolls the whole transaction back, savepoints and all (InnoDB, 1213), not only
    /// the failed statement (PostgreSQL, 40P01, inside a savepoint): the pipeline then runs the
    /// transaction again from its start instead of retrying the statement.
    const DEADLOCK_LOSES_TRANSACTION: bool;

    /// Opens the savepoint on `conn`; `reopen`: one is open and succeeded, released first.
    async fn open_savepoint(&self, conn: &mut Conn<Self>, reopen: bool) -> Result<(), sqlx::Error>;

    /// Rolls `conn` back to the savepoint (which stays open).
    async fn rollback_to_savepoint(&self, conn: &mut Conn<Self>) -> Result<(), sqlx::Error>;
}

/// One pause row of a handler, as read: (message type, state name, next probe).
pub(crate) type PauseRow = (String, String, Option<DateTime<Utc>>);

/// The handlers' pause states of consumer groups (`handler_pauses`, DESIGN.md "Pause and
/// circuit breaker"). Object-safe: one per pipeline, on the pool.
#[async_trait]
pub(crate) trait PauseBook: Send + Sync {
    /// Registers `group`'s handlers (`(type, kind)`) as running unless they have a row.
    async fn register(&self, group: &str, handlers: &[(String, &'static str)]) -> Result<(), sqlx::Error>;

    /// `group`'s handlers that are not running.
    async fn paused(&self, group: &str) -> Result<Vec<PauseRow>, sqlx::Error>;

    /// Takes the probe of a breaker-paused handler when due; the next probe time when this
    /// process won it. `interval_ms`: the probe interval.
    async fn take_probe(
        &self,
        group: &str,
        message_type: &str,
        interval_ms: i64,
    ) -> Result<Option<DateTime<Utc>>, sqlx::Error>;

    #[cfg(feature = "http")]
    /// The engine pauses a handler (`pause.state` is `breaker` or `gone`); the stored state and
    /// probe time, or `None` when an operator's pause stands.
    async fn pause(&self, pause: &EnginePause<'_>) -> Result<Option<(String, Option<DateTime<Utc>>)>, sqlx::Error>;

    #[cfg(feature = "http")]
    /// A probe succeeded: `breaker` → `running`; whether the row changed.
    async fn resume_after_probe(&self, group: &str, message_type: &str) -> Result<bool, sqlx::Error>;
}

#[cfg(feature = "http")]
/// A pause the engine writes.
pub(crate) struct EnginePause<'a> {
    pub group: &'a str,
    pub message_type: &'a str,
    /// `breaker` or `gone`.
    pub state: &'static str,
    /// First line of the failure, at most 500 characters.
    pub reason: &'a str,
    pub error_class: &'a str,
    pub http_status: Option<i16>,
    /// The probe interval, in ms.
    pub probe_interval_ms: i64,
}

/// The pause book of a store.
pub(crate) trait PauseBooks {
    /// A pause book on this store's pool.
    fn pause_book(&self) -> Arc<dyn PauseBook>;
}

/// Everything the pipeline asks of a store. Sealed: implemented by the engine's stores
/// ([`super::postgres::PgStore`], and `MySqlStore` with the feature `mysql`).
#[allow(private_bounds, reason = "the role traits seal it: hosts pick a store, they do not write one")]
pub trait PipelineStore:
    LeaseStore + Clone + ConflictCopies + LateFingerprints + HandlerSavepoints + PauseBooks
{
}

impl<S> PipelineStore for S where
    S: LeaseStore + Clone + ConflictCopies + LateFingerprints + HandlerSavepoints + PauseBooks
{
}
