#!/usr/bin/env bash
# MariaDB's (MySQL 8's) claim floor beside PostgreSQL's (issue 25): the MySQL equivalent of
# engine/benches/claim_floor.sql, one transaction claiming 500 new message ids straight into
# `succeeded` (ON DUPLICATE KEY UPDATE with the takeover of failed records with attempts left,
# created/claimed told apart by a per-statement nonce read back in place of RETURNING, the count
# delta, the message type, attempt rows only for retries), driven by mariadb-slap at 2 clients:
# the shape of `pgbench -c 2 -j 2`. records/s = 500 × tps. Results: BENCHMARKS.md, "MariaDB's
# claim floor beside PostgreSQL's (issue 25)".
#
#   engine/benches/mysql/claim_floor.sh mariadb VARIANT [TRANSACTIONS]   # fresh database each run
#   engine/benches/mysql/claim_floor.sh postgres [SECONDS]               # pgbench on claim_floor.sql
#   engine/benches/mysql/claim_floor.sh print VARIANT                    # the round trips, as sent
#
# VARIANT (each line of `print` is one round trip; the store binds what the bench computes
# from @p and @n, so the first packet's SET rides on the BEGIN every store sends anyway):
#   nonce   BEGIN | INSERT … ODKU | SELECT … WHERE claim_nonce = ? | count delta | type | COMMIT
#   keys    as nonce, read back by the dedup key (consumer_group = ? AND message_id IN (500 ids)),
#           no index on claim_nonce
#   perrow  as keys, read back one SELECT per message id (500 round trips)
#   multi   the whole claim as one multi-statement packet (count delta and attempt rows computed
#           in the server from the nonce's rows): 1 round trip, no stored routine
#   proc    the whole claim as a stored procedure: CALL, 1 round trip
#   odku    as nonce, the message type as INSERT … ON DUPLICATE KEY UPDATE (an X lock on the
#           type's row until commit) instead of INSERT … SELECT … WHERE NOT EXISTS
#   insert  BEGIN | INSERT … ODKU | COMMIT: no read-back, no count, no type (not a claim: the
#           lower bound the others add to)
#
#   engine/benches/mysql/claim_floor.sh rounds N   # N alternated rounds of postgres and each variant
#   VARIANTS="nonce odku" engine/benches/mysql/claim_floor.sh rounds N   # postgres and these only
#
# Message ids are random per row (MD5 of a per-transaction UUID and the row number, printed as
# a UUID): MySQL's UUID() is time-based and would put a batch's ids next to each other in the
# dedup key, which PostgreSQL's gen_random_uuid() does not. The read-back recomputes them, as
# the store sends them again.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../../.." && pwd)
MY=(mariadb -h 127.0.0.1 -u root)
SLAP=(mariadb-slap -h 127.0.0.1 -u root)
PGHOST=127.0.0.1; PGUSER=postgres; export PGHOST PGUSER

# message id n of the transaction whose prefix is @p ($1: an SQL expression for n)
mid() { echo "CONCAT('BENCH.EVENT.', INSERT(INSERT(INSERT(INSERT(MD5(CONCAT(@p, $1)), 21, 0, '-'), 17, 0, '-'), 13, 0, '-'), 9, 0, '-'), ':1')"; }

