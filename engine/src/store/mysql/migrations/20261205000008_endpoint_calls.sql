-- The endpoint cards' calls (PostgreSQL's partial index record_attempts_endpoint_calls_idx, in
-- MySQL's terms: no partial index, no INCLUDE): an endpoint's newest calls are one backward range
-- of (group, type, started_at), its rows read from the table.
CREATE INDEX record_attempts_endpoint_calls_idx ON record_attempts (consumer_group, message_type, started_at);
