//! Conformance cases of settlements: completions and failures fenced by the lease token, dead
//! records, poison, the fast path's duplicates.

use chrono::Utc;

use super::claims::{claim_one, claimed, complete, fail, lease, msg, no_handler, record};
use super::{GROUP, Harness, assert_counts};
use crate::record::HandlerMode;
use crate::store::{ClaimedRecord, DedupStore, FailureOutcome, FailureReport};

/// A permanent error makes the record dead at its first attempt; so does any failure of the
/// last attempt allowed.
pub async fn dead_at_max_attempts_and_on_a_permanent_error<H: Harness>() {
    let h = H::fresh().await;
    let l = lease("w");
    let m = msg("ORDER.PAY.20:1", "ORDER.PAY", "{}");
    let c = claimed(claim_one(&h, &m, &l).await);
    assert_eq!(fail(&h, &c, &m, &l, true).await, FailureOutcome::Dead);
    let r = record(&h, &m).await;
    assert_eq!((r.status.as_str(), r.attempts, r.retry_due, r.leased), ("dead", 1, false, false));
    assert_eq!(r.error_class.as_deref(), Some("BOOM"));
    assert_counts(&h, "a permanent failure").await;

    let last = msg("ORDER.PAY.21:1", "ORDER.PAY", "{}");
    let c = claimed(claim_one(&h, &last, &l).await);
    let at_max = ClaimedRecord { attempt: c.max_attempts, ..c };
    assert_eq!(fail(&h, &at_max, &last, &l, false).await, FailureOutcome::Dead);
    assert_eq!(record(&h, &last).await.status, "dead");
    assert_counts(&h, "a failure at max attempts").await;
}

/// Only the lease's holder settles a claim: a completion under another lease token, or a
/// failure with a forged one, changes nothing; a settled claim is not settled again.
pub async fn completion_and_failure_are_fenced_by_the_lease_token<H: Harness>() {
    let h = H::fresh().await;
    let (a, b) = (lease("a"), lease("b"));
    let m = msg("ORDER.PAY.22:1", "ORDER.PAY", "{}");
    let c = claimed(claim_one(&h, &m, &a).await);
    assert_eq!(complete(&h, &[&c], &b).await, Vec::<i64>::new(), "another lease token completes nothing");
    let forged = ClaimedRecord { lease_token: b.token, ..c.clone() };
    assert_eq!(fail(&h, &forged, &m, &b, false).await, FailureOutcome::Superseded);
    let r = record(&h, &m).await;
    assert_eq!((r.status.as_str(), r.lease_token, r.version), ("processing", Some(a.token), 0));
    assert_counts(&h, "refused settlements").await;

    assert_eq!(complete(&h, &[&c], &a).await, [c.id]);
    assert_eq!(complete(&h, &[&c], &a).await, Vec::<i64>::new(), "a succeeded record is not completed again");
    assert_eq!(fail(&h, &c, &m, &a, false).await, FailureOutcome::Superseded);
    assert_eq!(record(&h, &m).await.status, "succeeded");
    assert_counts(&h, "a completion").await;

    // The testing-only single completion is fenced the same way.
    let n = msg("ORDER.PAY.23:1", "ORDER.PAY", "{}");
    let c = claimed(claim_one(&h, &n, &a).await);
    let mut conn = h.store().pool().acquire().await.unwrap();
    let other = ClaimedRecord { lease_token: b.token, ..c.clone() };
    assert!(!h.store().complete(&mut *conn, &other, &b, HandlerMode::Transactional, None).await.unwrap());
    assert!(h.store().complete(&mut *conn, &c, &a, HandlerMode::Transactional, None).await.unwrap());
    assert_counts(&h, "single completions").await;
    let failure = FailureReport {
        claim: &c,
        mode: HandlerMode::Transactional,
        message: &n.message,
        lease: &a,
        error: "late",
        error_class: "LATE",
        permanent: false,
        retry_delay_ms: 10,
        answer: None,
        in_progress: false,
    };
    assert_eq!(h.store().fail_claimed(&mut *conn, &failure).await.unwrap(), FailureOutcome::Superseded);
}

/// Poison is stored dead once (dead-lettered), then each copy is a duplicate on it, a copy with
/// another payload a payload conflict too.
pub async fn poison_is_recorded_once_then_counted_as_a_duplicate<H: Harness>() {
    let h = H::fresh().await;
    let m = msg("POISON.1", "POISON", "not json");
    let first = no_handler(&h, &m, true).await;
    assert!(first.dead_lettered && first.reused_of.is_none(), "{first:?}");
    let r = record(&h, &m).await;
    assert_eq!((r.id, r.status.as_str(), r.attempts, r.has_payload), (first.id, "dead", 0, true));
    assert_eq!((r.duplicate_count, r.error_class.as_deref()), (0, Some("UNPARSABLE_PAYLOAD")));
    assert_counts(&h, "a poison record").await;

    let again = no_handler(&h, &m, true).await;
    assert_eq!((again.id, again.dead_lettered, again.reused_of), (first.id, false, None));
    no_handler(&h, &msg("POISON.1", "POISON", "other bytes"), true).await;
    let r = record(&h, &m).await;
    assert_eq!((r.duplicate_count, r.payload_conflicts, r.version), (2, 1, 0));
    assert_eq!(h.message_types().await, ["POISON"]);
    assert_counts(&h, "poison copies").await;
}

