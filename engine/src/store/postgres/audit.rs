//! PostgreSQL's audit log ([`AuditLog`]): `audit_log` (migration `20261130000020_audit_log`),
//! its records named in a `text[]` under a GIN index. [`insert`] also writes the entry of an
//! operator action inside the action's transaction.

use async_trait::async_trait;
use sqlx::{PgExecutor, PgPool, Postgres, QueryBuilder};

use crate::audit::{AuditEntry, AuditFilter, AuditLog, NewAuditEntry};
use crate::db::storable;

/// Writes one entry on `db` (the pool, or an action's transaction) and returns its id.
///
/// Errors: the database's, e.g. when the surrounding transaction is already aborted.
pub(crate) async fn insert<'e>(db: impl PgExecutor<'e>, entry: &NewAuditEntry<'_>) -> Result<i64, sqlx::Error> {
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

const SELECT: &str =
    "SELECT id, at, actor, action, outcome, reason, consumer_group, message_ids, detail, source FROM audit_log";

#[async_trait]
impl AuditLog for PgPool {
    async fn record(&self, entry: &NewAuditEntry<'_>) -> Result<i64, sqlx::Error> {
        insert(self, entry).await
    }

    async fn list(&self, filter: &AuditFilter) -> Result<Vec<AuditEntry>, sqlx::Error> {
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
        q.push(" ORDER BY id DESC LIMIT ").push_bind(filter.page_rows());
        q.build_query_as().fetch_all(self).await
    }

    async fn for_message(&self, group: &str, message_id: &str) -> Result<Vec<AuditEntry>, sqlx::Error> {
        sqlx::query_as(&format!(
            "{SELECT} WHERE message_ids @> ARRAY[$2]::text[] AND (consumer_group = $1 OR consumer_group IS NULL)
             ORDER BY id DESC LIMIT 100"
        ))
        .bind(group)
        .bind(message_id)
        .fetch_all(self)
        .await
    }
}
