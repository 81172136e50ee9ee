//! The audit log (`audit_log` table): every operator action and account event, who did it, when,
//! why, on which records, with what counts and outcome.
//!
//! Writers call [`record`] with an executor: inside the action's own transaction where there is
//! one (so the entry commits or rolls back with the change), on the pool otherwise (refusals,
//! failed logins). Readers use [`list`] (the Audit page, the REST API) and [`for_message`] (a
//! record's detail page).

use crate::db::storable;
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use sqlx::{FromRow, PgExecutor, PgPool, Postgres, QueryBuilder};

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
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, FromRow)]
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

/// Writes one entry and returns its id.
///
/// # Errors
/// The database error, e.g. when the surrounding transaction is already aborted.
pub async fn record<'e>(db: impl PgExecutor<'e>, entry: &NewAuditEntry<'_>) -> Result<i64, sqlx::Error> {
    sqlx::query_scalar(
        "INSERT INTO audit_log (actor, action, outcome, reason, consumer_group, message_ids, detail, source)
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8) RETURNING id",
    )
    // What an operator typed or a request carried may hold a NUL, which PostgreSQL refuses: the
    // entry is kept, with U+FFFD in its place (crate::db::storable).
    .bind(storable::text(entry.actor))
    .bind(entry.action)
    .bind(entry.outcome.as_str())
    .bind(storable::opt(entry.reason))
    .bind(storable::opt(entry.consumer_group))
    .bind(entry.message_ids.iter().map(|id| storable::text(id).into_owned()).collect::<Vec<_>>())
    .bind(storable::json(&entry.detail).as_ref())
    .bind(entry.source)
    .fetch_one(db)
    .await
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

const SELECT: &str =
    "SELECT id, at, actor, action, outcome, reason, consumer_group, message_ids, detail, source FROM audit_log";

/// One page of entries matching `filter`, newest first.
///
/// # Errors
/// The database error.
pub async fn list(pool: &PgPool, filter: &AuditFilter) -> Result<Vec<AuditEntry>, sqlx::Error> {
    let mut q: QueryBuilder<'_, Postgres> = QueryBuilder::new(SELECT);
    q.push(" WHERE true");
    if let Some(actor) = &filter.actor {
        q.push(" AND actor = ").push_bind(actor.clone());
    }
    if let Some(prefix) = &filter.action_prefix {
        // starts_with, not LIKE: a `%` or `_` in the input is matched literally.
        q.push(" AND starts_with(action, ").push_bind(prefix.clone()).push(")");
    }
    if let Some(outcome) = filter.outcome {
        q.push(" AND outcome = ").push_bind(outcome.as_str());
    }
    if let Some(since) = filter.since {
        q.push(" AND at >= ").push_bind(since);
    }
    if let Some(until) = filter.until {
        q.push(" AND at < ").push_bind(until);
    }
    if let Some(before) = filter.before_id {
        q.push(" AND id < ").push_bind(before);
    }
    q.push(" ORDER BY id DESC LIMIT ").push_bind(filter.limit.unwrap_or(50).clamp(1, 500));
    q.build_query_as().fetch_all(pool).await
}

/// The entries naming one record of a consumer group, newest first (at most 100).
///
/// # Errors
/// The database error.
pub async fn for_message(pool: &PgPool, group: &str, message_id: &str) -> Result<Vec<AuditEntry>, sqlx::Error> {
    sqlx::query_as(&format!(
        "{SELECT} WHERE message_ids @> ARRAY[$2]::text[] AND (consumer_group = $1 OR consumer_group IS NULL)
         ORDER BY id DESC LIMIT 100"
    ))
    .bind(group)
    .bind(message_id)
    .fetch_all(pool)
    .await
}
