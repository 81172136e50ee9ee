//! `verify` on MariaDB (issue 25) on a hand-made run whose order went through the handlers on
//! `Pipeline<MySqlStore>`: a clean run reports every message accounted for and no double
//! effect; a second payment row is reported as a double effect, and a published id without a
//! record as lost.

mod mysql_support;

use std::time::Duration;

use dedup_engine::pipeline::{AckReason, Disposition};
use dedup_engine::store::conformance::delivery;
use mysql_support::ShopDatabase;

const POISON_HASH: &str = "ab01ab01ab01ab01ab01ab01ab01ab01ab01ab01ab01ab01ab01ab01ab01ab01";

/// Order `V-1` created, paid and notified through the pipeline (the PAY twice), a poison
/// message's dead record, and a finished run that published those 4 messages, 2 copies each.
async fn clean_run(h: &ShopDatabase) -> i64 {
    let phone = "+8613800000002";
    let batch = [
        delivery(
            "ORDER.CREATE.V-1:1",
            &format!(r#"{{"orderNo":"V-1","sku":"SKU-0001","quantity":2,"amountCents":900,"phone":"{phone}"}}"#),
        ),
        delivery("ORDER.PAY.V-1:2", r#"{"orderNo":"V-1","amountCents":900,"expectedVersion":1}"#),
        delivery(
            "ORDER.NOTIFY.V-1:3",
            &format!(r#"{{"orderNo":"V-1","kind":"PAID","phone":"{phone}","text":"Order V-1 is paid."}}"#),
        ),
    ];
    let pipeline = h.pipeline();
    for message in &batch {
        assert_eq!(
            pipeline.process("w1", std::slice::from_ref(message)).await,
            [Disposition::Ack(AckReason::Processed)]
        );
    }
    assert_eq!(pipeline.process("w1", &batch[1..2]).await, [Disposition::Ack(AckReason::DuplicateRedis)]);
    sqlx::query(&format!(
        "INSERT INTO `{}`.dedup_records (consumer_group, message_id, message_type, status, attempts, max_attempts,
             payload_hash, source_broker, poison)
         VALUES ('orders', 'POISON.1', 'POISON', 'dead', 1, 5, UNHEX('{POISON_HASH}'), 'rabbitmq', TRUE)",
        h.db.name
    ))
    .execute(h.pool())
    .await
    .unwrap();

    let shop = h.shop.database();
    let run = sqlx::query(&format!(
        "INSERT INTO `{shop}`.simulation_runs (parameters, finished_at)
         VALUES ('{{\"orders\": 1, \"order_prefix\": \"V-\"}}', UTC_TIMESTAMP(6))"
    ))
    .execute(h.pool())
    .await
    .unwrap()
    .last_insert_id();
    for (id, poison) in [
        ("ORDER.CREATE.V-1:1".to_owned(), false),
        ("ORDER.PAY.V-1:2".to_owned(), false),
        ("ORDER.NOTIFY.V-1:3".to_owned(), false),
        (format!("POISON:{POISON_HASH}"), true),
    ] {
        add_message(h, run, &id, poison).await;
    }
    i64::try_from(run).unwrap()
}

async fn add_message(h: &ShopDatabase, run: u64, id: &str, poison: bool) {
    sqlx::query(&format!(
        "INSERT INTO `{}`.simulation_messages (run_id, consumer_group, message_id, poison, copies)
         VALUES (?, 'orders', ?, ?, 2)",
        h.shop.database()
    ))
    .bind(run)
    .bind(id)
    .bind(poison)
    .execute(h.pool())
    .await
    .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_clean_run_has_every_message_accounted_for_and_no_double_effect() {
    let h = ShopDatabase::create(10).await;
    let run = clean_run(&h).await;
    let report = h.shop.verify(h.pool(), &h.engine_schema(), None, Duration::from_secs(5)).await.unwrap();
    assert!(report.ok, "{report:?}");
    assert_eq!((report.run_id, report.order_prefix.as_str(), report.orders), (run, "V-", 1));
    assert_eq!((report.messages, report.copies, report.missing), (4, 8, 0), "{report:?}");
    assert_eq!((report.succeeded, report.dead, report.poison_dead), (3, 1, 1), "{report:?}");
    assert_eq!((report.failed, report.processing, report.parked), (0, 0, 0), "{report:?}");
    assert_eq!((report.orders_created, report.orders_paid, report.sms_sent), (1, 1, 1), "{report:?}");
    assert_eq!((report.double_reservations, report.double_payments, report.double_sms), (0, 0, 0), "{report:?}");
    assert_eq!((report.inconsistent_orders, report.inventory_mismatches), (0, 0), "{report:?}");
    assert!(report.violations.is_empty(), "{:?}", report.violations);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_second_payment_is_a_double_effect_and_an_id_without_record_is_lost() {
    let h = ShopDatabase::create(10).await;
    let run = clean_run(&h).await;
    let shop = h.shop.database();
    sqlx::query(&format!(
        "INSERT INTO `{shop}`.payments (order_no, amount_cents, message_id) VALUES ('V-1', 900, 'ORDER.PAY.V-1:2')"
    ))
    .execute(h.pool())
    .await
    .unwrap();
    sqlx::query(&format!("UPDATE `{shop}`.inventory SET reserved = reserved + 1 WHERE sku = 'SKU-0001'"))
        .execute(h.pool())
        .await
        .unwrap();
    add_message(&h, u64::try_from(run).unwrap(), "ORDER.CREATE.V-2:1", false).await;

    let report = h.shop.verify(h.pool(), &h.engine_schema(), Some(run), Duration::from_secs(1)).await.unwrap();
    assert!(!report.ok, "{report:?}");
    assert_eq!((report.double_payments, report.inconsistent_orders), (1, 1), "{report:?}");
    assert_eq!((report.inventory_mismatches, report.missing, report.messages), (1, 1, 5), "{report:?}");
    assert_eq!((report.double_reservations, report.double_sms), (0, 0), "{report:?}");
    for expected in ["1 orders paid more than once", "1 SKUs whose reserved", "1 published message ids without"] {
        assert!(report.violations.iter().any(|v| v.starts_with(expected)), "{expected}: {:?}", report.violations);
    }
}
