//! Conformance cases of claims: new records and duplicates, reused ids and the `NO_HANDLER`
//! rule, byte-wise keys, stuck records, concurrent claims, batches.

use std::time::Duration;

use super::{GROUP, Harness, assert_counts, delivery};
use crate::message::{IdSourceKind, InboundMessage};
use crate::record::{ConsumerGroup, MessageId, RecordStatus};
use crate::store::{
    ClaimAs, ClaimBatch, ClaimItem, ClaimOutcome, ClaimedRecord, DedupStore, ExistingRecord, FailureOutcome,
    FailureReport, Lease, PoisonRecord,
};
use crate::record::HandlerMode;

/// A delivery the cases claim.
pub struct Msg {
    /// Its id.
    pub id: MessageId,
    /// Its message type.
    pub message_type: &'static str,
    /// The delivery.
    pub message: InboundMessage,
    /// SHA-256 of its payload.
    pub hash: Vec<u8>,
}

/// A delivery of `message_type` under `id` with `body`.
pub fn msg(id: &str, message_type: &'static str, body: &str) -> Msg {
    let message = delivery(id, body);
    let hash = message.payload_hash();
    Msg { id: MessageId::parse(id).expect("a valid id"), message_type, message, hash }
}

/// The group of the cases.
pub fn group() -> ConsumerGroup {
    ConsumerGroup::parse(GROUP).expect("a valid group")
}

/// A lease of 30 s of worker `owner`.
pub fn lease(owner: &str) -> Lease {
    Lease::new(owner, Duration::from_secs(30))
}

/// Claims `msgs` as `claim_as` under `lease` (at most 3 attempts) in a transaction of its own,
/// committed.
pub async fn claim<H: Harness>(h: &H, msgs: &[&Msg], claim_as: ClaimAs, lease: &Lease) -> Vec<ClaimOutcome> {
    claim_in(h, &group(), msgs, claim_as, lease).await
}

/// [`claim`] in consumer group `group`.
pub async fn claim_in<H: Harness>(
    h: &H,
    group: &ConsumerGroup,
    msgs: &[&Msg],
    claim_as: ClaimAs,
    lease: &Lease,
) -> Vec<ClaimOutcome> {
    let (outcomes, tx) = claim_uncommitted(h, group, msgs, claim_as, lease).await;
    tx.commit().await.unwrap();
    outcomes
}

/// [`claim_in`], its transaction left open: a claim in flight, its rows locked until the
/// caller commits or drops it.
pub async fn claim_uncommitted<H: Harness>(
    h: &H,
    group: &ConsumerGroup,
    msgs: &[&Msg],
    claim_as: ClaimAs,
    lease: &Lease,
) -> (Vec<ClaimOutcome>, sqlx::Transaction<'static, <H::Store as DedupStore>::Db>) {
    let batch = ClaimBatch {
        group,
        max_attempts: 3,
        lease,
        claim_as,
        items: msgs.iter().map(|m| item(m)).collect(),
    };
    let mut tx = h.store().pool().begin().await.unwrap();
    let outcomes = h.store().claim_many(&mut *tx, &batch).await.expect("a claim makes no error");
    (outcomes, tx)
}

/// The one outcome of claiming `m` as `processing`.
pub async fn claim_one<H: Harness>(h: &H, m: &Msg, lease: &Lease) -> ClaimOutcome {
    claim(h, &[m], ClaimAs::Processing, lease).await.pop().expect("one outcome")
}

/// The claim an outcome must be.
pub fn claimed(outcome: ClaimOutcome) -> ClaimedRecord {
    match outcome {
        ClaimOutcome::Claimed(c) => c,
        other => panic!("expected a claim, got {other:?}"),
    }
}

/// The existing record an outcome must be.
pub fn existing(outcome: ClaimOutcome) -> ExistingRecord {
    match outcome {
        ClaimOutcome::Existing(e) => e,
        other => panic!("expected an existing record, got {other:?}"),
    }
}

/// Completes `claims` under `lease` in a transaction of its own; the ids completed.
pub async fn complete<H: Harness>(h: &H, claims: &[&ClaimedRecord], lease: &Lease) -> Vec<i64> {
    let mut tx = h.store().pool().begin().await.unwrap();
    let done = h.store().complete_many(&mut *tx, claims, lease).await.unwrap();
    tx.commit().await.unwrap();
    done
}

