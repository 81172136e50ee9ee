-- The audit log: one row per operator or account action (who, when, what, why, on which records,
-- with what counts and outcome). Written in the same transaction as the action where there is
-- one, so an action that rolled back leaves a `failed` entry only when written separately.
CREATE TABLE audit_log (
    id             BIGSERIAL PRIMARY KEY,
    at             TIMESTAMPTZ NOT NULL DEFAULT now(),
    -- `user:<name>`, `cli:<os user>`, `scheduler`, or `anonymous` for failed logins.
    actor          TEXT NOT NULL,
    -- dotted verb: `record.release`, `record.requeue`, `bulk.requeue.start`, `cleanup.run`,
    -- `auth.login`, `auth.login_failed`, `user.add`, ...
    action         TEXT NOT NULL,
    outcome        TEXT NOT NULL CHECK (outcome IN ('ok', 'refused', 'failed')),
    reason         TEXT,
    consumer_group TEXT,
    -- The records acted on, by message id (empty for filter-based or account actions).
    message_ids    TEXT[] NOT NULL DEFAULT '{}',
    -- The filter of a bulk action, counts (done/skipped/failed/deleted), anything else.
    detail         JSONB NOT NULL DEFAULT '{}',
    -- Client address for account actions, request id for web requests.
    source         TEXT
);

CREATE INDEX audit_log_at_idx ON audit_log (at DESC, id DESC);
CREATE INDEX audit_log_actor_idx ON audit_log (actor, at DESC);
CREATE INDEX audit_log_action_idx ON audit_log (action, at DESC);
-- A record's detail page lists the entries that name it.
CREATE INDEX audit_log_message_ids_idx ON audit_log USING GIN (message_ids);
