//! The statements of leased claims and [`crate::store::LeaseStore`] on MySQL (see the parent
//! module; the rules are `postgres/sql/settle.rs`'s). Each settlement first reads the records
//! still `processing` with `FOR UPDATE` ([`processing`]); the store keeps those whose lease token
//! is the claim's, and updates them by primary key.

use super::repeat;

/// The records among `n` ids still `processing`, with their lease token, locked.
pub(in crate::store::mysql) fn processing(n: usize) -> String {
    format!(
        "SELECT id, attempts, consumer_group, lease_token FROM {{s}}.dedup_records
 WHERE id IN ({}) AND status = 'processing' ORDER BY id FOR UPDATE",
        repeat("?", n)
    )
}

/// The runs so far of `n` records a leased claim took over: their attempt rows (before the one
/// the claim opens) and the last one's answer status.
pub(in crate::store::mysql) fn prior_runs(n: usize) -> String {
    format!(
        "SELECT a.record_id, COUNT(*) AS runs,
        (SELECT b.answer_status FROM {{s}}.record_attempts b WHERE b.record_id = a.record_id
         ORDER BY b.id DESC LIMIT 1) AS previous_status
 FROM {{s}}.record_attempts a WHERE a.record_id IN ({}) GROUP BY a.record_id",
        repeat("?", n)
    )
}

/// Closes the attempts a leased claim superseded, as `lease_lost` (binds: the worker twice, then
/// `n` × (record id, the claim's attempt)).
pub(in crate::store::mysql) fn close_superseded(n: usize) -> String {
    format!(
        "UPDATE {{s}}.record_attempts SET ended_at = UTC_TIMESTAMP(6), outcome = 'lease_lost', taken_over_by = ?,
    error = CONCAT('the lease expired; taken over by ', ?)
 WHERE ended_at IS NULL AND ({})",
        vec!["(record_id = ? AND attempt < ?)"; n].join(" OR ")
    )
}

/// The attempt rows `n` leased claims open (record id, attempt, worker, group, type).
pub(in crate::store::mysql) fn open_attempts(n: usize) -> String {
    format!(
        "INSERT INTO {{s}}.record_attempts (record_id, attempt, worker, started_at, consumer_group, message_type)
 VALUES {}",
        repeat("(?, ?, ?, UTC_TIMESTAMP(6), ?, ?)", n)
    )
}

/// Closes one open attempt (binds: outcome, error, answer status, latency in ms, answer, in
/// progress, record id, attempt).
pub(in crate::store::mysql) const CLOSE_ATTEMPT: &str = "UPDATE {s}.record_attempts SET
    ended_at = UTC_TIMESTAMP(6), outcome = ?, error = COALESCE(?, error), answer_status = ?, latency_ms = ?,
    answer = ?, in_progress = ?
 WHERE record_id = ? AND attempt = ? AND ended_at IS NULL";

/// A leased failure of a held record (binds: status, error, error class, retry delay in ms,
/// record id); the claim stored the delivery already.
pub(in crate::store::mysql) const FAIL_LEASED: &str = "UPDATE {s}.dedup_records SET
    status = ?, version = version + 1, lease_owner = NULL, lease_token = NULL, lease_expires_at = NULL,
    last_error = ?, error_class = ?,
    next_attempt_at = IF(status = 'failed', TIMESTAMPADD(MICROSECOND, ? * 1000, UTC_TIMESTAMP(6)), NULL),
    updated_at = UTC_TIMESTAMP(6)
 WHERE id = ?";

/// Whether record `?`'s run of in-progress answers (the attempts marked in progress since the
/// last closed one that was not) started less than `?` ms ago; NULL ms: always (binds: id, id,
/// ms, ms).
pub(in crate::store::mysql) const DEFER_WITHIN: &str = "SELECT ? IS NULL OR COALESCE(
    (SELECT MIN(a.started_at) FROM {s}.record_attempts a
     WHERE a.record_id = ? AND a.in_progress
       AND a.started_at > COALESCE((SELECT MAX(b.ended_at) FROM {s}.record_attempts b
                                    WHERE b.record_id = a.record_id AND NOT b.in_progress), '1000-01-01')),
    UTC_TIMESTAMP(6)) > TIMESTAMPADD(MICROSECOND, -COALESCE(?, 0) * 1000, UTC_TIMESTAMP(6)) AS within";

/// A leased claim given back uncounted (binds: error, error class, retry delay in ms, id).
pub(in crate::store::mysql) const DEFER: &str = "UPDATE {s}.dedup_records SET
    status = 'failed', version = version + 1, attempts = attempts - 1,
    lease_owner = NULL, lease_token = NULL, lease_expires_at = NULL, last_error = ?, error_class = ?,
    next_attempt_at = TIMESTAMPADD(MICROSECOND, ? * 1000, UTC_TIMESTAMP(6)), updated_at = UTC_TIMESTAMP(6)
 WHERE id = ?";

/// Leases of `n` held records extended by `?` ms from now (bound first).
pub(in crate::store::mysql) fn extend(n: usize) -> String {
    format!(
        "UPDATE {{s}}.dedup_records SET lease_expires_at = TIMESTAMPADD(MICROSECOND, ? * 1000, UTC_TIMESTAMP(6))
 WHERE id IN ({})",
        repeat("?", n)
    )
}

/// `n` held records whose effects are about to start.
pub(in crate::store::mysql) fn mark_started(n: usize) -> String {
    format!("UPDATE {{s}}.dedup_records SET effect_started = TRUE WHERE id IN ({})", repeat("?", n))
}

/// `n` held records given back unstarted: `failed`, one attempt less, due in `?` ms (bound first).
pub(in crate::store::mysql) fn release(n: usize) -> String {
    format!(
        "UPDATE {{s}}.dedup_records SET
    status = 'failed', version = version + 1, attempts = attempts - 1,
    lease_owner = NULL, lease_token = NULL, lease_expires_at = NULL, effect_started = NULL,
    next_attempt_at = TIMESTAMPADD(MICROSECOND, ? * 1000, UTC_TIMESTAMP(6)), updated_at = UTC_TIMESTAMP(6)
 WHERE id IN ({})",
        repeat("?", n)
    )
}

/// The attempt rows `n` released claims opened (record id, attempt), removed: no call was made.
pub(in crate::store::mysql) fn unopen(n: usize) -> String {
    format!(
        "DELETE FROM {{s}}.record_attempts WHERE ended_at IS NULL AND ({})",
        vec!["(record_id = ? AND attempt = ?)"; n].join(" OR ")
    )
}

/// A late effect (binds: answer status, latency, answer, record id, attempt).
pub(in crate::store::mysql) const LATE_EFFECT: &str = "UPDATE {s}.record_attempts SET
    late_effect = TRUE, outcome = COALESCE(outcome, 'lease_lost'), ended_at = COALESCE(ended_at, UTC_TIMESTAMP(6)),
    answer_status = COALESCE(?, answer_status), latency_ms = COALESCE(?, latency_ms), answer = COALESCE(?, answer)
 WHERE record_id = ? AND attempt = ? AND NOT (outcome <=> 'deferred') AND NOT (outcome <=> 'succeeded')";
