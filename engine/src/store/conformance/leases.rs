//! Conformance cases of leased claims ([`crate::store::ClaimAs::Leased`], the testing-only
//! single leased claim) and [`LeaseStore`]: the lease floor, live and expired leases, reclaim
//! and hold, fencing, heartbeats, effect starts, releases, deferrals, late effects.

use std::time::Duration;

use super::claims::{claimed, existing, lease, msg, record, Msg};
use super::{GROUP, Harness, assert_counts};
use crate::handler::EffectAnswer;
use crate::message::IdSourceKind;
use crate::record::{ConsumerGroup, HandlerMode};
use crate::store::{
    ClaimAs, ClaimBatch, ClaimItem, ClaimOutcome, ClaimRequest, ClaimedRecord, DedupStore, FailureOutcome,
    FailureReport, Lease, LeaseStore,
};

/// A leased claim of `m` (at most 3 attempts), alone (autocommit).
pub(super) async fn claim_leased<H: Harness>(h: &H, m: &Msg, lease: &Lease, reclaim: bool) -> ClaimOutcome {
    let group = ConsumerGroup::parse(GROUP).unwrap();
    let request = ClaimRequest {
        group: &group,
        message_id: &m.id,
        message_type: m.message_type,
        mode: HandlerMode::Leased,
        max_attempts: 3,
        reclaim_expired: reclaim,
        lease,
        message: &m.message,
        payload_hash: &m.hash,
    };
    let mut conn = h.store().pool().acquire().await.unwrap();
    h.store().claim(&mut *conn, &request).await.unwrap()
}

/// A leased batch claim of `msgs`, alone (autocommit), each item's effect starting at once or not.
pub(super) async fn claim_batch<H: Harness>(h: &H, msgs: &[(&Msg, bool)], lease: &Lease, reclaim: bool) -> Vec<ClaimOutcome> {
    let group = ConsumerGroup::parse(GROUP).unwrap();
    let batch = ClaimBatch {
        group: &group,
        max_attempts: 3,
        lease,
        claim_as: ClaimAs::Leased,
        items: msgs
            .iter()
            .map(|(m, starts)| ClaimItem {
                message_id: &m.id,
                message_type: m.message_type,
                payload_hash: &m.hash,
                message: &m.message,
                id_source: IdSourceKind::Header,
                reclaim_expired: reclaim,
                starts_at_once: *starts,
            })
            .collect(),
    };
    let mut conn = h.store().pool().acquire().await.unwrap();
    h.store().claim_many(&mut *conn, &batch).await.unwrap()
}

async fn complete<H: Harness>(h: &H, claim: &ClaimedRecord, lease: &Lease) -> bool {
    let mut conn = h.store().pool().acquire().await.unwrap();
    h.store().complete(&mut *conn, claim, lease, HandlerMode::Leased, None).await.unwrap()
}

pub(super) fn failure<'a>(claim: &'a ClaimedRecord, m: &'a Msg, lease: &'a Lease, answer: Option<&'a EffectAnswer>) -> FailureReport<'a> {
    FailureReport {
        claim,
        mode: HandlerMode::Leased,
        message: &m.message,
        lease,
        error: "boom",
        error_class: "BOOM",
        permanent: false,
        retry_delay_ms: 10,
        answer,
        in_progress: false,
    }
}

/// A lease asked for zero (or less) lasts [`crate::store::MIN_LEASE`] by the database clock.
pub async fn a_lease_of_zero_or_less_is_raised_to_the_minimum<H: Harness>() {
    let h = H::fresh().await;
    let m = msg("ORDER.NOTIFY.1:3", "ORDER.NOTIFY", "{}");
    let zero = Lease::new("w", Duration::ZERO);
    assert_eq!(zero.millis(), 1000);
    let c = claimed(claim_leased(&h, &m, &zero, false).await);
    let remaining = h.lease_remaining_ms(c.id).await;
    assert!(remaining > 900.0 && remaining <= 1000.0, "{remaining}");
}

/// A live lease is never taken over, even where reclaim is allowed.
pub async fn a_live_lease_is_never_taken_even_with_reclaim_allowed<H: Harness>() {
    let h = H::fresh().await;
    let m = msg("ORDER.NOTIFY.2:3", "ORDER.NOTIFY", "{}");
    claimed(claim_leased(&h, &m, &lease("a"), true).await);
    let e = existing(claim_leased(&h, &m, &lease("b"), true).await);
    assert!(!e.lease_expired && !e.parked, "{e:?}");
    assert_counts(&h, "a live lease").await;
}

