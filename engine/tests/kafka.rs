//! The consumer against a real Kafka-protocol broker (the local test broker): offsets committed
//! only up to the first unfinished record while records finish out of order, a rebalance in the
//! middle of that, retries through the retry topics, dead letters in `<topic>.DLT` while the
//! partition keeps moving, a requeue back to the original topic, and back-pressure. Every test
//! uses its own topic and consumer group.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use common::*;
use dedup_engine::consumer::{Consumer, ConsumerSettings};
use dedup_engine::handler::{Handler, HandlerError, HandlerInput, HandlerRegistry, TransactionalHandler};
use dedup_engine::pipeline::PipelineSettings;
use dedup_engine::retry::Backoff;
use dedup_engine::source::kafka::{KafkaConnector, KafkaSettings, SOURCE_TOPIC_HEADER};
use dedup_engine::source::{DEAD_LETTER_REASON_HEADER, Outbound, SourceFactory};
use dedup_engine::testing::kafka::TestKafka;
use serde_json::json;
use sqlx::PgConnection;
use tokio::io::AsyncBufReadExt;
use tokio_util::sync::CancellationToken;

/// Starts a consumer on `connector`; returns its shutdown token and task.
fn start(
    h: &Harness,
    connector: Arc<KafkaConnector>,
    handlers: HandlerRegistry,
    settings: PipelineSettings,
    workers: ConsumerSettings,
) -> (CancellationToken, tokio::task::JoinHandle<()>) {
    let consumer = Consumer::new(h.pipeline_with(handlers, settings), connector as Arc<dyn SourceFactory>, workers);
    let token = CancellationToken::new();
    let task = tokio::spawn(consumer.run(token.clone()));
    (token, task)
}

fn workers(concurrency: usize, batch_size: usize) -> ConsumerSettings {
    ConsumerSettings { concurrency, batch_size, batch_linger_ms: 0, backoff_initial_ms: 100, backoff_max_ms: 1000 }
}

/// Publishes `(key, message id, payload)` records to `topic` one after the other (so their
/// offsets follow this order within a partition).
async fn produce(connector: &KafkaConnector, topic: &str, records: &[(&str, &str, Vec<u8>)]) {
    let publisher = connector.open_publisher().await.expect("topics created");
    let headers = serde_json::Map::new();
    for (key, id, payload) in records {
        let message = Outbound {
            destination: topic,
            routing_key: "",
            key: Some(key),
            message_id: Some(id),
            payload,
            headers: &headers,
            content_type: Some("application/json"),
            type_property: None,
        };
        publisher.publish(message).await.expect("record published");
    }
}

/// Publishes one record per id, keyed `k<n>` so that they spread over the partitions.
async fn produce_spread(connector: &KafkaConnector, topic: &str, ids: &[String]) {
    let keys: Vec<String> = (0..ids.len()).map(|n| format!("k{n}")).collect();
    let records: Vec<(&str, &str, Vec<u8>)> =
        keys.iter().zip(ids).map(|(key, id)| (key.as_str(), id.as_str(), body(id))).collect();
    produce(connector, topic, &records).await;
}

fn body(id: &str) -> Vec<u8> {
    serde_json::to_vec(&json!({ "id": id })).unwrap()
}

