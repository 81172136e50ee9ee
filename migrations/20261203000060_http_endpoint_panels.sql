-- The overview's HTTP endpoint cards (docs/DESIGN.md, "What the console shows"): each endpoint
-- (an HTTP handler: consumer group and message type) shows its calls of the last 15 minutes by
-- answer class, its success rate and p50/p95 latency, from at most its newest 5 000 calls.
--
-- An attempt row names its record only; its endpoint is the record's group and type at the
-- claim. A leased claim writes them on the attempt row it opens (the record's message type
-- may change on a later claim under another type policy), so that one endpoint's newest calls
-- are one range of the index below instead of a walk over every endpoint's calls with a join
-- per row. Other attempt rows (transactional ones, and those opened before this migration)
-- leave them NULL.
ALTER TABLE record_attempts ADD COLUMN consumer_group TEXT;
ALTER TABLE record_attempts ADD COLUMN message_type TEXT;

-- Attempts already answered (written since 20261203000059, hours before this one) get theirs.
UPDATE record_attempts a SET consumer_group = r.consumer_group, message_type = r.message_type
FROM dedup_records r WHERE r.id = a.record_id AND a.latency_ms IS NOT NULL;

-- Calls (attempt rows with an answer or a transport error: `latency_ms` is set when the call
-- ends), newest first per endpoint, index-only: `console::endpoints::endpoint_stats`. Partial,
-- so transactional attempts and leased handlers that report no answer never enter it.
CREATE INDEX record_attempts_endpoint_calls_idx
    ON record_attempts (consumer_group, message_type, started_at DESC)
    INCLUDE (answer_status, latency_ms, outcome)
    WHERE latency_ms IS NOT NULL;