/// An expired lease is taken over only where reclaim is allowed (else the delivery is parked),
/// as attempt 2 and a re-entry, closing the old attempt; the old holder can settle nothing.
pub async fn an_expired_lease_is_reclaimed_only_when_allowed_and_the_old_holder_is_fenced_out<H: Harness>() {
    let h = H::fresh().await;
    let m = msg("ORDER.NOTIFY.3:3", "ORDER.NOTIFY", "{}");
    let first = lease("a");
    let a = claimed(claim_leased(&h, &m, &first, true).await);
    assert_eq!((a.calls, a.previous_status), (1, None));
    h.expire_lease(a.id).await;
    let held = existing(claim_leased(&h, &m, &lease("b"), false).await);
    assert!(held.lease_expired && held.parked, "{held:?}");
    let second = lease("c");
    let c = claimed(claim_leased(&h, &m, &second, true).await);
    assert!(c.took_over && !c.created);
    assert_eq!((c.attempt, c.calls), (2, 2));
    assert_eq!(record(&h, &m).await.reentries, 1);
    let rows: Vec<(i32, Option<String>)> = vec![(1, Some("lease_lost".into())), (2, None)];
    assert_eq!(h.attempt_rows(c.id).await, rows);
    assert_counts(&h, "a takeover").await;

    assert!(!complete(&h, &a, &first).await, "the old holder cannot complete");
    let mut conn = h.store().pool().acquire().await.unwrap();
    let late = failure(&a, &m, &first, None);
    assert_eq!(h.store().fail_claimed(&mut *conn, &late).await.unwrap(), FailureOutcome::Superseded);
    assert!(complete(&h, &c, &second).await, "the new holder completes");
    let r = record(&h, &m).await;
    assert_eq!((r.status.as_str(), r.attempts, r.has_payload), ("succeeded", 2, false));
    assert_counts(&h, "a completion after a takeover").await;
}

/// The heartbeat extends only leases whose token it presents.
pub async fn extending_a_lease_needs_its_token<H: Harness>() {
    let h = H::fresh().await;
    let m = msg("ORDER.NOTIFY.4:3", "ORDER.NOTIFY", "{}");
    let l = Lease::new("a", Duration::from_secs(2));
    let c = claimed(claim_leased(&h, &m, &l, false).await);
    let mut conn = h.store().pool().acquire().await.unwrap();
    assert_eq!(h.store().extend_leases(&mut *conn, &[&c], &lease("a")).await.unwrap(), vec![c.id]);
    assert!(h.lease_remaining_ms(c.id).await > 20_000.0);
    let forged = ClaimedRecord { lease_token: uuid::Uuid::new_v4(), ..c };
    assert_eq!(h.store().extend_leases(&mut *conn, &[&forged], &l).await.unwrap(), Vec::<i64>::new());
}

