//! MySQL's audit log ([`AuditLog`]): `audit_log` with the records an entry names as a JSON
//! array, and one row per named record in `audit_log_messages` to find an entry by message id
//! (migration `20261205000006_audit_log`; MySQL has no array type and no GIN index).

use std::collections::BTreeSet;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use sqlx::mysql::{MySqlConnection, MySqlPool};
use sqlx::{FromRow, MySql, QueryBuilder};

use crate::audit::{AuditEntry, AuditFilter, AuditLog, NewAuditEntry};
use crate::db::storable;
use crate::record::MAX_MESSAGE_ID_BYTES;

#[derive(FromRow)]
struct EntryRow {
    id: i64,
    at: DateTime<Utc>,
    actor: String,
    action: String,
    outcome: String,
    reason: Option<String>,
    consumer_group: Option<String>,
    message_ids: String,
    detail: String,
    source: Option<String>,
}

impl TryFrom<EntryRow> for AuditEntry {
    type Error = sqlx::Error;

    fn try_from(r: EntryRow) -> Result<Self, sqlx::Error> {
        Ok(AuditEntry {
            id: r.id,
            at: r.at,
            actor: r.actor,
            action: r.action,
            outcome: r.outcome,
            reason: r.reason,
            consumer_group: r.consumer_group,
            message_ids: json("message_ids", &r.message_ids)?,
            detail: json("detail", &r.detail)?,
            source: r.source,
        })
    }
}

/// Column `column`'s JSON text, parsed.
fn json<T: serde::de::DeserializeOwned>(column: &str, text: &str) -> Result<T, sqlx::Error> {
    serde_json::from_str(text).map_err(|e| sqlx::Error::ColumnDecode { index: column.to_owned(), source: e.into() })
}

/// The entry's columns; sqlx reads `_bin` text as bytes, so it is read `AS CHAR`.
const SELECT: &str = "SELECT a.id, a.at, CAST(a.actor AS CHAR) AS actor, CAST(a.action AS CHAR) AS action,
                             CAST(a.outcome AS CHAR) AS outcome, a.reason,
                             CAST(a.consumer_group AS CHAR) AS consumer_group, a.message_ids, a.detail, a.source
                      FROM audit_log a";

fn entries(rows: Vec<EntryRow>) -> Result<Vec<AuditEntry>, sqlx::Error> {
    rows.into_iter().map(AuditEntry::try_from).collect()
}

/// Writes one entry, and a row per record it names, on `conn` (in the caller's transaction:
/// an operator action's, or the one [`AuditLog::record`] opens) and returns its id.
///
/// Errors: the database's.
pub(crate) async fn insert(conn: &mut MySqlConnection, entry: &NewAuditEntry<'_>) -> Result<i64, sqlx::Error> {
    // The same texts as PostgreSQL stores (U+FFFD for NUL), so both read back alike.
    let ids: Vec<String> = entry.message_ids.iter().map(|id| storable::text(id).into_owned()).collect();
    let id = sqlx::query(
        "INSERT INTO audit_log (at, actor, action, outcome, reason, consumer_group, message_ids, detail, source)
         VALUES (UTC_TIMESTAMP(6), ?, ?, ?, ?, ?, ?, ?, ?)",
    )
    .bind(storable::text(entry.actor))
    .bind(entry.action)
    .bind(entry.outcome.as_str())
    .bind(storable::opt(entry.reason))
    .bind(storable::opt(entry.consumer_group))
    .bind(serde_json::to_string(&ids).map_err(|e| sqlx::Error::Encode(e.into()))?)
    .bind(storable::json(&entry.detail).to_string())
    .bind(entry.source)
    .execute(&mut *conn)
    .await?
    .last_insert_id();
    // No record has a longer id, so none is looked up by one; each id once (the key).
    let named: BTreeSet<&str> = ids.iter().map(String::as_str).filter(|id| id.len() <= MAX_MESSAGE_ID_BYTES).collect();
    if !named.is_empty() {
        let mut q: QueryBuilder<'_, MySql> = QueryBuilder::new("INSERT INTO audit_log_messages (message_id, entry_id) ");
        q.push_values(named, |mut row, message_id| {
            row.push_bind(message_id.as_bytes()).push_bind(id);
        });
        q.build().execute(&mut *conn).await?;
    }
    i64::try_from(id).map_err(|e| sqlx::Error::Decode(e.into()))
}

#[async_trait]
impl AuditLog for MySqlPool {
    async fn record(&self, entry: &NewAuditEntry<'_>) -> Result<i64, sqlx::Error> {
        let mut tx = self.begin().await?;
        let id = insert(&mut tx, entry).await?;
        tx.commit().await?;
        Ok(id)
    }

    async fn list(&self, filter: &AuditFilter) -> Result<Vec<AuditEntry>, sqlx::Error> {
        let mut q: QueryBuilder<'_, MySql> = QueryBuilder::new(SELECT);
        q.push(" WHERE TRUE");
        if let Some(actor) = &filter.actor {
            q.push(" AND a.actor = ").push_bind(actor.clone());
        }
        if let Some(prefix) = &filter.action_prefix {
            // A prefix compared as it is, not LIKE: a `%` or `_` in the input is matched literally.
            q.push(" AND LEFT(a.action, CHAR_LENGTH(").push_bind(prefix.clone());
            q.push(")) = ").push_bind(prefix.clone());
        }
        if let Some(outcome) = filter.outcome {
            q.push(" AND a.outcome = ").push_bind(outcome.as_str());
        }
        if let Some(since) = filter.since {
            q.push(" AND a.at >= ").push_bind(since.naive_utc());
        }
        if let Some(until) = filter.until {
            q.push(" AND a.at < ").push_bind(until.naive_utc());
        }
        if let Some(before) = filter.before_id {
            q.push(" AND a.id < ").push_bind(before);
        }
        q.push(" ORDER BY a.id DESC LIMIT ").push_bind(filter.page_rows());
        entries(q.build_query_as().fetch_all(self).await?)
    }

    async fn for_message(&self, group: &str, message_id: &str) -> Result<Vec<AuditEntry>, sqlx::Error> {
        let rows: Vec<EntryRow> = sqlx::query_as(&format!(
            "{SELECT} JOIN audit_log_messages m ON m.entry_id = a.id
             WHERE m.message_id = ? AND (a.consumer_group = ? OR a.consumer_group IS NULL)
             ORDER BY a.id DESC LIMIT 100"
        ))
        .bind(message_id.as_bytes())
        .bind(group)
        .fetch_all(self)
        .await?;
        entries(rows)
    }
}
