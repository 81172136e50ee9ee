//! The statements that settle claimed records: completions, failures and deferrals, poison
//! records, lease heartbeats and late effects, and the duplicates the Redis fast path caught
//! (see the parent module for the rules every statement follows).

/// The case of [`POISON_SQL`] in which a delivery without a handler carries the id of a record of
/// another message type, and is not that record's own message typed anew (as `same_type!` in the
/// parent module has it: a `NO_HANDLER` record of the same payload, or one that found no type):
/// a reused id, never its duplicate (DESIGN.md, "Reused ids and payload conflicts"); nothing is
/// counted on the record.
macro_rules! reused_id {
    () => {
        "(NOT EXCLUDED.poison AND NOT (r.message_type = EXCLUDED.message_type
          OR (COALESCE(left(r.error_class, 11) = 'NO_HANDLER:', false)
              AND (r.message_type = 'UNKNOWN' OR r.payload_hash = EXCLUDED.payload_hash))))"
    };
}

/// The case of [`POISON_SQL`] in which a copy without a handler makes its record `dead` again:
/// the record is a `NO_HANDLER` dead letter an operator requeued (`failed`) before any handler
/// ran (attempts 0), and the copy is no poison (`EXCLUDED.poison` false: it has no handler
/// either).
macro_rules! dead_again {
    () => {
        "(r.status = 'failed' AND r.attempts = 0 AND NOT EXCLUDED.poison
          AND COALESCE(left(r.error_class, 11) = 'NO_HANDLER:', false))"
    };
}

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
/// from (NULL for a synthetic id). A copy of one already stored counts as a duplicate on it —
/// but a copy without a handler of a `NO_HANDLER` record an operator requeued before its handler
/// existed (`failed`, no attempt) makes it `dead` again with the copy's reason, and is
/// dead-lettered again (`dead_lettered`): counted as a duplicate, it left the record `failed`
/// with nothing to retry it and its message acked. One that carries the id of a record of
/// another type ([`reused_id`]) counts nothing on it: `reused_of` names that record's type, and
/// the pipeline dead-letters the delivery and keeps its copy. `prior` reads the status the
/// statement started from, only to tell a record dead again apart: its row is locked first
/// ([`LOCK_RECORD_SQL`]), or a copy whose statement waited on another copy making the record
/// dead again read `failed` from its snapshot, found it `dead`, and was dead-lettered a second
/// time.
pub(super) const POISON_SQL: &str = concat!(
    r#"
WITH prior AS (
    SELECT status FROM {s}.dedup_records WHERE consumer_group = $1 AND message_id = $2
), stored AS (
    INSERT INTO {s}.dedup_records AS r (
        consumer_group, message_id, message_type, status, handler_mode, attempts, max_attempts,
        last_error, error_class, payload_hash, payload, payload_truncated, headers, content_type,
        source_broker, source_exchange, source_routing_key, source_queue, poison, type_property, id_source)
    VALUES ($1, $2, $3, 'dead', NULL, 0, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17, $18)
    ON CONFLICT (consumer_group, message_id) DO UPDATE SET
        id_source = COALESCE(r.id_source, EXCLUDED.id_source),
        status = CASE WHEN "#,
    dead_again!(),
    r#" THEN 'dead' ELSE r.status END,
        version = r.version + CASE WHEN "#,
    dead_again!(),
    r#" THEN 1 ELSE 0 END,
        message_type = CASE WHEN "#,
    dead_again!(),
    r#" THEN EXCLUDED.message_type ELSE r.message_type END,
        last_error = CASE WHEN "#,
    dead_again!(),
    r#" THEN EXCLUDED.last_error ELSE r.last_error END,
        error_class = CASE WHEN "#,
    dead_again!(),
    r#" THEN EXCLUDED.error_class ELSE r.error_class END,
        next_attempt_at = CASE WHEN "#,
    dead_again!(),
    r#" THEN NULL ELSE r.next_attempt_at END,
        updated_at = CASE WHEN "#,
    dead_again!(),
    r#" THEN now() ELSE r.updated_at END,
        duplicate_count = r.duplicate_count + CASE WHEN "#,
    dead_again!(),
    " OR ",
    reused_id!(),
    r#" THEN 0 ELSE 1 END,
        last_duplicate_at = CASE WHEN "#,
    dead_again!(),
    " OR ",
    reused_id!(),
    r#" THEN r.last_duplicate_at ELSE now() END,
        payload_conflicts = r.payload_conflicts + CASE WHEN r.payload_hash = EXCLUDED.payload_hash OR "#,
    dead_again!(),
    " OR ",
    reused_id!(),
    r#" THEN 0 ELSE 1 END
    RETURNING r.id, (r.xmax = 0) AS created, r.message_type, r.status, r.error_class, r.payload_hash
)"#,
    count_created!("stored", "dead"),
    r#"
SELECT id, created OR (status = 'dead' AND COALESCE((SELECT status FROM prior) = 'failed', false)) AS dead_lettered,
       CASE WHEN NOT created AND NOT $16 AND NOT (message_type = $3
                 OR (COALESCE(left(error_class, 11) = 'NO_HANDLER:', false)
                     AND (message_type = 'UNKNOWN' OR payload_hash = $7)))
            THEN message_type END AS reused_of
FROM stored
"#
);

/// Locks a record's row, if it exists (`$1` group, `$2` message id), before [`POISON_SQL`]: the
/// statement that follows starts from a snapshot that sees the row as it is, and no other
/// transaction changes it meanwhile. (`FOR UPDATE` in `prior` itself would not do: a CTE that
/// only the final `SELECT` reads is scanned after `stored` changed the row, and skips it.)
pub(super) const LOCK_RECORD_SQL: &str =
    "SELECT 1 FROM {s}.dedup_records WHERE consumer_group = $1 AND message_id = $2 FOR UPDATE";

/// A superseded worker's effect ran although its completion was refused (`$1` record, `$2` its
/// attempt, `$3`..`$5` its late answer): flagged, the attempt closed as `lease_lost` if the
/// takeover has not closed it. Deferred rows of the same number are earlier runs.
pub(super) const LATE_EFFECT_SQL: &str = "
UPDATE {s}.record_attempts SET late_effect = true, outcome = COALESCE(outcome, 'lease_lost'),
       ended_at = COALESCE(ended_at, now()),
       answer_status = COALESCE($3, answer_status), latency_ms = COALESCE($4, latency_ms),
       answer = COALESCE($5, answer)
WHERE record_id = $1 AND attempt = $2 AND outcome IS DISTINCT FROM 'deferred' AND outcome IS DISTINCT FROM 'succeeded'";

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
