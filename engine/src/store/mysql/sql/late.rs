//! The statements of late duplicates on MySQL (the rules are `postgres/late.rs`'s): the lookup
//! of a batch's deliveries in the fingerprints cleanup keeps, the notes of the late duplicates a
//! batch created, and a late duplicate held for an operator.

use super::{HELD_OWNER, derived, repeat};

/// The fingerprint of `group`, `message_type` and `message_id` (SQL operands): PostgreSQL's
/// `dedup_fingerprint`, the first 8 bytes of the MD5 of the three joined by newlines (none may
/// hold a control character), as `BINARY(8)`: the same 64 bits.
pub(in crate::store::mysql) fn fingerprint(group: &str, message_type: &str, message_id: &str) -> String {
    format!("UNHEX(LEFT(MD5(CONCAT({group}, CHAR(10), {message_type}, CHAR(10), {message_id})), 16))")
}

/// The fingerprints kept of `n` deliveries (binds: `n` × (message id, message type), then the
/// group): each delivery's fingerprint is looked up by the primary key (`eq_ref`).
pub(in crate::store::mysql) fn fingerprint_matches(n: usize) -> String {
    format!(
        "SELECT d.message_id, f.first_seen_at
 FROM {deliveries} d
 JOIN {{s}}.dedup_fingerprints f ON f.fingerprint = {fingerprint}",
        deliveries = derived(&["message_id", "message_type"], n),
        fingerprint = fingerprint("?", "d.message_type", "d.message_id"),
    )
}

/// Notes the late duplicates among the records of `n` matches (binds: the statement's nonce, `n`
/// × (message id, the first sighting its fingerprint keeps), the group, the `n` message ids): a
/// record first seen after its fingerprint's sighting, not noted yet, is noted once. Looked up
/// by the dedup key. No `RETURNING`: the rows this statement noted carry its nonce
/// ([`NOTED`]); one noted already is left as it was.
pub(in crate::store::mysql) fn note_late_duplicates(n: usize) -> String {
    format!(
        "INSERT INTO {{s}}.late_duplicates
    (record_id, consumer_group, message_id, first_seen_at, delay_ms, held, note_nonce)
SELECT r.id, r.consumer_group, r.message_id, r.earlier, TIMESTAMPDIFF(MICROSECOND, r.earlier, r.first_seen_at) DIV 1000,
       FALSE, ?
FROM (SELECT id, consumer_group, message_id, first_seen_at, CASE message_id {earlier} END AS earlier
      FROM {{s}}.dedup_records WHERE consumer_group = ? AND message_id IN ({ids})) r
WHERE r.first_seen_at > r.earlier
ORDER BY r.id
ON DUPLICATE KEY UPDATE record_id = record_id",
        earlier = vec!["WHEN ? THEN ?"; n].join(" "),
        ids = repeat("?", n),
    )
}

/// The delays of the late duplicates a note (its nonce bound) noted.
pub(in crate::store::mysql) const NOTED: &str = "SELECT delay_ms FROM {s}.late_duplicates WHERE note_nonce = ?";

/// A late duplicate held for an operator (`HOLD_SQL` of `postgres/late.rs`): a new record
/// `processing`, parked, its lease already expired, owned by no worker ([`HELD_OWNER`]), with
/// its whole message (binds: group, message id, type, handler mode, max attempts, lease token,
/// reason, error class, payload hash, payload, headers, content type, broker, exchange, routing
/// key, queue, AMQP `type`, id source, nonce). A record of the message id that exists is left as
/// it was: only a record created by this statement has its nonce ([`HELD_LATE_DUPLICATE`]).
pub(in crate::store::mysql) fn hold_late_duplicate() -> String {
    format!(
        "INSERT INTO {{s}}.dedup_records (
    consumer_group, message_id, message_type, status, handler_mode, attempts, max_attempts,
    lease_owner, lease_token, lease_expires_at, parked_at, last_error, error_class,
    payload_hash, payload, headers, content_type,
    source_broker, source_exchange, source_routing_key, source_queue, type_property, id_source, claim_nonce)
VALUES (?, ?, ?, 'processing', ?, 0, ?, {HELD_OWNER}, ?, UTC_TIMESTAMP(6), UTC_TIMESTAMP(6), ?, ?,
        ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
ON DUPLICATE KEY UPDATE claim_nonce = claim_nonce"
    )
}

/// The record [`hold_late_duplicate`] created (its nonce bound last), with its delay after the first sighting
/// (bound first), in ms.
pub(in crate::store::mysql) const HELD_LATE_DUPLICATE: &str = "SELECT id, TIMESTAMPDIFF(MICROSECOND, ?, first_seen_at) DIV 1000 AS delay_ms
 FROM {s}.dedup_records WHERE claim_nonce = ?";

/// The note of a held late duplicate (binds: record id, group, message id, first sighting, delay
/// in ms).
pub(in crate::store::mysql) const NOTE_HELD: &str = "INSERT INTO {s}.late_duplicates
    (record_id, consumer_group, message_id, first_seen_at, delay_ms, held) VALUES (?, ?, ?, ?, ?, TRUE)";
