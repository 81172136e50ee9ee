//! The copies of conflicting deliveries (DESIGN.md, "Reused ids and payload conflicts"): a
//! delivery whose message id is a record's but whose message type or payload is not keeps its
//! whole message in `record_conflicts`, one row per record and distinct payload, in the
//! transaction that judges it (transactional) or before it is acknowledged (leased).

use async_trait::async_trait;
use sqlx::PgConnection;
use sqlx::types::Json;

use super::PgStore;
use crate::db::storable::Storable;
use crate::message::InboundMessage;
use crate::record::ConsumerGroup;
use crate::store::StoreError;
use crate::store::roles::ConflictCopies;

/// `$1` group, `$2`.. the copies' columns; a copy kept already (and open) counts one more. A
/// record keeps at most [`MAX_OPEN_PAYLOAD_COPIES`] open payload conflicts; copies past that
/// are counted on the record only (`payload_conflicts`).
const KEEP_SQL: &str = "
INSERT INTO {s}.record_conflicts AS c (
    record_id, consumer_group, message_id, kind, message_type, id_source, payload_hash, payload, headers,
    content_type, type_property, source_broker, source_exchange, source_routing_key, source_queue, copies)
SELECT i.record_id, $1, i.message_id, i.kind, i.message_type, i.id_source, i.payload_hash, i.payload, i.headers,
       i.content_type, i.type_property, i.broker, i.exchange, i.routing_key, i.queue, i.copies
FROM unnest($2::bigint[], $3::text[], $4::text[], $5::text[], $6::bytea[], $7::bytea[], $8::jsonb[], $9::text[],
            $10::text[], $11::text[], $12::text[], $13::text[], $14::text[], $15::int[], $16::text[])
     AS i(record_id, message_id, kind, message_type, payload_hash, payload, headers, content_type,
          type_property, broker, exchange, routing_key, queue, copies, id_source)
WHERE i.kind = 'type'
   OR (SELECT count(*) FROM {s}.record_conflicts o
       WHERE o.record_id = i.record_id AND o.kind = 'payload' AND o.settled_at IS NULL) < $17
ORDER BY i.record_id, i.payload_hash
ON CONFLICT (record_id, payload_hash) WHERE settled_at IS NULL
DO UPDATE SET copies = c.copies + EXCLUDED.copies, last_seen_at = now()";

/// Open payload conflicts a record keeps at most: a producer that puts a send time in its
/// payload makes every retry one.
pub(crate) const MAX_OPEN_PAYLOAD_COPIES: i64 = 5;

/// What a conflicting delivery conflicts in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ConflictKind {
    /// Another message type: a reused id, never a duplicate.
    Type,
    /// The same type, another payload.
    Payload,
}

impl ConflictKind {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            ConflictKind::Type => "type",
            ConflictKind::Payload => "payload",
        }
    }
}

/// A conflicting delivery to keep.
#[derive(Clone)]
pub(crate) struct ConflictCopy<'a> {
    /// The record whose message id it carried.
    pub record_id: i64,
    pub message_id: &'a str,
    pub kind: ConflictKind,
    /// Its own message type.
    pub message_type: &'a str,
    /// The `ids.from` source its message id came from, as written (`key`, `header:<name>`, ...).
    pub id_source: String,
    pub payload_hash: &'a [u8],
    pub message: &'a InboundMessage,
}

impl<'a> ConflictCopy<'a> {
    /// `copies` one per record and payload, with how many came (two of one record and payload
    /// are one row with two copies), in the order they first came.
    pub(crate) fn per_payload<'c>(copies: &'c [ConflictCopy<'a>]) -> Vec<(&'c ConflictCopy<'a>, i32)> {
        let mut rows: Vec<(&ConflictCopy<'_>, i32)> = Vec::with_capacity(copies.len());
        for copy in copies {
            match rows.iter_mut().find(|(c, _)| c.record_id == copy.record_id && c.payload_hash == copy.payload_hash) {
                Some((_, n)) => *n += 1,
                None => rows.push((copy, 1)),
            }
        }
        rows
    }
}

#[async_trait]
impl ConflictCopies for PgStore {
    async fn keep_conflicts(
        &self,
        conn: &mut PgConnection,
        group: &ConsumerGroup,
        copies: &[ConflictCopy<'_>],
    ) -> Result<(), StoreError> {
        let rows = ConflictCopy::per_payload(copies);
        let stored: Vec<Storable<'_>> = rows.iter().map(|(c, _)| Storable::of(c.message)).collect();
        sqlx::query(&self.render(KEEP_SQL))
            .bind(group.as_str())
            .bind(rows.iter().map(|(c, _)| c.record_id).collect::<Vec<_>>())
            .bind(rows.iter().map(|(c, _)| c.message_id).collect::<Vec<_>>())
            .bind(rows.iter().map(|(c, _)| c.kind.as_str()).collect::<Vec<_>>())
            .bind(rows.iter().map(|(c, _)| c.message_type).collect::<Vec<_>>())
            .bind(rows.iter().map(|(c, _)| c.payload_hash).collect::<Vec<_>>())
            .bind(rows.iter().map(|(c, _)| &c.message.payload[..]).collect::<Vec<_>>())
            .bind(stored.iter().map(|m| Json(&m.headers)).collect::<Vec<_>>())
            .bind(stored.iter().map(|m| m.content_type.as_deref()).collect::<Vec<_>>())
            .bind(stored.iter().map(|m| m.type_property.as_deref()).collect::<Vec<_>>())
            .bind(rows.iter().map(|(c, _)| c.message.broker.as_str()).collect::<Vec<_>>())
            .bind(stored.iter().map(|m| m.exchange.as_deref()).collect::<Vec<_>>())
            .bind(stored.iter().map(|m| m.routing_key.as_deref()).collect::<Vec<_>>())
            .bind(stored.iter().map(|m| m.queue.as_deref()).collect::<Vec<_>>())
            .bind(rows.iter().map(|(_, n)| *n).collect::<Vec<_>>())
            .bind(rows.iter().map(|(c, _)| c.id_source.as_str()).collect::<Vec<_>>())
            .bind(MAX_OPEN_PAYLOAD_COPIES)
            .execute(&mut *conn)
            .await?;
        Ok(())
    }
}
