//! Conformance case of the bulk requeue ([`crate::actions::bulk`] through
//! [`crate::actions::bulk::RequeueJobBooks`]): the preview's counts, the selection frozen at
//! confirmation, the operator's compare-and-sets on a job, one runner per job, the runner's
//! batches (the records made claimable, the status counts following, each copy published once),
//! the canary pausing a job, every outcome audited; two batches of one job never sharing an
//! item, and a runner lock lost with its connection.

use tokio_util::sync::CancellationToken;

use super::claims::{claim_one, claimed, complete, fail, lease, msg, record};
use super::record_actions::broker;
use super::{GROUP, Harness};
use crate::actions::RecordActionKind::Requeue;
use crate::actions::bulk::runner::run_job;
use crate::actions::bulk::{
    ItemVerdict, JobControl, RequeueJobParams, requeue_job, requeue_job_control, requeue_job_start, requeue_jobs, requeue_preview,
};
use crate::actions::{ActionError, RecordAction, record_action};
use crate::audit::AuditFilter;
use crate::console::console_store;
use crate::console::filter::RecordFilter;
use crate::record::RecordStatus;

/// A bulk requeue of a group's records: the preview counts what would be requeued and what
/// skipped, by reason; a confirmation of another count is refused; the job freezes its
/// selection (a record dead-lettered later is not in it, one requeued by hand meanwhile is
/// skipped); pause, resume and their refusals; a second runner stands aside while the first
/// holds the job; the run requeues each record once (one copy each in the broker, the counts
/// equal to the rows), fails the unroutable one, and completes. A second job, of the dead
/// records left, pauses itself when its canary fails.
pub async fn a_bulk_requeue_freezes_its_selection_and_one_runner_requeues_each_record_once<H: Harness>() {
    let h = H::fresh().await;
    let pool = h.engine_pool();
    let store = console_store(&pool);
    let (broker, publishers) = broker();
    let l = lease("w1");
    let dead = |n: u32, routable: bool| {
        let mut m = msg(&format!("BULK.{n}"), "ORDER.PAY", &format!(r#"{{"n":{n}}}"#));
        if routable {
            m.message.source.exchange = Some(broker.settings.exchange.clone());
        } else {
            // The default exchange and no such queue: the broker refuses the publish.
            m.message.source.exchange = Some(String::new());
            m.message.source.routing_key = Some(format!("no-such-queue-{}", uuid::Uuid::new_v4()));
        }
        m
    };
    let mut msgs = Vec::new();
    for (n, routable) in [(1, true), (2, true), (3, true), (4, true), (5, false)] {
        let m = dead(n, routable);
        let c = claimed(claim_one(&h, &m, &l).await);
        fail(&h, &c, &m, &l, true).await;
        msgs.push(m);
    }
    let done = msg("BULK.6", "ORDER.PAY", r#"{"n":6}"#);
    let c = claimed(claim_one(&h, &done, &l).await);
    complete(&h, &[&c], &l).await;
    claim_one(&h, &msg("BULK.7", "ORDER.PAY", r#"{"n":7}"#), &l).await;

    let filter = RecordFilter { group: Some(GROUP.to_owned()), ..RecordFilter::default() };
    let preview = requeue_preview(store, &filter).await.unwrap();
    assert_eq!((preview.matched, preview.would_requeue), (7, 5));
    assert_eq!(preview.skipped, [("already succeeded".to_owned(), 1), ("lease live".to_owned(), 1)]);

    let params = |expected: i64, canary: i32| RequeueJobParams {
        filter: &filter,
        rate_per_sec: 1000.0,
        canary_size: canary,
        failure_threshold: 1.0,
        expected_count: Some(expected),
        reason: Some("downstream <b>fixed</b>"),
    };
    let changed = requeue_job_start(store, "user:ann", &params(4, 0)).await;
    assert!(matches!(changed, Err(ActionError::Refused(_))), "{changed:?}");
    let job = requeue_job_start(store, "user:ann", &params(5, 0)).await.unwrap();
    assert_eq!((job.state.as_str(), job.total, job.skipped, job.done, job.created_by.as_str()), ("running", 7, 2, 0, "user:ann"));
    assert_eq!(job.filter, serde_json::to_value(&filter).unwrap());
    assert_eq!(job.reason.as_deref(), Some("downstream <b>fixed</b>"));

    // After the freeze: a new dead record is not in the job; one requeued by hand is skipped.
    let late = dead(8, true);
    let c = claimed(claim_one(&h, &late, &l).await);
    fail(&h, &c, &late, &l, true).await;
    let by_hand = RecordAction { record_id: record(&h, &msgs[0]).await.id, ..RecordAction::default() };
    record_action(store, "user:bob", Requeue, &by_hand, &publishers).await.unwrap();

    let control = |id, c| requeue_job_control(store, "user:bob", id, c, None);
    assert_eq!(control(job.id, JobControl::Pause).await.unwrap().state, "paused");
    let twice = control(job.id, JobControl::Pause).await;
    assert!(matches!(twice, Err(ActionError::Refused(_))), "{twice:?}");
    assert_eq!(control(job.id, JobControl::Resume).await.unwrap().state, "running");
    let unknown = control(i64::MAX, JobControl::Cancel).await;
    assert!(matches!(unknown, Err(ActionError::UnknownJob { .. })), "{unknown:?}");

    // One runner per job: while one holds it, another returns at once, having done nothing.
    let held = store.lock_job_runner(job.id).await.unwrap().expect("the job's runner lock");
    assert!(store.lock_job_runner(job.id).await.unwrap().is_none());
    run_job(store, &publishers, job.id, &CancellationToken::new()).await.unwrap();
    assert_eq!(requeue_job(store, job.id).await.unwrap().done, 0);
    held.release().await;
    run_job(store, &publishers, job.id, &CancellationToken::new()).await.unwrap();
    let ran = requeue_job(store, job.id).await.unwrap();
    assert_eq!((ran.state.as_str(), ran.done, ran.failed, ran.skipped), ("completed", 3, 1, 3));
    assert!(ran.finished_at.is_some() && ran.elapsed_secs >= 0.0, "{ran:?}");
    assert_eq!(broker.depth(&broker.settings.queue).await, 4, "one copy by hand, three by the job");
    for m in &msgs[1..4] {
        let row = record(&h, m).await;
        assert_eq!((row.status.as_str(), row.retry_due, row.attempts, row.max_attempts), ("failed", true, 1, 3));
    }
    assert_eq!(record(&h, &msgs[4]).await.status, "dead", "its publish failed");
    assert_eq!(record(&h, &late).await.status, "dead", "not in the frozen selection");
    assert_eq!(h.counted().await, h.actual().await);
    let again = requeue_job_control(store, "user:bob", job.id, JobControl::Resume, None).await;
    assert!(matches!(again, Err(ActionError::Refused(_))), "a completed job is not resumed: {again:?}");

    // The dead records left: the unroutable one comes first, so the canary fails.
    let dead_only = RecordFilter { status: Some(RecordStatus::Dead), ..filter.clone() };
    let canary = RequeueJobParams { filter: &dead_only, ..params(2, 1) };
    let second = requeue_job_start(store, "user:ann", &canary).await.unwrap();
    run_job(store, &publishers, second.id, &CancellationToken::new()).await.unwrap();
    let paused = requeue_job(store, second.id).await.unwrap();
    assert_eq!((paused.state.as_str(), paused.done, paused.failed), ("paused", 0, 1));
    assert!(paused.paused_reason.as_deref().unwrap_or_default().starts_with("canary failed"), "{paused:?}");
    assert_eq!(broker.depth(&broker.settings.queue).await, 4, "nothing more published");
    let listed: Vec<i64> = requeue_jobs(store, 10).await.unwrap().iter().map(|j| j.id).collect();
    assert_eq!(listed, [second.id, job.id]);

    let entries = store.list(&AuditFilter::default()).await.unwrap();
    let seen: Vec<(&str, &str)> = entries
        .iter()
        .rev()
        .filter(|e| e.action.starts_with("bulk."))
        .map(|e| (e.action.as_str(), e.outcome.as_str()))
        .collect();
    assert_eq!(
        seen,
        [
            ("bulk.requeue.start", "refused"),
            ("bulk.requeue.start", "ok"),
            ("bulk.requeue.pause", "ok"),
            ("bulk.requeue.pause", "refused"),
            ("bulk.requeue.resume", "ok"),
            ("bulk.requeue.cancel", "refused"),
            ("bulk.requeue.complete", "ok"),
            ("bulk.requeue.resume", "refused"),
            ("bulk.requeue.start", "ok"),
            ("bulk.requeue.auto_pause", "ok"),
        ]
    );
    let started = entries.iter().rev().find(|e| e.action == "bulk.requeue.start" && e.outcome == "ok").unwrap();
    assert_eq!(started.message_ids, ["BULK.1", "BULK.2", "BULK.3", "BULK.4", "BULK.5"]);
}

/// Two runners of one job (the first one's lock lost with its connection, a second taking the
/// job): the lock says it is lost; a second batch waits for the first's items, then takes the
/// ones after them; the job's counters count each item once; a job is not completed while an
/// item is pending.
pub async fn two_batches_of_one_job_never_share_an_item_and_a_lost_runner_lock_shows<H: Harness>() {
    use std::time::Duration;
    let h = H::fresh().await;
    let pool = h.engine_pool();
    let store = console_store(&pool);
    let l = lease("w1");
    for n in 1..=4 {
        let m = msg(&format!("LOST.{n}"), "ORDER.PAY", "{}");
        let c = claimed(claim_one(&h, &m, &l).await);
        fail(&h, &c, &m, &l, true).await;
    }
    let filter = RecordFilter { group: Some(GROUP.to_owned()), ..RecordFilter::default() };
    let params = RequeueJobParams {
        filter: &filter,
        rate_per_sec: 1000.0,
        canary_size: 0,
        failure_threshold: 1.0,
        expected_count: Some(4),
        reason: None,
    };
    let job = requeue_job_start(store, "user:ann", &params).await.unwrap();

    let mut first = store.lock_job_runner(job.id).await.unwrap().expect("the job's runner lock");
    assert!(first.held().await);
    h.lose_runner_lock(job.id).await;
    assert!(!first.held().await, "its session ended: the lock is gone");
    let mut second = store.lock_job_runner(job.id).await.unwrap().expect("a lost lock is free");
    assert!(second.held().await);
    first.release().await;
    assert!(second.held().await, "releasing a lost lock leaves the new holder's");

    let (items, _, batch) = store.begin_batch(job.id, 2).await.unwrap();
    let seqs: Vec<i32> = items.iter().map(|i| i.seq).collect();
    let other = store.begin_batch(job.id, 2);
    tokio::pin!(other);
    let waited = tokio::time::timeout(Duration::from_millis(300), &mut other).await;
    assert!(waited.is_err(), "a second batch of the job waits for the first's items");
    let verdicts: Vec<ItemVerdict> = items
        .iter()
        .map(|i| ItemVerdict { seq: i.seq, record_id: i.record_id, state: "skipped", detail: Some("by hand".into()) })
        .collect();
    batch.finish(job.id, &[], &verdicts).await.unwrap();
    let (later, _, later_batch) = other.await.unwrap();
    let later_seqs: Vec<i32> = later.iter().map(|i| i.seq).collect();
    assert_eq!(later.len(), 2, "the two items after the first batch's: {later_seqs:?} after {seqs:?}");
    assert!(later_seqs.iter().all(|s| !seqs.contains(s)), "{later_seqs:?} after {seqs:?}");
    store.complete_running_job(job.id).await.unwrap();
    assert_eq!(requeue_job(store, job.id).await.unwrap().state, "running", "two items are pending");
    drop(later_batch);
    let read = requeue_job(store, job.id).await.unwrap();
    assert_eq!((read.state.as_str(), read.skipped, read.done), ("running", 2, 0));
    second.release().await;
    assert_eq!(h.counted().await, h.actual().await);
}
