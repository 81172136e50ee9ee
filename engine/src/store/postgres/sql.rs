//! The SQL statements of [`super::PgStore`]: claims and duplicate notes here; completions,
//! failures, poison records and lease heartbeats in `settle.rs`. Each is one statement so that a claim or a transition is atomic; the rules
//! they implement are in DESIGN.md ("Claims and leases"). Every transition raises the record's
//! `version` by one (operator actions compare it); duplicate notes and heartbeats do not.
//!
//! These statements run in a team's transaction, under the team's `search_path`: every table
//! is written `{s}.<table>`, and [`Statements::new`] puts the engine's schema in place of `{s}`
//! once, when the store is built.

/// [`same_type`] for a delivery `d` of the duplicate check (every expression reads the record
/// `r` as locked by the update, never an earlier snapshot: a record completed meanwhile must be
/// judged, and counted, as it is now).
macro_rules! same_type_of_delivery {
    () => {
        "(r.message_type = d.message_type OR (COALESCE(left(r.error_class, 11) = 'NO_HANDLER:', false)
          AND (r.message_type = 'UNKNOWN' OR r.payload_hash = d.payload_hash)))"
    };
}

/// The lease owner of a late duplicate held for an operator (`late.rs`): no worker holds it, and
/// no lease reclaim takes it over, whatever the handler's `on_lease_expiry`.
macro_rules! held_owner {
    () => {
        "'held: late duplicate'"
    };
}

/// What every claim of an existing record requires besides its status: the delivery is of the
/// record's message type. One of another type carries a reused id (a Kafka record key that is
/// an order number) and is never the record's retry: the duplicate check sends it to
/// `record_conflicts`. A record dead for want of a handler (error class `NO_HANDLER: <type>`) is
/// the exception when the delivery is its own message typed anew — the same payload (a copy a
/// type mapping added since maps to another type, a resend with its type header fixed), or any
/// payload when the record found no type at all (`UNKNOWN`, the engine's `UNKNOWN_TYPE`: a
/// resend typed in its body). A delivery of another type and payload is another event under
/// the same id, a reused id even of a dead letter: taking it over would erase that event.
macro_rules! same_type {
    () => {
        "(r.message_type = EXCLUDED.message_type OR (COALESCE(left(r.error_class, 11) = 'NO_HANDLER:', false)
          AND (r.message_type = 'UNKNOWN' OR r.payload_hash = EXCLUDED.payload_hash)))"
    };
}

/// A record that is claimable as it stands: `failed` with attempts left, or dead for want of a
/// handler before any ran (`NO_HANDLER`, attempts 0). The latter is claimed by a delivery that
/// has a handler now — a producer's corrected resend, a copy after the handler was added — as
/// no effect of it ever started: without this, such a delivery was counted as a duplicate of
/// the dead record and acked, its event lost.
macro_rules! claimable {
    () => {
        "((r.status = 'failed' AND r.attempts < r.max_attempts)
       OR (r.status = 'dead' AND r.attempts = 0 AND COALESCE(left(r.error_class, 11) = 'NO_HANDLER:', false)))"
    };
}

/// The stored message of a `NO_HANDLER` record is the delivery that found no handler; a claim
/// that takes such a record over (a producer's resend with its type fixed, a copy a type mapping
/// added since maps) stores its own delivery in its place — hash, content type, AMQP `type`,
/// source — as an insert would: kept, the old copy was what a requeue published (untyped: a
/// reused id of the record, never its handler) and its hash made every copy of the message that
/// ran a payload conflict. The payload and headers and the error class are set by each claim.
macro_rules! restamp {
    () => {
        r#",
        payload_hash = CASE WHEN COALESCE(left(r.error_class, 11) = 'NO_HANDLER:', false)
                            THEN EXCLUDED.payload_hash ELSE r.payload_hash END,
        payload_truncated = r.payload_truncated AND NOT COALESCE(left(r.error_class, 11) = 'NO_HANDLER:', false),
        content_type = CASE WHEN COALESCE(left(r.error_class, 11) = 'NO_HANDLER:', false)
                            THEN EXCLUDED.content_type ELSE r.content_type END,
        type_property = CASE WHEN COALESCE(left(r.error_class, 11) = 'NO_HANDLER:', false)
                             THEN EXCLUDED.type_property ELSE r.type_property END,
        source_broker = CASE WHEN COALESCE(left(r.error_class, 11) = 'NO_HANDLER:', false)
                             THEN EXCLUDED.source_broker ELSE r.source_broker END,
        source_exchange = CASE WHEN COALESCE(left(r.error_class, 11) = 'NO_HANDLER:', false)
                               THEN EXCLUDED.source_exchange ELSE r.source_exchange END,
        source_routing_key = CASE WHEN COALESCE(left(r.error_class, 11) = 'NO_HANDLER:', false)
                                  THEN EXCLUDED.source_routing_key ELSE r.source_routing_key END,
        source_queue = CASE WHEN COALESCE(left(r.error_class, 11) = 'NO_HANDLER:', false)
                            THEN EXCLUDED.source_queue ELSE r.source_queue END"#
    };
}

