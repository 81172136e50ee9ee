//! Conflicting copies (DESIGN.md, "Reused ids and payload conflicts"): deliveries whose message
//! id was an existing record's while their message type (a reused id) or payload was not, kept
//! in `record_conflicts` with their whole message. An operator lists them and settles each once:
//! requeues it under a new message id of its own, `<message id>#conflict-<conflict id>`, or
//! dismisses it with a reason. Either is a compare-and-set on `settled_at`, audited
//! (`conflict.requeue`, `conflict.dismiss`) in the same transaction; a requeue holds it while the
//! broker confirms the copy. The bulk requeue takes reused ids only: a payload conflict was
//! judged a duplicate (often a producer's retry with a new send time), so running it again is an
//! operator's call, copy by copy.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::json;
use sqlx::{FromRow, PgPool};

use super::ActionError;
use super::bulk::audit_on_pool;
use super::republish::{Publishers, StoredMessage, publish_stored};
use crate::audit::{AuditOutcome, NewAuditEntry};
use crate::store::postgres::audit;
use crate::record::MAX_MESSAGE_ID_BYTES;

/// One kept copy.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, FromRow)]
pub struct RecordConflict {
    /// Conflict id.
    pub id: i64,
    /// The record whose message id it carried.
    pub record_id: i64,
    /// The group.
    pub consumer_group: String,
    /// The message id it carried.
    pub message_id: String,
    /// `type` (another message type: a reused id, dead-lettered) or `payload` (the same type,
    /// another payload: judged a duplicate).
    pub kind: String,
    /// Its own message type.
    pub message_type: String,
    /// Where its message id came from: the group's `ids.from` source that gave it (`key`,
    /// `header:x-message-id`, ...).
    pub id_source: String,
    /// Its payload, up to [`PAYLOAD_SHOWN_BYTES`] bytes, as text (lossy UTF-8).
    #[sqlx(try_from = "Vec<u8>")]
    pub payload_excerpt: Lossy,
    /// Its whole payload's size, bytes.
    pub payload_bytes: i32,
    /// Where it came from: exchange or topic.
    pub source_exchange: Option<String>,
    /// Routing key or Kafka record key.
    pub source_routing_key: Option<String>,
    /// Copies of it that came.
    pub copies: i32,
    /// First and last arrival.
    pub first_seen_at: DateTime<Utc>,
    /// Last arrival.
    pub last_seen_at: DateTime<Utc>,
    /// The message id it was requeued under, when it was.
    pub requeued_as: Option<String>,
    /// When it was requeued or dismissed; `None` while open.
    pub settled_at: Option<DateTime<Utc>>,
    /// By whom.
    pub settled_by: Option<String>,
}

/// Bytes shown as text, invalid UTF-8 replaced (U+FFFD).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Lossy(pub String);

impl From<Vec<u8>> for Lossy {
    fn from(bytes: Vec<u8>) -> Self {
        Lossy(String::from_utf8_lossy(&bytes).into_owned())
    }
}

/// Bytes of a copy's payload a listing shows.
pub const PAYLOAD_SHOWN_BYTES: i32 = 2048;

const COLUMNS: &str = "id, record_id, consumer_group, message_id, kind, message_type, id_source,
    substring(payload FROM 1 FOR 2048) AS payload_excerpt, length(payload) AS payload_bytes,
    source_exchange, source_routing_key, copies, first_seen_at, last_seen_at, requeued_as, settled_at, settled_by";

/// The copies kept for record `record_id`, oldest first.
///
/// Errors: the database's.
pub async fn record_conflicts(pool: &PgPool, record_id: i64) -> Result<Vec<RecordConflict>, ActionError> {
    Ok(sqlx::query_as(&format!("SELECT {COLUMNS} FROM record_conflicts WHERE record_id = $1 ORDER BY id"))
        .bind(record_id)
        .fetch_all(pool)
        .await?)
}

/// The new message id of conflict `id` of `message_id`: `<message id>#conflict-<id>`, the
/// message id cut (at a character boundary) so that the whole fits [`MAX_MESSAGE_ID_BYTES`];
/// unique by the conflict id either way.
fn new_message_id(message_id: &str, id: i64) -> String {
    let suffix = format!("#conflict-{id}");
    let mut keep = MAX_MESSAGE_ID_BYTES.saturating_sub(suffix.len()).min(message_id.len());
    while !message_id.is_char_boundary(keep) {
        keep -= 1;
    }
    format!("{}{suffix}", &message_id[..keep])
}

