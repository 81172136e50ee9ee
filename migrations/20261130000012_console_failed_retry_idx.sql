-- The retries page's "next retry due": the soonest next_attempt_at among failed records, one
-- probe instead of a pass over every failed record.
CREATE INDEX dedup_records_failed_next_idx ON dedup_records (next_attempt_at) WHERE status = 'failed';
