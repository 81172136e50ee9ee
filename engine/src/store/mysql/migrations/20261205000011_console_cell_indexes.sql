-- What the console's failure reads and the attempts order need on MySQL (PostgreSQL reads them
-- through its partial indexes `dedup_records_unsettled_idx` and `dedup_records_retried_idx`,
-- migration 20261203000065, its heap pages cached by the OS as well). Without them the retries
-- and dead-letter cells looked up each failed or dead row through `dedup_records_unsettled_idx` (1.6 s and 0.7 s p95
-- at 1 M records, 10 000 of each, 128 MB buffer pool) and the attempts order sorted the table
-- (2.3 s). MariaDB has no partial index, so every row writes an entry in each; their cost on the
-- consumer is measured beside PostgreSQL's in BENCHMARKS.md. The first leads with `status`, not
-- the generated `unsettled_status`: MariaDB 10.11 read an index on that column alone only on a
-- prepared statement's first execution, and looked every row up on the next ones.

-- A status's records in attempts order (the retries page's most retried, a filtered list sorted
-- by attempts: a range read in order), and the retries' cells (attempts × type, the next due
-- time) and the dead letters' (class × type, first and last seen) read from the index alone
-- over the `failed` or `dead` range.
CREATE INDEX dedup_records_status_cells_idx ON dedup_records
    (status, attempts, id, message_type, error_class, next_attempt_at, first_seen_at, updated_at);
-- The records list in attempts order (keyset on attempts, id; each of its three parts a range).
CREATE INDEX dedup_records_attempts_idx ON dedup_records (attempts, id);