/// Polls `check` every 100 ms until it is true or `within` passes.
async fn eventually<F: Future<Output = bool>>(within: Duration, what: &str, mut check: impl FnMut() -> F) {
    let started = Instant::now();
    while !check().await {
        assert!(started.elapsed() < within, "not within {within:?}: {what}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn scalar(h: &Harness, sql: &str) -> i64 {
    sqlx::query_scalar(sql).fetch_one(h.pool()).await.unwrap()
}

/// Sleeps inside its transaction, then records its effect: the slow record.
struct SlowEffect {
    delay: Duration,
    started: AtomicBool,
    runs: AtomicUsize,
}

#[async_trait]
impl TransactionalHandler for SlowEffect {
    async fn handle(&self, input: &HandlerInput<'_>, tx: &mut PgConnection) -> Result<(), HandlerError> {
        self.started.store(true, Ordering::SeqCst);
        tokio::time::sleep(self.delay).await;
        self.runs.fetch_add(1, Ordering::SeqCst);
        RecordEffect.handle(input, tx).await
    }
}

#[tokio::test]
async fn records_finishing_out_of_order_commit_only_up_to_the_slow_one_and_a_rebalance_redelivers_the_rest() {
    // Redis down: every duplicate is judged (and counted) by the database.
    let h = Harness::with_redis("redis://127.0.0.1:1").await;
    let mut kafka = TestKafka::new(1, Backoff { initial_ms: 200, max_ms: 400 });
    kafka.settings.revoke_grace_ms = 300;
    let slow = Arc::new(SlowEffect {
        delay: Duration::from_secs(8),
        started: AtomicBool::new(false),
        runs: AtomicUsize::new(0),
    });
    let handlers = || {
        let mut handlers = HandlerRegistry::new();
        handlers.register("TEST.FAST", Handler::Transactional(Arc::new(RecordEffect)));
        handlers.register("TEST.SLOW", Handler::Transactional(slow.clone()));
        handlers
    };
    let ids: Vec<String> =
        (0..=7).map(|o| if o == 4 { "TEST.SLOW.4:1".to_owned() } else { format!("TEST.FAST.{o}:1") }).collect();
    let records: Vec<(&str, &str, Vec<u8>)> = ids.iter().map(|id| ("k", id.as_str(), body(id))).collect();
    let a = kafka.connector();
    produce(&a, kafka.topic(), &records).await;

    let (token_a, task_a) = start(&h, a, handlers(), settings(5, Duration::from_secs(30)), workers(3, 1));
    eventually(Duration::from_secs(30), "offsets 0-3 and 5-7 done, 4 running", || async {
        scalar(&h, "SELECT count(*) FROM test_effects").await == 7 && slow.started.load(Ordering::SeqCst)
    })
    .await;
    eventually(Duration::from_secs(10), "offset 4 committed", || async {
        kafka.committed(kafka.topic()).await == [Some(4)]
    })
    .await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(kafka.committed(kafka.topic()).await, [Some(4)], "never past the unfinished record 4");

    // A second member joins: the partition is revoked while 4 is still running.
    let (token_b, task_b) =
        start(&h, kafka.connector(), handlers(), settings(5, Duration::from_secs(30)), workers(3, 1));
    eventually(Duration::from_secs(40), "everything committed after the rebalance", || async {
        kafka.committed(kafka.topic()).await == [Some(8)]
    })
    .await;

    assert_eq!(slow.runs.load(Ordering::SeqCst), 1, "4 ran once");
    for id in &ids {
        assert_eq!(h.effects(id).await, 1, "{id} applied once");
        assert_eq!(h.record(id).await.unwrap().0, "succeeded", "{id}");
    }
    for id in ["TEST.FAST.5:1", "TEST.FAST.6:1", "TEST.FAST.7:1", "TEST.SLOW.4:1"] {
        let (_, attempts, duplicates, _) = h.record(id).await.unwrap();
        assert_eq!(attempts, 1, "{id}");
        assert!(duplicates >= 1, "{id} was redelivered after the rebalance and skipped as a duplicate");
    }
    for id in &ids[..4] {
        assert_eq!(h.record(id).await.unwrap().2, 0, "{id} was committed before the rebalance");
    }
    token_a.cancel();
    token_b.cancel();
    task_a.await.unwrap();
    task_b.await.unwrap();
}

/// Fails its first attempt slowly: once started, waits for `rebalance` and `after` more, then
/// fails (retryable); later attempts record their effect. The first attempt runs twice (its
/// batch is run again with savepoints after the failure); the second run fails at once.
struct FailsFirstAfterRebalance {
    started: AtomicBool,
    rebalance: tokio::sync::Notify,
    after: Duration,
}

#[async_trait]
impl TransactionalHandler for FailsFirstAfterRebalance {
    async fn handle(&self, input: &HandlerInput<'_>, tx: &mut PgConnection) -> Result<(), HandlerError> {
        if input.attempt > 1 {
            return RecordEffect.handle(input, tx).await;
        }
        if !self.started.swap(true, Ordering::SeqCst) {
            self.rebalance.notified().await;
            tokio::time::sleep(self.after).await;
        }
        Err(HandlerError::retryable("DOWNSTREAM_DOWN", "downstream 503 during the rebalance"))
    }
}

#[tokio::test]
async fn a_record_failing_while_its_partition_is_revoked_goes_to_the_retry_topic_and_is_retried() {
    let h = Harness::new().await;
    let mut kafka = TestKafka::new(1, Backoff { initial_ms: 300, max_ms: 600 });
    // The failure comes well inside the grace: the revocation waits for it, then commits.
    kafka.settings.revoke_grace_ms = 20_000;
    let flaky = Arc::new(FailsFirstAfterRebalance {
        started: AtomicBool::new(false),
        rebalance: tokio::sync::Notify::new(),
        // More than a heartbeat interval (2 s): the first member is revoking by then.
        after: Duration::from_secs(5),
    });
    let handlers = || {
        let mut handlers = HandlerRegistry::new();
        handlers.register("TEST.FLAKY", Handler::Transactional(flaky.clone()));
        handlers
    };
    let id = "TEST.FLAKY.1:1";
    let a = kafka.connector();
    produce(&a, kafka.topic(), &[("k", id, body(id))]).await;
    let pipeline = || PipelineSettings { backoff: kafka.backoff.clone(), ..settings(5, Duration::from_secs(30)) };
    let (token_a, task_a) = start(&h, a, handlers(), pipeline(), workers(1, 1));
    eventually(Duration::from_secs(30), "the first attempt started", || async { flaky.started.load(Ordering::SeqCst) })
        .await;

    // A second member joins: the first revokes the partition while the attempt is running.
    let (token_b, task_b) = start(&h, kafka.connector(), handlers(), pipeline(), workers(1, 1));
    flaky.rebalance.notify_one();
    eventually(Duration::from_secs(60), "the record retried from its retry copy and succeeded", || async {
        h.record(id).await.is_some_and(|(status, ..)| status == "succeeded")
    })
    .await;
    assert_eq!(h.record(id).await.unwrap().1, 2, "attempts");
    assert_eq!(h.effects(id).await, 1);
    let retry_topic = kafka.settings.retry_topic(kafka.topic(), &kafka.group, Duration::from_millis(300));
    let copies = kafka.read(&retry_topic, 1, Duration::from_secs(10)).await;
    assert_eq!(copies.len(), 1, "the retry copy was published");
    eventually(Duration::from_secs(20), "the source topic committed past the record", || async {
        kafka.committed(kafka.topic()).await == [Some(1)]
    })
    .await;
    token_a.cancel();
    token_b.cancel();
    task_a.await.unwrap();
    task_b.await.unwrap();
}

#[tokio::test]
async fn poison_and_failing_records_end_dead_in_the_dead_letter_topic_while_the_partition_moves_on() {
    let h = Harness::new().await;
    let kafka = TestKafka::new(2, Backoff { initial_ms: 300, max_ms: 600 });
    let connector = kafka.connector();
    let topic = kafka.topic().to_owned();
    let records = vec![
        ("k1", "ORDER.CREATE.1:1", body("1")),
        ("k1", "ORDER.CREATE.9:1", b"{not json".to_vec()),
        ("k1", "ORDER.PAY.2:2", body("2")),
        ("k1", "ORDER.CREATE.3:1", body("3")),
        ("k1", "ORDER.CREATE.4:1", body("4")),
        ("k1", "ORDER.CREATE.5:1", body("5")),
    ];
    produce(&connector, &topic, &records).await;
    let mut handlers = HandlerRegistry::new();
    handlers.register("ORDER.PAY", Handler::Transactional(Arc::new(AlwaysFails)));
    handlers.register("ORDER.CREATE", Handler::Transactional(Arc::new(RecordEffect)));
    let pipeline = PipelineSettings { backoff: kafka.backoff.clone(), ..settings(3, Duration::from_secs(30)) };
    let (token, task) = start(&h, connector.clone(), handlers, pipeline, workers(2, 10));

    eventually(Duration::from_secs(30), "2 dead, 4 succeeded", || async {
        scalar(&h, "SELECT count(*) FROM dedup_records WHERE status = 'dead'").await == 2
            && scalar(&h, "SELECT count(*) FROM dedup_records WHERE status = 'succeeded'").await == 4
    })
    .await;
    let moved_on: bool = sqlx::query_scalar(
        "SELECT (SELECT completed_at FROM dedup_records WHERE message_id = 'ORDER.CREATE.5:1')
              < (SELECT updated_at FROM dedup_records WHERE message_id = 'ORDER.PAY.2:2')",
    )
    .fetch_one(h.pool())
    .await
    .unwrap();
    assert!(moved_on, "the records after the failing one were done before it went dead");
    let started: Vec<chrono::DateTime<chrono::Utc>> =
        sqlx::query_scalar("SELECT started_at FROM record_attempts a JOIN dedup_records r ON r.id = a.record_id WHERE r.message_id = 'ORDER.PAY.2:2' ORDER BY attempt")
            .fetch_all(h.pool())
            .await
            .unwrap();
    let gaps: Vec<i64> = started.windows(2).map(|w| (w[1] - w[0]).num_milliseconds()).collect();
    assert_eq!(started.len(), 3, "max_attempts attempts");
    assert!(gaps[0] >= 290 && gaps[1] >= 590, "retry copies waited for their back-off: {gaps:?} ms");
    for delay in [300, 600] {
        let retry_topic = kafka.settings.retry_topic(&topic, &kafka.group, Duration::from_millis(delay));
        let copies = kafka.read(&retry_topic, 1, Duration::from_secs(10)).await;
        assert_eq!(copies.len(), 1, "one copy went through {retry_topic}");
        assert_eq!(copies[0].header("x-message-id"), Some("ORDER.PAY.2:2"));
    }

    let dead = kafka.read(&KafkaSettings::dead_letter_topic(&topic), 2, Duration::from_secs(10)).await;
    assert_eq!(dead.len(), 2, "{dead:?}");
    for (copy, (id, reason)) in
        dead.iter().zip([("ORDER.CREATE.9:1", "unparsable"), ("ORDER.PAY.2:2", "downstream 503")])
    {
        assert_eq!(copy.header("x-message-id"), Some(id));
        assert_eq!(copy.key.as_deref(), Some("k1"));
        assert_eq!(copy.header(SOURCE_TOPIC_HEADER), Some(topic.as_str()));
        let why = copy.header(DEAD_LETTER_REASON_HEADER).unwrap_or_default();
        assert!(why.contains(reason), "{id}: {why}");
    }
    eventually(Duration::from_secs(10), "the group's lag is 0", || async { connector.lag().await.unwrap() == 0 }).await;

    // An operator's requeue: the stored record goes back to its topic, same id, same key.
    let (payload, headers, content_type, destination, key): (
        Vec<u8>,
        serde_json::Value,
        Option<String>,
        String,
        Option<String>,
    ) = sqlx::query_as(
        "SELECT payload, headers, content_type, source_exchange, source_routing_key FROM dedup_records
             WHERE message_id = 'ORDER.PAY.2:2'",
    )
    .fetch_one(h.pool())
    .await
    .unwrap();
    let publisher = connector.open_publisher().await.unwrap();
    let requeue = Outbound {
        destination: &destination,
        routing_key: "",
        key: key.as_deref(),
        message_id: Some("ORDER.PAY.2:2"),
        payload: &payload,
        headers: headers.as_object().unwrap(),
        content_type: content_type.as_deref(),
        type_property: None,
    };
    publisher.publish(requeue).await.unwrap();
    let all = kafka.read(&topic, records.len() + 1, Duration::from_secs(10)).await;
    let original = all.iter().find(|r| r.header("x-message-id") == Some("ORDER.PAY.2:2")).unwrap();
    let copy = all.iter().rev().find(|r| r.header("x-message-id") == Some("ORDER.PAY.2:2")).unwrap();
    assert!(copy.offset > original.offset, "a new record");
    assert_eq!(
        (copy.partition, copy.key.as_deref(), &copy.payload),
        (original.partition, Some("k1"), &original.payload)
    );
    assert!(copy.headers.iter().all(|(k, _)| !k.starts_with("x-dedup-")), "{:?}", copy.headers);
    token.cancel();
    task.await.unwrap();
}

/// Sleeps a little per record, in the transaction.
struct Sleepy;

#[async_trait]
impl TransactionalHandler for Sleepy {
    async fn handle(&self, input: &HandlerInput<'_>, tx: &mut PgConnection) -> Result<(), HandlerError> {
        tokio::time::sleep(Duration::from_millis(5)).await;
        RecordEffect.handle(input, tx).await
    }
}

#[tokio::test]
async fn back_pressure_bounds_the_records_fetched_ahead_of_the_workers() {
    let h = Harness::new().await;
    let mut kafka = TestKafka::new(1, Backoff { initial_ms: 200, max_ms: 200 });
    kafka.settings.max_in_flight = 20;
    let connector = kafka.connector();
    let ids: Vec<String> = (0..400).map(|i| format!("TEST.BULK.{i}:1")).collect();
    let records: Vec<(&str, &str, Vec<u8>)> = ids.iter().map(|id| ("k", id.as_str(), body(id))).collect();
    produce(&connector, kafka.topic(), &records).await;
    let mut handlers = HandlerRegistry::new();
    handlers.register("TEST.BULK", Handler::Transactional(Arc::new(Sleepy)));
    let (token, task) = start(&h, connector.clone(), handlers, settings(5, Duration::from_secs(30)), workers(1, 5));

    let mut most = 0;
    let started = Instant::now();
    while scalar(&h, "SELECT count(*) FROM test_effects").await < 400 {
        assert!(started.elapsed() < Duration::from_secs(60), "all 400 processed");
        most = most.max(connector.in_flight());
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert!((11..=20).contains(&most), "up to max_in_flight records fetched and unsettled, never more: {most}");
    token.cancel();
    task.await.unwrap();
}

/// Environment of [`a_plain_group_member_for_a_child_process`]: `<brokers> <group> <topic>`.
const CHILD_MEMBER_ENV: &str = "DC_TEST_KAFKA_CHILD_MEMBER";

/// Not a test of its own: the group member that [`a_member_is_killed`] runs in a child process
/// of this test binary (and kills). Joins the group, commits nothing, and prints
/// `assigned <n>` each time its assignment changes, until killed.
#[test]
#[ignore = "run as a child process by the tests that kill a group member"]
fn a_plain_group_member_for_a_child_process() {
    use rdkafka::ClientConfig;
    use rdkafka::consumer::{BaseConsumer, Consumer as _};
    use std::io::Write as _;
    let Ok(spec) = std::env::var(CHILD_MEMBER_ENV) else { return };
    let [brokers, group, topic]: [&str; 3] = spec.split(' ').collect::<Vec<_>>().try_into().expect("three words");
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .set("group.id", group)
        .set("session.timeout.ms", "6000")
        .set("enable.auto.commit", "false")
        .create()
        .expect("consumer");
    consumer.subscribe(&[topic]).expect("subscribed");
    let mut last = usize::MAX;
    loop {
        let _ = consumer.poll(Duration::from_millis(100));
        let assigned = consumer.assignment().map_or(0, |a| a.count());
        if assigned != last {
            println!("assigned {assigned}");
            std::io::stdout().flush().unwrap();
            last = assigned;
        }
    }
}

/// The child's next `assigned <n>` line, waited for up to 60 s.
async fn next_assignment(
    lines: &mut tokio::io::Lines<tokio::io::BufReader<tokio::process::ChildStdout>>,
    what: &str,
) -> usize {
    let next = async {
        loop {
            let line = lines.next_line().await.unwrap().expect("the child runs");
            if let Some(n) = line.strip_prefix("assigned ") {
                return n.parse::<usize>().unwrap();
            }
        }
    };
    tokio::time::timeout(Duration::from_secs(60), next).await.expect(what)
}

/// When the child member, leader of the group, is SIGKILLed.
#[derive(Clone, Copy)]
enum Kill {
    /// Once the partitions are shared: the test broker keeps the dead leader's generation.
    Settled,
    /// As soon as it gives its partitions up to share them (before the new generation's
    /// assignment): the test broker settles with nothing assigned to anyone.
    Rebalancing,
}

/// A plain member in a child process leads the group and holds the 4 partitions; the engine's
/// member joins, and the child is killed (no LeaveGroup) at `kill`. Every record of every
/// partition, before and after the kill, must then be applied exactly once: the survivor ends
/// up owning them all, however the test broker left the group (engine/src/source/kafka/
/// membership.rs).
async fn a_member_is_killed(kill: Kill) {
    let h = Harness::new().await;
    let kafka = TestKafka::new(4, Backoff { initial_ms: 200, max_ms: 400 });
    let connector = kafka.connector();
    // Creates the topic; each partition gets records before the kill (keys spread them).
    let before: Vec<String> = (0..40).map(|n| format!("TEST.KILL.{n}:1")).collect();
    produce_spread(&connector, kafka.topic(), &before).await;

    let mut child = tokio::process::Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "a_plain_group_member_for_a_child_process", "--ignored", "--nocapture"])
        .env(CHILD_MEMBER_ENV, format!("{} {} {}", kafka.settings.brokers, kafka.group, kafka.topic()))
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("child started");
    let mut lines = tokio::io::BufReader::new(child.stdout.take().unwrap()).lines();
    assert_eq!(next_assignment(&mut lines, "the child took every partition").await, 4);
    let mut handlers = HandlerRegistry::new();
    handlers.register("TEST.KILL", Handler::Transactional(Arc::new(RecordEffect)));
    let (token, task) = start(&h, connector.clone(), handlers, settings(5, Duration::from_secs(30)), workers(2, 10));
    let kill_at = |n: usize| match kill {
        Kill::Settled => (1..4).contains(&n),
        Kill::Rebalancing => n == 0,
    };
    while !kill_at(next_assignment(&mut lines, "the child's assignment changed").await) {}
    child.kill().await.unwrap();

    let after: Vec<String> = (0..40).map(|n| format!("TEST.KILL.after.{n}:1")).collect();
    produce_spread(&connector, kafka.topic(), &after).await;
    eventually(Duration::from_secs(90), "every record, of every partition, processed", || async {
        scalar(&h, "SELECT count(*) FROM test_effects WHERE message_id LIKE 'TEST.KILL.%'").await == 80
    })
    .await;
    for id in before.iter().chain(&after) {
        assert_eq!(h.effects(id).await, 1, "{id} applied once");
    }
    token.cancel();
    task.await.unwrap();
}

#[tokio::test]
async fn a_member_killed_with_sigkill_leaves_its_partitions_to_the_survivor() {
    a_member_is_killed(Kill::Settled).await;
}

#[tokio::test]
async fn a_leader_killed_in_the_middle_of_a_rebalance_leaves_no_partition_unowned() {
    a_member_is_killed(Kill::Rebalancing).await;
}
