//! The hot path's `tracing` spans: one batch through the consumer on a real RabbitMQ, captured
//! by a layer on a registry this test owns (installed for the test's thread only, with
//! `set_default`: the engine installs nothing global; the test harness's global subscriber keeps
//! nothing and only keeps callsites enabled). Prints the batch's trace tree
//! (`cargo test -p dedup-engine --test traces -- --nocapture`); DESIGN.md, "Tracing", shows one.

mod common;

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::*;
use dedup_engine::consumer::{Consumer, ConsumerSettings};
use dedup_engine::handler::{Handler, HandlerRegistry};
use dedup_engine::pipeline::PipelineSettings;
use dedup_engine::record::LeaseExpiryPolicy;
use dedup_engine::retry::Backoff;
use dedup_engine::source::{Outbound, SourceFactory};
use dedup_engine::testing::{TestBroker, amqp_url};
use tokio_util::sync::CancellationToken;
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing::{Level, Subscriber};
use tracing_subscriber::Layer;
use tracing_subscriber::filter::Targets;
use tracing_subscriber::layer::{Context, SubscriberExt};
use tracing_subscriber::registry::LookupSpan;

/// One span as the layer saw it.
#[derive(Debug, Clone)]
struct Captured {
    name: &'static str,
    level: Level,
    /// Index of the parent span in the capture.
    parent: Option<usize>,
    /// Every field, as written (`Display` for `%` fields, numbers and strings plain).
    fields: BTreeMap<&'static str, String>,
    opened: Instant,
    /// Open to close; `None` while open.
    duration: Option<Duration>,
}

impl Captured {
    fn field(&self, name: &str) -> &str {
        self.fields.get(name).unwrap_or_else(|| panic!("{} has no field {name}: {:?}", self.name, self.fields))
    }
}

/// Records every span it is let see (fields as they are recorded, parent, duration) in creation
/// order. `N` tells the captures of one registry apart.
#[derive(Clone, Default)]
struct Capture<const N: usize>(Arc<Mutex<Vec<Captured>>>);

/// A span's index in capture `N`, kept in the registry's extensions (span ids are reused).
struct Index<const N: usize>(usize);

struct Fields<'a>(&'a mut BTreeMap<&'static str, String>);

impl Visit for Fields<'_> {
    fn record_str(&mut self, field: &Field, value: &str) {
        self.0.insert(field.name(), value.to_owned());
    }
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        self.0.insert(field.name(), format!("{value:?}"));
    }
}

impl<S: Subscriber + for<'a> LookupSpan<'a>, const N: usize> Layer<S> for Capture<N> {
    fn on_new_span(&self, attrs: &Attributes<'_>, id: &Id, ctx: Context<'_, S>) {
        let span = ctx.span(id).expect("a new span is in the registry");
        let parent = span.parent().and_then(|p| p.extensions().get::<Index<N>>().map(|i| i.0));
        let mut fields = BTreeMap::new();
        attrs.record(&mut Fields(&mut fields));
        let mut spans = self.0.lock().unwrap();
        let meta = attrs.metadata();
        spans.push(Captured {
            name: meta.name(),
            level: *meta.level(),
            parent,
            fields,
            opened: Instant::now(),
            duration: None,
        });
        span.extensions_mut().insert(Index::<N>(spans.len() - 1));
    }

    fn on_record(&self, id: &Id, values: &Record<'_>, ctx: Context<'_, S>) {
        let Some(index) = ctx.span(id).and_then(|s| s.extensions().get::<Index<N>>().map(|i| i.0)) else { return };
        values.record(&mut Fields(&mut self.0.lock().unwrap()[index].fields));
    }

    fn on_close(&self, id: Id, ctx: Context<'_, S>) {
        let Some(index) = ctx.span(&id).and_then(|s| s.extensions().get::<Index<N>>().map(|i| i.0)) else { return };
        let mut spans = self.0.lock().unwrap();
        spans[index].duration = Some(spans[index].opened.elapsed());
    }
}

impl<const N: usize> Capture<N> {
    fn spans(&self) -> Vec<Captured> {
        self.0.lock().unwrap().clone()
    }
}

/// The span at `root` and every span under it, with their depth, in creation order.
fn subtree(spans: &[Captured], root: usize) -> Vec<(usize, usize)> {
    let mut out = vec![(root, 0)];
    let mut i = 0;
    while i < out.len() {
        let (parent, depth) = out[i];
        let children: Vec<(usize, usize)> =
            (0..spans.len()).filter(|&c| spans[c].parent == Some(parent)).map(|c| (c, depth + 1)).collect();
        for (k, child) in children.into_iter().enumerate() {
            out.insert(i + 1 + k, child);
        }
        i += 1;
    }
    out
}

