//! Conflicting copies (DESIGN.md, "Reused ids and payload conflicts"): deliveries whose message
//! id was an existing record's while their message type (a reused id) or payload was not, kept
//! in `record_conflicts` with their whole message. An operator lists them and settles each once:
//! requeues it under a new message id of its own, `<message id>#conflict-<conflict id>`, or
//! dismisses it with a reason. Either is a compare-and-set on `settled_at`, audited
//! (`conflict.requeue`, `conflict.dismiss`) in the same transaction; a requeue holds it while the
//! broker confirms the copy. The bulk requeue takes reused ids only: a payload conflict was
//! judged a duplicate (often a producer's retry with a new send time), so running it again is an
//! operator's call, copy by copy. The rules are here; each database's statements are behind
//! [`ConflictBooks`] (`store/<database>/conflict_books.rs`).

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::json;
use sqlx::FromRow;

use super::{ActionError, OperatorTx, end_action};
use super::republish::{Publishers, StoredMessage, publish_stored};
use crate::audit::{AuditOutcome, NewAuditEntry};
use crate::console::ConsoleStore;
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

/// The kept copies on one database: their listing, and the transaction an operator settles
/// one in. Errors are the database's.
#[async_trait]
pub trait ConflictBooks: Send + Sync {
    /// The copies kept for record `record_id`, oldest first.
    async fn conflict_copies(&self, record_id: i64) -> Result<Vec<RecordConflict>, sqlx::Error>;

    /// The ids of the open reused-id (`type`) copies of `group` (all groups when `None`), by id.
    async fn open_conflict_ids(&self, group: Option<&str>) -> Result<Vec<i64>, sqlx::Error>;

    /// A transaction for one operator's settlement of a copy.
    async fn begin_conflict_change(&self) -> Result<Box<dyn ConflictChange>, sqlx::Error>;
}

/// One operator's settlement of a kept copy, in one transaction: nothing is kept unless it
/// commits.
#[async_trait]
pub trait ConflictChange: OperatorTx {
    /// Copy `id` with its message, its row locked until the transaction ends; `None` when there
    /// is none.
    async fn lock(&mut self, id: i64) -> Result<Option<LockedConflict>, sqlx::Error>;

    /// Settles copy `id` as `actor` now: requeued under `requeued_as`, or dismissed (`None`).
    async fn settle(&mut self, id: i64, actor: &str, requeued_as: Option<&str>) -> Result<(), sqlx::Error>;

}

/// A kept copy as an operator's settlement locked it: its message as a requeue publishes it
/// (`id` is the record's), whether it is settled, and where its message id came from.
#[derive(Debug, FromRow)]
pub struct LockedConflict {
    #[sqlx(flatten)]
    pub(crate) stored: StoredMessage,
    pub(crate) settled_at: Option<DateTime<Utc>>,
    pub(crate) id_source: String,
}

/// The copies kept for record `record_id`, oldest first.
///
/// Errors: the database's.
pub async fn record_conflicts(store: &dyn ConsoleStore, record_id: i64) -> Result<Vec<RecordConflict>, ActionError> {
    Ok(store.conflict_copies(record_id).await?)
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
    store: &dyn ConsoleStore,
    actor: &str,
    id: i64,
    publishers: &Publishers,
) -> Result<String, ActionError> {
    let mut tx = store.begin_conflict_change().await?;
    let result = async {
        let LockedConflict { mut stored, settled_at, id_source } =
            tx.lock(id).await?.ok_or(ActionError::UnknownJob { what: "conflict", id })?;
        refuse_settled(id, settled_at)?;
        let original = std::mem::take(&mut stored.message_id);
        stored.message_id = new_message_id(&original, id);
        carry_new_id(&mut stored, &id_source);
        let publisher = publishers.for_record(stored.id, &stored.consumer_group, &stored.source_broker).await?;
        let published = publish_stored(publisher.as_ref(), &stored).await;
        publisher.close().await;
        published?;
        tx.settle(id, actor, Some(&stored.message_id)).await?;
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
        tx.audit(&entry).await?;
        Ok::<String, ActionError>(stored.message_id)
    }
    .await;
    end_action(store, tx, actor, "conflict.requeue", None, json!({ "conflict_id": id }), result).await
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
pub async fn dismiss_conflict(store: &dyn ConsoleStore, actor: &str, id: i64, reason: &str) -> Result<(), ActionError> {
    let mut tx = store.begin_conflict_change().await?;
    let result = async {
        let reason = reason.trim();
        if reason.is_empty() {
            return Err(ActionError::Invalid("give a reason to dismiss a conflicting copy".to_owned()));
        }
        let locked = tx.lock(id).await?.ok_or(ActionError::UnknownJob { what: "conflict", id })?;
        refuse_settled(id, locked.settled_at)?;
        tx.settle(id, actor, None).await?;
        let entry = NewAuditEntry {
            actor,
            action: "conflict.dismiss",
            outcome: AuditOutcome::Ok,
            reason: Some(reason),
            consumer_group: Some(&locked.stored.consumer_group),
            message_ids: std::slice::from_ref(&locked.stored.message_id),
            detail: json!({ "conflict_id": id, "record_id": locked.stored.id }),
            source: None,
        };
        tx.audit(&entry).await?;
        Ok(())
    }
    .await;
    end_action(store, tx, actor, "conflict.dismiss", Some(reason), json!({ "conflict_id": id }), result).await
}

/// The open reused-id conflicts of `group` (all groups when `None`): those [`requeue_conflicts`]
/// would requeue. Payload conflicts are left out (see the module).
///
/// Errors: the database's.
pub async fn open_conflicts(store: &dyn ConsoleStore, group: Option<&str>) -> Result<Vec<i64>, ActionError> {
    Ok(store.open_conflict_ids(group).await?)
}

/// Every open reused-id conflict of `group` (all groups when `None`), by id: requeued one after
/// the other ([`requeue_conflict`]). Returns (requeued, failed with their errors).
///
/// Errors: the database's, listing them.
pub async fn requeue_conflicts(
    store: &dyn ConsoleStore,
    actor: &str,
    group: Option<&str>,
    publishers: &Publishers,
) -> Result<(Vec<(i64, String)>, Vec<(i64, ActionError)>), ActionError> {
    let open = open_conflicts(store, group).await?;
    let (mut done, mut failed) = (Vec::new(), Vec::new());
    for id in open {
        match requeue_conflict(store, actor, id, publishers).await {
            Ok(new_id) => done.push((id, new_id)),
            Err(e) => failed.push((id, e)),
        }
    }
    Ok((done, failed))
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
