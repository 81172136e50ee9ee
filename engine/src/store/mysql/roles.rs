//! The pipeline's roles beyond the claims on MySQL/MariaDB: a first, minimal form (DESIGN.md,
//! "MySQL store"). The MySQL schema has no `record_conflicts`, `handler_pauses` or fingerprint
//! tables yet, so:
//!
//! - a conflicting copy is refused (an error): the pipeline redelivers its delivery rather than
//!   acknowledge it without a copy; nothing is lost, the delivery waits in the broker;
//! - no fingerprint is kept (cleanup does not run on MySQL yet), so no delivery is a late
//!   duplicate, and holding one is refused (redelivered);
//! - no handler is paused: the pause book reads none, takes no probe, and refuses to store a
//!   breaker's pause (the breaker logs it; the handler keeps running).

use std::sync::Arc;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use sqlx::{Executor, MySqlConnection};

use super::MySqlStore;
use crate::record::ConsumerGroup;
use crate::store::StoreError;
use crate::store::postgres::{ConflictCopy, HeldDelivery};
#[cfg(feature = "http")]
use crate::store::roles::EnginePause;
use crate::store::roles::{ConflictCopies, HandlerSavepoints, LateFingerprints, PauseBook, PauseBooks, PauseRow};

/// The error of a role this store does not hold yet.
fn not_yet(what: &str) -> sqlx::Error {
    sqlx::Error::Configuration(format!("{what} are not stored on MySQL yet").into())
}

#[async_trait]
impl ConflictCopies for MySqlStore {
    /// Refused: no `record_conflicts` table yet (the deliveries are redelivered).
    async fn keep_conflicts(
        &self,
        _conn: &mut MySqlConnection,
        _group: &ConsumerGroup,
        _copies: &[ConflictCopy<'_>],
    ) -> Result<(), StoreError> {
        Err(not_yet("conflicting copies").into())
    }
}

#[async_trait]
impl LateFingerprints for MySqlStore {
    /// None: cleanup keeps no fingerprint on MySQL yet.
    async fn fingerprint_matches(
        &self,
        _group: &ConsumerGroup,
        _ids: &[&str],
        _types: &[&str],
    ) -> Result<Vec<(String, DateTime<Utc>)>, StoreError> {
        Ok(Vec::new())
    }

    /// None to note (no fingerprint matches).
    async fn note_late_duplicates(
        &self,
        _group: &ConsumerGroup,
        _matches: &[(String, DateTime<Utc>)],
    ) -> Result<Vec<i64>, StoreError> {
        Ok(Vec::new())
    }

    /// Refused (the delivery is redelivered); not reached while no fingerprint matches.
    async fn hold_late_duplicate(&self, _d: &HeldDelivery<'_>) -> Result<Option<(i64, i64)>, StoreError> {
        Err(not_yet("late duplicates").into())
    }
}

#[async_trait]
impl HandlerSavepoints for MySqlStore {
    const DEADLOCK_LOSES_TRANSACTION: bool = true;

    /// Two statements when reopening (InnoDB's `SAVEPOINT` of an existing name moves it, but
    /// releasing first keeps the same shape as PostgreSQL's).
    async fn open_savepoint(&self, conn: &mut MySqlConnection, reopen: bool) -> Result<(), sqlx::Error> {
        if reopen {
            conn.execute("RELEASE SAVEPOINT handler").await?;
        }
        conn.execute("SAVEPOINT handler").await.map(drop)
    }

    async fn rollback_to_savepoint(&self, conn: &mut MySqlConnection) -> Result<(), sqlx::Error> {
        conn.execute("ROLLBACK TO SAVEPOINT handler").await.map(drop)
    }
}

/// No pause rows on MySQL yet: every handler runs.
struct NoPauses;

impl PauseBooks for MySqlStore {
    fn pause_book(&self) -> Arc<dyn PauseBook> {
        Arc::new(NoPauses)
    }
}

#[async_trait]
impl PauseBook for NoPauses {
    async fn register(&self, _group: &str, _handlers: &[(String, &'static str)]) -> Result<(), sqlx::Error> {
        Ok(())
    }

    async fn paused(&self, _group: &str) -> Result<Vec<PauseRow>, sqlx::Error> {
        Ok(Vec::new())
    }

    async fn take_probe(&self, _: &str, _: &str, _: i64) -> Result<Option<DateTime<Utc>>, sqlx::Error> {
        Ok(None)
    }

    #[cfg(feature = "http")]
    async fn pause(&self, _pause: &EnginePause<'_>) -> Result<Option<(String, Option<DateTime<Utc>>)>, sqlx::Error> {
        Err(not_yet("handler pauses"))
    }

    #[cfg(feature = "http")]
    async fn resume_after_probe(&self, _group: &str, _message_type: &str) -> Result<bool, sqlx::Error> {
        Ok(false)
    }
}
