//! Duplicate drill: publish a `succeeded` record's message id again and show that the copy was
//! caught as a duplicate — by which layer — and that the handler did not run again.
//!
//! A succeeded record no longer keeps its payload. The Redis marker holds the payload's hash and
//! catches only a copy with the same payload; so the operator may give the original payload
//! (checked against the record's SHA-256), and then Redis catches the copy when its marker is
//! there. Without it the copy carries a drill payload (`{"messageId": ..., "drill": <id>}`),
//! which the fast path passes on and the database catches — counted as a payload conflict too.
//! Both carry the `x-dedup-drill` header. The layer shows in the record's counters: the fast
//! path adds the copy to `duplicate_count` only (flushed within a second or so); the database
//! check adds it to `duplicate_count` and, for a drill payload, to `payload_conflicts`. The
//! verdict comes from the record alone: caught, no attempt added, still `succeeded` — the
//! handler did not run again, so neither did its effect. (The engine knows no business table;
//! a domain may check its own effects.) Each database's statements are behind [`DrillBooks`]
//! (`store/<database>/drill_books.rs`).

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::json;
use sha2::{Digest, Sha256};
use sqlx::FromRow;

use super::bulk::audit_on_pool;
use super::{ActionError, OperatorTx, Publishers};
use crate::audit::{AuditOutcome, NewAuditEntry};
use crate::console::ConsoleStore;
use crate::fastpath::FastPath;
use crate::source::Outbound;

/// Header marking drill copies (value: the drill id).
pub const DRILL_HEADER: &str = "x-dedup-drill";

/// Which record to drill.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DrillTarget {
    /// This record (must be succeeded).
    Record(i64),
    /// The latest succeeded record of this message type.
    LatestOfType(String),
}

/// A drill and what has been seen since.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DrillReport {
    /// Drill id.
    pub id: i64,
    /// The record.
    pub record_id: i64,
    /// Its group.
    pub consumer_group: String,
    /// Its message id.
    pub message_id: String,
    /// Who ran it.
    pub actor: String,
    /// When the copy was published.
    pub published_at: DateTime<Utc>,
    /// Whether the Redis marker existed then.
    pub marker_present: bool,
    /// `redis` or `database` once the copy was seen; `None` while in flight.
    pub caught_by: Option<String>,
    /// Duplicate deliveries added to the record since.
    pub duplicates_added: i64,
    /// Handler attempts added since (0: the handler did not run again).
    pub attempts_added: i64,
    /// The record's status now (`succeeded` expected).
    pub status: Option<String>,
    /// True once caught, with no new attempt and the record still `succeeded`: the handler did
    /// not run again, so its effect did not happen again.
    pub passed: bool,
}

/// A drill's record as [`DrillBooks::drill_target`] reads it: where its copy goes and its
/// counters before.
#[derive(Debug, FromRow)]
pub struct DrillRecord {
    pub(crate) id: i64,
    pub(crate) consumer_group: String,
    pub(crate) message_id: String,
    pub(crate) status: String,
    pub(crate) source_broker: String,
    pub(crate) source_exchange: Option<String>,
    pub(crate) source_routing_key: Option<String>,
    pub(crate) duplicate_count: i32,
    pub(crate) payload_conflicts: i32,
    pub(crate) attempts: i32,
    pub(crate) payload_hash: Vec<u8>,
}

/// A drill with its record's counters now ([`DrillBooks::drill_row`]; the record's are `None`
/// once it is gone).
#[derive(Debug, FromRow)]
pub struct DrillRow {
    pub(crate) id: i64,
    pub(crate) record_id: i64,
    pub(crate) consumer_group: String,
    pub(crate) message_id: String,
    pub(crate) actor: String,
    pub(crate) published_at: DateTime<Utc>,
    pub(crate) marker_present: bool,
    pub(crate) duplicates_before: i32,
    pub(crate) conflicts_before: i32,
    pub(crate) attempts_before: i32,
    pub(crate) duplicate_count: Option<i32>,
    pub(crate) payload_conflicts: Option<i32>,
    pub(crate) attempts: Option<i32>,
    pub(crate) status: Option<String>,
}

/// The drills on one database. Errors are the database's.
#[async_trait]
pub trait DrillBooks: Send + Sync {
    /// The record `target` names: record `id` whatever its status, or the latest `succeeded`
    /// one of a message type; `None` when there is none.
    async fn drill_target(&self, target: &DrillTarget) -> Result<Option<DrillRecord>, sqlx::Error>;

    /// A transaction holding a new drill of `record` by `actor` (its counters as read, whether
    /// the Redis marker was there); returns the drill's id with it, uncommitted.
    async fn begin_drill(
        &self,
        record: &DrillRecord,
        actor: &str,
        marker_present: bool,
    ) -> Result<(i64, Box<dyn OperatorTx>), sqlx::Error>;

    /// Drill `id` with its record's counters now; `None` when there is no such drill.
    async fn drill_row(&self, id: i64) -> Result<Option<DrillRow>, sqlx::Error>;
}

