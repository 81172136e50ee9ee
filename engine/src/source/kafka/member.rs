//! The group member: one Kafka consumer per process, polled on a thread of its own, feeding a
//! queue that the workers' [`KafkaSource`](super::source::KafkaSource)s take from.
//!
//! The thread is the only caller of `poll`, so the rebalance callbacks run there and may block
//! (briefly) without stalling the workers, which keep running on the async runtime:
//!
//! - **revoke**: stop dispatching and taking records of the revoked partitions; wait up to
//!   `revoke_grace_ms` for the ones workers hold to settle (as usual: retry and dead-letter
//!   copies are published before a record counts as settled); commit (synchronously) each
//!   partition's lowest unfinished offset; abandon the rest (queued, held, or still running):
//!   the next owner fetches them again from that commit and the dedup table skips what did
//!   finish. Records still running finish against the database as usual, but their settlement
//!   moves no offset and sends no retry copy (the next owner has the original).
//! - **assign**: track the partitions under a new epoch.
//!
//! When the broker leaves the membership stale (see [`super::membership`]), the thread leaves
//! the group, committing what is done, and joins again as a new member.
//!
//! Between polls the thread commits (asynchronously) every offset that moved, hands retry
//! copies to the queue when they are due, and applies back-pressure: at `max_in_flight`
//! unsettled records every assigned partition is paused (polling goes on, for the group's
//! sake) until half of them have settled.

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer, ConsumerContext, Rebalance};
use rdkafka::error::{KafkaError, KafkaResult, RDKafkaErrorCode};
use rdkafka::{ClientConfig, ClientContext, Message, Offset, TopicPartitionList};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::delivery::Delivered;
use super::membership::StaleWatch;
use super::offsets::{Offsets, Stage, TopicPartition};
use crate::source::SourceError;

/// Longest wait in one `poll`: how late a due retry copy or a stop request can be.
const POLL: Duration = Duration::from_millis(100);

/// How often the offsets that moved are committed (a commit per record would load the broker).
const COMMIT_INTERVAL: Duration = Duration::from_millis(100);

/// State shared by the member's thread, its rebalance callbacks and the workers' sources.
pub(super) struct Shared {
    offsets: Mutex<Offsets>,
    /// Records on their way to the workers.
    pub queue_tx: mpsc::UnboundedSender<Delivered>,
    /// The workers' end of the queue (one worker gathers a batch at a time).
    pub queue_rx: tokio::sync::Mutex<mpsc::UnboundedReceiver<Delivered>>,
    /// Cancelled once the thread has left the group.
    pub stopped: CancellationToken,
    stop: AtomicBool,
    connected: Arc<AtomicBool>,
    retry_topics: HashSet<String>,
    max_in_flight: usize,
    revoke_grace: Duration,
    /// The subscribed topics but the retry topics.
    source_topics: Vec<String>,
    idle_check: Duration,
}

impl Shared {
    /// The offset bookkeeping (a poisoned lock is recovered: the state stays consistent).
    pub fn offsets(&self) -> MutexGuard<'_, Offsets> {
        self.offsets.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// What the member needs besides its client configuration.
pub(super) struct MemberPlan {
    /// Source topics and retry topics to subscribe to.
    pub topics: Vec<String>,
    /// The retry topics among them (their records wait for their due time).
    pub retry_topics: HashSet<String>,
    /// Back-pressure threshold.
    pub max_in_flight: usize,
    /// How long a revocation waits for records held by workers.
    pub revoke_grace: Duration,
    /// The source topics among them (whose progress a member without partitions watches).
    pub source_topics: Vec<String>,
    /// How often a member without partitions checks that the group makes progress (see
    /// [`super::membership`]): the session timeout.
    pub idle_check: Duration,
}

/// A running group member.
pub(super) struct Member {
    /// Shared with the sources.
    pub shared: Arc<Shared>,
    thread: Mutex<Option<std::thread::JoinHandle<()>>>,
}

impl Member {
    /// Creates the consumer from `config`, subscribes and starts the polling thread.
    ///
    /// Errors: [`SourceError::Broker`] for an invalid configuration or subscription.
    pub fn start(config: &ClientConfig, plan: MemberPlan, connected: Arc<AtomicBool>) -> Result<Self, SourceError> {
        let (queue_tx, queue_rx) = mpsc::unbounded_channel();
        let shared = Arc::new(Shared {
            offsets: Mutex::new(Offsets::default()),
            queue_tx,
            queue_rx: tokio::sync::Mutex::new(queue_rx),
            stopped: CancellationToken::new(),
            stop: AtomicBool::new(false),
            connected,
            retry_topics: plan.retry_topics,
            max_in_flight: plan.max_in_flight.max(1),
            revoke_grace: plan.revoke_grace,
            source_topics: plan.source_topics,
            idle_check: plan.idle_check,
        });
        let joining = Joining { config: config.clone(), topics: plan.topics };
        let consumer = joining.create(&shared)?;
        joining.subscribe(&consumer)?;
        let thread_shared = shared.clone();
        let thread = std::thread::Builder::new()
            .name("kafka-consumer".to_owned())
            .spawn(move || run(consumer, &joining, &thread_shared))
            .map_err(|e| SourceError::Broker(format!("cannot start the Kafka consumer thread: {e}")))?;
        Ok(Self { shared, thread: Mutex::new(Some(thread)) })
    }

