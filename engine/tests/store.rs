//! The dedup store's leased claims on PostgreSQL: leases, fencing, reclaim and hold, heartbeats,
//! and what only PostgreSQL counts with triggers. The cases every store passes (transactional
//! claims, duplicates, completions, failures, poison, counts) are the conformance suite's
//! (`dedup_engine::store::conformance`, run by tests/conformance_postgres.rs and
//! tests/conformance_mysql.rs); these move there as the MySQL store learns leases.

mod common;

use std::time::Duration;

use common::*;
use dedup_engine::record::{ConsumerGroup, HandlerMode, MessageId};
use dedup_engine::store::postgres::PgStore;
use dedup_engine::store::{
    ClaimOutcome, ClaimRequest, ClaimedRecord, DedupStore, FailureOutcome, FailureReport, Lease, LeaseStore,
};
use serde_json::json;

struct Case {
    h: Harness,
    store: PgStore,
    group: ConsumerGroup,
    id: MessageId,
    message: dedup_engine::message::InboundMessage,
}

impl Case {
    async fn new(id: &str) -> Self {
        let h = Harness::new().await;
        let store = PgStore::new(h.pool().clone(), &h.db.schema);
        let message = message(id, json!({"n": 1}));
        Self { h, store, group: ConsumerGroup::parse(GROUP).unwrap(), id: MessageId::parse(id).unwrap(), message }
    }

    async fn claim(&self, lease: &Lease, reclaim: bool) -> ClaimOutcome {
        let hash = self.message.payload_hash();
        let request = ClaimRequest {
            group: &self.group,
            message_id: &self.id,
            message_type: "ORDER.NOTIFY",
            mode: HandlerMode::Leased,
            max_attempts: 3,
            reclaim_expired: reclaim,
            lease,
            message: &self.message,
            payload_hash: &hash,
        };
        let mut conn = self.h.pool().acquire().await.unwrap();
        self.store.claim(&mut conn, &request).await.unwrap()
    }

    async fn claimed(&self, lease: &Lease, reclaim: bool) -> ClaimedRecord {
        match self.claim(lease, reclaim).await {
            ClaimOutcome::Claimed(c) => c,
            other => panic!("expected a claim, got {other:?}"),
        }
    }

    async fn expire_lease(&self) {
        sqlx::query("UPDATE dedup_records SET lease_expires_at = now() - interval '1 second' WHERE message_id = $1")
            .bind(self.id.as_str())
            .execute(self.h.pool())
            .await
            .unwrap();
    }

    async fn complete(&self, claim: &ClaimedRecord, lease: &Lease) -> bool {
        let mut conn = self.h.pool().acquire().await.unwrap();
        self.store.complete(&mut conn, claim, lease, HandlerMode::Leased, None).await.unwrap()
    }
}

#[tokio::test]
async fn a_lease_of_zero_or_less_is_raised_to_the_minimum() {
    let case = Case::new("ORDER.NOTIFY.1:3").await;
    let lease = Lease::new("w", Duration::ZERO);
    assert_eq!(lease.millis(), 1000);
    case.claimed(&lease, false).await;
    let (owner, remaining_ms): (String, f64) = sqlx::query_as(
        "SELECT lease_owner, (extract(epoch FROM lease_expires_at - now()) * 1000)::float8 FROM dedup_records",
    )
    .fetch_one(case.h.pool())
    .await
    .unwrap();
    assert_eq!(owner, "w");
    assert!(remaining_ms > 900.0 && remaining_ms <= 1000.0, "{remaining_ms}");
}

#[tokio::test]
async fn a_live_lease_is_never_taken_even_with_reclaim_allowed() {
    let case = Case::new("ORDER.NOTIFY.2:3").await;
    case.claimed(&Lease::new("a", Duration::from_secs(30)), true).await;
    match case.claim(&Lease::new("b", Duration::from_secs(30)), true).await {
        ClaimOutcome::Existing(e) => assert!(!e.lease_expired && !e.parked, "{e:?}"),
        other => panic!("{other:?}"),
    }
}

#[tokio::test]
async fn an_expired_lease_is_reclaimed_only_when_allowed_and_the_old_holder_is_fenced_out() {
    let case = Case::new("ORDER.NOTIFY.3:3").await;
    let first = Lease::new("a", Duration::from_secs(30));
    let a = case.claimed(&first, true).await;
    case.expire_lease().await;

    // hold: the delivery is parked, nobody runs it.
    match case.claim(&Lease::new("b", Duration::from_secs(30)), false).await {
        ClaimOutcome::Existing(e) => assert!(e.lease_expired && e.parked, "{e:?}"),
        other => panic!("{other:?}"),
    }
    // reclaim: taken over, attempt 2, reentry counted.
    let second = Lease::new("c", Duration::from_secs(30));
    let c = case.claimed(&second, true).await;
    assert!(c.took_over);
    assert_eq!(c.attempt, 2);
    let reentries: i32 =
        sqlx::query_scalar("SELECT reentries FROM dedup_records").fetch_one(case.h.pool()).await.unwrap();
    assert_eq!(reentries, 1);

    assert!(!case.complete(&a, &first).await, "the old holder cannot complete");
    let failure = FailureReport {
        claim: &a,
        mode: HandlerMode::Leased,
        message: &case.message,
        lease: &first,
        error: "late",
        error_class: "LATE",
        permanent: false,
        retry_delay_ms: 1000,
        answer: None,
        in_progress: false,
    };
    let mut conn = case.h.pool().acquire().await.unwrap();
    assert_eq!(case.store.fail_claimed(&mut conn, &failure).await.unwrap(), FailureOutcome::Superseded);
    assert!(case.complete(&c, &second).await, "the new holder completes");
    let (status, attempts, _, _) = case.h.record("ORDER.NOTIFY.3:3").await.unwrap();
    assert_eq!((status.as_str(), attempts), ("succeeded", 2));
}