/// A leased record that failed is claimed again until its attempts run out; each failure closes
/// its attempt with the effect's answer (read back by `attempt_outcome`), and the record keeps
/// the delivery the claim stored.
pub async fn a_failed_leased_record_is_claimable_until_its_attempts_run_out<H: Harness>() {
    let h = H::fresh().await;
    let m = msg("ORDER.NOTIFY.5:3", "ORDER.NOTIFY", r#"{"n":5}"#);
    let answer = EffectAnswer { status: Some(503), latency: Duration::from_millis(12), summary: "busy".into() };
    for attempt in 1..=3 {
        let l = lease("w");
        let c = claimed(claim_leased(&h, &m, &l, false).await);
        assert_eq!((c.attempt, c.calls), (attempt, attempt));
        assert_eq!(c.previous_status, (attempt > 1).then_some(503));
        let mut conn = h.store().pool().acquire().await.unwrap();
        let expected = if attempt == 3 { FailureOutcome::Dead } else { FailureOutcome::Failed };
        assert_eq!(h.store().fail_claimed(&mut *conn, &failure(&c, &m, &l, Some(&answer))).await.unwrap(), expected);
        let r = record(&h, &m).await;
        assert_eq!((r.leased, r.has_payload, r.attempts), (false, true, attempt));
        assert_counts(&h, &format!("leased failure {attempt}")).await;
    }
    assert!(matches!(claim_leased(&h, &m, &lease("w"), true).await, ClaimOutcome::Existing(_)));
    let id = record(&h, &m).await.id;
    let rows: Vec<(i32, Option<String>)> =
        [(1, "failed"), (2, "failed"), (3, "dead")].into_iter().map(|(a, o)| (a, Some(o.to_owned()))).collect();
    assert_eq!(h.attempt_rows(id).await, rows);
    // The store reads each attempt's outcome back (a failure whose answer was lost).
    let mut conn = h.store().pool().acquire().await.unwrap();
    for (attempt, outcome) in [(1, Some("failed")), (3, Some("dead")), (4, None)] {
        let read = h.store().attempt_outcome(&mut *conn, id, attempt).await.unwrap();
        assert_eq!(read.as_deref(), outcome, "attempt {attempt}");
    }
}

/// A leased batch creates records with their delivery and attempt rows; a record whose lease
/// expired before its effect started is taken over whatever the reclaim policy; a started one
/// is not; effect starts, releases, deferrals and late effects are fenced by the token.
pub async fn leased_batches_and_their_settlements<H: Harness>() {
    let h = H::fresh().await;
    let (a, b, c) = (
        msg("ORDER.NOTIFY.7:a", "ORDER.NOTIFY", "{}"),
        msg("ORDER.NOTIFY.7:b", "ORDER.NOTIFY", "{}"),
        msg("ORDER.NOTIFY.7:c", "ORDER.NOTIFY", "{}"),
    );
    let first = lease("w1");
    let claims: Vec<ClaimedRecord> =
        claim_batch(&h, &[(&a, false), (&b, true), (&c, false)], &first, false).await.into_iter().map(claimed).collect();
    assert!(claims.iter().all(|c| c.created && c.calls == 1), "{claims:?}");
    let r = record(&h, &a).await;
    assert_eq!((r.status.as_str(), r.has_payload, r.id_source.as_deref()), ("processing", true, Some("h")));
    assert_counts(&h, "a leased batch").await;
    let mut conn = h.store().pool().acquire().await.unwrap();
    let forged = ClaimedRecord { lease_token: uuid::Uuid::new_v4(), ..claims[2].clone() };
    assert_eq!(h.store().mark_effects_started(&mut *conn, &[&claims[2], &forged]).await.unwrap(), [claims[2].id]);

    // a: never started, expired: taken over without reclaim. b, c: started, expired: parked.
    for c in &claims {
        h.expire_lease(c.id).await;
    }
    let second = lease("w2");
    let again = claim_batch(&h, &[(&a, true), (&b, true), (&c, true)], &second, false).await;
    let taken = claimed(again[0].clone());
    assert!(taken.took_over && taken.attempt == 2, "{taken:?}");
    assert!(existing(again[1].clone()).parked && existing(again[2].clone()).parked);
    assert_counts(&h, "a takeover of an unstarted effect").await;

    // The late worker's effect ran: flagged on its attempt, the takeover's attempt untouched.
    let answer = EffectAnswer { status: Some(200), latency: Duration::from_millis(5), summary: "ok".into() };
    h.store().note_late_effect(&mut *conn, &claims[0], Some(&answer)).await.unwrap();
    assert_eq!(h.late_effects(taken.id).await, [1]);

    // Release a's new claim: failed, one attempt less, its attempt row gone.
    let stale = ClaimedRecord { lease_token: claims[0].lease_token, ..taken.clone() };
    assert_eq!(h.store().release_unstarted(&mut *conn, &[&stale], 1000).await.unwrap(), Vec::<i64>::new());
    assert_eq!(h.store().release_unstarted(&mut *conn, &[&taken], 1000).await.unwrap(), [taken.id]);
    let r = record(&h, &a).await;
    assert_eq!((r.status.as_str(), r.attempts, r.retry_due), ("failed", 1, true));
    assert_eq!(h.attempt_rows(taken.id).await, [(1, Some("lease_lost".to_owned()))]);
    assert_counts(&h, "a release").await;

    // Defer b: failed, one attempt less, its attempt closed as deferred; then complete c.
    let busy = failure(&claims[1], &b, &first, None);
    let busy = FailureReport { in_progress: true, ..busy };
    assert!(h.store().defer_claimed(&mut *conn, &busy, Some(Duration::from_secs(60))).await.unwrap());
    let r = record(&h, &b).await;
    assert_eq!((r.status.as_str(), r.attempts), ("failed", 0));
    assert_eq!(h.attempt_rows(claims[1].id).await, [(1, Some("deferred".to_owned()))]);
    assert_eq!(h.store().complete_many_leased(&mut *conn, &[(&claims[2], Some(&answer))]).await.unwrap(), [claims[2].id]);
    assert_eq!(h.attempt_rows(claims[2].id).await, [(1, Some("succeeded".to_owned()))]);
    assert_counts(&h, "a deferral and a completion").await;
}

/// Eight leased claims of one new id at once, each committed alone: one claims it, the others
/// find it under a live lease (not counted); no error reaches the caller.
pub async fn eight_concurrent_leased_claims_of_one_id_make_one_claim<H: Harness>() {
    let h = H::fresh().await;
    let m = msg("ORDER.NOTIFY.8:1", "ORDER.NOTIFY", "{}");
    let leases: Vec<Lease> = (0..8).map(|i| lease(&format!("w{i}"))).collect();
    let item = [(&m, true)];
    let outcomes = futures::future::join_all(leases.iter().map(|l| claim_batch(&h, &item, l, true))).await;
    let claimed: Vec<&ClaimOutcome> =
        outcomes.iter().flatten().filter(|o| matches!(o, ClaimOutcome::Claimed(_))).collect();
    assert_eq!(claimed.len(), 1, "{outcomes:?}");
    let r = record(&h, &m).await;
    assert_eq!((r.status.as_str(), r.attempts, r.duplicate_count), ("processing", 1, 0));
    assert_eq!(h.attempt_rows(r.id).await, [(1, None)]);
    assert_counts(&h, "concurrent leased claims").await;
}
