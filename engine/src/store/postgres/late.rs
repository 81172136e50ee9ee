//! Late duplicates (DESIGN.md, "Late duplicates"): the fingerprints cleanup keeps of the
//! records it deleted, looked up for a batch's deliveries, and what becomes of a delivery whose
//! fingerprint matches — a note on the record it created, or, under the group's `hold` policy,
//! a record parked for an operator instead of a handler call.

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use sqlx::types::Json;
use sqlx::Row;
use uuid::Uuid;

use super::PgStore;
use crate::db::storable::{self, Storable};
use crate::record::ConsumerGroup;
use crate::store::{HeldDelivery, LATE_DUPLICATE_CLASS, StoreError};
use crate::store::roles::LateFingerprints;


/// Matches of deliveries against the kept fingerprints: `$1` group, `$2` message ids, `$3` their
/// message types.
const MATCHES_SQL: &str = "
SELECT d.message_id, f.first_seen_at
FROM unnest($2::text[], $3::text[]) AS d(message_id, message_type)
JOIN {s}.dedup_fingerprints f ON f.fingerprint = {s}.dedup_fingerprint($1, d.message_type, d.message_id)";

/// Late duplicates among records the batch created: `$2` message ids and `$3` the first
/// sightings their fingerprints keep. A record created since (first seen after the
/// fingerprint's sighting) and not noted yet is noted once; the delays of those noted return.
const NOTE_SQL: &str = "
INSERT INTO {s}.late_duplicates (record_id, consumer_group, message_id, first_seen_at, delay_ms, held)
SELECT r.id, $1, r.message_id, d.first_seen_at,
       (extract(epoch FROM r.first_seen_at - d.first_seen_at) * 1000)::bigint, false
FROM unnest($2::text[], $3::timestamptz[]) AS d(message_id, first_seen_at)
JOIN {s}.dedup_records r ON r.consumer_group = $1 AND r.message_id = d.message_id
WHERE r.first_seen_at > d.first_seen_at
ORDER BY r.id
ON CONFLICT (record_id) DO NOTHING
RETURNING delay_ms";

/// A late duplicate held for an operator: a new record `processing`, parked, its lease already
/// expired and its whole message kept (payload, headers, source), so that a release requeues
/// it and a mark-succeeded or a dead-letter settles it; noted in `late_duplicates`. Nothing
/// when the record exists (the delivery is an ordinary duplicate of it, judged as such).
const HOLD_SQL: &str = concat!(
    r#"
WITH held AS (
    INSERT INTO {s}.dedup_records AS r (
        consumer_group, message_id, message_type, status, handler_mode, attempts, max_attempts,
        lease_owner, lease_token, lease_expires_at, parked_at, last_error, error_class,
        payload_hash, payload, headers, content_type,
        source_broker, source_exchange, source_routing_key, source_queue, type_property, id_source)
    VALUES ($1, $2, $3, 'processing', $4, 0, $5,
            "#,
    held_owner!(),
    r#", $6, now(), now(), $7, $8,
            $9, $10, $11, $12,
            $13, $14, $15, $16, $17, $19)
    ON CONFLICT (consumer_group, message_id) DO NOTHING
    RETURNING r.id, r.message_type, true AS created
)"#,
    count_created!("held", "processing"),
    r#", noted AS (
    INSERT INTO {s}.late_duplicates (record_id, consumer_group, message_id, first_seen_at, delay_ms, held)
    SELECT id, $1, $2, $18, (extract(epoch FROM now() - $18) * 1000)::bigint, true FROM held
)
SELECT id, (extract(epoch FROM now() - $18) * 1000)::bigint AS delay_ms FROM held
"#
);

#[async_trait]
impl LateFingerprints for PgStore {
    /// The message ids of `ids` (with their `types`) whose fingerprint cleanup keeps for
    /// `group`, with when their deleted record was first seen.
    ///
    /// Errors: the database's.
    async fn fingerprint_matches(
        &self,
        group: &ConsumerGroup,
        ids: &[&str],
        types: &[&str],
    ) -> Result<Vec<(String, DateTime<Utc>)>, StoreError> {
        let rows = sqlx::query_as(&self.render(MATCHES_SQL))
            .bind(group.as_str())
            .bind(ids)
            .bind(types)
            .fetch_all(&self.pool)
            .await?;
        Ok(rows)
    }

    /// Notes the late duplicates among `matches` (message id, first sighting) whose records a
    /// batch created; returns their delays in ms. On the pool: after the batch committed.
    ///
    /// Errors: the database's.
    async fn note_late_duplicates(
        &self,
        group: &ConsumerGroup,
        matches: &[(String, DateTime<Utc>)],
    ) -> Result<Vec<i64>, StoreError> {
        let ids: Vec<&str> = matches.iter().map(|m| m.0.as_str()).collect();
        let seen: Vec<DateTime<Utc>> = matches.iter().map(|m| m.1).collect();
        Ok(sqlx::query_scalar(&self.render(NOTE_SQL))
            .bind(group.as_str())
            .bind(ids)
            .bind(seen)
            .fetch_all(&self.pool)
            .await?)
    }

    /// Holds `d` for an operator (see [`HOLD_SQL`]); returns the record id and the delay in ms,
    /// or `None` when its record exists.
    ///
    /// Errors: the database's.
    async fn hold_late_duplicate(&self, d: &HeldDelivery<'_>) -> Result<Option<(i64, i64)>, StoreError> {
    let m = Storable::of(d.message);
    let reason = d.reason();
    let row = sqlx::query(&self.render(HOLD_SQL))
        .bind(d.group.as_str())
        .bind(d.message_id.as_str())
        .bind(d.message_type)
        .bind(d.handler_mode.as_str())
        .bind(d.max_attempts)
        .bind(Uuid::new_v4())
        .bind(storable::text(&reason))
        .bind(LATE_DUPLICATE_CLASS)
        .bind(d.payload_hash)
        .bind(&d.message.payload[..])
        .bind(Json(&m.headers))
        .bind(m.content_type.as_deref())
        .bind(d.message.broker.as_str())
        .bind(m.exchange.as_deref())
        .bind(m.routing_key.as_deref())
        .bind(m.queue.as_deref())
        .bind(m.type_property.as_deref())
        .bind(d.first_seen_at)
        .bind(d.id_source.code())
        .fetch_optional(&self.pool)
        .await?;
    match row {
        None => Ok(None),
        Some(row) => Ok(Some((row.try_get("id")?, row.try_get("delay_ms")?))),
    }
    }
}