/// Fails `claim` of `m` (transactional) in a transaction of its own.
pub async fn fail<H: Harness>(h: &H, claim: &ClaimedRecord, m: &Msg, lease: &Lease, permanent: bool) -> FailureOutcome {
    let failure = FailureReport {
        claim,
        mode: HandlerMode::Transactional,
        message: &m.message,
        lease,
        error: "boom",
        error_class: "BOOM",
        permanent,
        retry_delay_ms: 1000,
        answer: None,
        in_progress: false,
    };
    let mut tx = h.store().pool().begin().await.unwrap();
    let outcome = h.store().fail_claimed(&mut *tx, &failure).await.unwrap();
    tx.commit().await.unwrap();
    outcome
}

/// Stores `m` as a dead record without a handler (`NO_HANDLER: <type>`), or as poison.
pub async fn no_handler<H: Harness>(h: &H, m: &Msg, poison: bool) -> crate::store::PoisonStored {
    let group = group();
    let reason_kind = if poison { "UNPARSABLE_PAYLOAD".to_owned() } else { format!("NO_HANDLER: {}", m.message_type) };
    let record = PoisonRecord {
        group: &group,
        message_id: &m.id,
        message_type: m.message_type,
        reason: "no handler",
        reason_kind: &reason_kind,
        message: &m.message,
        payload_hash: &m.hash,
        keep_payload_bytes: 1024,
        max_attempts: 3,
        poison,
        id_source: Some(IdSourceKind::Property),
    };
    let mut conn = h.store().pool().acquire().await.unwrap();
    h.store().record_poison(&mut *conn, &record).await.unwrap()
}

/// The record of `m`.
pub async fn record<H: Harness>(h: &H, m: &Msg) -> super::RecordRow {
    h.record(GROUP, m.id.as_str()).await.expect("the record exists")
}

