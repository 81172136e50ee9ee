//! Conformance case of the cleanup schedules ([`crate::actions::cleanup`] through
//! [`crate::actions::cleanup::CleanupBooks`]): schedules saved by compare-and-set, a run deleting
//! only what is past its retention in bounded batches with the status counts following, the
//! fingerprints of what it deleted finding a late copy, one runner per schedule, the retention
//! watch and advice, every run recorded and audited.

use std::time::Duration;

use chrono::Utc;

use super::claims::{claim_one, claimed, complete, fail, group, lease, msg};
use super::roles::{copy, keep};
use super::{GROUP, Harness};
use crate::actions::ActionError;
use crate::actions::cleanup::late::{RetentionWatch, late_duplicates};
use crate::actions::cleanup::execute_run;
use crate::actions::cleanup::scheduler::{cleanup_run_now, run_due};
use crate::actions::cleanup::{
    CleanupRun, CleanupBooks, DeleteBatch, ScheduleInput, cleanup_dry_run, cleanup_runs, cleanup_schedule_save, cleanup_schedules,
    retention_advice,
};
use crate::audit::AuditFilter;
use crate::console::console_store;
use crate::record::RecordStatus;
use crate::store::roles::{ConflictCopies, LateFingerprints};
use crate::store::{ConflictKind, DedupStore, StoreError};

const DAY_MS: i64 = 86_400_000;

