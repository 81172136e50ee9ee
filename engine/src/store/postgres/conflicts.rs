//! The copies of conflicting deliveries (DESIGN.md, "Reused ids and payload conflicts"): a
//! delivery whose message id is a record's but whose message type or payload is not keeps its
//! whole message in `record_conflicts`, one row per record and distinct payload, in the
//! transaction that judges it (transactional) or before it is acknowledged (leased).

use async_trait::async_trait;
use sqlx::{Connection, PgConnection};
use sqlx::types::Json;

use super::PgStore;
use crate::db::storable::Storable;
use crate::record::ConsumerGroup;
use crate::store::roles::ConflictCopies;
use crate::store::{ConflictCopy, MAX_OPEN_PAYLOAD_COPIES, StoreError, all_locked, records_of};

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

#[async_trait]
impl ConflictCopies for PgStore {
    async fn keep_conflicts(
        &self,
        conn: &mut PgConnection,
        group: &ConsumerGroup,
        copies: &[ConflictCopy<'_>],
    ) -> Result<(), StoreError> {
        let rows = ConflictCopy::per_payload(copies);
        if rows.is_empty() {
            return Ok(());
        }
        // The records first, `FOR NO KEY UPDATE` in id order: a cleanup batch skips them while
        // the copies are kept, and one it deleted first is gone. One keeper at a time per
        // record, too: the statement counts a record's open payload conflicts, and under a
        // shared lock eight keepers at once all counted the same few and kept 7-8 of 5 (break
        // review; case `distinct_payload_copies_kept_at_once_stay_within_the_open_limit`).
        // A savepoint in the transactional path's transaction, a transaction of its own in the
        // leased one, which keeps its copies on a connection of their own.
        let records = records_of(&rows);
        let mut tx = conn.begin().await?;
        let locked: Vec<i64> =
            sqlx::query_scalar(&self.render("SELECT id FROM {s}.dedup_records WHERE id = ANY($1) ORDER BY id FOR NO KEY UPDATE"))
                .bind(&records)
                .fetch_all(&mut *tx)
                .await?;
        all_locked(&records, &locked)?;
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
            .execute(&mut *tx)
            .await?;
        tx.commit().await?;
        Ok(())
    }
}
