//! The order example's CREATE of an order that exists already (issue 27): the same order again
//! (a replay under another message id, or a late duplicate after its record was cleaned up) is
//! a harmless no-op, not a dead letter that fails again on every requeue; another order under
//! the same number is a permanent `ORDER_EXISTS`.

use std::sync::Arc;
use std::time::Duration;

use dedup_engine::fastpath::{FastPath, FastPathSettings};
use dedup_engine::message::{IdPolicy, InboundMessage, TypePolicy};
use dedup_engine::pipeline::{AckReason, Disposition, Pipeline, PipelineSettings};
use dedup_engine::record::ConsumerGroup;
use dedup_engine::retry::Backoff;
use dedup_engine::stats::Stats;
use dedup_engine::store::postgres::PgStore;
use dedup_engine::testing::{TestDatabase, rabbitmq_delivery, redis_url};
use dedup_example_orders::{OrderSettings, handlers, stock_inventory};
use serde_json::json;

fn create(message_id: &str, sku: &str, quantity: i64) -> InboundMessage {
    let body = json!({"orderNo": "R-1", "sku": sku, "quantity": quantity, "amountCents": 1200, "phone": "+4915100000"});
    let mut delivery = rabbitmq_delivery(Some(message_id), serde_json::to_vec(&body).unwrap());
    delivery.source.exchange = Some("orders".to_owned());
    delivery.source.routing_key = Some("order.create".to_owned());
    delivery
}

#[tokio::test]
async fn the_same_order_created_again_is_a_no_op_and_another_one_under_its_number_is_refused() {
    let db = TestDatabase::create().await;
    dedup_example_orders::migrate(&db.pool).await.unwrap();
    let orders = OrderSettings { skus: 2, ..OrderSettings::default() };
    stock_inventory(&db.pool, &orders).await.unwrap();
    let prefix = format!("t-{}", db.name);
    let fast_path = Arc::new(FastPath::new(&redis_url(), FastPathSettings { prefix, ..FastPathSettings::default() }));
    let settings = PipelineSettings {
        group: ConsumerGroup::parse("order-service").unwrap(),
        max_attempts: 3,
        lease: Duration::from_secs(30),
        backoff: Backoff { initial_ms: 1000, max_ms: 1000 },
        id_policy: IdPolicy::default(),
        type_policy: TypePolicy::default(),
        keep_poison_payload_bytes: 1024,
        late_duplicates: dedup_engine::LateDuplicatePolicy::Process,
    };
    let pipeline = Pipeline::new(
        PgStore::new(db.pool.clone(), &db.schema),
        fast_path,
        Arc::new(Stats::default()),
        handlers(db.pool.clone(), &orders),
        settings,
    );
    let processed = [Disposition::Ack(AckReason::Processed)];
    assert_eq!(pipeline.process("w", &[create("ORDER.CREATE.R-1:1", "SKU-0001", 3)]).await, processed);
    // The producer sends the same order again under a new id: done, nothing reserved twice.
    assert_eq!(pipeline.process("w", &[create("ORDER.CREATE.R-1:1b", "SKU-0001", 3)]).await, processed);
    let reserved: (i64, i64) = sqlx::query_as(
        "SELECT (SELECT count(*) FROM shop.inventory_reservations WHERE order_no = 'R-1'),
                (SELECT reserved::bigint FROM shop.inventory WHERE sku = 'SKU-0001')",
    )
    .fetch_one(&db.pool)
    .await
    .unwrap();
    assert_eq!(reserved, (1, 3), "one reservation of 3 units");
    // Another order under the same number: a conflict an operator must see.
    let other = pipeline.process("w", &[create("ORDER.CREATE.R-1:2", "SKU-0002", 1)]).await;
    assert!(
        matches!(&other[..], [Disposition::DeadLetter { reason }] if reason.starts_with("ORDER_EXISTS")),
        "{other:?}"
    );
}
