//! The SQL statements of [`super::PgStore`]: claims, duplicate notes, completions, failures and
//! poison records. Each is one statement so that a claim or a transition is atomic; the rules
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
        "(r.message_type = d.message_type OR COALESCE(left(r.error_class, 11) = 'NO_HANDLER:', false))"
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
/// the exception: a type mapping added since maps its copies to another type.
macro_rules! same_type {
    () => {
        "(r.message_type = EXCLUDED.message_type OR COALESCE(left(r.error_class, 11) = 'NO_HANDLER:', false))"
    };
}

/// How a claim takes over an existing, claimable record (the `ON CONFLICT` branch shared by the
/// single and the batch claim): a new lease, one more attempt, counted as a re-entry when it
/// was still `processing` (an expired lease), and whether its effect may have started as the
/// claim says (NULL: unknown, when the claim does not say). A record without an id source (a
/// `NO_HANDLER` dead letter, a record from before migration 070) takes the claim's.
macro_rules! take_over {
    () => {
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
        updated_at = now()"#
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
            r#" AND ((r.status = 'failed' AND r.attempts < r.max_attempts)
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
    r#" AND r.status = 'failed' AND r.attempts < r.max_attempts
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
        completed_at = now(), updated_at = now()
    WHERE "#,
    same_type!(),
    r#" AND r.status = 'failed' AND r.attempts < r.max_attempts
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
    r#" AND ((r.status = 'failed' AND r.attempts < r.max_attempts)
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

/// Completions of a leased batch, fenced by each record's lease token, with their attempt
/// rows closed with the effect's answer: `$1` record ids, `$2` lease tokens, `$3`..`$5` the
/// answers (status, latency in ms, summary). Returns the ids completed.
pub(super) const COMPLETE_MANY_LEASED_SQL: &str = r#"
WITH c AS (
    SELECT * FROM unnest($1::bigint[], $2::uuid[], $3::smallint[], $4::int[], $5::text[])
             AS c(id, token, answer_status, latency_ms, answer)
), done AS (
    UPDATE {s}.dedup_records r SET
        status = 'succeeded', version = r.version + 1, lease_owner = NULL, lease_token = NULL, lease_expires_at = NULL,
        completed_at = now(), updated_at = now(), next_attempt_at = NULL, parked_at = NULL,
        payload = NULL, headers = NULL, error_class = NULL
    FROM c WHERE r.id = c.id AND r.status = 'processing' AND r.lease_token = c.token
    RETURNING r.id, r.attempts
), attempt AS (
    UPDATE {s}.record_attempts a SET ended_at = now(), outcome = 'succeeded',
           answer_status = c.answer_status, latency_ms = c.latency_ms, answer = c.answer
    FROM done JOIN c ON c.id = done.id
    WHERE a.record_id = done.id AND a.attempt = done.attempts AND a.ended_at IS NULL
)
SELECT id FROM done
"#;

/// Completions of a transactional batch with the attempt rows of retries (see
/// [`COMPLETE_TX_SQL`]); `$3` is the worker, `$4` when the claims were made.
pub(super) const COMPLETE_MANY_SQL: &str = r#"
WITH done AS (
    UPDATE {s}.dedup_records r SET
        status = 'succeeded', version = r.version + 1, lease_owner = NULL, lease_token = NULL, lease_expires_at = NULL,
        completed_at = now(), updated_at = now(), next_attempt_at = NULL, parked_at = NULL,
        payload = NULL, headers = NULL, error_class = NULL
    FROM unnest($1::bigint[]) AS c(id)
    WHERE r.id = c.id AND r.status = 'processing' AND r.lease_token = $2
    RETURNING r.id, r.attempts
), attempt AS (
    INSERT INTO {s}.record_attempts (record_id, attempt, worker, started_at, ended_at, outcome)
    SELECT id, attempts, $3, $4, now(), 'succeeded' FROM done WHERE attempts > 1
)
SELECT id FROM done
"#;

#[cfg(feature = "testing")]
/// Completion: `succeeded`, lease and stored payload cleared, attempt closed.
macro_rules! complete_sql {
    ($attempt_cte:literal) => {
        concat!(
            r#"
WITH done AS (
    UPDATE {s}.dedup_records SET
        status = 'succeeded', version = version + 1, lease_owner = NULL, lease_token = NULL, lease_expires_at = NULL,
        completed_at = now(), updated_at = now(), next_attempt_at = NULL, parked_at = NULL,
        payload = NULL, headers = NULL, error_class = NULL
    WHERE id = $1 AND status = 'processing' AND lease_token = $2
    RETURNING id, attempts
), attempt AS ("#,
            $attempt_cte,
            r#")
SELECT count(*) FROM done
"#
        )
    };
}
#[cfg(feature = "testing")]
/// Transactional attempts are written when they end (their claim may be rolled back); `$3` is
/// the worker, `$4` when the claim was made. A first-try success writes none: the record says
/// it all (attempt 1, `succeeded`, `completed_at`; the console shows it as the attempt, see
/// `console::records`), so attempt rows start at the first failure.
pub(super) const COMPLETE_TX_SQL: &str = complete_sql!(
    "INSERT INTO {s}.record_attempts (record_id, attempt, worker, started_at, ended_at, outcome)
     SELECT id, attempts, $3, $4, now(), 'succeeded' FROM done WHERE attempts > 1"
);
#[cfg(feature = "testing")]
/// Leased attempts were opened by the claim; `$3`..`$5` the effect's answer (status, latency in
/// ms, summary).
pub(super) const COMPLETE_LEASED_SQL: &str = complete_sql!(
    "UPDATE {s}.record_attempts a SET ended_at = now(), outcome = 'succeeded',
            answer_status = $3, latency_ms = $4, answer = $5
     FROM done WHERE a.record_id = done.id AND a.attempt = done.attempts AND a.ended_at IS NULL"
);

/// A failure, fenced by the lease token. `$7`..`$9` and `$12`: payload, headers, content type
/// and AMQP `type` property (kept by a transactional failure, whose claim stored none; a leased
/// claim stored them already).
macro_rules! fail_sql {
    ($keep_payload:literal, $attempt_cte:literal) => {
        concat!(
            r#"
WITH failed AS (
    UPDATE {s}.dedup_records SET
        status = $3, version = version + 1, lease_owner = NULL, lease_token = NULL, lease_expires_at = NULL,
        last_error = $4, error_class = $5,
        next_attempt_at = CASE WHEN $3 = 'failed' THEN now() + $6 * interval '1 millisecond' END,
        updated_at = now()"#,
            $keep_payload,
            r#"
    WHERE id = $1 AND status = 'processing' AND lease_token = $2
    RETURNING id, attempts, lease_owner
), attempt AS ("#,
            $attempt_cte,
            r#")
SELECT count(*) FROM failed
"#
        )
    };
}
/// Transactional: payload kept now, attempt row written now (`$10` worker, `$11` claim time).
pub(super) const FAIL_TX_SQL: &str = fail_sql!(
    ", payload = $7, headers = $8, content_type = COALESCE($9, content_type), type_property = $12",
    "INSERT INTO {s}.record_attempts (record_id, attempt, worker, started_at, ended_at, outcome, error)
     SELECT id, attempts, $10, $11, now(), $3, $4 FROM failed"
);
/// Leased: the claim opened the attempt row; `$7`..`$9` the effect's answer, `$10` whether the
/// far side said it was still working on it.
pub(super) const FAIL_LEASED_SQL: &str = fail_sql!(
    "",
    "UPDATE {s}.record_attempts a SET ended_at = now(), outcome = $3, error = $4,
            answer_status = $7, latency_ms = $8, answer = $9, in_progress = $10
     FROM failed WHERE a.record_id = failed.id AND a.attempt = failed.attempts AND a.ended_at IS NULL"
);

/// A leased claim given back without counting its attempt (`$1` record, `$2` lease token, `$3`
/// error, `$4` its class, `$5` retry delay in ms, `$6` how long a run of such answers stays
/// uncounted, in ms, NULL: always, `$7`..`$9` the answer, `$10` whether the far side said it
/// was still working on it): `failed`, one attempt less, the attempt closed as `deferred` —
/// while the run of such answers (attempts `in_progress`, deferred or counted, since the last
/// closed attempt that was not) started less than `$6` ago. Its first one is this very attempt
/// when there is none before.
pub(super) const DEFER_SQL: &str = r#"
WITH streak AS (
    SELECT min(a.started_at) AS since FROM {s}.record_attempts a
    WHERE a.record_id = $1 AND a.in_progress
      AND a.started_at > COALESCE((SELECT max(b.ended_at) FROM {s}.record_attempts b
                                   WHERE b.record_id = $1 AND NOT b.in_progress), '-infinity')
), deferred AS (
    UPDATE {s}.dedup_records SET
        status = 'failed', version = version + 1, attempts = attempts - 1,
        lease_owner = NULL, lease_token = NULL, lease_expires_at = NULL,
        last_error = $3, error_class = $4,
        next_attempt_at = now() + $5 * interval '1 millisecond', updated_at = now()
    WHERE id = $1 AND status = 'processing' AND lease_token = $2
      AND ($6::bigint IS NULL OR COALESCE((SELECT since FROM streak), now()) > now() - $6 * interval '1 millisecond')
    RETURNING id, attempts
), attempt AS (
    UPDATE {s}.record_attempts a SET ended_at = now(), outcome = 'deferred', error = $3,
           answer_status = $7, latency_ms = $8, answer = $9, in_progress = $10
    FROM deferred d WHERE a.record_id = d.id AND a.attempt = d.attempts + 1 AND a.ended_at IS NULL
)
SELECT count(*) FROM deferred
"#;

/// A message that never reaches a handler, stored `dead` at once: poison (`$16` true), or a
/// type without a handler (false: requeueable once the handler exists); `$18` where its id came
/// from (NULL for a synthetic id). A copy of one already
/// stored counts as a duplicate on it.
pub(super) const POISON_SQL: &str = concat!(
    r#"
WITH stored AS (
    INSERT INTO {s}.dedup_records AS r (
        consumer_group, message_id, message_type, status, handler_mode, attempts, max_attempts,
        last_error, error_class, payload_hash, payload, payload_truncated, headers, content_type,
        source_broker, source_exchange, source_routing_key, source_queue, poison, type_property, id_source)
    VALUES ($1, $2, $3, 'dead', NULL, 0, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17, $18)
    ON CONFLICT (consumer_group, message_id) DO UPDATE SET
        id_source = COALESCE(r.id_source, EXCLUDED.id_source),
        duplicate_count = r.duplicate_count + 1,
        last_duplicate_at = now(),
        payload_conflicts = r.payload_conflicts + CASE WHEN r.payload_hash = EXCLUDED.payload_hash THEN 0 ELSE 1 END
    RETURNING r.id, (r.xmax = 0) AS created, r.message_type
)"#,
    count_created!("stored", "dead"),
    r#"
SELECT id, created FROM stored
"#
);

/// A superseded worker's effect ran although its completion was refused (`$1` record, `$2` its
/// attempt, `$3`..`$5` its late answer): flagged, the attempt closed as `lease_lost` if the
/// takeover has not closed it. Deferred rows of the same number are earlier runs.
pub(super) const LATE_EFFECT_SQL: &str = "
UPDATE {s}.record_attempts SET late_effect = true, outcome = COALESCE(outcome, 'lease_lost'),
       ended_at = COALESCE(ended_at, now()),
       answer_status = COALESCE($3, answer_status), latency_ms = COALESCE($4, latency_ms),
       answer = COALESCE($5, answer)
WHERE record_id = $1 AND attempt = $2 AND outcome IS DISTINCT FROM 'deferred'";

/// Heartbeat of a worker: the leases of all its in-flight records (`$1` ids, `$2` their lease
/// tokens) extended by `$3` ms from now, each fenced by its token. Returns the ids still held.
pub(super) const EXTEND_LEASES_SQL: &str = "
UPDATE {s}.dedup_records r SET lease_expires_at = now() + $3 * interval '1 millisecond'
FROM unnest($1::bigint[], $2::uuid[]) AS l(id, token)
WHERE r.id = l.id AND r.status = 'processing' AND r.lease_token = l.token
RETURNING r.id";

/// A wave of leased claims whose effects are about to start (`$1` ids, `$2` their lease tokens):
/// `effect_started`, each fenced by its token, committed before any of them starts. Returns
/// the ids still held; the others' leases are lost.
pub(super) const MARK_EFFECTS_STARTED_SQL: &str = "
UPDATE {s}.dedup_records r SET effect_started = true
FROM unnest($1::bigint[], $2::uuid[]) AS l(id, token)
WHERE r.id = l.id AND r.status = 'processing' AND r.lease_token = l.token
RETURNING r.id";

/// Leased claims whose effect never started, given back because their handler was paused
/// meanwhile (`$1` ids, `$2` their lease tokens, `$3` when the held copy is due, in ms): `failed`
/// with one attempt less, each fenced by its token, and the attempt row the claim opened
/// removed (no call was made: it is no attempt). Returns the ids given back.
pub(super) const RELEASE_UNSTARTED_SQL: &str = "
WITH released AS (
    UPDATE {s}.dedup_records r SET
        status = 'failed', version = r.version + 1, attempts = r.attempts - 1,
        lease_owner = NULL, lease_token = NULL, lease_expires_at = NULL, effect_started = NULL,
        next_attempt_at = now() + $3 * interval '1 millisecond', updated_at = now()
    FROM unnest($1::bigint[], $2::uuid[]) AS l(id, token)
    WHERE r.id = l.id AND r.status = 'processing' AND r.lease_token = l.token
    RETURNING r.id, r.attempts
), unopened AS (
    DELETE FROM {s}.record_attempts a USING released
    WHERE a.record_id = released.id AND a.attempt = released.attempts + 1 AND a.ended_at IS NULL
)
SELECT id FROM released";

/// Duplicates caught by the fast path, added to their records (`$1`..`$4`: groups, message
/// ids, copies, latest arrival).
pub(super) const ADD_FAST_PATH_DUPLICATES_SQL: &str = r#"
UPDATE {s}.dedup_records r SET duplicate_count = r.duplicate_count + d.copies,
       last_duplicate_at = GREATEST(r.last_duplicate_at, d.at)
FROM unnest($1::text[], $2::text[], $3::int[], $4::timestamptz[]) AS d(consumer_group, message_id, copies, at)
WHERE r.consumer_group = d.consumer_group AND r.message_id = d.message_id COLLATE "C"
"#;

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
