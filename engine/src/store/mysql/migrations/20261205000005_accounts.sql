-- Operator accounts, their API tokens and the login throttle's counters (PostgreSQL's migration
-- 20261130000021), in MySQL's terms. MariaDB 10.11 and MySQL 8.0.16+ accept it.

CREATE TABLE users (
    id            BIGINT NOT NULL AUTO_INCREMENT,
    -- Letters, digits, `.`, `_`, `-`; 1 to 64 characters (checked by the engine).
    name          VARCHAR(64) NOT NULL,
    -- Unique regardless of case: PostgreSQL's unique index on lower(name) as a stored generated
    -- column of bytes (no collation folds accents, no PAD SPACE makes 'a' equal 'a ').
    name_key      VARBINARY(256) AS (LOWER(name)) STORED,
    role          VARCHAR(16) NOT NULL,
    -- argon2id in PHC string form (`$argon2id$v=19$m=...`).
    password_hash VARCHAR(255) NOT NULL,
    disabled      BOOLEAN NOT NULL DEFAULT FALSE,
    created_at    DATETIME(6) NOT NULL DEFAULT (UTC_TIMESTAMP(6)),
    updated_at    DATETIME(6) NOT NULL DEFAULT (UTC_TIMESTAMP(6)),
    last_login_at DATETIME(6) NULL,
    PRIMARY KEY (id),
    UNIQUE KEY users_name_key (name_key),
    CONSTRAINT users_role_check CHECK (role IN ('viewer', 'operator', 'admin'))
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_unicode_ci;

-- Per-user API tokens; only the SHA-256 of a token is stored.
CREATE TABLE api_tokens (
    id           BIGINT NOT NULL AUTO_INCREMENT,
    user_id      BIGINT NOT NULL,
    -- What the owner calls it: 1 to 64 characters, no control characters (checked by the engine).
    name         VARCHAR(64) NOT NULL,
    -- The token's first characters, to tell tokens apart in lists.
    prefix       VARCHAR(16) NOT NULL,
    token_sha256 BINARY(32) NOT NULL,
    created_at   DATETIME(6) NOT NULL DEFAULT (UTC_TIMESTAMP(6)),
    last_used_at DATETIME(6) NULL,
    revoked_at   DATETIME(6) NULL,
    PRIMARY KEY (id),
    UNIQUE KEY api_tokens_sha256_key (token_sha256),
    KEY api_tokens_user_idx (user_id, id),
    CONSTRAINT api_tokens_user_fk FOREIGN KEY (user_id) REFERENCES users (id) ON DELETE CASCADE
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_unicode_ci;

-- Failed logins per key (`account:<lower name>` or `address:<ip>`) within a window. `key` is a
-- reserved word in MySQL; the key is compared as bytes, as PostgreSQL compares text.
CREATE TABLE login_failures (
    throttle_key VARBINARY(512) NOT NULL,
    failures     INT NOT NULL,
    window_start DATETIME(6) NOT NULL,
    PRIMARY KEY (throttle_key)
) ENGINE = InnoDB;