/// How a claim takes over an existing, claimable record (the `ON CONFLICT` branch shared by the
/// single and the batch claim): a new lease, one more attempt, counted as a re-entry when it
/// was still `processing` (an expired lease), and whether its effect may have started as the
/// claim says (NULL: unknown, when the claim does not say). A record without an id source (a
/// `NO_HANDLER` dead letter, a record from before migration 070) takes the claim's.
macro_rules! take_over {
    () => {
        concat!(
            r#"
    ON CONFLICT (consumer_group, message_id) DO UPDATE SET
        status = 'processing',
        version = r.version + 1,
        attempts = r.attempts + 1,
        reentries = r.reentries + CASE WHEN r.status = 'processing' THEN 1 ELSE 0 END,
        handler_mode = EXCLUDED.handler_mode,
        message_type = EXCLUDED.message_type,
        lease_owner = EXCLUDED.lease_owner,
        lease_token = EXCLUDED.lease_token,
        lease_expires_at = EXCLUDED.lease_expires_at,
        effect_started = EXCLUDED.effect_started,
        next_attempt_at = NULL,
        parked_at = NULL,
        id_source = COALESCE(r.id_source, EXCLUDED.id_source),
        payload = CASE WHEN COALESCE(left(r.error_class, 11) = 'NO_HANDLER:', false)
                       THEN EXCLUDED.payload ELSE r.payload END,
        headers = CASE WHEN COALESCE(left(r.error_class, 11) = 'NO_HANDLER:', false)
                       THEN EXCLUDED.headers ELSE r.headers END,
        error_class = CASE WHEN COALESCE(left(r.error_class, 11) = 'NO_HANDLER:', false)
                           THEN NULL ELSE r.error_class END,
        updated_at = now()"#,
            restamp!()
        )
    };
}

/// The bookkeeping of an insert statement (no trigger counts inserts since migration
/// `20261203000065_lean_write_path`): the records it created counted in `record_counts` under
/// `$status`, and the message types it stored added to `message_types` (in one order, so two
/// batches bringing the same new types wait on each other rather than deadlock). `$rows` names
/// the insert's CTE, which returns `created` (`xmax = 0`) and `message_type`; `$1` is the group.
/// Every statement that inserts into `dedup_records` must carry it.
macro_rules! count_created {
    ($rows:literal, $status:literal) => {
        concat!(
            r#", counted AS (
    INSERT INTO {s}.record_counts (consumer_group, status, n)
    SELECT $1, '"#,
            $status,
            r#"', count(*) FROM "#,
            $rows,
            r#" WHERE created HAVING count(*) > 0
), typed AS (
    INSERT INTO {s}.message_types (message_type)
    SELECT DISTINCT message_type FROM "#,
            $rows,
            r#" ORDER BY 1
    ON CONFLICT DO NOTHING
)"#
        )
    };
}

/// A leased claim's attempt rows (`$worker`: the parameter naming the worker; `$1` is the
/// group): the attempt it opens, named by its endpoint (group and type) for the console's
/// endpoint cards, and the superseded one it closes as `lease_lost` when it took an expired
/// lease over.
macro_rules! leased_attempts {
    ($worker:literal) => {
        concat!(
            r#", attempt AS (
    INSERT INTO {s}.record_attempts (record_id, attempt, worker, started_at, consumer_group, message_type)
    SELECT id, attempts, "#,
            $worker,
            r#", now(), $1, message_type FROM claimed
), superseded AS (
    UPDATE {s}.record_attempts a SET ended_at = now(), outcome = 'lease_lost', taken_over_by = "#,
            $worker,
            r#",
           error = 'the lease expired; taken over by ' || "#,
            $worker,
            r#"
    FROM claimed c WHERE a.record_id = c.id AND a.ended_at IS NULL AND a.attempt < c.attempts
)"#
        )
    };
}