# the claim: every row new or, for an existing record, taken over only when it is of the same
# type and claimable (failed with attempts left, or dead for want of a handler before any ran),
# as CLAIM_MANY_SUCCEEDED_SQL. ODKU assignments run left to right and see earlier ones: the
# nonce decides first (on the old row), every later one asks `c` (is the nonce ours), and
# error_class, which the restamp reads, is reset last.
claim_sql() { # $1: the nonce expression
  local c="claim_nonce <=> VALUES(claim_nonce)" nh="COALESCE(LEFT(error_class, 11) = 'NO_HANDLER:', FALSE)"
  cat <<SQL
INSERT INTO dedup_records (consumer_group, message_id, message_type, status, handler_mode, attempts, max_attempts, completed_at, payload_hash, content_type, source_broker, source_exchange, source_routing_key, source_queue, id_source, claim_nonce)
SELECT 'bench', $(mid s.n), 'BENCH.EVENT', 'succeeded', 'transactional', 1, 5, UTC_TIMESTAMP(6), UNHEX(SHA2(s.n, 256)), 'application/json', 'rabbitmq', 'orders.events', 'bench', 'bench.queue', 'h', $1
FROM bench_seq s ORDER BY 2
ON DUPLICATE KEY UPDATE
 claim_nonce = IF((message_type = VALUES(message_type) OR ($nh AND (message_type = 'UNKNOWN' OR payload_hash = VALUES(payload_hash)))) AND ((status = 'failed' AND attempts < max_attempts) OR (status = 'dead' AND attempts = 0 AND $nh)), VALUES(claim_nonce), claim_nonce),
 status = IF($c, 'succeeded', status), version = IF($c, version + 1, version), attempts = IF($c, attempts + 1, attempts), handler_mode = IF($c, 'transactional', handler_mode),
 payload_hash = IF($c AND $nh, VALUES(payload_hash), payload_hash), payload_truncated = IF($c, payload_truncated AND NOT $nh, payload_truncated),
 content_type = IF($c AND $nh, VALUES(content_type), content_type), type_property = IF($c AND $nh, VALUES(type_property), type_property),
 source_broker = IF($c AND $nh, VALUES(source_broker), source_broker), source_exchange = IF($c AND $nh, VALUES(source_exchange), source_exchange),
 source_routing_key = IF($c AND $nh, VALUES(source_routing_key), source_routing_key), source_queue = IF($c AND $nh, VALUES(source_queue), source_queue),
 message_type = IF($c, VALUES(message_type), message_type), lease_owner = IF($c, NULL, lease_owner), lease_token = IF($c, NULL, lease_token),
 lease_expires_at = IF($c, NULL, lease_expires_at), next_attempt_at = IF($c, NULL, next_attempt_at), parked_at = IF($c, NULL, parked_at),
 payload = IF($c, NULL, payload), headers = IF($c, NULL, headers), id_source = IF($c, COALESCE(id_source, VALUES(id_source)), id_source),
 completed_at = IF($c, UTC_TIMESTAMP(6), completed_at), updated_at = IF($c, UTC_TIMESTAMP(6), updated_at), error_class = IF($c, NULL, error_class)
SQL
}
readback_cols="id, message_id, message_type, attempts, max_attempts, version = 0 AS created, first_seen_at, UTC_TIMESTAMP(6) AS claimed_at"
readback_cols_key="id, message_id, message_type, attempts, max_attempts, claim_nonce <=> @n AS claimed, (claim_nonce <=> @n AND version = 0) AS created, first_seen_at, UTC_TIMESTAMP(6) AS claimed_at"
# the message type, without a lock another batch waits on: under READ COMMITTED the NOT EXISTS
# is a consistent read (a race of two first inserts of one type ends in a 1062 the store retries)
type_sql="INSERT INTO message_types (message_type) SELECT 'BENCH.EVENT' FROM DUAL WHERE NOT EXISTS (SELECT 1 FROM message_types WHERE message_type = 'BENCH.EVENT')"
type_odku_sql="INSERT INTO message_types (message_type) VALUES ('BENCH.EVENT') ON DUPLICATE KEY UPDATE message_type = message_type"
# the count delta: the store counts `created` in the read-back (every row here is new)
count_sql="INSERT INTO record_counts (consumer_group, status, n) VALUES ('bench', 'succeeded', 500)"
begin_sql="SET @p = UUID(), @n = UNHEX(REPLACE(UUID(), '-', '')); START TRANSACTION"
attempts_sql() { echo "INSERT INTO record_attempts (record_id, attempt, worker, started_at, ended_at, outcome) SELECT id, attempts, 'bench', UTC_TIMESTAMP(6), UTC_TIMESTAMP(6), 'succeeded' FROM dedup_records WHERE claim_nonce = $1 AND version > 0 AND attempts > 1"; }  # a retry is a takeover: version > 0 (the index range is empty for new records)
count_server_sql() { echo "INSERT INTO record_counts (consumer_group, status, n) SELECT 'bench', 'succeeded', COUNT(*) FROM dedup_records WHERE claim_nonce = $1 AND version = 0 HAVING COUNT(*) > 0"; }

# one transaction of VARIANT, one round trip per line
script() {
  local v=$1 i
  case $v in
  nonce|odku)
    echo "$begin_sql"; claim_sql @n | tr '\n' ' '; echo
    echo "SELECT $readback_cols FROM dedup_records WHERE claim_nonce = @n"
    echo "$count_sql"
    if [ "$v" = odku ]; then echo "$type_odku_sql"; else echo "$type_sql"; fi
    echo "COMMIT" ;;
  keys)
    echo "$begin_sql"; claim_sql @n | tr '\n' ' '; echo
    printf "SELECT %s FROM dedup_records WHERE consumer_group = 'bench' AND message_id IN (" "$readback_cols_key"
    for i in $(seq 1 500); do printf "%s%s" "$([ "$i" = 1 ] || echo ,)" "$(mid "$i")"; done; echo ")"
    echo "$count_sql"; echo "$type_sql"; echo "COMMIT" ;;
  perrow)
    echo "$begin_sql"; claim_sql @n | tr '\n' ' '; echo
    for i in $(seq 1 500); do echo "SELECT $readback_cols_key FROM dedup_records WHERE consumer_group = 'bench' AND message_id = $(mid "$i")"; done
    echo "$count_sql"; echo "$type_sql"; echo "COMMIT" ;;
  multi)
    { echo "$begin_sql;"; claim_sql @n; echo ";"; count_server_sql @n; echo ";"; echo "$type_sql;"
      attempts_sql @n; echo ";"; echo "SELECT $readback_cols FROM dedup_records WHERE claim_nonce = @n;"; echo "COMMIT"; } | tr '\n' ' '; echo ;;
  proc)
    echo "CALL claim_floor_batch(UUID())" ;;
  insert)
    echo "$begin_sql"; claim_sql @n | tr '\n' ' '; echo; echo "COMMIT" ;;
  *) echo "unknown variant $v" >&2; exit 2 ;;
  esac
}