    /// Whether the thread still polls.
    pub fn is_running(&self) -> bool {
        !self.shared.stopped.is_cancelled()
    }

    /// Stops polling, commits what is done and leaves the group (its partitions go to the other
    /// members). Blocks until then: call it off the async runtime.
    pub fn stop(&self) {
        self.shared.stop.store(true, Ordering::Release);
        let thread = self.thread.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(thread) = thread
            && thread.join().is_err()
        {
            tracing::error!("the Kafka consumer thread panicked");
        }
    }
}

/// How the member joins the group: again after a stale assignment (see the module docs).
struct Joining {
    config: ClientConfig,
    topics: Vec<String>,
}

impl Joining {
    /// Creates a consumer, outside the group until [`Joining::subscribe`].
    ///
    /// Errors: [`SourceError::Broker`] for an invalid configuration.
    fn create(&self, shared: &Arc<Shared>) -> Result<BaseConsumer<MemberContext>, SourceError> {
        let context = MemberContext { shared: shared.clone(), watch: StaleWatch::default() };
        self.config
            .create_with_context(context)
            .map_err(|e| SourceError::Broker(format!("cannot create the Kafka consumer: {e}")))
    }

    /// Subscribes `consumer` to the topics: it joins the group.
    ///
    /// Errors: [`SourceError::Broker`] for a subscription librdkafka refuses.
    fn subscribe(&self, consumer: &BaseConsumer<MemberContext>) -> Result<(), SourceError> {
        let topics: Vec<&str> = self.topics.iter().map(String::as_str).collect();
        consumer.subscribe(&topics).map_err(|e| SourceError::Broker(format!("cannot subscribe to {topics:?}: {e}")))?;
        tracing::info!(topics = ?self.topics, "Kafka consumer subscribed");
        Ok(())
    }
}

/// The rebalance callbacks (run by `poll`, on the member's thread).
struct MemberContext {
    shared: Arc<Shared>,
    watch: StaleWatch,
}

impl ClientContext for MemberContext {}

impl ConsumerContext for MemberContext {
    fn pre_rebalance(&self, consumer: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        match rebalance {
            Rebalance::Revoke(tpl) => {
                self.watch.revoked(consumer);
                self.revoke(consumer, &partitions(tpl));
            }
            Rebalance::Assign(_) => {}
            Rebalance::Error(e) => tracing::warn!(error = %e, "Kafka rebalance error"),
        }
    }

    fn post_rebalance(&self, consumer: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        if let Rebalance::Assign(tpl) = rebalance {
            let assigned = partitions(tpl);
            self.watch.assigned(consumer, assigned.len(), self.shared.idle_check);
            let mut offsets = self.shared.offsets();
            for tp in &assigned {
                offsets.assign(tp.clone());
            }
            drop(offsets);
            self.shared.connected.store(true, Ordering::Relaxed);
            tracing::info!(partitions = %describe(&assigned), "Kafka partitions assigned");
        }
    }

    fn commit_callback(&self, result: KafkaResult<()>, _: &TopicPartitionList) {
        if let Err(e) = result {
            tracing::warn!(error = %e, "Kafka offset commit failed; will commit again");
            self.shared.offsets().commit_failed();
        }
    }
}

impl MemberContext {
    fn revoke(&self, consumer: &BaseConsumer<Self>, revoked: &[TopicPartition]) {
        let shared = &self.shared;
        shared.offsets().close(revoked);
        let deadline = Instant::now() + shared.revoke_grace;
        while shared.offsets().taken(revoked) > 0 && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
        let positions = shared.offsets().positions(revoked);
        let lost = consumer.assignment_lost();
        if !lost
            && !positions.is_empty()
            && let Err(e) = consumer.commit(&offset_list(&positions), CommitMode::Sync)
        {
            tracing::warn!(error = %e, "committing revoked partitions failed; their next owner redelivers more");
        }
        let abandoned = shared.offsets().remove(revoked);
        tracing::info!(
            partitions = %describe(revoked),
            committed = %describe_positions(&positions),
            abandoned,
            lost,
            "Kafka partitions revoked"
        );
    }
}

fn partitions(tpl: &TopicPartitionList) -> Vec<TopicPartition> {
    tpl.elements().iter().map(|e| TopicPartition { topic: e.topic().to_owned(), partition: e.partition() }).collect()
}

fn describe(tps: &[TopicPartition]) -> String {
    tps.iter().map(|tp| format!("{}/{}", tp.topic, tp.partition)).collect::<Vec<_>>().join(", ")
}

fn describe_positions(positions: &[(TopicPartition, i64)]) -> String {
    positions.iter().map(|(tp, o)| format!("{}/{}@{o}", tp.topic, tp.partition)).collect::<Vec<_>>().join(", ")
}

fn partition_list<'a>(tps: impl IntoIterator<Item = &'a TopicPartition>) -> TopicPartitionList {
    let mut tpl = TopicPartitionList::new();
    for tp in tps {
        tpl.add_partition(&tp.topic, tp.partition);
    }
    tpl
}