#[cfg(feature = "testing")]
/// Claim: insert, or take over a claimable record; for leased handlers the same statement
/// opens the attempt row (a transactional attempt is written when it ends, in its transaction).
/// `$17` says whether an expired lease may be reclaimed; `$18` is the AMQP `type` property. `prior` reads the status the statement
/// started from, only to tell a lease takeover apart for metrics.
macro_rules! claim_sql {
    ($attempt_cte:expr, $columns:literal) => {
        concat!(
            r#"
WITH prior AS (
    SELECT status FROM {s}.dedup_records WHERE consumer_group = $1 AND message_id = $2
), claimed AS (
    INSERT INTO {s}.dedup_records AS r (
        consumer_group, message_id, message_type, status, handler_mode, attempts, max_attempts,
        lease_owner, lease_token, lease_expires_at, payload_hash, payload, headers, content_type,
        source_broker, source_exchange, source_routing_key, source_queue, type_property)
    VALUES ($1, $2, $3, 'processing', $4, 1, $5,
            $6, $7, now() + $8 * interval '1 millisecond', $9, $10, $11, $12,
            $13, $14, $15, $16, $18)
    "#,
            take_over!(),
            "\n    WHERE ",
            same_type!(),
            " AND (",
            claimable!(),
            r#"
       OR ($17 AND r.status = 'processing' AND r.lease_expires_at < now() AND r.lease_owner IS DISTINCT FROM "#,
            held_owner!(),
            r#"))
    RETURNING r.id, r.attempts, r.max_attempts, (r.xmax = 0) AS created, r.first_seen_at, r.message_type
)"#,
            count_created!("claimed", "processing"),
            $attempt_cte,
            r#"
SELECT c.id, c.attempts, c.max_attempts, c.created, c.first_seen_at, now() AS claimed_at,
       COALESCE((SELECT status FROM prior) = 'processing', false) AS took_over"#,
            $columns,
            r#"
FROM claimed c
"#
        )
    };
}
#[cfg(feature = "testing")]
pub(super) const CLAIM_TX_SQL: &str = claim_sql!("", "");
#[cfg(feature = "testing")]
/// A leased claim opens its attempt row, and when it took an expired lease over, closes the
/// superseded attempt as `lease_lost`: when (now) and by whom. It reports the runs so far, this
/// one included (`calls`: the attempt rows, which the statement's snapshot shows without the
/// one it opens), and what the last one's far side answered (`previous_status`). The record's
/// attempt rows are read through `record_attempts_record_idx` and sorted (`OFFSET 0` keeps the
/// planner from walking the whole primary key backwards for `ORDER BY id DESC LIMIT 1`
/// instead: 40 ms per claim at 80 000 attempt rows). The attempt row names its endpoint (group and
/// type), which the console's endpoint cards read.
pub(super) const CLAIM_LEASED_SQL: &str = claim_sql!(
    leased_attempts!("$6"),
    r#",
       (SELECT count(*) FROM {s}.record_attempts a WHERE a.record_id = c.id)::int + 1 AS calls,
       (SELECT a.answer_status FROM (SELECT a.id, a.answer_status FROM {s}.record_attempts a
                                     WHERE a.record_id = c.id OFFSET 0) a
        ORDER BY a.id DESC LIMIT 1) AS previous_status"#
);

/// The duplicate check after a claim found nothing claimable (set-based: `$2`..`$4` are the
/// message ids, payload hashes and message types): counts the delivery on the record, flags a
/// payload conflict, parks a delivery of a stuck record (the claim would have taken it if reclaim
/// were allowed) and reports the record's state. A delivery of a record under a live lease is sent
/// back to be judged again later, and counted then: not now, or each return would count again.
/// A delivery of another message type ([`same_type`]) is no duplicate: nothing is counted on the
/// record, `same_type` says so.
pub(super) const NOTE_DUPLICATES_SQL: &str = concat!(
    r#"
UPDATE {s}.dedup_records r SET
    duplicate_count = r.duplicate_count + CASE WHEN (r.status = 'processing' AND r.lease_expires_at >= now())
                                                    OR NOT "#,
    same_type_of_delivery!(),
    r#" THEN 0 ELSE 1 END,
    last_duplicate_at = CASE WHEN (r.status = 'processing' AND r.lease_expires_at >= now()) OR NOT "#,
    same_type_of_delivery!(),
    r#"
                             THEN r.last_duplicate_at ELSE now() END,
    payload_conflicts = r.payload_conflicts + CASE WHEN r.payload_hash = d.payload_hash
                                                        OR (r.status = 'processing' AND r.lease_expires_at >= now())
                                                        OR NOT "#,
    same_type_of_delivery!(),
    r#" THEN 0 ELSE 1 END,
    parked_at = CASE WHEN r.status = 'processing' AND r.lease_expires_at < now() AND "#,
    same_type_of_delivery!(),
    r#"
                     THEN now() ELSE r.parked_at END
FROM unnest($2::text[], $3::bytea[], $4::text[]) AS d(message_id, payload_hash, message_type)
WHERE r.consumer_group = $1 AND r.message_id = d.message_id
RETURNING r.id, r.message_id, r.status, r.lease_expires_at,
          COALESCE(r.lease_expires_at < now(), false) AS lease_expired,
          r.payload_hash = d.payload_hash AS same_payload, "#,
    same_type_of_delivery!(),
    r#" AS same_type,
          (extract(epoch FROM now() - r.first_seen_at) * 1000)::bigint AS delay_ms,
          (r.status = 'processing' AND r.lease_expires_at < now() AND "#,
    same_type_of_delivery!(),
    r#") AS parked
"#
);

/// The rows of a transactional batch claim, in message-id order (one lock order for every
/// batch); `$1` group, `$2` max attempts, `$6`..`$14` the items' columns (`$14` where each id
/// came from, [`crate::message::IdSourceKind::code`]).
macro_rules! claim_many_rows {
    () => {
        r#"
FROM unnest($6::text[], $7::text[], $8::bytea[], $9::text[], $10::text[], $11::text[], $12::text[], $13::text[],
            $14::"char"[])
     AS i(message_id, message_type, payload_hash, content_type, broker, exchange, routing_key, queue, id_source)
ORDER BY i.message_id
"#
    };
}

/// Claims of a transactional batch ([`crate::store::ClaimAs::Processing`]): one INSERT ... ON
/// CONFLICT for all messages under the lease `$3`..`$5`. No payload or headers (stored only if
/// the attempt fails).
pub(super) const CLAIM_MANY_SQL: &str = concat!(
    r#"
WITH claimed AS (
    INSERT INTO {s}.dedup_records AS r (
        consumer_group, message_id, message_type, status, handler_mode, attempts, max_attempts,
        lease_owner, lease_token, lease_expires_at, payload_hash, content_type,
        source_broker, source_exchange, source_routing_key, source_queue, id_source)
    SELECT $1, i.message_id, i.message_type, 'processing', 'transactional', 1, $2,
           $3, $4, now() + $5 * interval '1 millisecond', i.payload_hash, i.content_type,
           i.broker, i.exchange, i.routing_key, i.queue, i.id_source"#,
    claim_many_rows!(),
    take_over!(),
    "\n    WHERE ",
    same_type!(),
    " AND ",
    claimable!(),
    r#"
    RETURNING r.id, r.message_id, r.message_type, r.attempts, r.max_attempts, (r.xmax = 0) AS created,
              r.first_seen_at, now() AS claimed_at
)"#,
    count_created!("claimed", "processing"),
    r#"
SELECT id, message_id, attempts, max_attempts, created, first_seen_at, claimed_at FROM claimed
"#
);

/// Claims of a transactional batch straight into `succeeded`
/// ([`crate::store::ClaimAs::Succeeded`]): the claimable rows of [`CLAIM_MANY_SQL`] with what
/// [`COMPLETE_MANY_SQL`] would write on them, and the attempt rows of retries (`$3` the worker;
/// a first-try success has none, see [`COMPLETE_TX_SQL`]). `$4`
/// and `$5` (the lease) are bound but unused: the record is never `processing` outside the
/// transaction.
pub(super) const CLAIM_MANY_SUCCEEDED_SQL: &str = concat!(
    r#"
WITH claimed AS (
    INSERT INTO {s}.dedup_records AS r (
        consumer_group, message_id, message_type, status, handler_mode, attempts, max_attempts,
        completed_at, payload_hash, content_type,
        source_broker, source_exchange, source_routing_key, source_queue, id_source)
    SELECT $1, i.message_id, i.message_type, 'succeeded', 'transactional', 1, $2,
           now(), i.payload_hash, i.content_type,
           i.broker, i.exchange, i.routing_key, i.queue, i.id_source"#,
    claim_many_rows!(),
    r#"
    ON CONFLICT (consumer_group, message_id) DO UPDATE SET
        status = 'succeeded',
        version = r.version + 1,
        attempts = r.attempts + 1,
        handler_mode = 'transactional',
        message_type = EXCLUDED.message_type,
        lease_owner = NULL, lease_token = NULL, lease_expires_at = NULL,
        next_attempt_at = NULL, parked_at = NULL, payload = NULL, headers = NULL, error_class = NULL,
        id_source = COALESCE(r.id_source, EXCLUDED.id_source),
        completed_at = now(), updated_at = now()"#,
    restamp!(),
    r#"
    WHERE "#,
    same_type!(),
    " AND ",
    claimable!(),
    r#"
    RETURNING r.id, r.message_id, r.message_type, r.attempts, r.max_attempts, (r.xmax = 0) AS created,
              r.first_seen_at, now() AS claimed_at
)"#,
    count_created!("claimed", "succeeded"),
    r#", attempt AS (
    INSERT INTO {s}.record_attempts (record_id, attempt, worker, started_at, ended_at, outcome)
    SELECT id, attempts, $3, now(), now(), 'succeeded' FROM claimed WHERE attempts > 1
)
SELECT id, message_id, attempts, max_attempts, created, first_seen_at, claimed_at FROM claimed
"#
);

/// Claims of a leased batch ([`crate::store::ClaimAs::Leased`]): one INSERT ... ON CONFLICT
/// for all messages under the lease `$3`..`$5`, with payload, headers and AMQP `type` property
/// (`$14`..`$16`; a leased record keeps them until it succeeds), each claim opening its attempt
/// row and closing a superseded one as `lease_lost`, as [`CLAIM_LEASED_SQL`] does for one.
/// `$17`: the message ids whose type may take over an expired lease (`on_lease_expiry =
/// reclaim`) unless it is a late duplicate held for an operator ([`held_owner`]). `$18`: whether each item's effect starts at once (`effect_started`; the others are
/// marked by [`MARK_EFFECTS_STARTED_SQL`] before they start). A record whose lease expired
/// before its effect started (`effect_started = false`) is taken over whatever the policy: no
/// effect was attempted. `$19`: where each id came from. `prior` reads the status each record started from, only to tell a
/// takeover apart.
pub(super) const CLAIM_MANY_LEASED_SQL: &str = concat!(
    r#"
WITH prior AS (
    SELECT p.message_id, p.status FROM {s}.dedup_records p
    WHERE p.consumer_group = $1 AND p.message_id = ANY($6::text[])
), claimed AS (
    INSERT INTO {s}.dedup_records AS r (
        consumer_group, message_id, message_type, status, handler_mode, attempts, max_attempts,
        lease_owner, lease_token, lease_expires_at, payload_hash, payload, headers, content_type,
        source_broker, source_exchange, source_routing_key, source_queue, type_property, effect_started, id_source)
    SELECT $1, i.message_id, i.message_type, 'processing', 'leased', 1, $2,
           $3, $4, now() + $5 * interval '1 millisecond', i.payload_hash, i.payload, i.headers, i.content_type,
           i.broker, i.exchange, i.routing_key, i.queue, i.type_property, i.started, i.id_source
    FROM unnest($6::text[], $7::text[], $8::bytea[], $9::text[], $10::text[], $11::text[], $12::text[], $13::text[],
                $14::bytea[], $15::jsonb[], $16::text[], $18::boolean[], $19::"char"[])
         AS i(message_id, message_type, payload_hash, content_type, broker, exchange, routing_key, queue,
              payload, headers, type_property, started, id_source)
    ORDER BY i.message_id"#,
    take_over!(),
    "\n    WHERE ",
    same_type!(),
    " AND (",
    claimable!(),
    r#"
       OR (r.status = 'processing' AND r.lease_expires_at < now()
           AND ((r.message_id = ANY($17::text[]) AND r.lease_owner IS DISTINCT FROM "#,
    held_owner!(),
    r#") OR r.effect_started = false)))
    RETURNING r.id, r.message_id, r.message_type, r.attempts, r.max_attempts, (r.xmax = 0) AS created,
              r.first_seen_at
)"#,
    count_created!("claimed", "processing"),
    leased_attempts!("$3"),
    r#"
SELECT c.id, c.message_id, c.attempts, c.max_attempts, c.created, c.first_seen_at, now() AS claimed_at,
       COALESCE(p.status = 'processing', false) AS took_over,
       (SELECT count(*) FROM {s}.record_attempts a WHERE a.record_id = c.id)::int + 1 AS calls,
       (SELECT a.answer_status FROM (SELECT a.id, a.answer_status FROM {s}.record_attempts a
                                     WHERE a.record_id = c.id OFFSET 0) a
        ORDER BY a.id DESC LIMIT 1) AS previous_status
FROM claimed c LEFT JOIN prior p ON p.message_id = c.message_id
"#
);

mod settle;
use settle::*;

/// Every statement of the store with the engine's schema in place of `{s}`, built once per
/// store.
#[derive(Debug)]
pub(super) struct Statements {
    #[cfg(feature = "testing")]
    pub claim_tx: String,
    #[cfg(feature = "testing")]
    pub claim_leased: String,
    pub note_duplicates: String,
    pub claim_many: String,
    pub claim_many_succeeded: String,
    pub claim_many_leased: String,
    pub complete_many: String,
    pub complete_many_leased: String,
    #[cfg(feature = "testing")]
    pub complete_tx: String,
    #[cfg(feature = "testing")]
    pub complete_leased: String,
    pub fail_tx: String,
    pub fail_leased: String,
    pub defer: String,
    pub poison: String,
    pub lock_record: String,
    pub extend_leases: String,
    pub mark_effects_started: String,
    pub release_unstarted: String,
    pub late_effect: String,
    pub add_fast_path_duplicates: String,
}

impl Statements {
    pub fn new(schema: &crate::db::Schema) -> Self {
        let s = schema.quoted();
        let render = |template: &str| template.replace("{s}", &s);
        Self {
            #[cfg(feature = "testing")]
            claim_tx: render(CLAIM_TX_SQL),
            #[cfg(feature = "testing")]
            claim_leased: render(CLAIM_LEASED_SQL),
            note_duplicates: render(NOTE_DUPLICATES_SQL),
            claim_many: render(CLAIM_MANY_SQL),
            claim_many_succeeded: render(CLAIM_MANY_SUCCEEDED_SQL),
            claim_many_leased: render(CLAIM_MANY_LEASED_SQL),
            complete_many: render(COMPLETE_MANY_SQL),
            complete_many_leased: render(COMPLETE_MANY_LEASED_SQL),
            #[cfg(feature = "testing")]
            complete_tx: render(COMPLETE_TX_SQL),
            #[cfg(feature = "testing")]
            complete_leased: render(COMPLETE_LEASED_SQL),
            fail_tx: render(FAIL_TX_SQL),
            fail_leased: render(FAIL_LEASED_SQL),
            defer: render(DEFER_SQL),
            poison: render(POISON_SQL),
            lock_record: render(LOCK_RECORD_SQL),
            extend_leases: render(EXTEND_LEASES_SQL),
            mark_effects_started: render(MARK_EFFECTS_STARTED_SQL),
            release_unstarted: render(RELEASE_UNSTARTED_SQL),
            late_effect: render(LATE_EFFECT_SQL),
            add_fast_path_duplicates: render(ADD_FAST_PATH_DUPLICATES_SQL),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_table_is_named_with_the_schema() {
        let sql = Statements::new(&crate::db::Schema::parse("ops_x").unwrap());
        let all = format!("{sql:?}");
        assert!(!all.contains("{s}"), "a placeholder was left");
        let unqualified = regex_free_find(&all, &["dedup_records", "record_attempts", "record_counts", "message_types"]);
        assert_eq!(unqualified, None, "an unqualified table in the store's SQL");
        assert!(sql.claim_many.contains("INSERT INTO \"ops_x\".dedup_records"), "{}", sql.claim_many);
    }

    /// The first table name in `text` not preceded by `".` (the end of a quoted schema).
    fn regex_free_find(text: &str, tables: &[&str]) -> Option<String> {
        tables.iter().find_map(|t| {
            text.match_indices(t)
                .find(|(at, _)| !text[..*at].ends_with("\"."))
                .map(|(at, _)| text[at.saturating_sub(30)..(at + t.len()).min(text.len())].to_owned())
        })
    }
}
