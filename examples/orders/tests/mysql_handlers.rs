//! The order handlers on MariaDB through `Pipeline<MySqlStore>` (issue 25): CREATE, PAY and
//! NOTIFY delivered with duplicates — again, through other workers, and a CREATE replayed under
//! another id — make one reservation, one payment and one SMS; a PAY before its CREATE is
//! retried, not lost, and pays once the order exists.

mod mysql_support;

use std::time::Duration;

use dedup_engine::message::InboundMessage;
use dedup_engine::pipeline::{AckReason, Disposition};
use dedup_engine::store::conformance::delivery;
use mysql_support::ShopDatabase;

fn create(order: &str, id_version: &str) -> InboundMessage {
    delivery(
        &format!("ORDER.CREATE.{order}:{id_version}"),
        &format!(
            r#"{{"orderNo":"{order}","sku":"SKU-0002","quantity":3,"amountCents":1250,"phone":"+8613800000001"}}"#
        ),
    )
}

fn pay(order: &str) -> InboundMessage {
    delivery(
        &format!("ORDER.PAY.{order}:2"),
        &format!(r#"{{"orderNo":"{order}","amountCents":1250,"expectedVersion":1}}"#),
    )
}

fn notify(order: &str) -> InboundMessage {
    delivery(
        &format!("ORDER.NOTIFY.{order}:3"),
        &format!(r#"{{"orderNo":"{order}","kind":"PAID","phone":"+8613800000001","text":"Order {order} is paid."}}"#),
    )
}

/// `(status, version)` of the order, and `(available, reserved)` of SKU-0002.
async fn state(h: &ShopDatabase, order: &str) -> ((Vec<u8>, i32), (i32, i32)) {
    let db = h.shop.database();
    let order = sqlx::query_as(&format!("SELECT status, version FROM `{db}`.orders WHERE order_no = ?"))
        .bind(order)
        .fetch_one(h.pool())
        .await
        .unwrap();
    let stock = sqlx::query_as(&format!("SELECT available, reserved FROM `{db}`.inventory WHERE sku = 'SKU-0002'"))
        .fetch_one(h.pool())
        .await
        .unwrap();
    (order, stock)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn create_pay_notify_with_duplicates_make_each_effect_once() {
    let h = ShopDatabase::create(10).await;
    let first = h.pipeline();
    assert_eq!(first.process("w1", &[create("A-1", "1")]).await, vec![Disposition::Ack(AckReason::Processed)]);
    assert_eq!(
        first.process("w1", &[pay("A-1"), notify("A-1")]).await,
        vec![Disposition::Ack(AckReason::Processed); 2]
    );

    // Every message again, through a worker whose Redis knows none of them: the database judges.
    let again = h.pipeline().process("w2", &[create("A-1", "1"), pay("A-1"), notify("A-1")]).await;
    assert_eq!(again, vec![Disposition::Ack(AckReason::DuplicateDatabase); 3]);
    // The same order under a new message id (a replay): a no-op, not a second reservation.
    let replay = h.pipeline().process("w3", &[create("A-1", "replay")]).await;
    assert_eq!(replay, vec![Disposition::Ack(AckReason::Processed)]);

    assert_eq!(h.count("inventory_reservations").await, 1, "stock reserved once");
    assert_eq!(h.count("payments").await, 1, "paid once");
    assert_eq!(h.count("notifications").await, 1, "one SMS");
    assert_eq!(state(&h, "A-1").await, ((b"PAID".to_vec(), 2), (7, 3)));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_pay_before_its_create_is_retried_then_pays_once() {
    let h = ShopDatabase::create(10).await;
    let pipeline = h.pipeline();
    let early = pipeline.process("w1", &[pay("B-1")]).await;
    assert!(matches!(early[..], [Disposition::Retry { .. }]), "ORDER_NOT_FOUND is retryable: {early:?}");
    let (status, error): (Vec<u8>, Option<Vec<u8>>) = sqlx::query_as(&format!(
        "SELECT status, error_class FROM `{}`.dedup_records WHERE message_id = 'ORDER.PAY.B-1:2'",
        h.db.name
    ))
    .fetch_one(h.pool())
    .await
    .unwrap();
    assert_eq!((status.as_slice(), error.as_deref()), (&b"failed"[..], Some(&b"ORDER_NOT_FOUND"[..])));
    assert_eq!(h.count("payments").await, 0);

    assert_eq!(pipeline.process("w1", &[create("B-1", "1")]).await, vec![Disposition::Ack(AckReason::Processed)]);
    tokio::time::sleep(Duration::from_millis(400)).await; // past the retry's backoff
    assert_eq!(pipeline.process("w1", &[pay("B-1")]).await, vec![Disposition::Ack(AckReason::Processed)]);
    assert_eq!(h.pipeline().process("w2", &[pay("B-1")]).await, vec![Disposition::Ack(AckReason::DuplicateDatabase)]);
    assert_eq!(h.count("payments").await, 1, "paid once");
    assert_eq!(state(&h, "B-1").await, ((b"PAID".to_vec(), 2), (7, 3)));
}
