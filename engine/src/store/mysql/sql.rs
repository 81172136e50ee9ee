//! The SQL of [`super::MySqlStore`], in MySQL 8 / MariaDB 10.11 terms (the PostgreSQL store's
//! `postgres/sql.rs` states the rules; the comments here say only where MySQL differs).
//!
//! Every table is written `{s}.<table>`: [`super::MySqlStore`] puts the quoted database in place
//! of `{s}`. Batches are multi-row `VALUES` lists or `UNION ALL` derived tables (no `unnest` in
//! MySQL; `JSON_TABLE` would need MariaDB 10.6+ and JSON-encoded binds), so a statement's text
//! depends on its number of rows: the functions below build it. Times are `UTC_TIMESTAMP(6)`, the
//! statement's start (PostgreSQL's `now()` is the transaction's).

mod conflicts;
mod late;
mod leases;
mod pauses;
pub(super) use conflicts::*;
pub(super) use late::*;
pub(super) use leases::*;
pub(super) use pauses::*;

use crate::store::ClaimAs;

/// Whether the record's stored delivery found no handler (`NO_HANDLER: <type>`); reads
/// `error_class`, so an ODKU list assigns `error_class` after every use of it.
pub(super) const NO_HANDLER: &str = "COALESCE(LEFT(error_class, 11) = 'NO_HANDLER:', FALSE)";

/// Whether this statement's claim took the row: the first assignment of a claim's ODKU list set
/// the nonce, and every later assignment asks this (they see the earlier ones' results).
const OURS: &str = "claim_nonce <=> VALUES(claim_nonce)";

/// `same_type!` of `postgres/sql.rs` on an ODKU row: the delivery is of the record's message type,
/// or the record found no handler and this is its own message typed anew.
fn same_type() -> String {
    format!(
        "(message_type = VALUES(message_type) OR ({NO_HANDLER} AND (message_type = 'UNKNOWN' \
         OR payload_hash = VALUES(payload_hash))))"
    )
}

/// `claimable!` of `postgres/sql.rs`: `failed` with attempts left, or dead for want of a handler
/// before any ran.
fn claimable() -> String {
    format!("((status = 'failed' AND attempts < max_attempts) OR (status = 'dead' AND attempts = 0 AND {NO_HANDLER}))")
}

/// `n` copies of `row`, comma-separated.
pub(super) fn repeat(row: &str, n: usize) -> String {
    vec![row; n].join(", ")
}

/// A derived table of `n` rows of bound values named `columns`: `(SELECT ? AS a, ? AS b UNION ALL
/// SELECT ?, ? …)`, portable to MySQL 8 and MariaDB (their row constructors differ).
pub(super) fn derived(columns: &[&str], n: usize) -> String {
    let first: Vec<String> = columns.iter().map(|c| format!("? AS {c}")).collect();
    let rest = repeat("?", columns.len());
    let mut sql = format!("(SELECT {}", first.join(", "));
    for _ in 1..n {
        sql.push_str(" UNION ALL SELECT ");
        sql.push_str(&rest);
    }
    sql.push(')');
    sql
}

/// The columns a batch claim inserts (the same for every kind, so `VALUES(col)` of the ODKU list
/// never reads a column left out of the insert).
const CLAIM_COLUMNS: &str = "consumer_group, message_id, message_type, status, handler_mode, attempts, max_attempts, \
     lease_owner, lease_token, lease_expires_at, completed_at, payload_hash, content_type, type_property, \
     source_broker, source_exchange, source_routing_key, source_queue, id_source, claim_nonce, payload, headers, \
     effect_started";

/// One row of a `processing` claim: group, id, type, max attempts, lease owner, token and
/// milliseconds, hash, content type, broker, exchange, routing key, queue, id source, nonce.
const PROCESSING_ROW: &str = "(?, ?, ?, 'processing', 'transactional', 1, ?, ?, ?, \
     TIMESTAMPADD(MICROSECOND, ? * 1000, UTC_TIMESTAMP(6)), NULL, ?, ?, NULL, ?, ?, ?, ?, ?, ?, NULL, NULL, NULL)";