/// A delivery without a handler under the id of a record of another type is a reused id: not
/// counted on it, its type named (`reused_of`).
pub async fn a_message_without_handler_under_another_types_id_is_a_reused_id<H: Harness>() {
    let h = H::fresh().await;
    let l = lease("w");
    let create = msg("ORDER.24:1", "ORDER.CREATE", r#"{"order":24}"#);
    let c = claimed(claim_one(&h, &create, &l).await);
    complete(&h, &[&c], &l).await;
    let stored = no_handler(&h, &msg("ORDER.24:1", "ORDER.PAY", r#"{"paid":24}"#), false).await;
    assert_eq!((stored.id, stored.dead_lettered), (c.id, false));
    assert_eq!(stored.reused_of.as_deref(), Some("ORDER.CREATE"));
    let r = record(&h, &create).await;
    assert_eq!((r.status.as_str(), r.duplicate_count, r.payload_conflicts), ("succeeded", 0, 0));
    assert_counts(&h, "a reused id without handler").await;
}

/// The fast path's duplicate counts are added to their records, however many a flush holds;
/// entries of unknown ids change nothing.
pub async fn fast_path_duplicates_are_added_to_their_records<H: Harness>() {
    let h = H::fresh().await;
    let l = lease("w");
    let m = msg("ORDER.PAY.25:1", "ORDER.PAY", "{}");
    let c = claimed(claim_one(&h, &m, &l).await);
    complete(&h, &[&c], &l).await;
    let mut entries = vec![
        (GROUP.to_owned(), "ORDER.PAY.25:1".to_owned(), 3, Utc::now()),
        (GROUP.to_owned(), "ORDER.PAY.unknown".to_owned(), 2, Utc::now()),
        ("another-group".to_owned(), "ORDER.PAY.25:1".to_owned(), 5, Utc::now()),
    ];
    // A flush holds whatever the fast path caught meanwhile: more than one statement's binds.
    entries.extend((0..2500).map(|n| (GROUP.to_owned(), format!("ORDER.PAY.gone-{n}"), 1, Utc::now())));
    h.store().add_fast_path_duplicates(&entries).await.unwrap();
    h.store().add_fast_path_duplicates(&entries[..1]).await.unwrap();
    assert_eq!(record(&h, &m).await.duplicate_count, 6);
    assert_counts(&h, "fast-path duplicates").await;
}

/// A retry's success writes its attempt row next to the failed one's (a first try's writes none).
pub async fn a_retry_completed_writes_its_attempt_row<H: Harness>() {
    let h = H::fresh().await;
    let m = msg("ORDER.PAY.26:1", "ORDER.PAY", "{}");
    let first = lease("a");
    let c = claimed(claim_one(&h, &m, &first).await);
    assert_eq!(fail(&h, &c, &m, &first, false).await, FailureOutcome::Failed);
    let second = lease("b");
    let retry = claimed(claim_one(&h, &m, &second).await);
    assert_eq!((retry.id, retry.attempt, retry.created), (c.id, 2, false));
    let r = record(&h, &m).await;
    assert_eq!((r.status.as_str(), r.retry_due, r.lease_token), ("processing", false, Some(second.token)));
    assert_counts(&h, "a retry's claim").await;
    assert_eq!(complete(&h, &[&retry], &second).await, [c.id]);
    let rows: Vec<(i32, Option<String>)> = vec![(1, Some("failed".into())), (2, Some("succeeded".into()))];
    assert_eq!(h.attempt_rows(c.id).await, rows);
    let r = record(&h, &m).await;
    assert_eq!((r.status.as_str(), r.has_payload, r.error_class, r.attempts), ("succeeded", false, None, 2));
    assert_counts(&h, "a retry's success").await;
}

/// A batch of 500 (the pipeline's largest) is claimed, then counted as 500 duplicates, in one
/// statement each however many binds that takes.
pub async fn a_batch_of_500<H: Harness>() {
    let h = H::fresh().await;
    let msgs: Vec<super::claims::Msg> =
        (0..500).map(|n| msg(&format!("ORDER.PAY.{n:03}:500"), "ORDER.PAY", "{}")).collect();
    let refs: Vec<&super::claims::Msg> = msgs.iter().collect();
    let l = lease("w");
    let first = super::claims::claim(&h, &refs, crate::store::ClaimAs::Succeeded, &l).await;
    assert!(first.iter().all(|o| matches!(o, crate::store::ClaimOutcome::Claimed(_))));
    let again = super::claims::claim(&h, &refs, crate::store::ClaimAs::Processing, &l).await;
    assert!(again.iter().all(|o| matches!(o, crate::store::ClaimOutcome::Existing(e) if e.same_payload)));
    assert_eq!(record(&h, &msgs[499]).await.duplicate_count, 1);
    assert_eq!(h.counted().await, [(GROUP.to_owned(), "succeeded".to_owned(), 500)]);
}