/// Requeues conflict `id` as `actor`: publishes its copy (payload, headers, content type, AMQP
/// `type`) to where it came from, under a new message id (`<message id>#conflict-<id>`, the id cut
/// at a character boundary to fit 512 bytes), and settles it —
/// once. Returns the new message id. The new id goes where the old one was read from when that
/// was a header (the copy's header is rewritten), and always in the AMQP `message_id` property or
/// the Kafka id header. A copy whose id came from the record key or the payload keeps those as
/// they were: the group's `ids.from` must then read the property or header first for the copy
/// to become a record of its own; a copy that comes back under the old id opens a new conflict.
///
/// Errors: [`ActionError::UnknownJob`] (no such conflict), [`ActionError::Refused`] (settled
/// already), [`ActionError::NoPublisher`] / [`ActionError::Publish`] (nothing changed), database
/// errors.
#[tracing::instrument(skip_all, fields(conflict = id, actor), err(level = "warn"))]
pub async fn requeue_conflict(
    pool: &PgPool,
    actor: &str,
    id: i64,
    publishers: &Publishers,
) -> Result<String, ActionError> {
    let result = async {
        let mut tx = pool.begin().await?;
        let row: Option<StoredRow> = sqlx::query_as(
            "SELECT record_id AS id, consumer_group, message_id, source_broker, source_exchange, source_routing_key,
                    payload, false AS payload_truncated, headers, content_type, type_property, false AS poison,
                    settled_at, id_source
             FROM record_conflicts WHERE id = $1 FOR UPDATE",
        )
        .bind(id)
        .fetch_optional(&mut *tx)
        .await?;
        let StoredRow { mut stored, settled_at, id_source } =
            row.ok_or(ActionError::UnknownJob { what: "conflict", id })?;
        refuse_settled(id, settled_at)?;
        let original = std::mem::take(&mut stored.message_id);
        stored.message_id = new_message_id(&original, id);
        carry_new_id(&mut stored, &id_source);
        let publisher = publishers.for_record(stored.id, &stored.consumer_group, &stored.source_broker).await?;
        let published = publish_stored(publisher.as_ref(), &stored).await;
        publisher.close().await;
        published?;
        sqlx::query("UPDATE record_conflicts SET requeued_as = $2, settled_at = now(), settled_by = $3 WHERE id = $1")
            .bind(id)
            .bind(&stored.message_id)
            .bind(actor)
            .execute(&mut *tx)
            .await?;
        let ids = [original, stored.message_id.clone()];
        let entry = NewAuditEntry {
            actor,
            action: "conflict.requeue",
            outcome: AuditOutcome::Ok,
            reason: None,
            consumer_group: Some(&stored.consumer_group),
            message_ids: &ids,
            detail: json!({ "conflict_id": id, "record_id": stored.id, "requeued_as": stored.message_id }),
            source: None,
        };
        audit::insert(&mut *tx, &entry).await?;
        tx.commit().await?;
        Ok::<String, ActionError>(stored.message_id)
    }
    .await;
    if let Err(e) = &result {
        let detail = json!({ "conflict_id": id, "error": e.to_string() });
        audit_on_pool(pool, actor, "conflict.requeue", e.audit_outcome(), None, detail).await;
    }
    result
}

fn refuse_settled(id: i64, settled_at: Option<DateTime<Utc>>) -> Result<(), ActionError> {
    match settled_at {
        Some(at) => Err(ActionError::Refused(format!("conflict {id} was settled already (requeued or dismissed), at {at}"))),
        None => Ok(()),
    }
}

