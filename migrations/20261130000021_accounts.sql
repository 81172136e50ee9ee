-- Operator accounts, their API tokens, and the login-failure counters of the throttle.
-- (The session table, tower_sessions.session, is created by the session store at start-up.)
CREATE TABLE users (
    id            BIGSERIAL PRIMARY KEY,
    -- Letters, digits, `.`, `_`, `-`; 1 to 64 characters; unique regardless of case.
    name          TEXT NOT NULL,
    role          TEXT NOT NULL CONSTRAINT users_role_check CHECK (role IN ('viewer', 'operator', 'admin')),
    -- argon2id in PHC string form (`$argon2id$v=19$m=...`).
    password_hash TEXT NOT NULL,
    disabled      BOOLEAN NOT NULL DEFAULT false,
    created_at    TIMESTAMPTZ NOT NULL DEFAULT now(),
    updated_at    TIMESTAMPTZ NOT NULL DEFAULT now(),
    last_login_at TIMESTAMPTZ
);
CREATE UNIQUE INDEX users_name_key ON users (lower(name));

-- Per-user API tokens for REST automation (`Authorization: Bearer <token>`). Only the SHA-256 of
-- the token is stored; the token itself is shown once, at creation.
CREATE TABLE api_tokens (
    id           BIGSERIAL PRIMARY KEY,
    user_id      BIGINT NOT NULL REFERENCES users (id) ON DELETE CASCADE,
    -- What the owner calls it (`grafana`, `ci`).
    name         TEXT NOT NULL,
    -- The token's first characters, to tell tokens apart in lists.
    prefix       TEXT NOT NULL,
    token_sha256 BYTEA NOT NULL CONSTRAINT api_tokens_sha256_key UNIQUE,
    created_at   TIMESTAMPTZ NOT NULL DEFAULT now(),
    last_used_at TIMESTAMPTZ,
    revoked_at   TIMESTAMPTZ
);
CREATE INDEX api_tokens_user_idx ON api_tokens (user_id, id);

-- Failed logins per key (`account:<lower name>` or `address:<ip>`) within a window.
CREATE TABLE login_failures (
    key          TEXT PRIMARY KEY,
    failures     INTEGER NOT NULL,
    window_start TIMESTAMPTZ NOT NULL
);