fn offset_list(positions: &[(TopicPartition, i64)]) -> TopicPartitionList {
    let mut tpl = TopicPartitionList::new();
    for (tp, offset) in positions {
        // Cannot fail: the partition was just added.
        let _ = tpl.add_partition_offset(&tp.topic, tp.partition, Offset::Offset(*offset));
    }
    tpl
}

fn now_ms() -> i64 {
    chrono::Utc::now().timestamp_millis()
}

/// The thread's loop (see the module docs).
fn run(consumer: BaseConsumer<MemberContext>, joining: &Joining, shared: &Arc<Shared>) {
    // The workers learn that the member is gone however the thread ends.
    let _stopped = shared.stopped.clone().drop_guard();
    let mut poller = Poller {
        consumer,
        delayed: Vec::new(),
        paused: HashSet::new(),
        generation: None,
        backpressure: false,
        holding_changed: false,
    };
    let mut last_commit = Instant::now();
    while !shared.stop.load(Ordering::Acquire) {
        let watch = &poller.consumer.context().watch;
        watch.check_progress(&poller.consumer, &shared.source_topics, shared.idle_check);
        if watch.is_stale() && !poller.join_again(joining, shared) {
            return;
        }
        poller.release_due(shared);
        poller.apply_pauses(shared);
        if last_commit.elapsed() >= COMMIT_INTERVAL {
            poller.commit(shared, CommitMode::Async);
            last_commit = Instant::now();
        }
        match poller.consumer.poll(poller.wait()) {
            None => {}
            Some(Ok(record)) => {
                shared.connected.store(true, Ordering::Relaxed);
                let delivered = Delivered::from_record(&record, shared.retry_topics.contains(record.topic()));
                drop(record);
                poller.dispatch(shared, delivered);
            }
            Some(Err(e)) => report(shared, &e),
        }
    }
    poller.commit(shared, CommitMode::Sync);
    // Dropping the consumer leaves the group: the revoke callback runs once more.
    drop(poller);
    shared.connected.store(false, Ordering::Relaxed);
    tracing::info!("Kafka consumer left the group");
}

fn report(shared: &Shared, e: &KafkaError) {
    if e.rdkafka_error_code() == Some(RDKafkaErrorCode::AllBrokersDown) {
        shared.connected.store(false, Ordering::Relaxed);
    }
    tracing::warn!(error = %e, "Kafka consumer error");
}

/// The thread's state between polls.
struct Poller {
    consumer: BaseConsumer<MemberContext>,
    /// Retry copies waiting for their due time (their partitions paused meanwhile).
    delayed: Vec<Delivered>,
    /// Partitions this loop has paused.
    paused: HashSet<TopicPartition>,
    /// The assignment generation `paused` refers to.
    generation: Option<u64>,
    backpressure: bool,
    /// `delayed` lost records since the pauses were last applied.
    holding_changed: bool,
}

impl Poller {
    /// How long the next poll may wait: until the next due copy, at most [`POLL`].
    fn wait(&self) -> Duration {
        let now = now_ms();
        self.delayed.iter().filter_map(|d| d.meta.due_ms).min().map_or(POLL, |due| {
            Duration::from_millis(u64::try_from(due - now).unwrap_or(0).clamp(1, POLL.as_millis() as u64))
        })
    }

    /// Registers a fetched record and queues it — or, a retry copy not yet due, holds it and
    /// pauses its partition (the copies after it in that retry topic are due no earlier).
    fn dispatch(&mut self, shared: &Shared, mut delivered: Delivered) {
        let hold = delivered.meta.due_ms.is_some_and(|due| due > now_ms());
        let stage = if hold { Stage::Held } else { Stage::Queued };
        let Some(epoch) = shared.offsets().dispatch(&delivered.meta.tp, delivered.meta.offset, stage) else {
            return;
        };
        delivered.meta.epoch = epoch;
        if hold {
            let tp = delivered.meta.tp.clone();
            if let Err(e) = self.consumer.pause(&partition_list([&tp])) {
                tracing::warn!(error = %e, "cannot pause a retry partition");
            }
            self.paused.insert(tp);
            self.delayed.push(delivered);
        } else {
            let _ = shared.queue_tx.send(delivered);
        }
    }