/// Waits for run `id` of schedule `schedule` to finish (a manual run goes on in the background).
async fn finished(books: &dyn CleanupBooks, schedule: i64, id: i64) -> CleanupRun {
    for _ in 0..200 {
        let runs = cleanup_runs(books, Some(schedule), 10).await.unwrap();
        if let Some(run) = runs.into_iter().find(|r| r.id == id && r.finished_at.is_some()) {
            return run;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("cleanup run {id} did not finish in 10 s");
}

/// Five succeeded records and a dead one forty days old, one stuck in `processing` as old, two
/// succeeded today. A schedule is refused an invalid cron, a taken name and an unknown id, and
/// is edited by id; its dry run counts five. While one instance holds the schedule's lock, a
/// scheduler pass and a run now of another stand aside; two passes at once run the due tick
/// once, deleting the five in batches of two (the counts equal to the rows after), and the next
/// pass finds nothing due. The deleted records' fingerprints are kept: the retention watch says
/// so at once, before any refresh (it did not, before: a pipeline looked no copy up until the
/// scheduler's next pass), a late copy matches with its first sighting forty days back and is noted as a late
/// duplicate, and the advice finds the retention too short. A second schedule deletes the old
/// dead record, keeping no fingerprint, by a run now. Every save and run is audited.
pub async fn a_cleanup_schedule_deletes_old_succeeded_records_in_batches_once_and_keeps_their_fingerprints<
    H: Harness,
>() {
    let h = H::fresh().await;
    let pool = h.engine_pool();
    let store = console_store(&pool);
    let l = lease("w1");
    let mut old = Vec::new();
    for n in 1..=5 {
        let m = msg(&format!("OLD.{n}"), "ORDER.PAY", "{}");
        let c = claimed(claim_one(&h, &m, &l).await);
        complete(&h, &[&c], &l).await;
        h.age_record(c.id, 40).await;
        old.push(m);
    }
    let dead = msg("OLD.DEAD", "ORDER.PAY", "{}");
    let c = claimed(claim_one(&h, &dead, &l).await);
    fail(&h, &c, &dead, &l, true).await;
    h.age_record(c.id, 40).await;
    let stuck = msg("OLD.STUCK", "ORDER.PAY", "{}");
    let c = claimed(claim_one(&h, &stuck, &l).await);
    h.age_record(c.id, 40).await;
    for n in 1..=2 {
        let m = msg(&format!("NEW.{n}"), "ORDER.PAY", "{}");
        let c = claimed(claim_one(&h, &m, &l).await);
        complete(&h, &[&c], &l).await;
    }

    let input = ScheduleInput { name: "nightly".to_owned(), retention_days: 30, batch_size: 10, ..ScheduleInput::default() };
    let bad = ScheduleInput { cron: "61 * * * *".to_owned(), ..input.clone() };
    let refused = cleanup_schedule_save(store, "user:ann", None, &bad).await;
    assert!(matches!(refused, Err(ActionError::Invalid(_))), "{refused:?}");
    let s = cleanup_schedule_save(store, "user:ann", None, &input).await.unwrap();
    assert_eq!((s.statuses.as_slice(), s.created_by.as_str(), s.enabled), (&["succeeded".to_owned()][..], "user:ann", true));
    assert!(s.next_run_at.is_some_and(|t| t > Utc::now()), "{s:?}");
    let taken = cleanup_schedule_save(store, "user:bob", None, &input).await;
    assert!(matches!(taken, Err(ActionError::Refused(_))), "{taken:?}");
    let edit = ScheduleInput { batch_size: 2, consumer_group: Some(GROUP.to_owned()), ..input.clone() };
    let s = cleanup_schedule_save(store, "user:bob", Some(s.id), &edit).await.unwrap();
    assert_eq!((s.batch_size, s.consumer_group.as_deref(), s.created_by.as_str()), (2, Some(GROUP), "user:ann"));
    let unknown = cleanup_schedule_save(store, "user:bob", Some(i64::MAX), &edit).await;
    assert!(matches!(unknown, Err(ActionError::UnknownJob { .. })), "{unknown:?}");
    assert_eq!(cleanup_schedules(store).await.unwrap(), std::slice::from_ref(&s));
    assert_eq!(cleanup_dry_run(store, s.id).await.unwrap(), 5);

    let watch = RetentionWatch::default();
    watch.refresh(store).await.unwrap();
    assert_eq!(watch.retention_ms(GROUP), Some(30 * DAY_MS));
    assert_eq!(watch.retention_ms("another-group"), None);
    assert!(!watch.fingerprints_kept());

    // One runner per schedule: while another instance holds it, nothing runs here.
    h.make_schedule_due(s.id).await;
    let due = store.cleanup_schedule(s.id).await.unwrap().unwrap().next_run_at;
    let held = store.lock_schedule(s.id).await.unwrap().expect("the schedule's lock");
    assert!(store.lock_schedule(s.id).await.unwrap().is_none());
    assert_eq!(run_due(store, &watch).await.unwrap(), Vec::<i64>::new(), "the holder runs it");
    let busy = cleanup_run_now(&pool, "user:bob", s.id).await;
    assert!(matches!(busy, Err(ActionError::Refused(_))), "{busy:?}");
    held.release().await;
    let (a, b) = tokio::join!(run_due(store, &watch), run_due(store, &watch));
    let ran: Vec<i64> = a.unwrap().into_iter().chain(b.unwrap()).collect();
    assert_eq!(ran.len(), 1, "two passes at once run the tick once: {ran:?}");
    assert!(watch.fingerprints_kept(), "the run that kept the first fingerprints armed the watch at once");
    assert_eq!(run_due(store, &watch).await.unwrap(), Vec::<i64>::new(), "the next tick is not due");
    let run = cleanup_runs(store, Some(s.id), 10).await.unwrap().remove(0);
    assert_eq!((run.id, run.trigger.as_str(), run.actor.as_str(), run.tick_at), (ran[0], "schedule", "scheduler", due));
    assert_eq!((run.rows_deleted, run.batches, run.error.as_deref()), (5, 3, None), "batches of 2, 2 and 1");
    assert!(run.finished_at.is_some() && run.cutoff < Utc::now() - chrono::Duration::days(29), "{run:?}");
    for m in &old {
        assert!(h.record(GROUP, m.id.as_str()).await.is_none(), "{} is deleted", m.id.as_str());
    }
    for kept in ["OLD.DEAD", "OLD.STUCK", "NEW.1", "NEW.2"] {
        assert!(h.record(GROUP, kept).await.is_some(), "{kept} is kept");
    }
    assert_eq!(h.counted().await, h.actual().await);

    // The fingerprints of the deleted records find a late copy right after the run, looked up
    // because the watch says fingerprints are kept (as a pipeline does), with no refresh between.
    assert!(watch.fingerprints_kept());
    let matches = h.store().fingerprint_matches(&group(), &["OLD.1", "NEW.1"], &["ORDER.PAY", "ORDER.PAY"]).await.unwrap();
    assert_eq!(matches.len(), 1, "{matches:?}");
    assert_eq!((matches[0].0.as_str(), (Utc::now() - matches[0].1).num_days()), ("OLD.1", 40));
    let copy = claimed(claim_one(&h, &old[0], &l).await);
    let delays = h.store().note_late_duplicates(&group(), &matches).await.unwrap();
    assert!(delays.len() == 1 && (40 * DAY_MS..41 * DAY_MS).contains(&delays[0]), "{delays:?}");
    assert_eq!(h.late_duplicates().await, [(copy.id, delays[0], false)]);
    let late = late_duplicates(store, 30).await.unwrap();
    assert_eq!((late.len(), late[0].consumer_group.as_str(), late[0].count, late[0].held), (1, GROUP, 1, 0));
    let advice = retention_advice(store).await.unwrap();
    assert_eq!(advice.longest_delay_ms, Some(delays[0]));
    assert!(advice.is_too_short(30) && !advice.is_too_short(100), "{advice:?}");

    // Dead letters, by a run now: no fingerprint kept of them.
    let letters = ScheduleInput { name: "dead letters".to_owned(), statuses: vec![RecordStatus::Dead], ..input };
    let d = cleanup_schedule_save(store, "user:ann", None, &letters).await.unwrap();
    assert_eq!(d.statuses, ["dead"]);
    let manual = cleanup_run_now(&pool, "user:bob", d.id).await.unwrap();
    let run = finished(store, d.id, manual).await;
    assert_eq!((run.trigger.as_str(), run.actor.as_str(), run.tick_at, run.rows_deleted), ("manual", "user:bob", None, 1));
    assert!(h.record(GROUP, "OLD.DEAD").await.is_none());
    assert!(h.record(GROUP, "OLD.STUCK").await.is_some(), "processing records are never deleted");
    let none = h.store().fingerprint_matches(&group(), &["OLD.DEAD"], &["ORDER.PAY"]).await.unwrap();
    assert_eq!(none, []);
    assert_eq!(h.counted().await, h.actual().await);

    let entries = store.list(&AuditFilter::default()).await.unwrap();
    let seen: Vec<(&str, &str)> = entries
        .iter()
        .rev()
        .filter(|e| e.action.starts_with("cleanup."))
        .map(|e| (e.action.as_str(), e.outcome.as_str()))
        .collect();
    assert_eq!(
        seen,
        [
            ("cleanup.schedule.create", "refused"),
            ("cleanup.schedule.create", "ok"),
            ("cleanup.schedule.create", "refused"),
            ("cleanup.schedule.update", "ok"),
            ("cleanup.schedule.update", "refused"),
            ("cleanup.run", "refused"),
            ("cleanup.run", "ok"),
            ("cleanup.schedule.create", "ok"),
            ("cleanup.run", "ok"),
        ]
    );
}

/// Three succeeded records forty days old: one with an open conflicting copy, one whose copy is
/// being kept (by the store's keeper, uncommitted) while a delete batch runs, one without. The
/// batch deletes the last only and the status counts follow: the keeper holds the record it
/// keeps a copy of, and a batch skips a held record. Before, PostgreSQL's batch read the copies
/// as of its statement's start and deleted a record whose copy committed while it ran; MySQL's
/// re-read them after its lock. A copy kept after its record's batch finds the record gone and
/// keeps nothing ([`StoreError::RecordDeleted`]): its delivery is judged again, not left naming
/// no record.
pub async fn cleanup_keeps_a_record_whose_conflicting_copy_is_kept_while_its_batch_runs<H: Harness>() {
    let h = H::fresh().await;
    let pool = h.engine_pool();
    let store = console_store(&pool);
    let l = lease("w1");
    let mut ids = Vec::new();
    for name in ["COPY.OPEN", "COPY.IN_FLIGHT", "COPY.NONE"] {
        let m = msg(name, "ORDER.PAY", "{}");
        let c = claimed(claim_one(&h, &m, &l).await);
        complete(&h, &[&c], &l).await;
        h.age_record(c.id, 40).await;
        ids.push(c.id);
    }
    let open = msg("COPY.OPEN", "ORDER.PAY", "{\"other\":1}");
    keep(&h, &[copy(ids[0], &open, ConflictKind::Payload)], true).await;
    let batch = DeleteBatch {
        status: "succeeded",
        cutoff: store.cleanup_cutoff(30).await.unwrap(),
        group: Some(GROUP),
        limit: 10,
        fingerprint_days: 1,
    };
    let in_flight = msg("COPY.IN_FLIGHT", "ORDER.PAY", "{\"other\":2}");
    let mut keeper = h.store().pool().begin().await.unwrap();
    let kept = h.store().keep_conflicts(&mut *keeper, &group(), &[copy(ids[1], &in_flight, ConflictKind::Payload)]).await;
    kept.expect("the copy is kept");
    let commit_later = async {
        tokio::time::sleep(Duration::from_millis(500)).await;
        keeper.commit().await.unwrap();
    };
    let (deleted, ()) = tokio::join!(store.delete_batch(&batch), commit_later);
    assert_eq!(deleted.unwrap(), 1, "only the record without a copy is deleted");
    assert!(h.record(GROUP, "COPY.OPEN").await.is_some(), "a record with an open copy is kept");
    assert!(h.record(GROUP, "COPY.IN_FLIGHT").await.is_some(), "a record whose copy was kept as its batch ran is kept");
    assert!(h.record(GROUP, "COPY.NONE").await.is_none(), "a record without one is deleted");
    assert_eq!(h.conflicts(ids[1]).await.len(), 1);
    assert_eq!(h.counted().await, h.actual().await);

    let late = msg("COPY.NONE", "ORDER.PAY", "{\"other\":3}");
    let mut conn = h.store().pool().acquire().await.unwrap();
    let kept = h.store().keep_conflicts(&mut *conn, &group(), &[copy(ids[2], &late, ConflictKind::Payload)]).await;
    assert!(matches!(kept, Err(StoreError::RecordDeleted(id)) if id == ids[2]), "{kept:?}");
    assert!(h.conflicts(ids[2]).await.is_empty(), "no copy names a deleted record");
}

/// A run whose schedule's lock was lost (its session ended, as an idle timeout, a proxy or a
/// `KILL` would end it) stops before its next batch, failed, having deleted nothing more: another
/// instance may hold the schedule by then, and two runs never overlap (before, the run went on
/// deleting). That other instance's run then deletes the records.
pub async fn a_cleanup_run_that_lost_its_schedules_lock_stops_before_its_next_batch<H: Harness>() {
    let h = H::fresh().await;
    let pool = h.engine_pool();
    let store = console_store(&pool);
    let l = lease("w1");
    for name in ["OLD.1", "OLD.2"] {
        let m = msg(name, "ORDER.PAY", "{}");
        let c = claimed(claim_one(&h, &m, &l).await);
        complete(&h, &[&c], &l).await;
        h.age_record(c.id, 40).await;
    }
    let input = ScheduleInput { name: "nightly".to_owned(), batch_size: 1, ..ScheduleInput::default() };
    let s = cleanup_schedule_save(store, "user:ann", None, &input).await.unwrap();
    let mut lock = store.lock_schedule(s.id).await.unwrap().expect("the schedule's lock");
    assert!(lock.held().await);
    h.lose_schedule_lock(s.id).await;
    assert!(!lock.held().await, "a lock whose session ended is not held");
    let cutoff = store.cleanup_cutoff(s.retention_days).await.unwrap();
    let run_id = store.start_manual_run(s.id, "user:ann", cutoff).await.unwrap();
    execute_run(store, &s, run_id, cutoff, "user:ann", lock.as_mut(), None).await;
    lock.release().await;
    let run = finished(store, s.id, run_id).await;
    assert_eq!((run.rows_deleted, run.batches), (0, 0), "{run:?}");
    assert!(run.error.as_deref().is_some_and(|e| e.contains("lock was lost")), "{run:?}");
    assert!(h.record(GROUP, "OLD.1").await.is_some() && h.record(GROUP, "OLD.2").await.is_some());

    let again = cleanup_run_now(&pool, "user:bob", s.id).await.unwrap();
    let run = finished(store, s.id, again).await;
    assert_eq!((run.rows_deleted, run.error.as_deref()), (2, None), "{run:?}");
    assert_eq!(h.counted().await, h.actual().await);
}
