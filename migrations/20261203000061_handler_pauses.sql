-- Whether each handler takes deliveries, per (consumer group, message type) (docs/DESIGN.md,
-- "Pause and circuit breaker"). Shared by every process of the group: each reads the paused rows
-- of its group at most a second old, before it claims anything. While a handler is paused its
-- deliveries wait in the broker (the retry path's delay queues or retry topics): no record is
-- written, no attempt is spent, nothing is dead-lettered or discarded.
--
-- A running engine registers a row per handler it has (state `running`), so the console lists
-- every handler; the table holds one row per (group, type) and stays small.
CREATE TABLE handler_pauses (
    consumer_group TEXT NOT NULL,
    message_type   TEXT NOT NULL,
    -- `running`; `breaker` (paused by the circuit breaker: a run of transport failures or 5xx,
    -- probed every `probe_interval_ms`); `gone` (the service answered 410 Gone: paused until an
    -- operator resumes it); `operator` (paused by hand: `changed_by`, `reason`).
    state          TEXT NOT NULL DEFAULT 'running' CHECK (state IN ('running', 'breaker', 'gone', 'operator')),
    -- When the state began.
    since          TIMESTAMPTZ NOT NULL DEFAULT now(),
    -- Who set the state: `user:<name>` or `cli:<os user>` for an operator, `engine` for the
    -- circuit breaker and a 410.
    changed_by     TEXT,
    -- Why: the operator's reason, or the failure's text (its first line) that paused it.
    reason         TEXT,
    -- The last failure that paused it or kept it paused: its class (`HTTP_UNAVAILABLE`,
    -- `HTTP_TIMEOUT`, `HTTP_CONNECT`, `HTTP_GONE`, ...), HTTP status (NULL: no answer) and time.
    error_class    TEXT,
    http_status    SMALLINT,
    failed_at      TIMESTAMPTZ,
    -- `breaker`: the next probe is let through at or after this instant (one process wins it by
    -- a compare-and-set that moves it on by the probe interval).
    probe_at       TIMESTAMPTZ,
    -- Raised by every change of state: an operator's compare-and-set names the version shown.
    version        BIGINT NOT NULL DEFAULT 1,
    -- The handler's kind as last registered (`http`, `leased`, `transactional`) and when.
    kind           TEXT,
    seen_at        TIMESTAMPTZ NOT NULL DEFAULT now(),
    PRIMARY KEY (consumer_group, message_type)
);
