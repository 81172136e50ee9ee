//! What only the PostgreSQL store does: counting with triggers and append-only deltas folded.
//! The cases every store passes (claims of every kind, duplicates, leases and fencing,
//! completions, failures, poison, counts) are the conformance suite's
//! (`dedup_engine::store::conformance`, run by tests/conformance_postgres.rs and
//! tests/conformance_mysql.rs).

mod common;

use std::time::Duration;

use common::*;
use dedup_engine::record::{ConsumerGroup, HandlerMode, MessageId};
use dedup_engine::store::postgres::PgStore;
use dedup_engine::store::{ClaimOutcome, ClaimRequest, DedupStore, Lease};
use serde_json::json;

/// On PostgreSQL a delete is counted by its statement trigger (cleanup and operator deletes); the
/// counts of claims and settlements are the conformance suite's, on every store.
#[tokio::test]
async fn deletes_are_counted_by_the_statement_trigger() {
    let h = Harness::new().await;
    let store = PgStore::new(h.pool().clone(), &h.db.schema);
    let group = ConsumerGroup::parse(GROUP).unwrap();
    let id = MessageId::parse("ORDER.NOTIFY.6:3").unwrap();
    let message = message(id.as_str(), json!({"n": 1}));
    let hash = message.payload_hash();
    let lease = Lease::new("w", Duration::from_secs(30));
    let request = ClaimRequest {
        group: &group,
        message_id: &id,
        message_type: "ORDER.NOTIFY",
        mode: HandlerMode::Leased,
        max_attempts: 3,
        reclaim_expired: false,
        lease: &lease,
        message: &message,
        payload_hash: &hash,
    };
    let mut conn = h.pool().acquire().await.unwrap();
    assert!(matches!(store.claim(&mut conn, &request).await.unwrap(), ClaimOutcome::Claimed(_)));
    let counted = "SELECT status, sum(n)::bigint FROM record_counts GROUP BY 1 HAVING sum(n) <> 0 ORDER BY 1";
    let counts: Vec<(String, i64)> = sqlx::query_as(counted).fetch_all(h.pool()).await.unwrap();
    assert_eq!(counts, [("processing".into(), 1)]);
    sqlx::query("DELETE FROM dedup_records").execute(h.pool()).await.unwrap();
    let total: i64 =
        sqlx::query_scalar("SELECT COALESCE(sum(n), 0)::bigint FROM record_counts").fetch_one(h.pool()).await.unwrap();
    assert_eq!(total, 0, "deletes are counted by the statement trigger");
}

/// Counting only appends rows: two transactions that count the same group's statuses in
/// opposite orders neither wait for each other nor deadlock, even on backends that shared a
/// counter shard under the old in-place counters (pid % 64); a fold keeps the sums.
#[tokio::test]
async fn counting_never_makes_concurrent_transactions_wait() {
    use sqlx::{Connection, PgConnection};
    let h = Harness::new().await;
    let options = h.pool().connect_options();
    // Two connections whose backends would have written the same shard.
    let mut by_shard: std::collections::HashMap<i32, PgConnection> = std::collections::HashMap::new();
    let (mut a, mut b) = loop {
        let mut conn = PgConnection::connect_with(&options).await.unwrap();
        let pid: i32 = sqlx::query_scalar("SELECT pg_backend_pid()").fetch_one(&mut conn).await.unwrap();
        match by_shard.remove(&(pid % 64)) {
            Some(other) => break (other, conn),
            None => by_shard.insert(pid % 64, conn),
        };
    };
    let apply = "SELECT record_counts_apply(ARRAY['g'], ARRAY[$1], ARRAY[1::bigint])";
    for conn in [&mut a, &mut b] {
        sqlx::raw_sql("BEGIN; SET LOCAL lock_timeout = '2s'").execute(&mut *conn).await.unwrap();
    }
    sqlx::query(apply).bind("processing").execute(&mut a).await.unwrap();
    sqlx::query(apply).bind("failed").execute(&mut b).await.unwrap();
    sqlx::query(apply).bind("failed").execute(&mut a).await.expect("a does not wait for b's counts");
    sqlx::query(apply).bind("processing").execute(&mut b).await.expect("b does not wait for a's counts");
    for conn in [&mut a, &mut b] {
        sqlx::query("COMMIT").execute(&mut *conn).await.unwrap();
    }
    let counts = "SELECT status, sum(n)::bigint FROM record_counts WHERE consumer_group = 'g' GROUP BY 1 ORDER BY 1";
    let before: Vec<(String, i64)> = sqlx::query_as(counts).fetch_all(h.pool()).await.unwrap();
    assert_eq!(before, [("failed".into(), 2), ("processing".into(), 2)]);
    let folded: i64 = sqlx::query_scalar("SELECT record_counts_fold()").fetch_one(h.pool()).await.unwrap();
    assert_eq!(folded, 4, "four delta rows folded");
    let after: Vec<(String, i64)> = sqlx::query_as(counts).fetch_all(h.pool()).await.unwrap();
    assert_eq!(after, before, "a fold keeps the sums");
    let rows: i64 = sqlx::query_scalar("SELECT count(*) FROM record_counts WHERE consumer_group = 'g'")
        .fetch_one(h.pool())
        .await
        .unwrap();
    assert_eq!(rows, 2, "one row per (group, status) after the fold");
    let again: i64 = sqlx::query_scalar("SELECT record_counts_fold()").fetch_one(h.pool()).await.unwrap();
    assert_eq!(again, 0, "a folded table is not rewritten");
}
