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
//! a domain may check its own effects.)

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::json;
use sha2::{Digest, Sha256};
use sqlx::{FromRow, PgPool};

use super::bulk::audit_on_pool;
use super::{ActionError, Publishers};
use crate::audit::{AuditOutcome, NewAuditEntry};
use crate::store::postgres::audit;
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

#[derive(FromRow)]
struct Target {
    id: i64,
    consumer_group: String,
    message_id: String,
    status: String,
    source_broker: String,
    source_exchange: Option<String>,
    source_routing_key: Option<String>,
    duplicate_count: i32,
    payload_conflicts: i32,
    attempts: i32,
    payload_hash: Vec<u8>,
}

/// Publishes the drill copy of `target` through its group's broker and records the drill
/// (audited as `record.drill`).
///
/// Errors: [`ActionError::UnknownRecord`] / [`ActionError::Refused`] (no succeeded record of the
/// type), [`ActionError::WrongStatus`] (not succeeded), [`ActionError::NoPublisher`],
/// [`ActionError::Publish`].
#[tracing::instrument(skip_all, fields(actor), err(level = "warn"))]
pub async fn drill_start(
    pool: &PgPool,
    fast_path: &FastPath,
    publishers: &Publishers,
    actor: &str,
    target: &DrillTarget,
    original_payload: Option<&[u8]>,
) -> Result<DrillReport, ActionError> {
    let result = async {
        let select = "SELECT id, consumer_group, message_id, status, source_broker, source_exchange, source_routing_key,
                             duplicate_count, payload_conflicts, attempts, payload_hash FROM dedup_records";
        let row: Target = match target {
            DrillTarget::Record(id) => sqlx::query_as(&format!("{select} WHERE id = $1"))
                .bind(id)
                .fetch_optional(pool)
                .await?
                .ok_or(ActionError::UnknownRecord(*id))?,
            DrillTarget::LatestOfType(t) => sqlx::query_as(&format!(
                "{select} WHERE status = 'succeeded' AND message_type = $1 ORDER BY first_seen_at DESC, id DESC LIMIT 1"
            ))
            .bind(t)
            .fetch_optional(pool)
            .await?
            .ok_or_else(|| ActionError::Refused(format!("no succeeded record of message type {t:?} to drill")))?,
        };
        if row.status != "succeeded" {
            return Err(ActionError::WrongStatus {
                id: row.id,
                action: "a duplicate drill",
                actual: row.status.parse().map_err(|e| ActionError::Unexpected(anyhow::Error::new(e)))?,
                allowed: "succeeded".to_owned(),
            });
        }
        let marker_present = matches!(fast_path.marker_ttl(&fast_path.key(&row.consumer_group, &row.message_id)).await, Ok(Some(_)));
        let mut tx = pool.begin().await?;
        let id: i64 = sqlx::query_scalar(
            "INSERT INTO drills (record_id, consumer_group, message_id, actor, marker_present, duplicates_before,
                                 conflicts_before, attempts_before)
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8) RETURNING id",
        )
        .bind(row.id)
        .bind(&row.consumer_group)
        .bind(&row.message_id)
        .bind(actor)
        .bind(marker_present)
        .bind(row.duplicate_count)
        .bind(row.payload_conflicts)
        .bind(row.attempts)
        .fetch_one(&mut *tx)
        .await?;
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
        audit::insert(&mut *tx, &entry).await?;
        tx.commit().await?;
        Ok(id)
    }
    .await;
    match result {
        Ok(id) => drill_report(pool, id).await,
        Err(error) => {
            let detail = json!({ "target": target, "error": error.to_string() });
            audit_on_pool(pool, actor, "record.drill", error.audit_outcome(), None, detail).await;
            Err(error)
        }
    }
}

/// A drill with what its record shows now.
///
/// Errors: [`ActionError::UnknownJob`].
pub async fn drill_report(pool: &PgPool, id: i64) -> Result<DrillReport, ActionError> {
    #[derive(FromRow)]
    struct Row {
        id: i64,
        record_id: i64,
        consumer_group: String,
        message_id: String,
        actor: String,
        published_at: DateTime<Utc>,
        marker_present: bool,
        duplicates_before: i32,
        conflicts_before: i32,
        attempts_before: i32,
        duplicate_count: Option<i32>,
        payload_conflicts: Option<i32>,
        attempts: Option<i32>,
        status: Option<String>,
    }
    let d: Row = sqlx::query_as(
        "SELECT d.id, d.record_id, d.consumer_group, d.message_id, d.actor, d.published_at, d.marker_present,
                d.duplicates_before, d.conflicts_before, d.attempts_before,
                r.duplicate_count, r.payload_conflicts, r.attempts, r.status
         FROM drills d LEFT JOIN dedup_records r ON r.id = d.record_id WHERE d.id = $1",
    )
    .bind(id)
    .fetch_optional(pool)
    .await?
    .ok_or(ActionError::UnknownJob { what: "drill", id })?;
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
