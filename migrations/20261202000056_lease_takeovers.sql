-- Leased handlers whose lease was lost (DESIGN.md, "Two handler modes"): a claim that takes an
-- expired lease over closes the superseded attempt as `lease_lost`, with when (ended_at) and by
-- whom (taken_over_by). A superseded worker whose effect had already run when its completion was
-- refused says so (late_effect): the effect may have run twice, and the console flags the record.
ALTER TABLE record_attempts ADD COLUMN taken_over_by TEXT;
ALTER TABLE record_attempts ADD COLUMN late_effect BOOLEAN NOT NULL DEFAULT false;
CREATE INDEX record_attempts_late_effect_idx ON record_attempts (record_id) WHERE late_effect;