/// One row of a claim straight into `succeeded`: as [`PROCESSING_ROW`] without the lease.
const SUCCEEDED_ROW: &str = "(?, ?, ?, 'succeeded', 'transactional', 1, ?, NULL, NULL, NULL, UTC_TIMESTAMP(6), \
     ?, ?, NULL, ?, ?, ?, ?, ?, ?, NULL, NULL, NULL)";

/// One row of a leased claim: as [`PROCESSING_ROW`] with the AMQP `type` property after the
/// content type, and the payload, headers and whether the effect starts at once after the nonce.
const LEASED_ROW: &str = "(?, ?, ?, 'processing', 'leased', 1, ?, ?, ?, \
     TIMESTAMPADD(MICROSECOND, ? * 1000, UTC_TIMESTAMP(6)), NULL, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)";

/// The lease owner of a late duplicate held for an operator (`held_owner!` of `postgres/sql.rs`):
/// no lease reclaim takes it over.
const HELD_OWNER: &str = "'held: late duplicate'";

/// A batch claim of `n` rows as `kind` says (rows in message-id order, one lock order for every
/// batch): `INSERT … ON DUPLICATE KEY UPDATE` whose first assignment decides, on the old row,
/// whether this statement takes the record (the same type and claimable: then the row gets the
/// statement's nonce); every later assignment keys off the nonce. Assignments run left to right
/// and see earlier results, so each column is read before it is assigned: `claimed_from` and
/// `reentries` before `status`, `error_class` (which [`NO_HANDLER`] reads) last. A row not
/// taken is left as it was (locked until the transaction ends). `succeeded`: what a completion
/// writes (no lease, no payload, no error class); otherwise `processing` under the lease. A
/// leased claim also takes over a record whose lease expired when its message id is among the
/// `reclaim` ids bound after the rows (their type reclaims; `-1`… stands for none) and no
/// operator holds it, or when its effect never started.
pub(super) fn claim_many(n: usize, kind: ClaimAs, reclaim: usize) -> String {
    let c = OURS;
    let nh = NO_HANDLER;
    let (row, succeeded) = match kind {
        ClaimAs::Processing => (PROCESSING_ROW, false),
        ClaimAs::Succeeded => (SUCCEEDED_ROW, true),
        ClaimAs::Leased => (LEASED_ROW, false),
    };
    let claimable = if kind == ClaimAs::Leased {
        format!(
            "({claimable} OR (status = 'processing' AND lease_expires_at < UTC_TIMESTAMP(6)
              AND ((message_id IN ({ids}) AND NOT (lease_owner <=> {HELD_OWNER})) OR effect_started <=> FALSE)))",
            claimable = claimable(),
            ids = repeat("?", reclaim.max(1)),
        )
    } else {
        claimable()
    };
    // Succeeded claims clear payload, headers and error class; the others give a NO_HANDLER
    // record this delivery's (`restamp!`): a leased claim stores it, a transactional one none.
    let clear = if succeeded { c.to_owned() } else { format!("{c} AND {nh}") };
    let processing_only = if succeeded {
        String::new()
    } else {
        format!(
            "reentries = IF({c} AND status = 'processing', reentries + 1, reentries),
 effect_started = IF({c}, VALUES(effect_started), effect_started),"
        )
    };
    let completed = if succeeded { format!("completed_at = IF({c}, VALUES(completed_at), completed_at),") } else { String::new() };
    format!(
        "INSERT INTO {{s}}.dedup_records ({CLAIM_COLUMNS})
VALUES {rows}
ON DUPLICATE KEY UPDATE
 claim_nonce = IF({same_type} AND {claimable}, VALUES(claim_nonce), claim_nonce),
 claimed_from = IF({c}, status, claimed_from),
 version = IF({c}, version + 1, version),
 attempts = IF({c}, attempts + 1, attempts),
 {processing_only}
 status = IF({c}, VALUES(status), status),
 handler_mode = IF({c}, VALUES(handler_mode), handler_mode),
 message_type = IF({c}, VALUES(message_type), message_type),
 lease_owner = IF({c}, VALUES(lease_owner), lease_owner),
 lease_token = IF({c}, VALUES(lease_token), lease_token),
 lease_expires_at = IF({c}, VALUES(lease_expires_at), lease_expires_at),
 {completed}
 next_attempt_at = IF({c}, NULL, next_attempt_at),
 parked_at = IF({c}, NULL, parked_at),
 id_source = IF({c}, COALESCE(id_source, VALUES(id_source)), id_source),
 payload = IF({clear}, VALUES(payload), payload),
 headers = IF({clear}, VALUES(headers), headers),
 payload_hash = IF({c} AND {nh}, VALUES(payload_hash), payload_hash),
 payload_truncated = IF({c} AND {nh}, FALSE, payload_truncated),
 content_type = IF({c} AND {nh}, VALUES(content_type), content_type),
 type_property = IF({c} AND {nh}, VALUES(type_property), type_property),
 source_broker = IF({c} AND {nh}, VALUES(source_broker), source_broker),
 source_exchange = IF({c} AND {nh}, VALUES(source_exchange), source_exchange),
 source_routing_key = IF({c} AND {nh}, VALUES(source_routing_key), source_routing_key),
 source_queue = IF({c} AND {nh}, VALUES(source_queue), source_queue),
 updated_at = IF({c}, UTC_TIMESTAMP(6), updated_at),
 error_class = IF({clear}, NULL, error_class)",
        rows = repeat(row, n),
        same_type = same_type(),
    )
}