#[tokio::test]
async fn extending_a_lease_needs_its_token() {
    let case = Case::new("ORDER.NOTIFY.4:3").await;
    let lease = Lease::new("a", Duration::from_secs(2));
    let claim = case.claimed(&lease, false).await;
    let mut conn = case.h.pool().acquire().await.unwrap();
    assert_eq!(case.store.extend_leases(&mut conn, &[&claim], &lease).await.unwrap(), vec![claim.id]);
    let forged = ClaimedRecord { lease_token: uuid::Uuid::new_v4(), ..claim };
    assert_eq!(case.store.extend_leases(&mut conn, &[&forged], &lease).await.unwrap(), Vec::<i64>::new());
}

#[tokio::test]
async fn a_failed_record_is_claimable_until_its_attempts_run_out() {
    let case = Case::new("ORDER.NOTIFY.5:3").await;
    for attempt in 1..=3 {
        let lease = Lease::new("w", Duration::from_secs(30));
        let claim = case.claimed(&lease, false).await;
        assert_eq!(claim.attempt, attempt);
        let failure = FailureReport {
            claim: &claim,
            mode: HandlerMode::Leased,
            message: &case.message,
            lease: &lease,
            error: "boom",
            error_class: "BOOM",
            permanent: false,
            retry_delay_ms: 10,
            answer: None,
            in_progress: false,
        };
        let mut conn = case.h.pool().acquire().await.unwrap();
        let expected = if attempt == 3 { FailureOutcome::Dead } else { FailureOutcome::Failed };
        assert_eq!(case.store.fail_claimed(&mut conn, &failure).await.unwrap(), expected);
    }
    assert!(matches!(case.claim(&Lease::new("w", Duration::from_secs(30)), true).await, ClaimOutcome::Existing(_)));
    let lease_fields_cleared: bool = sqlx::query_scalar(
        "SELECT lease_owner IS NULL AND lease_token IS NULL AND lease_expires_at IS NULL FROM dedup_records",
    )
    .fetch_one(case.h.pool())
    .await
    .unwrap();
    assert!(lease_fields_cleared);
}

/// Claims, completions and failures keep `record_counts` exact on every store (the conformance
/// suite, `dedup_engine::store::conformance`, checks it after each operation); on PostgreSQL a
/// delete is counted by its statement trigger (cleanup and operator deletes), and a leased claim
/// (not yet on MySQL) counts the record it creates, stores its type and opens its attempt row.
#[tokio::test]
async fn deletes_and_leased_claims_are_counted() {
    let case = Case::new("ORDER.NOTIFY.6:3").await;
    let lease = Lease::new("w", Duration::from_secs(30));
    let claim = case.claimed(&lease, false).await;
    let counted = "SELECT status, sum(n)::bigint FROM record_counts GROUP BY 1 HAVING sum(n) <> 0 ORDER BY 1";
    let counts: Vec<(String, i64)> = sqlx::query_as(counted).fetch_all(case.h.pool()).await.unwrap();
    assert_eq!(counts, [("processing".into(), 1)]);
    let types: Vec<String> =
        sqlx::query_scalar("SELECT message_type FROM message_types ORDER BY 1").fetch_all(case.h.pool()).await.unwrap();
    assert_eq!(types, ["ORDER.NOTIFY"]);
    let attempts: Vec<i32> =
        sqlx::query_scalar("SELECT attempt FROM record_attempts").fetch_all(case.h.pool()).await.unwrap();
    assert_eq!(attempts, [1], "a leased claim opens its attempt row");
    assert!(case.complete(&claim, &lease).await);
    let counts: Vec<(String, i64)> = sqlx::query_as(counted).fetch_all(case.h.pool()).await.unwrap();
    assert_eq!(counts, [("succeeded".into(), 1)]);
    sqlx::query("DELETE FROM dedup_records").execute(case.h.pool()).await.unwrap();
    let total: i64 = sqlx::query_scalar("SELECT COALESCE(sum(n), 0)::bigint FROM record_counts")
        .fetch_one(case.h.pool())
        .await
        .unwrap();
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
    let folded = dedup_engine::stats::fold_record_counts(h.pool()).await.unwrap();
    assert_eq!(folded, 4, "four delta rows folded");
    let after: Vec<(String, i64)> = sqlx::query_as(counts).fetch_all(h.pool()).await.unwrap();
    assert_eq!(after, before, "a fold keeps the sums");
    let rows: i64 = sqlx::query_scalar("SELECT count(*) FROM record_counts WHERE consumer_group = 'g'")
        .fetch_one(h.pool())
        .await
        .unwrap();
    assert_eq!(rows, 2, "one row per (group, status) after the fold");
    let again = dedup_engine::stats::fold_record_counts(h.pool()).await.unwrap();
    assert_eq!(again, 0, "a folded table is not rewritten");
}