/// The trace tree as text: `name{field=value …} duration`, indented by depth.
fn render(spans: &[Captured], tree: &[(usize, usize)]) -> String {
    let mut text = String::new();
    for &(i, depth) in tree {
        let s = &spans[i];
        let fields: Vec<String> = s.fields.iter().map(|(k, v)| format!("{k}={v}")).collect();
        let took = s.duration.map_or("open".to_owned(), |d| format!("{:.1} ms", d.as_secs_f64() * 1e3));
        writeln!(text, "{}{} {}{{{}}} {took}", "  ".repeat(depth), s.level, s.name, fields.join(" ")).unwrap();
    }
    text
}

async fn publish(broker: &TestBroker, messages: &[(&str, &[u8])]) {
    let factory = broker.connector();
    let publisher = factory.open_publisher().await.unwrap();
    let headers = serde_json::Map::new();
    for (id, body) in messages {
        publisher
            .publish(Outbound {
                destination: &broker.settings.exchange,
                routing_key: "trace.test",
                key: None,
                message_id: Some(id),
                payload: body,
                headers: &headers,
                content_type: Some("application/json"),
                type_property: None,
            })
            .await
            .unwrap();
    }
    factory.close().await;
}

#[tokio::test] // current-thread: every task of the consumer reports to this thread's subscriber
async fn one_batch_through_the_consumer_makes_one_trace_with_its_outcomes_handlers_statements_and_settle() {
    // Everything the engine opens, and what a host filtering at `info` would see.
    let (capture, info) = (Capture::<0>::default(), Capture::<1>::default());
    let subscriber = tracing_subscriber::registry()
        .with(capture.clone().with_filter(Targets::new().with_target("dedup_engine", Level::TRACE)))
        .with(info.clone().with_filter(Targets::new().with_target("dedup_engine", Level::INFO)));
    let _scope = tracing::subscriber::set_default(subscriber);

    let h = Harness::new().await;
    let broker = TestBroker::new(&amqp_url(), Backoff { initial_ms: 60_000, max_ms: 60_000 });
    let mut handlers = HandlerRegistry::new();
    handlers.register("ORDER.PAY", Handler::Transactional(Arc::new(RecordEffect)));
    handlers.register("ORDER.SHIP", Handler::Transactional(Arc::new(AlwaysFails)));
    let mail = CountingEffect::new(Duration::ZERO);
    handlers.register("MAIL.SEND", Handler::Leased { handler: mail, on_lease_expiry: LeaseExpiryPolicy::Hold });
    let settings = PipelineSettings { backoff: broker.backoff.clone(), ..settings(3, Duration::from_secs(30)) };
    let pipeline = h.pipeline_with(handlers, settings);

    // Published before the consumer starts, gathered into one batch by the linger.
    let paid = br#"{"amountCents":100}"#.as_slice();
    let messages: [(&str, &[u8]); 7] = [
        ("ORDER.PAY.1:1", paid),
        ("ORDER.PAY.2:1", paid),
        ("ORDER.PAY.1:1", paid),             // the same message again: a duplicate
        ("ORDER.SHIP.1:1", paid),            // its handler fails: a retry copy
        ("MAIL.SEND.1:1", br#"{"to":"a"}"#), // leased
        ("INVOICE.SEND.1:1", paid),          // no handler: dead
        ("ORDER.PAY.3:1", b"{not json"),     // poison
    ];
    publish(&broker, &messages).await;
    let consumer = Consumer::new(
        pipeline,
        broker.connector() as Arc<dyn SourceFactory>,
        ConsumerSettings { concurrency: 1, batch_size: 20, batch_linger_ms: 500, ..ConsumerSettings::default() },
    );
    let token = CancellationToken::new();
    let task = tokio::spawn(consumer.run(token.clone()));
    eventually(Duration::from_secs(20), || async {
        capture.spans().iter().any(|s| s.name == "batch" && s.duration.is_some())
    })
    .await;
    token.cancel();
    task.await.unwrap();

    let spans = capture.spans();
    let batches: Vec<usize> = (0..spans.len()).filter(|&i| spans[i].name == "batch").collect();
    assert_eq!(batches.len(), 1, "one batch: {:?}", batches.iter().map(|&i| &spans[i].fields).collect::<Vec<_>>());
    let batch = &spans[batches[0]];
    let tree = subtree(&spans, batches[0]);
    println!("trace of one batch (engine/tests/traces.rs):\n{}", render(&spans, &tree));

    assert_eq!(batch.level, Level::INFO);
    assert_eq!(batch.parent, None, "a batch is a root span");
    for (field, value) in [
        ("group", GROUP),
        ("size", "7"),
        ("succeeded", "3"),
        ("duplicate", "1"),
        ("retried", "1"),
        ("dead", "1"),
        ("poison", "1"),
        ("redelivered", "0"),
        ("parked", "0"),
        ("lease_lost", "0"),
    ] {
        assert_eq!(batch.field(field), value, "batch field {field}");
    }
    let under: Vec<&Captured> = tree[1..].iter().map(|&(i, _)| &spans[i]).collect();
    let named = |name: &str| under.iter().copied().filter(|s| s.name == name).collect::<Vec<_>>();

    // Each handler call: its message, type, attempt and mode, how long it took, how it ended.
    let handlers = named("handler");
    let calls = |id: &str| handlers.iter().filter(|s| s.field("message_id") == id).collect::<Vec<_>>();
    for s in &handlers {
        assert_eq!(s.level, Level::INFO);
        assert_eq!(s.field("attempt"), "1", "{:?}", s.fields);
        assert!(s.field("duration_ms").parse::<f64>().unwrap() >= 0.0);
    }
    let mail = calls("MAIL.SEND.1:1");
    assert_eq!(mail.len(), 1, "the leased handler runs once");
    assert_eq!(
        (mail[0].field("mode"), mail[0].field("message_type"), mail[0].field("outcome")),
        ("leased", "MAIL.SEND", "ok")
    );
    // The failing handler aborts the optimistic attempt; the savepoint attempt runs it again.
    let ship = calls("ORDER.SHIP.1:1");
    assert!(
        ship.len() == 2 && ship.iter().all(|s| s.field("outcome") == "error" && s.field("mode") == "transactional")
    );
    let paid_calls = calls("ORDER.PAY.2:1");
    assert!(paid_calls.last().is_some_and(|s| s.field("outcome") == "ok" && s.field("message_type") == "ORDER.PAY"));
    assert!(calls("INVOICE.SEND.1:1").is_empty() && calls("ORDER.PAY.3:1").is_empty(), "no handler for those");

    // The transaction attempts: optimistic, rolled back at the failure; then with savepoints.
    let transactions: Vec<(&str, &str)> =
        named("transaction").iter().map(|s| (s.field("isolation"), s.field("end"))).collect();
    assert_eq!(transactions, [("optimistic", "rolled_back"), ("savepoints", "committed")]);
    let committed = named("transaction").into_iter().find(|s| s.field("end") == "committed").unwrap();
    assert_eq!((committed.field("messages"), committed.field("poison")), ("4", "2"), "4 transactional, 2 poison");

    // Store statement groups, DEBUG, by what they do.
    let groups: Vec<&str> = under.iter().filter(|s| s.level == Level::DEBUG).map(|s| s.name).collect();
    for name in ["redis_lookup", "claim", "record_poison", "record_failure", "complete", "redis_mark", "settle"] {
        assert!(groups.contains(&name), "{name} in {groups:?}");
    }
    let leased_claim = named("claim").into_iter().find(|s| s.field("mode") == "leased").expect("the leased claim");
    assert_eq!(leased_claim.field("count"), "1");
    let duplicate_claim = |s: &&Captured| {
        s.fields.get("into").is_some_and(|into| into == "processing")
            && s.field("count") == "1"
            && s.field("claimed") == "0"
    };
    assert!(named("claim").iter().any(duplicate_claim), "the duplicate's claim (second round) claims nothing");
    assert_eq!(named("record_poison").len(), 4, "two poison records, in each attempt");
    assert_eq!(named("redis_mark")[0].field("count"), "3", "markers for the three successes");

    // The broker settle: one span, inside the batch, with what it did.
    let settle = named("settle");
    assert_eq!(settle.len(), 1);
    for (field, value) in [
        ("broker", "rabbitmq"),
        ("count", "7"),
        ("retry_copies", "1"),
        ("dead_letter_copies", "2"),
        ("acks", "7"),
        ("requeues", "0"),
        ("multiple", "true"),
    ] {
        assert_eq!(settle[0].field(field), value, "settle field {field}");
    }
    assert_eq!(h.effects("ORDER.PAY.1:1").await, 1, "the duplicate changed nothing");

    // At `info`: the batch and its handler calls, straight under it.
    let info = info.spans();
    let info_batch = (0..info.len()).find(|&i| info[i].name == "batch").expect("the batch at info");
    let info_tree: Vec<&Captured> = subtree(&info, info_batch)[1..].iter().map(|&(i, _)| &info[i]).collect();
    assert_eq!(info_tree.len(), handlers.len(), "only the handler calls under the batch: {info_tree:?}");
    assert!(info_tree.iter().all(|s| s.name == "handler" && s.parent == Some(info_batch)));
    assert_eq!(info[info_batch].fields, batch.fields, "the same outcome counts");
}