    /// Queues the held copies that are due; drops the ones of revoked partitions.
    fn release_due(&mut self, shared: &Shared) {
        if self.delayed.is_empty() {
            return;
        }
        let now = now_ms();
        let before = self.delayed.len();
        let mut offsets = shared.offsets();
        self.delayed.retain(|d| {
            let m = &d.meta;
            if !offsets.is_current(&m.tp, m.epoch) {
                return false;
            }
            if m.due_ms.is_some_and(|due| due > now) {
                return true;
            }
            if offsets.release(&m.tp, m.offset, m.epoch) {
                let _ = shared.queue_tx.send(d.clone());
            }
            false
        });
        self.holding_changed |= self.delayed.len() != before;
    }

    /// Pauses what must wait (everything under back-pressure, else the partitions holding a
    /// copy) and resumes the rest. After a new assignment every partition's state is set anew.
    fn apply_pauses(&mut self, shared: &Shared) {
        let offsets = shared.offsets();
        let in_flight = offsets.in_flight();
        let reset = self.generation != Some(offsets.generation());
        let backpressure =
            if self.backpressure { in_flight > shared.max_in_flight / 2 } else { in_flight >= shared.max_in_flight };
        if !reset && !self.holding_changed && backpressure == self.backpressure {
            return;
        }
        let assigned: Vec<TopicPartition> = offsets.assigned().cloned().collect();
        self.generation = Some(offsets.generation());
        drop(offsets);
        if backpressure != self.backpressure {
            tracing::debug!(in_flight, backpressure, "Kafka back-pressure changed");
            self.backpressure = backpressure;
        }
        self.holding_changed = false;
        let holding: HashSet<&TopicPartition> = self.delayed.iter().map(|d| &d.meta.tp).collect();
        let wanted: HashSet<TopicPartition> =
            assigned.iter().filter(|tp| backpressure || holding.contains(tp)).cloned().collect();
        let (pause, resume): (Vec<&TopicPartition>, Vec<&TopicPartition>) = if reset {
            (wanted.iter().collect(), assigned.iter().filter(|tp| !wanted.contains(*tp)).collect())
        } else {
            (wanted.difference(&self.paused).collect(), self.paused.difference(&wanted).collect())
        };
        if !pause.is_empty()
            && let Err(e) = self.consumer.pause(&partition_list(pause))
        {
            tracing::warn!(error = %e, "cannot pause Kafka partitions");
        }
        if !resume.is_empty()
            && let Err(e) = self.consumer.resume(&partition_list(resume))
        {
            tracing::warn!(error = %e, "cannot resume Kafka partitions");
        }
        self.paused = wanted;
    }

    /// Leaves the group (committing what is done; the revoke callback runs) and joins it again
    /// as a new member. Returns false when no new consumer can be made (the thread then ends and
    /// the workers reconnect).
    fn join_again(&mut self, joining: &Joining, shared: &Arc<Shared>) -> bool {
        self.commit(shared, CommitMode::Sync);
        let consumer = match joining.create(shared) {
            Ok(consumer) => consumer,
            Err(e) => {
                tracing::error!(error = %e, "cannot join the Kafka group again");
                return false;
            }
        };
        // The old consumer leaves the group before the new one joins it.
        drop(std::mem::replace(&mut self.consumer, consumer));
        self.paused.clear();
        self.generation = None;
        if let Err(e) = joining.subscribe(&self.consumer) {
            tracing::error!(error = %e, "cannot join the Kafka group again");
            return false;
        }
        true
    }

    /// Commits every offset that moved, in a `DEBUG` span `commit_offsets` (`partitions`,
    /// `mode`: sync or async).
    fn commit(&self, shared: &Shared, mode: CommitMode) {
        let (due, in_flight) = {
            let mut offsets = shared.offsets();
            (offsets.due_commits(), offsets.in_flight())
        };
        metrics::gauge!("dedup_kafka_in_flight").set(in_flight as f64);
        if due.is_empty() {
            return;
        }
        let _span = tracing::debug_span!("commit_offsets", partitions = due.len(), mode = ?mode).entered();
        if let Err(e) = self.consumer.commit(&offset_list(&due), mode) {
            tracing::warn!(error = %e, "Kafka offset commit failed; will commit again");
            shared.offsets().commit_failed();
        }
    }
}