/// The read-back in place of `RETURNING`: the rows a claim took, by its nonce (an index range).
/// `created`: a new record has version 0; a takeover raised it. `claimed_at`: the database clock.
pub(super) const CLAIMED: &str = "SELECT id, message_id, attempts, max_attempts, version = 0 AS created, claimed_from, \
     first_seen_at, UTC_TIMESTAMP(6) AS claimed_at FROM {s}.dedup_records WHERE claim_nonce = ?";

/// The duplicate check of the rows a claim did not take (binds: the group, then `n` message
/// ids): the records as they are, with one clock reading. Looked up by the dedup key, forced (a
/// join with a derived table of the deliveries made InnoDB scan and lock other transactions'
/// rows, and deadlock concurrent batches; so did this statement's full scan, which the optimizer
/// chose on a table of 80 records: 83 row locks for 40 ids, 150 deadlocks of 8 workers); the claim's ODKU locked these rows already, in the same
/// order. The store judges each delivery against its record (`same_type`, `same_payload`) and
/// writes the counts with [`note_duplicates`].
pub(super) fn judge_duplicates(n: usize) -> String {
    format!(
        "SELECT r.id, r.message_id, r.status, r.lease_expires_at, r.message_type, r.payload_hash, r.error_class,
        COALESCE(r.lease_expires_at < UTC_TIMESTAMP(6), FALSE) AS lease_expired,
        COALESCE(r.status = 'processing' AND r.lease_expires_at >= UTC_TIMESTAMP(6), FALSE) AS lease_live,
        TIMESTAMPDIFF(MICROSECOND, r.first_seen_at, UTC_TIMESTAMP(6)) DIV 1000 AS delay_ms
 FROM {{s}}.dedup_records r FORCE INDEX (dedup_records_group_message_key)
 WHERE r.consumer_group = ? AND r.message_id IN ({})
 ORDER BY r.message_id FOR UPDATE",
        repeat("?", n)
    )
}

