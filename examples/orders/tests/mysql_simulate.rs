//! `simulate` and `verify` on MariaDB end to end (issue 25's acceptance, small): a run of 150
//! orders with 20 % duplicates, reordering and poison is published to a real RabbitMQ exchange
//! and recorded in the shop on MariaDB; two workers (each a `Pipeline<MySqlStore>` of its own,
//! as two `serve` processes) drain the queue concurrently, sending retries back as the retry
//! path would; the verifier then finds every message accounted for and no double effect.

mod mysql_support;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use dedup_engine::message::{IdPolicy, InboundMessage};
use dedup_engine::pipeline::Disposition;
use dedup_engine::retry::Backoff;
use dedup_engine::testing::{TestBroker, amqp_url, rabbitmq_delivery};
use dedup_example_orders::OrderSettings;
use dedup_example_orders::simulate::{SimulateParams, SimulatedGroup};
use lapin::options::BasicGetOptions;
use mysql_support::ShopDatabase;

/// Deliveries sent back to be tried again after their delay (the retry queues' stand-in).
type Retries = Arc<Mutex<Vec<(Instant, InboundMessage)>>>;

/// Processes the queue's messages and the due retries in batches of up to 20 until both are
/// empty; `(batches, dispositions other than an acknowledgement)`.
async fn drain(h: &ShopDatabase, broker: &TestBroker, worker: &str, retries: Retries) -> (u32, u32) {
    let pipeline = h.pipeline();
    let channel = broker.channel().await;
    let (mut batches, mut not_acked) = (0, 0);
    loop {
        let mut batch: Vec<InboundMessage> = {
            let mut due = retries.lock().unwrap();
            let now = Instant::now();
            let (ready, later) = due.drain(..).partition(|(at, _)| *at <= now);
            *due = later;
            ready.into_iter().map(|(_, m)| m).collect()
        };
        while batch.len() < 20 {
            let options = BasicGetOptions { no_ack: true };
            let Some(got) = channel.basic_get(broker.settings.queue.as_str().into(), options).await.unwrap() else {
                break;
            };
            let id = got.delivery.properties.message_id().as_ref().map(|id| id.as_str().to_owned());
            batch.push(rabbitmq_delivery(id.as_deref(), got.delivery.data));
        }
        if batch.is_empty() {
            if retries.lock().unwrap().is_empty() {
                return (batches, not_acked);
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
            continue;
        }
        batches += 1;
        let dispositions = pipeline.process(worker, &batch).await;
        for (message, disposition) in batch.into_iter().zip(dispositions) {
            let back = match disposition {
                Disposition::Ack(_) | Disposition::DeadLetter { .. } => continue,
                Disposition::Retry { delay } | Disposition::Held { delay } => delay,
                Disposition::Redeliver => Duration::ZERO,
            };
            not_acked += 1;
            retries.lock().unwrap().push((Instant::now() + back, message));
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_run_with_duplicates_through_two_workers_verifies_exactly_once() {
    let h = ShopDatabase::create(1_000_000).await;
    let broker = TestBroker::new(&amqp_url(), Backoff { initial_ms: 200, max_ms: 200 });
    let publisher = broker.connector().publisher().await.unwrap(); // declares the exchange and queue
    let params = SimulateParams {
        orders: 150,
        rate: 0.0,
        duplicate_rate: 0.2,
        duplicate_delay_ms: 400,
        reorder_window: 12,
        poison_rate: 0.05,
        groups: vec![SimulatedGroup { name: "orders".into(), binding_keys: vec![] }],
        exchange: broker.settings.exchange.clone(),
        seed: 25,
    };
    let orders = OrderSettings { skus: 3, ..OrderSettings::default() };
    let report =
        h.shop.simulate(h.pool(), &publisher, &params, &orders, &IdPolicy::default(), |_, _| {}).await.unwrap();
    assert_eq!(report.orders, 150);
    assert!(report.duplicates > 50 && report.poison > 0, "{report:?}");

    let retries = Retries::default();
    let (a, b) = tokio::join!(drain(&h, &broker, "w1", retries.clone()), drain(&h, &broker, "w2", retries.clone()));
    assert!(a.0 > 0 && b.0 > 0, "both workers took batches: {a:?} {b:?}");

    let verified =
        h.shop.verify(h.pool(), &h.engine_schema(), Some(report.run_id), Duration::from_secs(10)).await.unwrap();
    assert!(verified.ok, "{verified:?}");
    assert_eq!((verified.messages, verified.copies), (report.messages as i64, report.published as i64), "{verified:?}");
    assert_eq!((verified.missing, verified.failed, verified.processing), (0, 0, 0), "{verified:?}");
    assert_eq!(verified.succeeded, 450, "{verified:?}");
    assert_eq!(verified.poison_dead, report.poison as i64, "{verified:?}");
    assert_eq!((verified.orders_created, verified.orders_paid, verified.sms_sent), (150, 150, 150), "{verified:?}");
    assert_eq!(
        (verified.double_reservations, verified.double_payments, verified.double_sms, verified.inconsistent_orders),
        (0, 0, 0, 0),
        "{verified:?}"
    );
}
