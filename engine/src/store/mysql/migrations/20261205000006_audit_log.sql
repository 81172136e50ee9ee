-- The audit log (PostgreSQL's migration 20261130000020), in MySQL's terms. PostgreSQL keeps the
-- records an entry names in a `text[]` under a GIN index; MySQL has neither, so they are kept
-- twice: as a JSON array on the entry (read with it) and one row each in `audit_log_messages`
-- (found by message id, as a record's detail page asks). Both are written in one transaction.

CREATE TABLE audit_log (
    id             BIGINT NOT NULL AUTO_INCREMENT,
    at             DATETIME(6) NOT NULL DEFAULT (UTC_TIMESTAMP(6)),
    -- `user:<name>`, `cli:<os user>`, `scheduler`, or `anonymous` for failed logins.
    actor          VARCHAR(512) COLLATE utf8mb4_bin NOT NULL,
    -- dotted verb: `record.release`, `bulk.requeue.start`, `auth.login`, `user.add`, ...
    action         VARCHAR(255) COLLATE utf8mb4_bin NOT NULL,
    outcome        VARCHAR(16) COLLATE utf8mb4_bin NOT NULL,
    reason         MEDIUMTEXT NULL,
    consumer_group VARCHAR(255) COLLATE utf8mb4_bin NULL,
    -- The records acted on, by message id: a JSON array of strings (empty for filter-based or
    -- account actions).
    message_ids    LONGTEXT NOT NULL,
    -- The filter of a bulk action, counts, anything else: a JSON object.
    detail         LONGTEXT NOT NULL,
    -- Client address for account actions, request id for web requests.
    source         TEXT NULL,
    PRIMARY KEY (id),
    KEY audit_log_at_idx (at, id),
    KEY audit_log_actor_idx (actor, at),
    KEY audit_log_action_idx (action, at),
    CONSTRAINT audit_log_outcome_check CHECK (outcome IN ('ok', 'refused', 'failed'))
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_unicode_ci;

CREATE TABLE audit_log_messages (
    -- As dedup_records.message_id: bytes, 512 = MAX_MESSAGE_ID_BYTES (engine/src/record.rs).
    message_id VARBINARY(512) NOT NULL,
    entry_id   BIGINT NOT NULL,
    PRIMARY KEY (message_id, entry_id),
    CONSTRAINT audit_log_messages_entry_fk FOREIGN KEY (entry_id) REFERENCES audit_log (id) ON DELETE CASCADE
) ENGINE = InnoDB;
