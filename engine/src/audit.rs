//! The audit log (`audit_log` table): every operator action and account event, who did it, when,
//! why, on which records, with what counts and outcome.
//!
//! Kept by one [`AuditLog`] per database on its pool (`store/postgres/audit.rs`,
//! `store/mysql/audit.rs`), reached through [`crate::console::ConsoleStore`]: entries written
//! on their own (refusals, failed logins, account changes) and the readers, [`AuditLog::list`]
//! (the Audit page, the REST API) and [`AuditLog::for_message`] (a record's detail page). An
//! operator action writes its entry inside its own transaction instead (so the entry commits
//! or rolls back with the change), through its store.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use async_trait::async_trait;


/// How an audited action ended. Stored as `ok`, `refused` (a guard or a permission said no;
/// nothing changed) or `failed` (an error; nothing changed unless the detail says otherwise).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AuditOutcome {
    Ok,
    Refused,
    Failed,
}

impl AuditOutcome {
    /// The stored spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            AuditOutcome::Ok => "ok",
            AuditOutcome::Refused => "refused",
            AuditOutcome::Failed => "failed",
        }
    }
}

/// An entry to write.
#[derive(Debug, Clone)]
pub struct NewAuditEntry<'a> {
    /// `user:<name>`, `cli:<os user>`, `scheduler`, or `anonymous`.
    pub actor: &'a str,
    /// Dotted verb, e.g. `record.release`, `bulk.requeue.start`, `auth.login_failed`.
    pub action: &'a str,
    pub outcome: AuditOutcome,
    /// The operator's reason, when the action takes one.
    pub reason: Option<&'a str>,
    pub consumer_group: Option<&'a str>,
    /// Records acted on, by message id (empty for filter-based or account actions).
    pub message_ids: &'a [String],
    /// Filter, counts and anything else, as a JSON object.
    pub detail: serde_json::Value,
    /// Client address or request id.
    pub source: Option<&'a str>,
}

/// A stored entry, as the Audit page and `GET /api/v1/audit` show it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, sqlx::FromRow)]
pub struct AuditEntry {
    pub id: i64,
    pub at: DateTime<Utc>,
    pub actor: String,
    pub action: String,
    /// `ok`, `refused` or `failed`.
    pub outcome: String,
    pub reason: Option<String>,
    pub consumer_group: Option<String>,
    pub message_ids: Vec<String>,
    pub detail: serde_json::Value,
    pub source: Option<String>,
}

/// The audit log on one database. Errors are the database's.
#[async_trait]
pub trait AuditLog: Send + Sync {
    /// Writes one entry on its own and returns its id. Texts holding a NUL are kept with
    /// U+FFFD in its place (PostgreSQL refuses NUL; every store writes the same).
    async fn record(&self, entry: &NewAuditEntry<'_>) -> Result<i64, sqlx::Error>;

    /// One page of entries matching `filter`, newest first.
    async fn list(&self, filter: &AuditFilter) -> Result<Vec<AuditEntry>, sqlx::Error>;

    /// The entries naming `message_id` of consumer group `group` (or of no group), newest
    /// first (at most 100).
    async fn for_message(&self, group: &str, message_id: &str) -> Result<Vec<AuditEntry>, sqlx::Error>;
}


/// Filters of the Audit page; every field optional. Newest first, keyset-paged by `before_id`.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct AuditFilter {
    /// Exact actor, e.g. `user:alice`.
    pub actor: Option<String>,
    /// Action prefix: `record.` matches every record action.
    pub action_prefix: Option<String>,
    /// `ok`, `refused` or `failed`.
    pub outcome: Option<AuditOutcome>,
    pub since: Option<DateTime<Utc>>,
    pub until: Option<DateTime<Utc>>,
    /// Entries with an id below this one (the last id of the previous page).
    pub before_id: Option<i64>,
    /// Rows per page, clamped to 1..=500 (default 50).
    pub limit: Option<i64>,
}

impl AuditFilter {
    /// Rows per page: [`Self::limit`] clamped to 1..=500, 50 when unset.
    pub(crate) fn page_rows(&self) -> i64 {
        self.limit.unwrap_or(50).clamp(1, 500)
    }
}
