//! Conformance cases of the failure pages' reads ([`crate::console::failures::FailureReads`]).

use super::claims::{claim_one, claimed, fail, lease, msg};
use super::{GROUP, Harness};
use crate::console::console_store;
use crate::console::failures::{FailureReads, RetryCell};
use crate::record::HandlerMode;
use crate::store::{DedupStore, FailureReport};

/// Stuck records with their lease and total, the failed records per attempts and type with the
/// next retry, and the dead letters grouped by class, HTTP classes first.
pub async fn stuck_failed_and_dead_records_are_read_as_the_store_left_them<H: Harness>() {
    let h = H::fresh().await;
    let pool = h.engine_pool();
    let reads: &dyn FailureReads = console_store(&pool);
    assert_eq!(reads.stuck_records(10).await.unwrap().total, 0);
    assert_eq!(reads.retry_cells().await.unwrap(), (vec![], None));
    assert!(reads.dead_letter_groups(10).await.unwrap().is_empty());

    let l = lease("worker-1");
    let stuck = msg("SMS.1", "SMS.SEND", "s");
    let stuck_claim = claimed(claim_one(&h, &stuck, &l).await);
    h.expire_lease(stuck_claim.id).await;
    let _held = claimed(claim_one(&h, &msg("SMS.2", "SMS.SEND", "live"), &l).await);
    let failed = msg("ORDER.PAY.1", "ORDER.PAY", "f");
    fail(&h, &claimed(claim_one(&h, &failed, &l).await), &failed, &l, false).await;
    for (id, message_type) in [("D.1", "ORDER.PAY"), ("D.2", "ORDER.SHIP"), ("D.3", "ORDER.PAY")] {
        let m = msg(id, message_type, id);
        fail(&h, &claimed(claim_one(&h, &m, &l).await), &m, &l, true).await;
    }
    // A class of its own, and one differing from `BOOM` only by a trailing space.
    for (id, error_class) in [("D.4", "HTTP_GONE"), ("D.5", "BOOM ")] {
        let m = msg(id, "ORDER.SHIP", id);
        let claim = claimed(claim_one(&h, &m, &l).await);
        let report = FailureReport {
            claim: &claim,
            mode: HandlerMode::Transactional,
            message: &m.message,
            lease: &l,
            error: "permanent",
            error_class,
            permanent: true,
            retry_delay_ms: 1000,
            answer: None,
            in_progress: false,
        };
        let mut tx = h.store().pool().begin().await.unwrap();
        h.store().fail_claimed(&mut *tx, &report).await.unwrap();
        tx.commit().await.unwrap();
    }

    let list = reads.stuck_records(10).await.unwrap();
    assert_eq!(list.total, 1, "the live lease is not stuck");
    let row = &list.rows[0];
    assert_eq!((row.id, row.consumer_group.as_str(), row.message_id.as_str()), (stuck_claim.id, GROUP, "SMS.1"));
    assert_eq!((row.message_type.as_str(), row.lease_owner.as_deref()), ("SMS.SEND", Some("worker-1")));
    assert_eq!((row.attempts, row.reentries, row.crash_loop), (1, 0, false));
    assert!((0..5).contains(&row.stuck_secs), "{}", row.stuck_secs);
    assert_eq!(Some(row.lease_token), h.record(GROUP, "SMS.1").await.unwrap().lease_token);

    let (cells, next) = reads.retry_cells().await.unwrap();
    assert_eq!(cells, [RetryCell { attempts: 1, message_type: "ORDER.PAY".into(), records: 1 }]);
    assert!(next.is_some(), "the failed record's retry is due");

    let groups = reads.dead_letter_groups(10).await.unwrap();
    let seen: Vec<(Option<&str>, i64, Vec<&str>)> = groups
        .iter()
        .map(|g| (g.error_class.as_deref(), g.records, g.message_types.iter().map(String::as_str).collect()))
        .collect();
    let expected = vec![
        (Some("HTTP_GONE"), 1, vec!["ORDER.SHIP"]),
        (Some("BOOM"), 3, vec!["ORDER.PAY", "ORDER.SHIP"]),
        (Some("BOOM "), 1, vec!["ORDER.SHIP"]),
    ];
    assert_eq!(seen, expected, "HTTP classes first, then the largest; each type once, sorted; classes by their bytes");
    assert!(groups[1].first_seen_at <= groups[1].last_seen_at);
    assert_eq!(reads.dead_letter_groups(1).await.unwrap().len(), 1);
}
