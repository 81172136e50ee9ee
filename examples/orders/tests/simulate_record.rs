//! `simulate` on PostgreSQL records what it published (its `RunBook`): a run of 40 orders with
//! duplicates and poison, published to a real RabbitMQ exchange nobody consumes, is found by
//! `verify` with every message and copy counted — and all of them missing, since nothing ran.

use std::time::Duration;

use dedup_engine::message::IdPolicy;
use dedup_engine::retry::Backoff;
use dedup_engine::testing::{TestBroker, TestDatabase, amqp_url};
use dedup_example_orders::OrderSettings;
use dedup_example_orders::simulate::{SimulateParams, SimulatedGroup, simulate};
use dedup_example_orders::verify::verify;

#[tokio::test]
async fn a_run_is_recorded_with_every_message_and_copy() {
    let db = TestDatabase::create().await;
    dedup_example_orders::migrate(&db.pool).await.unwrap();
    let broker = TestBroker::new(&amqp_url(), Backoff { initial_ms: 200, max_ms: 200 });
    let publisher = broker.connector().publisher().await.unwrap();
    let params = SimulateParams {
        orders: 40,
        rate: 0.0,
        duplicate_rate: 0.3,
        duplicate_delay_ms: 300,
        reorder_window: 6,
        poison_rate: 0.1,
        groups: vec![SimulatedGroup { name: "orders".into(), binding_keys: vec![] }],
        exchange: broker.settings.exchange.clone(),
        seed: 7,
    };
    let report = simulate(&db.pool, &publisher, &params, &OrderSettings::default(), &IdPolicy::default(), |_, _| {})
        .await
        .unwrap();
    assert!(report.duplicates > 0 && report.poison > 0, "{report:?}");
    assert_eq!(report.messages, 120 + report.poison);

    let verified = verify(&db.pool, &db.schema, Some(report.run_id), Duration::ZERO).await.unwrap();
    assert_eq!(verified.order_prefix, report.order_prefix);
    assert_eq!((verified.orders, verified.messages), (40, report.messages as i64), "{verified:?}");
    assert_eq!((verified.copies, verified.missing), (report.published as i64, report.messages as i64), "{verified:?}");
    assert!(!verified.ok && verified.violations.iter().all(|v| !v.contains("recorded no message")), "{verified:?}");
}
