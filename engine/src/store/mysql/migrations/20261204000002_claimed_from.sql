-- The status a record was claimed from (issue 25): written by the claim's ON DUPLICATE KEY UPDATE
-- in the same assignment list that takes the record over, before `status` changes, and read back
-- with the claim nonce. PostgreSQL's triggers count a takeover's status change; MySQL has no
-- statement triggers, so the store writes the count deltas itself and needs the old status, which
-- an ODKU row cannot return. NULL on records never taken over.
ALTER TABLE dedup_records
    ADD COLUMN claimed_from VARCHAR(10) CHARACTER SET ascii COLLATE ascii_bin NULL AFTER claim_nonce; -- as status; no index: read only with the nonce
