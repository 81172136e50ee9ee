-- What a leased handler's far side answered, on each attempt row (docs/DESIGN.md, "HTTP
-- handlers"): the HTTP status (NULL for a timeout or a connection error, and for handlers that
-- report none), the call's latency, and the body's first 2 KiB or the transport error. A run
-- whose lease was lost keeps its late answer here too.
ALTER TABLE record_attempts ADD COLUMN answer_status SMALLINT;
ALTER TABLE record_attempts ADD COLUMN latency_ms INTEGER;
ALTER TABLE record_attempts ADD COLUMN answer TEXT;
-- The far side said it was still working on the message (HTTP 409): `deferred` attempts, closed
-- without counting them (the record's `attempts` went back by one), and the counted ones once
-- an unbroken run of such answers had lasted longer than its limit. The run starts at the first
-- such attempt after the last attempt that was not one.
ALTER TABLE record_attempts ADD COLUMN in_progress BOOLEAN NOT NULL DEFAULT false;
ALTER TABLE record_attempts DROP CONSTRAINT record_attempts_outcome_check;
ALTER TABLE record_attempts ADD CONSTRAINT record_attempts_outcome_check
    CHECK (outcome IS NULL OR outcome IN ('succeeded', 'failed', 'dead', 'lease_lost', 'released', 'deferred'));