/// Publishes the drill copy of `target` through its group's broker and records the drill
/// (audited as `record.drill`).
///
/// Errors: [`ActionError::UnknownRecord`] / [`ActionError::Refused`] (no succeeded record of the
/// type), [`ActionError::WrongStatus`] (not succeeded), [`ActionError::NoPublisher`],
/// [`ActionError::Publish`].
#[tracing::instrument(skip_all, fields(actor), err(level = "warn"))]
pub async fn drill_start(
    store: &dyn ConsoleStore,
    fast_path: &FastPath,
    publishers: &Publishers,
    actor: &str,
    target: &DrillTarget,
    original_payload: Option<&[u8]>,
) -> Result<DrillReport, ActionError> {
    let result = async {
        let row = store.drill_target(target).await?.ok_or_else(|| match target {
            DrillTarget::Record(id) => ActionError::UnknownRecord(*id),
            DrillTarget::LatestOfType(t) => ActionError::Refused(format!("no succeeded record of message type {t:?} to drill")),
        })?;
        if row.status != "succeeded" {
            return Err(ActionError::WrongStatus {
                id: row.id,
                action: "a duplicate drill",
                actual: row.status.parse().map_err(|e| ActionError::Unexpected(anyhow::Error::new(e)))?,
                allowed: "succeeded".to_owned(),
            });
        }
        let marker_present = matches!(fast_path.marker_ttl(&fast_path.key(&row.consumer_group, &row.message_id)).await, Ok(Some(_)));
        let (id, mut tx) = store.begin_drill(&row, actor, marker_present).await?;
        let mut headers = serde_json::Map::new();
        headers.insert(DRILL_HEADER.to_owned(), json!(id.to_string()));
        let payload = match original_payload {
            Some(p) if Sha256::digest(p).as_slice() == row.payload_hash.as_slice() => p.to_vec(),
            Some(_) => {
                return Err(ActionError::Invalid(
                    "the payload given is not the record's original (its SHA-256 differs); leave it empty for a drill payload"
                        .to_owned(),
                ));
            }
            None => serde_json::to_vec(&json!({ "messageId": row.message_id, "drill": id }))
                .map_err(|e| ActionError::Unexpected(e.into()))?,
        };
        let routing_key = row.source_routing_key.as_deref().unwrap_or_default();
        // Opened only now: every refusal above returns before it, and it is closed below
        // whatever the publish answers (a channel left to a drop is closed in the background,
        // racing the connection's close, which lapin logs as an ERROR).
        let publisher = publishers.for_record(row.id, &row.consumer_group, &row.source_broker).await?;
        let published = publisher
            .publish(Outbound {
                destination: row.source_exchange.as_deref().unwrap_or_default(),
                routing_key,
                key: (!routing_key.is_empty()).then_some(routing_key),
                message_id: Some(&row.message_id),
                payload: &payload,
                headers: &headers,
                content_type: Some("application/json"),
                type_property: None,
            })
            .await;
        publisher.close().await;
        published.map_err(|e| ActionError::Publish(e.0))?;
        let ids = [row.message_id.clone()];
        let entry = NewAuditEntry {
            actor,
            action: "record.drill",
            outcome: AuditOutcome::Ok,
            reason: None,
            consumer_group: Some(&row.consumer_group),
            message_ids: &ids,
            detail: json!({
                "drill_id": id, "record_id": row.id, "marker_present": marker_present,
                "original_payload": original_payload.is_some(),
            }),
            source: None,
        };
        tx.audit(&entry).await?;
        tx.commit().await?;
        Ok(id)
    }
    .await;
    match result {
        Ok(id) => drill_report(store, id).await,
        Err(error) => {
            let detail = json!({ "target": target, "error": error.to_string() });
            audit_on_pool(store, actor, "record.drill", error.audit_outcome(), None, detail).await;
            Err(error)
        }
    }
}

/// A drill with what its record shows now.
///
/// Errors: [`ActionError::UnknownJob`].
pub async fn drill_report(store: &dyn ConsoleStore, id: i64) -> Result<DrillReport, ActionError> {
    let d = store.drill_row(id).await?.ok_or(ActionError::UnknownJob { what: "drill", id })?;
    let duplicates_added = i64::from(d.duplicate_count.unwrap_or(d.duplicates_before) - d.duplicates_before);
    let conflicts_added = d.payload_conflicts.unwrap_or(d.conflicts_before) - d.conflicts_before;
    let attempts_added = i64::from(d.attempts.unwrap_or(d.attempts_before) - d.attempts_before);
    let caught_by = match (duplicates_added > 0, conflicts_added > 0) {
        (false, _) => None,
        (true, true) => Some("database".to_owned()),
        (true, false) => Some("redis".to_owned()),
    };
    let passed = caught_by.is_some() && attempts_added == 0 && d.status.as_deref() == Some("succeeded");
    Ok(DrillReport {
        id: d.id,
        record_id: d.record_id,
        consumer_group: d.consumer_group,
        message_id: d.message_id,
        actor: d.actor,
        published_at: d.published_at,
        marker_present: d.marker_present,
        caught_by,
        duplicates_added,
        attempts_added,
        status: d.status,
        passed,
    })
}
