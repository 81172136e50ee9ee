//! The statement keeping conflicting copies on MySQL (the rules are `postgres/conflicts.rs`'s).

use super::{derived, repeat};

/// Keeps `n` copies, one per record and payload (binds: the group, then per copy its record id,
/// message id, kind, message type, id source, payload hash, payload, headers, content type, AMQP
/// `type`, broker, exchange, routing key, queue and number of copies, then the most open payload
/// conflicts a record keeps). A copy of an open row counts on it: the unique key over the open
/// rows (`record_conflicts_open_key`, the stand-in for PostgreSQL's partial index) makes the
/// insert an update. Rows in (record, payload hash) order: one lock order for every batch.
/// `INSERT … SELECT` reads `record_conflicts` itself (MySQL allows it there, through a temporary
/// table, so every copy is judged on the table as it was, as PostgreSQL's statement is); the
/// target's own columns are named with their table in the update, which the derived table's
/// names would otherwise make ambiguous.
pub(in crate::store::mysql) fn keep_conflicts(n: usize) -> String {
    let copies = derived(
        &[
            "record_id",
            "message_id",
            "kind",
            "message_type",
            "id_source",
            "payload_hash",
            "payload",
            "headers",
            "content_type",
            "type_property",
            "broker",
            "exchange",
            "routing_key",
            "queue",
            "copies",
        ],
        n,
    );
    format!(
        "INSERT INTO {{s}}.record_conflicts (
    record_id, consumer_group, message_id, kind, message_type, id_source, payload_hash, payload, headers,
    content_type, type_property, source_broker, source_exchange, source_routing_key, source_queue, copies)
SELECT i.record_id, ?, i.message_id, i.kind, i.message_type, i.id_source, i.payload_hash, i.payload, i.headers,
       i.content_type, i.type_property, i.broker, i.exchange, i.routing_key, i.queue, i.copies
FROM {copies} i
WHERE i.kind = 'type'
   OR (SELECT COUNT(*) FROM {{s}}.record_conflicts o
       WHERE o.record_id = i.record_id AND o.kind = 'payload' AND o.settled_at IS NULL) < ?
ORDER BY i.record_id, i.payload_hash
ON DUPLICATE KEY UPDATE
 copies = {{s}}.record_conflicts.copies + VALUES(copies), last_seen_at = UTC_TIMESTAMP(6)"
    )
}

/// Locks `n` records (binds: their ids, ascending) before their copies are kept: the keeping
/// statement counts each record's open payload conflicts, and the lock makes that count the
/// record's own until commit.
pub(in crate::store::mysql) fn lock_records(n: usize) -> String {
    format!("SELECT id FROM {{s}}.dedup_records WHERE id IN ({}) ORDER BY id FOR UPDATE", repeat("?", n))
}