procedure() {
  cat <<SQL
DELIMITER //
CREATE PROCEDURE claim_floor_batch(IN p_prefix CHAR(36))
BEGIN
  SET @p = p_prefix, @n = UNHEX(REPLACE(UUID(), '-', ''));
  START TRANSACTION;
  $(claim_sql @n);
  $(count_server_sql @n);
  $type_sql;
  $(attempts_sql @n);
  SELECT $readback_cols FROM dedup_records WHERE claim_nonce = @n;
  COMMIT;
END//
DELIMITER ;
SQL
}

fresh_mariadb() { # $1: database, $2: variant
  "${MY[@]}" -e "DROP DATABASE IF EXISTS $1; CREATE DATABASE $1"
  "${MY[@]}" "$1" < "$repo/engine/src/store/mysql/migrations/20261204000001_claim_tables.sql"
  case $2 in keys|perrow) "${MY[@]}" "$1" -e "ALTER TABLE dedup_records DROP INDEX dedup_records_claim_nonce_idx" ;; esac
  "${MY[@]}" "$1" -e "CREATE TABLE bench_seq (n INT PRIMARY KEY); INSERT INTO bench_seq WITH RECURSIVE g(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM g WHERE n < 500) SELECT n FROM g"
  if [ "$2" = proc ]; then procedure | "${MY[@]}" "$1"; fi
}

case ${1:-} in
print) script "$2" ;;
mariadb)
  v=$2 txns=${3:-2000} db=claim_floor_$2
  fresh_mariadb "$db" "$v"
  q=$(mktemp); script "$v" | sed 's/$/|/' > "$q"
  per=$(grep -c '|$' "$q")
  start=$(date +%s.%N); load0=$(cut -d' ' -f1 /proc/loadavg)
  "${SLAP[@]}" --create-schema="$db" -c 2 --delimiter='|' --number-of-queries=$((txns * per)) -q "$q" \
    --init-command="SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED" > "$q.out"
  end=$(date +%s.%N); load1=$(cut -d' ' -f1 /proc/loadavg)
  rows=$("${MY[@]}" -N "$db" -e "SELECT COUNT(*) FROM dedup_records")
  counted=$("${MY[@]}" -N "$db" -e "SELECT COALESCE(SUM(n), 0) FROM record_counts")
  secs=$(awk '/Average number of seconds/ {print $(NF-1)}' "$q.out")
  awk -v v="$v" -v t="$txns" -v s="$secs" -v rt="$per" -v r="$rows" -v c="$counted" -v l0="$load0" -v l1="$load1" 'BEGIN {
    printf "mariadb %-6s %d tx in %.2f s: %.1f tps, %.0f records/s, %d round trips/tx, rows %d counted %d, load %s→%s\n",
      v, t, s, t / s, 500 * t / s, rt, r, c, l0, l1 }'
  rm -f "$q" "$q.out" ;;
postgres)
  secs=${2:-20} db=claim_floor_pg
  psql -qd postgres -c "DROP DATABASE IF EXISTS $db" -c "CREATE DATABASE $db"
  psql -qd "$db" -c "CREATE SCHEMA dedup"
  for f in "$repo"/migrations/*.sql; do PGOPTIONS='-c search_path=dedup' psql -qd "$db" -v ON_ERROR_STOP=1 -1 -f "$f" > /dev/null; done
  load0=$(cut -d' ' -f1 /proc/loadavg)
  out=$(PGOPTIONS='-c search_path=dedup' pgbench -n -f "$repo/engine/benches/claim_floor.sql" -c 2 -j 2 -T "$secs" "$db" 2>&1)
  load1=$(cut -d' ' -f1 /proc/loadavg)
  tps=$(echo "$out" | awk '/^tps/ {print $3}')
  rows=$(psql -Atd "$db" -c "SELECT count(*) FROM dedup.dedup_records")
  awk -v t="$tps" -v s="$secs" -v r="$rows" -v l0="$load0" -v l1="$load1" 'BEGIN {
    printf "postgres claim   %d s: %.1f tps, %.0f records/s, 1 round trip/tx, rows %d, load %s→%s\n", s, t, 500 * t, r, l0, l1 }' ;;
rounds)
  for r in $(seq 1 "$2"); do
    echo "== round $r, $(date -u +%H:%M:%S) UTC"
    "$0" postgres 20 2>/dev/null
    for v in ${VARIANTS:-nonce keys multi proc odku insert}; do "$0" mariadb $v 2000; done
    [ -n "${VARIANTS:-}" ] || "$0" mariadb perrow 200
  done ;;
*) sed -n '2,33p' "$0"; exit 2 ;;
esac