/// Dismisses conflict `id` as `actor` with `reason` (required): settled without a requeue, for
/// a copy whose event needs no run of its own (a producer's retry with another send time).
///
/// Errors: [`ActionError::Invalid`] (no reason), [`ActionError::UnknownJob`],
/// [`ActionError::Refused`] (settled already), database errors.
#[tracing::instrument(skip_all, fields(conflict = id, actor), err(level = "warn"))]
pub async fn dismiss_conflict(pool: &PgPool, actor: &str, id: i64, reason: &str) -> Result<(), ActionError> {
    let result = async {
        let reason = reason.trim();
        if reason.is_empty() {
            return Err(ActionError::Invalid("give a reason to dismiss a conflicting copy".to_owned()));
        }
        let mut tx = pool.begin().await?;
        let row: Option<(String, String, i64, Option<DateTime<Utc>>)> = sqlx::query_as(
            "SELECT consumer_group, message_id, record_id, settled_at FROM record_conflicts WHERE id = $1 FOR UPDATE",
        )
        .bind(id)
        .fetch_optional(&mut *tx)
        .await?;
        let (group, message_id, record_id, settled_at) = row.ok_or(ActionError::UnknownJob { what: "conflict", id })?;
        refuse_settled(id, settled_at)?;
        sqlx::query("UPDATE record_conflicts SET settled_at = now(), settled_by = $2 WHERE id = $1")
            .bind(id)
            .bind(actor)
            .execute(&mut *tx)
            .await?;
        let entry = NewAuditEntry {
            actor,
            action: "conflict.dismiss",
            outcome: AuditOutcome::Ok,
            reason: Some(reason),
            consumer_group: Some(&group),
            message_ids: &[message_id],
            detail: json!({ "conflict_id": id, "record_id": record_id }),
            source: None,
        };
        audit::insert(&mut *tx, &entry).await?;
        tx.commit().await?;
        Ok(())
    }
    .await;
    if let Err(e) = &result {
        let detail = json!({ "conflict_id": id, "error": e.to_string() });
        audit_on_pool(pool, actor, "conflict.dismiss", e.audit_outcome(), Some(reason), detail).await;
    }
    result
}

/// The open reused-id conflicts of `group` (all groups when `None`): those [`requeue_conflicts`]
/// would requeue. Payload conflicts are left out (see the module).
///
/// Errors: the database's.
pub async fn open_conflicts(pool: &PgPool, group: Option<&str>) -> Result<Vec<i64>, ActionError> {
    Ok(sqlx::query_scalar(
        "SELECT id FROM record_conflicts
         WHERE settled_at IS NULL AND kind = 'type' AND ($1::text IS NULL OR consumer_group = $1)
         ORDER BY id",
    )
    .bind(group)
    .fetch_all(pool)
    .await?)
}

/// Every open reused-id conflict of `group` (all groups when `None`), by id: requeued one after
/// the other ([`requeue_conflict`]). Returns (requeued, failed with their errors).
///
/// Errors: the database's, listing them.
pub async fn requeue_conflicts(
    pool: &PgPool,
    actor: &str,
    group: Option<&str>,
    publishers: &Publishers,
) -> Result<(Vec<(i64, String)>, Vec<(i64, ActionError)>), ActionError> {
    let open = open_conflicts(pool, group).await?;
    let (mut done, mut failed) = (Vec::new(), Vec::new());
    for id in open {
        match requeue_conflict(pool, actor, id, publishers).await {
            Ok(new_id) => done.push((id, new_id)),
            Err(e) => failed.push((id, e)),
        }
    }
    Ok((done, failed))
}

#[derive(FromRow)]
struct StoredRow {
    #[sqlx(flatten)]
    stored: StoredMessage,
    settled_at: Option<DateTime<Utc>>,
    id_source: String,
}

/// Writes the copy's new message id into the header its old id was read from (`id_source` of
/// the form `header:<name>`), so that a group whose `ids.from` reads that header first sees the
/// new id, not the old one again.
fn carry_new_id(stored: &mut StoredMessage, id_source: &str) {
    let Some(name) = id_source.strip_prefix("header:") else { return };
    let headers = stored.headers.get_or_insert_with(|| serde_json::Value::Object(Default::default()));
    if let Some(headers) = headers.as_object_mut() {
        headers.insert(name.to_owned(), serde_json::Value::String(stored.message_id.clone()));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::MessageId;

    #[test]
    fn a_new_id_fits_a_message_id_and_cuts_at_a_character() {
        assert_eq!(new_message_id("order-7", 3), "order-7#conflict-3");
        let long = "é".repeat(300);
        let new = new_message_id(&long, 12);
        assert!(new.len() <= MAX_MESSAGE_ID_BYTES && new.ends_with("#conflict-12"), "{}", new.len());
        assert!(MessageId::parse(new).is_ok());
    }
}
