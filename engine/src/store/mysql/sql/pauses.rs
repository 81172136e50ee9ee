//! The statements of the handlers' pause rows on MySQL (the rules are `postgres/pauses.rs`'s).
//! No `RETURNING`: what a write must report is read back in its transaction, by the primary key,
//! on the row the write locked.

use super::repeat;

/// Registers `n` handlers of a group (binds: `n` × (group, type, kind)) as `running` unless they
/// have a row (whose kind and sighting are updated).
pub(in crate::store::mysql) fn register(n: usize) -> String {
    format!(
        "INSERT INTO {{s}}.handler_pauses (consumer_group, message_type, kind) VALUES {}
 ON DUPLICATE KEY UPDATE kind = VALUES(kind), seen_at = UTC_TIMESTAMP(6)",
        repeat("(?, ?, ?)", n)
    )
}

/// The group's paused handlers (served by the primary key).
pub(in crate::store::mysql) const PAUSED: &str =
    "SELECT message_type, state, probe_at FROM {s}.handler_pauses WHERE consumer_group = ? AND state <> 'running'";

/// Takes the probe of a breaker-paused handler when it is due (binds: the probe interval in ms,
/// group, type): one process matches the row, whose new probe time [`PAUSE_STATE`] then reads.
pub(in crate::store::mysql) const TAKE_PROBE: &str = "UPDATE {s}.handler_pauses
 SET probe_at = TIMESTAMPADD(MICROSECOND, ? * 1000, UTC_TIMESTAMP(6))
 WHERE consumer_group = ? AND message_type = ? AND state = 'breaker'
   AND (probe_at IS NULL OR probe_at <= UTC_TIMESTAMP(6))";

/// A handler's state and next probe (binds: group, type).
pub(in crate::store::mysql) const PAUSE_STATE: &str =
    "SELECT state, probe_at FROM {s}.handler_pauses WHERE consumer_group = ? AND message_type = ?";

#[cfg(feature = "http")]
/// The engine pauses a handler (`PAUSE_SQL` of `postgres/pauses.rs`; binds: group, type, state
/// (`breaker` or `gone`), reason, error class, HTTP status, and for `breaker` the probe interval
/// in ms, else NULL). PostgreSQL's
/// `ON CONFLICT … WHERE` becomes a guard on every assignment (from `running` or `breaker`, or
/// the same state again); assignments see the ones before them, so `state`, which the guard and
/// the others read, is assigned last. Whether the pause took is read back ([`PAUSE_STATE`]): it
/// did when the row is in the state asked for (the engine never asks for `operator`).
pub(in crate::store::mysql) fn pause() -> String {
    let ok = "(state IN ('running', 'breaker') OR state = VALUES(state))";
    format!(
        "INSERT INTO {{s}}.handler_pauses
    (consumer_group, message_type, state, changed_by, reason, error_class, http_status, failed_at, probe_at)
VALUES (?, ?, ?, 'engine', ?, ?, ?, UTC_TIMESTAMP(6), TIMESTAMPADD(MICROSECOND, ? * 1000, UTC_TIMESTAMP(6)))
ON DUPLICATE KEY UPDATE
 since = IF({ok} AND state <> VALUES(state), UTC_TIMESTAMP(6), since),
 version = version + IF({ok} AND state <> VALUES(state), 1, 0),
 changed_by = IF({ok}, 'engine', changed_by),
 reason = IF({ok}, VALUES(reason), reason),
 error_class = IF({ok}, VALUES(error_class), error_class),
 http_status = IF({ok}, VALUES(http_status), http_status),
 failed_at = IF({ok}, UTC_TIMESTAMP(6), failed_at),
 probe_at = IF({ok} AND NOT (state = 'breaker' AND VALUES(state) = 'breaker'), VALUES(probe_at), probe_at),
 state = IF({ok}, VALUES(state), state)"
    )
}

#[cfg(feature = "http")]
/// A probe succeeded: `breaker` → `running` (binds: group, type; an operator's pause is left
/// alone). Matched rows decide (sqlx sends `CLIENT_FOUND_ROWS`): the row matches only in
/// `breaker`.
pub(in crate::store::mysql) const RESUME_AFTER_PROBE: &str = "UPDATE {s}.handler_pauses
 SET state = 'running', since = UTC_TIMESTAMP(6), changed_by = 'engine', reason = 'a probe succeeded',
     probe_at = NULL, version = version + 1
 WHERE consumer_group = ? AND message_type = ? AND state = 'breaker'";