/// The counts of a duplicate check, by primary key (binds: the ids counted as duplicates, twice,
/// the ids with a payload conflict, the ids parked, then every id; lists of `dup`, `conflict`,
/// `park`, `all` ids, never empty: `-1` stands for none).
pub(super) fn note_duplicates(dup: usize, conflict: usize, park: usize, all: usize) -> String {
    let list = |n: usize| repeat("?", n.max(1));
    format!(
        "UPDATE {{s}}.dedup_records SET
    duplicate_count = duplicate_count + (id IN ({d})),
    last_duplicate_at = IF(id IN ({d}), UTC_TIMESTAMP(6), last_duplicate_at),
    payload_conflicts = payload_conflicts + (id IN ({c})),
    parked_at = IF(id IN ({p}), UTC_TIMESTAMP(6), parked_at)
 WHERE id IN ({a})",
        d = list(dup),
        c = list(conflict),
        p = list(park),
        a = list(all),
    )
}

/// Count delta rows (`n` rows: group, status, delta), appended: no row two writers wait on.
pub(super) fn add_counts(n: usize) -> String {
    format!("INSERT INTO {{s}}.record_counts (consumer_group, status, n) VALUES {}", repeat("(?, ?, ?)", n))
}

/// The message types of `n` records (distinct, sorted) not yet known, inserted without the lock
/// an `ON DUPLICATE KEY UPDATE` would hold on a known type's row until commit (which serialized
/// every batch of a type). Two first inserts of one type race to a duplicate key (1062) on the
/// second, which rolls back only this statement; the store runs it again.
pub(super) fn add_types(n: usize) -> String {
    format!(
        "INSERT INTO {{s}}.message_types (message_type) SELECT t.message_type FROM {} t
 WHERE NOT EXISTS (SELECT 1 FROM {{s}}.message_types m WHERE m.message_type = t.message_type)",
        derived(&["message_type"], n)
    )
}

/// Attempt rows of `n` transactional attempts that ended now: record id, attempt, worker, when
/// it started, outcome, error.
pub(super) fn add_attempts(n: usize) -> String {
    format!(
        "INSERT INTO {{s}}.record_attempts (record_id, attempt, worker, started_at, ended_at, outcome, error) VALUES {}",
        repeat("(?, ?, ?, ?, UTC_TIMESTAMP(6), ?, ?)", n)
    )
}

/// The claims among `n` record ids still held under the lease token (the last bind), locked:
/// what a completion or failure may settle. Their group is read for the count deltas.
pub(super) fn held(n: usize) -> String {
    format!(
        "SELECT id, attempts, consumer_group FROM {{s}}.dedup_records
 WHERE id IN ({}) AND status = 'processing' AND lease_token = ? ORDER BY id FOR UPDATE",
        repeat("?", n)
    )
}

/// Completion of `n` held records ([`held`] locked them): `succeeded`, lease and stored payload
/// cleared.
pub(super) fn complete(n: usize) -> String {
    format!(
        "UPDATE {{s}}.dedup_records SET
    status = 'succeeded', version = version + 1, lease_owner = NULL, lease_token = NULL, lease_expires_at = NULL,
    completed_at = UTC_TIMESTAMP(6), updated_at = UTC_TIMESTAMP(6), next_attempt_at = NULL, parked_at = NULL,
    payload = NULL, headers = NULL, error_class = NULL
 WHERE id IN ({})",
        repeat("?", n)
    )
}

/// A transactional failure of a held record (`$1` status, error, error class, retry delay in
/// ms, payload, headers, content type, AMQP `type`, record id): the delivery is kept, as the
/// claim stored none.
pub(super) const FAIL_TX: &str = "UPDATE {s}.dedup_records SET
    status = ?, version = version + 1, lease_owner = NULL, lease_token = NULL, lease_expires_at = NULL,
    last_error = ?, error_class = ?,
    next_attempt_at = IF(status = 'failed', TIMESTAMPADD(MICROSECOND, ? * 1000, UTC_TIMESTAMP(6)), NULL),
    updated_at = UTC_TIMESTAMP(6),
    payload = ?, headers = ?, content_type = COALESCE(?, content_type), type_property = ?
 WHERE id = ?";

