-- What the console's overview counts without reading whole tables (PostgreSQL's partial indexes
-- in migrations 20261202000056 and 20261204000067, in MySQL's terms: MariaDB has no partial index, so each
-- index leads with the column PostgreSQL's WHERE tests, and the count reads that range only).

-- Records whose effect ran after the lease was lost: `WHERE late_effect` reads the TRUE range.
CREATE INDEX record_attempts_late_effect_idx ON record_attempts (late_effect, record_id);
-- Late duplicates of the last 30 days.
CREATE INDEX late_duplicates_seen_idx ON late_duplicates (seen_at);
-- Conflicting copies not settled: `WHERE settled_at IS NULL` reads the NULL range.
CREATE INDEX record_conflicts_settled_idx ON record_conflicts (settled_at);