/// A new record is created `processing` under the lease; a delivery under its live lease is sent
/// back uncounted; once it succeeded, copies are counted, a payload conflict too.
pub async fn a_new_claim_then_a_duplicate_counted_on_it<H: Harness>() {
    let h = H::fresh().await;
    let m = msg("ORDER.PAY.1:1", "ORDER.PAY", r#"{"n":1}"#);
    let a = lease("a");
    let c = claimed(claim_one(&h, &m, &a).await);
    assert!(c.created && !c.took_over, "{c:?}");
    assert_eq!((c.attempt, c.max_attempts, c.lease_token), (1, 3, a.token));
    let r = record(&h, &m).await;
    assert_eq!((r.status.as_str(), r.version, r.lease_token, r.leased), ("processing", 0, Some(a.token), true));
    assert_eq!((r.id, r.id_source.as_deref()), (c.id, Some("p")));
    assert_counts(&h, "a new claim").await;

    let live = existing(claim_one(&h, &m, &lease("b")).await);
    assert_eq!((live.id, live.status), (c.id, RecordStatus::Processing));
    assert!(!live.lease_expired && !live.parked && live.same_type && live.same_payload, "{live:?}");
    assert!(live.lease_expires_at.is_some());
    assert_eq!(record(&h, &m).await.duplicate_count, 0, "a delivery under a live lease is not counted");

    assert_eq!(complete(&h, &[&c], &a).await, [c.id]);
    let r = record(&h, &m).await;
    assert_eq!((r.status.as_str(), r.leased, r.completed, r.version), ("succeeded", false, true, 1));
    assert_eq!(h.attempt_rows(c.id).await, [], "a first-try success writes no attempt row");
    assert_counts(&h, "a completion").await;

    let dup = existing(claim_one(&h, &m, &lease("b")).await);
    assert_eq!((dup.id, dup.status, dup.lease_expires_at), (c.id, RecordStatus::Succeeded, None));
    assert!(dup.same_type && dup.same_payload && !dup.parked && !dup.lease_expired && dup.delay_ms >= 0, "{dup:?}");
    let other = msg("ORDER.PAY.1:1", "ORDER.PAY", r#"{"n":2}"#);
    let conflict = existing(claim_one(&h, &other, &lease("b")).await);
    assert!(conflict.same_type && !conflict.same_payload, "{conflict:?}");
    let r = record(&h, &m).await;
    assert_eq!((r.duplicate_count, r.payload_conflicts, r.version), (2, 1, 1));
    assert_eq!(h.message_types().await, ["ORDER.PAY"]);
    assert_counts(&h, "duplicates").await;
}

/// A failed record with attempts left is claimed again (attempt n + 1), until the last
/// attempt's failure makes it dead; a dead record is a duplicate.
pub async fn a_failed_record_is_claimed_again_until_its_attempts_run_out<H: Harness>() {
    let h = H::fresh().await;
    let m = msg("ORDER.PAY.2:1", "ORDER.PAY", r#"{"n":2}"#);
    for attempt in 1..=3 {
        let l = lease("w");
        let c = claimed(claim_one(&h, &m, &l).await);
        assert_eq!((c.attempt, c.created), (attempt, attempt == 1));
        let expected = if attempt == 3 { FailureOutcome::Dead } else { FailureOutcome::Failed };
        assert_eq!(fail(&h, &c, &m, &l, false).await, expected);
        let r = record(&h, &m).await;
        assert_eq!((r.status.as_str(), r.attempts, r.leased), (expected_status(expected), attempt, false));
        assert_eq!((r.retry_due, r.has_payload), (attempt < 3, true), "{r:?}");
        assert_eq!((r.last_error.as_deref(), r.error_class.as_deref()), (Some("boom"), Some("BOOM")));
        assert_counts(&h, &format!("failure {attempt}")).await;
    }
    let dead = existing(claim_one(&h, &m, &lease("w")).await);
    assert_eq!(dead.status, RecordStatus::Dead);
    assert_eq!(record(&h, &m).await.duplicate_count, 1);
    let id = record(&h, &m).await.id;
    let outcomes: Vec<(i32, Option<String>)> =
        [(1, "failed"), (2, "failed"), (3, "dead")].into_iter().map(|(a, o)| (a, Some(o.to_owned()))).collect();
    assert_eq!(h.attempt_rows(id).await, outcomes);
    assert_counts(&h, "a duplicate of a dead record").await;
}

fn expected_status(outcome: FailureOutcome) -> &'static str {
    match outcome {
        FailureOutcome::Dead => "dead",
        FailureOutcome::Failed => "failed",
        FailureOutcome::Superseded => "processing",
    }
}

/// A claim into `succeeded` creates new records with no lease and no attempt row, and takes a
/// failed one over with the retry's attempt row, its stored delivery and error cleared.
pub async fn claims_straight_into_succeeded<H: Harness>() {
    let h = H::fresh().await;
    let (m1, m2) = (msg("ORDER.PAY.3:1", "ORDER.PAY", "{}"), msg("ORDER.PAY.3:2", "ORDER.PAY", "{}"));
    let l = lease("w");
    for c in claim(&h, &[&m1, &m2], ClaimAs::Succeeded, &l).await.into_iter().map(claimed) {
        assert!(c.created && c.attempt == 1, "{c:?}");
        assert_eq!(h.attempt_rows(c.id).await, []);
    }
    let r = record(&h, &m1).await;
    assert_eq!((r.status.as_str(), r.leased, r.completed, r.attempts), ("succeeded", false, true, 1));
    assert_counts(&h, "claims into succeeded").await;

    let m3 = msg("ORDER.PAY.3:3", "ORDER.PAY", "{}");
    let first = claimed(claim_one(&h, &m3, &l).await);
    assert_eq!(fail(&h, &first, &m3, &l, false).await, FailureOutcome::Failed);
    let retry = claimed(claim(&h, &[&m3], ClaimAs::Succeeded, &lease("v")).await.remove(0));
    assert_eq!((retry.attempt, retry.created, retry.id), (2, false, first.id));
    let r = record(&h, &m3).await;
    assert_eq!((r.status.as_str(), r.leased, r.completed, r.has_payload), ("succeeded", false, true, false));
    assert_eq!((r.error_class, r.retry_due, r.version), (None, false, 2));
    let rows: Vec<(i32, Option<String>)> = vec![(1, Some("failed".into())), (2, Some("succeeded".into()))];
    assert_eq!(h.attempt_rows(first.id).await, rows);
    assert_counts(&h, "a retry claimed into succeeded").await;
}

/// A delivery of another message type under an existing id (a reused id) never takes the record
/// over, and counts nothing on it: `same_type` false.
pub async fn a_reused_id_of_another_type_is_neither_claimed_nor_counted<H: Harness>() {
    let h = H::fresh().await;
    let l = lease("w");
    let create = msg("ORDER.4:1", "ORDER.CREATE", r#"{"order":4}"#);
    let c = claimed(claim_one(&h, &create, &l).await);
    assert_eq!(fail(&h, &c, &create, &l, false).await, FailureOutcome::Failed);
    let pay = msg("ORDER.4:1", "ORDER.PAY", r#"{"order":4,"paid":true}"#);
    let reused = existing(claim_one(&h, &pay, &l).await);
    assert_eq!((reused.id, reused.status, reused.same_type), (c.id, RecordStatus::Failed, false));
    let r = record(&h, &create).await;
    assert_eq!((r.status.as_str(), r.attempts, r.message_type.as_str()), ("failed", 1, "ORDER.CREATE"));
    assert_eq!((r.duplicate_count, r.payload_conflicts), (0, 0));

    let done = msg("ORDER.5:1", "ORDER.CREATE", r#"{"order":5}"#);
    claim(&h, &[&done], ClaimAs::Succeeded, &l).await;
    let later = existing(claim(&h, &[&msg("ORDER.5:1", "ORDER.PAY", "{}")], ClaimAs::Succeeded, &l).await.remove(0));
    assert!(!later.same_type, "{later:?}");
    assert_eq!(record(&h, &done).await.duplicate_count, 0);
    assert_eq!(h.message_types().await, ["ORDER.CREATE"]);
    assert_counts(&h, "reused ids").await;
}

/// A record dead for want of a handler is claimed by its own message — of its type, or of
/// another type with the same payload (a type mapping added since) — and its stored delivery
/// and error class give way; another type with another payload is a reused id.
pub async fn a_no_handler_record_is_claimed_by_its_own_message<H: Harness>() {
    let h = H::fresh().await;
    let l = lease("w");
    let own = msg("ORDER.6:1", "ORDER.PAY", r#"{"order":6}"#);
    assert!(no_handler(&h, &own, false).await.dead_lettered);
    assert_counts(&h, "a NO_HANDLER record").await;
    let c = claimed(claim_one(&h, &own, &l).await);
    assert_eq!((c.attempt, c.created), (1, false));
    let r = record(&h, &own).await;
    assert_eq!((r.status.as_str(), r.error_class, r.has_payload), ("processing", None, false));
    assert_counts(&h, "a NO_HANDLER record claimed").await;

    let shipped = msg("ORDER.7:1", "ORDER.SHIP", r#"{"order":7}"#);
    no_handler(&h, &shipped, false).await;
    let mapped = msg("ORDER.7:1", "ORDER.PAY", r#"{"order":7}"#);
    let c = claimed(claim_one(&h, &mapped, &l).await);
    assert_eq!(record(&h, &mapped).await.message_type, "ORDER.PAY");
    assert_eq!(c.attempt, 1);

    let other = msg("ORDER.8:1", "ORDER.SHIP", r#"{"order":8}"#);
    no_handler(&h, &other, false).await;
    let reused = existing(claim_one(&h, &msg("ORDER.8:1", "ORDER.PAY", r#"{"order":"other"}"#), &l).await);
    assert_eq!((reused.status, reused.same_type), (RecordStatus::Dead, false));
    let r = record(&h, &other).await;
    assert_eq!((r.status.as_str(), r.duplicate_count, r.message_type.as_str()), ("dead", 0, "ORDER.SHIP"));
    assert_eq!(h.message_types().await, ["ORDER.PAY", "ORDER.SHIP"]);
    assert_counts(&h, "NO_HANDLER claims").await;
}

/// The dedup key compares bytes: case, trailing spaces and accents make other keys.
pub async fn keys_compare_bytes<H: Harness>() {
    let h = H::fresh().await;
    let ids = ["ORDER.PAY.A-1:1", "ORDER.PAY.a-1:1", "ORDER.PAY.a", "ORDER.PAY.a ", "ORDER.PAY.Ä-1:1"];
    let msgs: Vec<Msg> = ids.iter().map(|id| msg(id, "ORDER.PAY", "{}")).collect();
    let refs: Vec<&Msg> = msgs.iter().collect();
    let claims: Vec<ClaimedRecord> =
        claim(&h, &refs, ClaimAs::Succeeded, &lease("w")).await.into_iter().map(claimed).collect();
    assert!(claims.iter().all(|c| c.created), "{claims:?}");
    let mut distinct: Vec<i64> = claims.iter().map(|c| c.id).collect();
    distinct.sort();
    distinct.dedup();
    assert_eq!(distinct.len(), ids.len());
    for (m, c) in msgs.iter().zip(&claims) {
        assert_eq!(record(&h, m).await.id, c.id, "{:?}", m.id.as_str());
    }
    let again = existing(claim_one(&h, &msgs[1], &lease("w")).await);
    assert_eq!(again.id, claims[1].id);
    assert_eq!(h.counted().await, [(GROUP.to_owned(), "succeeded".to_owned(), 5)]);
    assert_counts(&h, "byte-wise keys").await;
}

/// A delivery of a record whose lease expired (stuck) is parked and counted; it is not taken
/// over by a transactional claim.
pub async fn a_duplicate_under_an_expired_lease_is_parked_and_counted<H: Harness>() {
    let h = H::fresh().await;
    let m = msg("ORDER.PAY.9:1", "ORDER.PAY", "{}");
    let c = claimed(claim_one(&h, &m, &lease("a")).await);
    h.expire_lease(c.id).await;
    let stuck = existing(claim_one(&h, &m, &lease("b")).await);
    assert_eq!(stuck.status, RecordStatus::Processing);
    assert!(stuck.lease_expired && stuck.parked, "{stuck:?}");
    let r = record(&h, &m).await;
    assert_eq!((r.parked, r.duplicate_count, r.lease_token), (true, 1, Some(c.lease_token)));
    assert_counts(&h, "a parked delivery").await;
}

/// Eight transactions claiming one new id at once: one claims it, the seven others wait for
/// its commit and count a duplicate on the record it completed; no error reaches the caller.
pub async fn eight_concurrent_claims_of_one_id_make_one_claim<H: Harness>() {
    let h = H::fresh().await;
    let m = msg("ORDER.PAY.10:1", "ORDER.PAY", "{}");
    let group = group();
    let one = |owner: String| {
        let (h, m, group) = (&h, &m, &group);
        async move {
            let l = lease(&owner);
            let batch = ClaimBatch {
                group,
                max_attempts: 3,
                lease: &l,
                claim_as: ClaimAs::Processing,
                items: vec![item(m)],
            };
            let mut tx = h.store().pool().begin().await?;
            let outcome = h.store().claim_many(&mut *tx, &batch).await?.remove(0);
            if let ClaimOutcome::Claimed(c) = &outcome {
                // Held a while, so that the others queue behind it.
                tokio::time::sleep(Duration::from_millis(200)).await;
                assert_eq!(h.store().complete_many(&mut *tx, &[c], &l).await?, [c.id]);
            }
            tx.commit().await?;
            Ok::<_, crate::store::StoreError>(outcome)
        }
    };
    let outcomes = futures::future::join_all((0..8).map(|i| one(format!("w{i}")))).await;
    let outcomes: Vec<ClaimOutcome> =
        outcomes.into_iter().map(|o| o.expect("no error surfaces from concurrent claims")).collect();
    let claimed_ids: Vec<i64> =
        outcomes.iter().filter_map(|o| if let ClaimOutcome::Claimed(c) = o { Some(c.id) } else { None }).collect();
    assert_eq!(claimed_ids.len(), 1, "{outcomes:?}");
    for o in &outcomes {
        if let ClaimOutcome::Existing(e) = o {
            assert_eq!((e.id, e.status), (claimed_ids[0], RecordStatus::Succeeded), "{e:?}");
        }
    }
    let r = record(&h, &m).await;
    assert_eq!((r.status.as_str(), r.duplicate_count), ("succeeded", 7));
    assert_counts(&h, "concurrent claims").await;
}

/// A batch's outcomes follow its items' order whatever order the store locks in.
pub async fn a_batch_claims_new_and_counts_existing_in_item_order<H: Harness>() {
    let h = H::fresh().await;
    let (a, b, c) = (msg("ORDER.PAY.11:a", "ORDER.PAY", "{}"), msg("ORDER.PAY.11:b", "ORDER.PAY", "{}"), msg("ORDER.PAY.11:c", "ORDER.REFUND", "{}"));
    let before = claimed(claim(&h, &[&b], ClaimAs::Succeeded, &lease("w")).await.remove(0));
    let outcomes = claim(&h, &[&c, &a, &b], ClaimAs::Processing, &lease("w")).await;
    let (oc, oa) = (claimed(outcomes[0].clone()), claimed(outcomes[1].clone()));
    assert_eq!(record(&h, &c).await.id, oc.id);
    assert_eq!(record(&h, &a).await.id, oa.id);
    assert_eq!(existing(outcomes[2].clone()).id, before.id);
    assert_eq!(h.message_types().await, ["ORDER.PAY", "ORDER.REFUND"]);
    assert_counts(&h, "a mixed batch").await;
}

/// Transactions claiming overlapping batches of new ids at once, in different item orders: each
/// id is claimed once, every other claim of it is a duplicate, and the counts stay exact. A
/// transaction lost to a deadlock is run again, as the pipeline runs a lost transaction again:
/// PostgreSQL never loses one here (rows locked in one order wait for each other); InnoDB can,
/// because its duplicate-key checks take next-key locks, which cover the gap below a key, so
/// one lock order does not rule out a cycle (docs/DESIGN.md, "MySQL store").
pub async fn overlapping_batches_claimed_at_once_claim_each_id_once<H: Harness>() {
    let h = H::fresh().await;
    let msgs: Vec<Msg> = (0..40).map(|n| msg(&format!("ORDER.PAY.{n:02}:12"), "ORDER.PAY", "{}")).collect();
    let group = group();
    let one = |from: usize, reversed: bool| {
        let (h, group) = (&h, &group);
        let mut batch: Vec<&Msg> = msgs[from..from + 20].iter().collect();
        if reversed {
            batch.reverse();
        }
        async move {
            let l = lease("w");
            let batch = ClaimBatch {
                group,
                max_attempts: 3,
                lease: &l,
                claim_as: ClaimAs::Succeeded,
                items: batch.iter().map(|m| item(m)).collect(),
            };
            let mut lost = 0;
            loop {
                let mut tx = h.store().pool().begin().await.unwrap();
                match h.store().claim_many(&mut *tx, &batch).await {
                    Ok(outcomes) => {
                        tx.commit().await.unwrap();
                        let claimed = outcomes.iter().filter(|o| matches!(o, ClaimOutcome::Claimed(_))).count();
                        return (claimed, lost);
                    }
                    Err(e) if e.is_transient() && lost < 100 => lost += 1,
                    Err(e) => panic!("a claim failed: {e}"),
                }
            }
        }
    };
    let runs = [(0, false), (10, true), (20, false), (5, true), (15, false), (0, true)];
    let results = futures::future::join_all(runs.iter().map(|&(from, rev)| one(from, rev))).await;
    let lost: usize = results.iter().map(|r| r.1).sum();
    eprintln!("{}: {lost} transaction(s) lost to deadlocks and run again", H::NAME);
    if H::NAME == "postgres" {
        assert_eq!(lost, 0, "PostgreSQL waits instead of deadlocking");
    }
    assert_eq!(results.iter().map(|r| r.0).sum::<usize>(), 40, "{results:?}");
    let mut duplicates = 0;
    for m in &msgs {
        duplicates += record(&h, m).await.duplicate_count;
    }
    assert_eq!(duplicates, 6 * 20 - 40);
    assert_counts(&h, "overlapping batches").await;
}

/// The batch item of `m` (id from the AMQP property).
fn item(m: &Msg) -> ClaimItem<'_> {
    ClaimItem {
        message_id: &m.id,
        message_type: m.message_type,
        payload_hash: &m.hash,
        message: &m.message,
        id_source: IdSourceKind::Property,
        reclaim_expired: false,
        starts_at_once: true,
    }
}