/// A poison record, or a copy of one (see `POISON_SQL` of `postgres/sql.rs`). The first
/// assignment decides whether the copy makes a requeued `NO_HANDLER` record dead again (then the
/// row gets the nonce); the duplicate counts read the old row before `message_type` and
/// `error_class` change. A reused id (a delivery of another type without a handler) counts
/// nothing.
pub(super) fn poison() -> String {
    let c = OURS;
    let nh = NO_HANDLER;
    let dead_again = format!("(status = 'failed' AND attempts = 0 AND NOT VALUES(poison) AND {nh})");
    let reused = format!("(NOT VALUES(poison) AND NOT {})", same_type());
    format!(
        "INSERT INTO {{s}}.dedup_records (
    consumer_group, message_id, message_type, status, handler_mode, attempts, max_attempts,
    last_error, error_class, payload_hash, payload, payload_truncated, headers, content_type,
    source_broker, source_exchange, source_routing_key, source_queue, poison, type_property, id_source, claim_nonce)
VALUES (?, ?, ?, 'dead', NULL, 0, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
ON DUPLICATE KEY UPDATE
 claim_nonce = IF({dead_again}, VALUES(claim_nonce), claim_nonce),
 id_source = COALESCE(id_source, VALUES(id_source)),
 duplicate_count = duplicate_count + IF({c} OR {reused}, 0, 1),
 last_duplicate_at = IF({c} OR {reused}, last_duplicate_at, UTC_TIMESTAMP(6)),
 payload_conflicts = payload_conflicts + IF(payload_hash = VALUES(payload_hash) OR {c} OR {reused}, 0, 1),
 claimed_from = IF({c}, status, claimed_from),
 status = IF({c}, 'dead', status),
 version = IF({c}, version + 1, version),
 message_type = IF({c}, VALUES(message_type), message_type),
 last_error = IF({c}, VALUES(last_error), last_error),
 next_attempt_at = IF({c}, NULL, next_attempt_at),
 updated_at = IF({c}, UTC_TIMESTAMP(6), updated_at),
 error_class = IF({c}, VALUES(error_class), error_class)"
    )
}

/// What [`poison`] did (binds: nonce, the delivery's type, its payload hash, group, message
/// id): `ours` (created, or dead again), `created`, and whether the record is of another type
/// than the delivery (a reused id).
pub(super) fn poison_stored() -> String {
    format!(
        "SELECT id, claim_nonce <=> ? AS ours, version = 0 AS fresh, claimed_from, message_type,
        NOT (message_type = ? OR ({NO_HANDLER} AND (message_type = 'UNKNOWN' OR payload_hash = ?))) AS other_type
 FROM {{s}}.dedup_records WHERE consumer_group = ? AND message_id = ?"
    )
}

/// Duplicates the fast path caught in one group (binds: `n` × (message id, copies), `n` ×
/// (message id, latest arrival, latest arrival), the group, the `n` message ids). Looked up by
/// the dedup key: a join with a derived table would scan and lock other transactions' rows.
/// MySQL's `GREATEST` is NULL when an argument is, so the latest arrival is picked with `IF`.
pub(super) fn fast_path_duplicates(n: usize) -> String {
    format!(
        "UPDATE {{s}}.dedup_records SET
    duplicate_count = duplicate_count + CASE message_id {copies} ELSE 0 END,
    last_duplicate_at = CASE message_id {at} ELSE last_duplicate_at END
 WHERE consumer_group = ? AND message_id IN ({ids})",
        copies = vec!["WHEN ? THEN ?"; n].join(" "),
        at = vec!["WHEN ? THEN IF(last_duplicate_at IS NULL OR last_duplicate_at < ?, ?, last_duplicate_at)"; n].join(" "),
        ids = repeat("?", n),
    )
}
