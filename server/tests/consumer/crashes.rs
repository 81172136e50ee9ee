//! Workers killed with SIGKILL in the middle of a handler, then restarted (DESIGN.md, "Two
//! handler modes").

use std::time::Duration;

use chrono::{DateTime, Utc};
use serde_json::json;

use crate::support::World;

fn notify(order_no: &str) -> serde_json::Value {
    json!({"orderNo": order_no, "kind": "PAID", "phone": "+8613800000000", "text": "paid"})
}

#[tokio::test]
async fn transactional_a_killed_worker_rolls_back_and_the_message_is_processed_once() {
    let world = World::new().await;
    let a = world.serve("a", &[("DEDUP_CONSUMER__WORKERS__CONCURRENCY", "1")]).await;
    // Hold the SKU's row so the CREATE handler blocks inside its transaction.
    let mut locker = world.db.pool.begin().await.unwrap();
    sqlx::query("SELECT 1 FROM shop.inventory WHERE sku = 'SKU-0001' FOR UPDATE").execute(&mut *locker).await.unwrap();
    world
        .publish(
            "ORDER.CREATE.K1:1",
            "order.create",
            json!({"orderNo": "K1", "sku": "SKU-0001", "quantity": 2, "amountCents": 100, "phone": "+1"}),
        )
        .await;
    let waiting: i64 = world
        .wait_for(
            Duration::from_secs(20),
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()
               AND wait_event_type = 'Lock' AND query LIKE '%UPDATE shop.inventory%'",
            |n: &i64| *n == 1,
        )
        .await;
    assert_eq!(waiting, 1, "the handler is mid-transaction");
    a.kill().await;
    locker.rollback().await.unwrap();

    let b = world.serve("b", &[]).await;
    let status: String = world
        .wait_for(
            Duration::from_secs(30),
            "SELECT COALESCE((SELECT status FROM dedup_records WHERE message_id = 'ORDER.CREATE.K1:1'), 'none')",
            |s: &String| s == "succeeded",
        )
        .await;
    assert_eq!(status, "succeeded");
    // A transactional first-try success writes no attempt row (the record says attempt 1): the
    // killed attempt, rolled back, left neither a row nor a count.
    let (reservations, reserved, attempts, attempt_rows): (i64, i32, i32, i64) = sqlx::query_as(
        "SELECT (SELECT count(*) FROM shop.inventory_reservations WHERE order_no = 'K1'),
                (SELECT reserved FROM shop.inventory WHERE sku = 'SKU-0001'),
                (SELECT attempts FROM dedup_records WHERE message_id = 'ORDER.CREATE.K1:1'),
                (SELECT count(*) FROM record_attempts)",
    )
    .fetch_one(&world.db.pool)
    .await
    .unwrap();
    assert_eq!(
        (reservations, reserved, attempts, attempt_rows),
        (1, 2, 1, 0),
        "stock reserved once; the killed attempt left nothing"
    );
    b.stop().await;
}

/// Starts a worker whose SMS takes 20 s, lets it claim `order_no`'s NOTIFY under a 2 s lease,
/// kills it, and returns when the lease it held expires (database clock).
async fn kill_mid_sms(world: &World, order_no: &str, policy: &str) -> (u32, DateTime<Utc>) {
    let a = world
        .serve(
            "a",
            &[
                ("DEDUP_ORDERS__SMS_LATENCY_MS", "20000"),
                ("DEDUP_CONSUMER__LEASE_MS", "2000"),
                ("DEDUP_ORDERS__NOTIFY_ON_LEASE_EXPIRY", policy),
            ],
        )
        .await;
    world.publish(&format!("ORDER.NOTIFY.{order_no}:3"), "order.notify", notify(order_no)).await;
    let status: String = world
        .wait_for(
            Duration::from_secs(20),
            "SELECT COALESCE((SELECT status FROM dedup_records LIMIT 1), 'none')",
            |s: &String| s == "processing",
        )
        .await;
    assert_eq!(status, "processing");
    let pid = a.pid();
    a.kill().await;
    let expires: DateTime<Utc> =
        sqlx::query_scalar("SELECT lease_expires_at FROM dedup_records").fetch_one(&world.db.pool).await.unwrap();
    (pid, expires)
}

#[tokio::test]
async fn leased_hold_a_killed_worker_leaves_the_record_stuck_and_the_redelivery_parked() {
    let world = World::new().await;
    let (killed_pid, _) = kill_mid_sms(&world, "K2", "hold").await;
    let b = world.serve("b", &[("DEDUP_CONSUMER__LEASE_MS", "2000")]).await;

    let parked: bool =
        world.wait_for(Duration::from_secs(30), "SELECT parked_at IS NOT NULL FROM dedup_records", |p: &bool| *p).await;
    assert!(parked, "the redelivery was parked; log: {}", b.log_text());
    tokio::time::sleep(Duration::from_secs(2)).await;
    let (status, owner, stuck, sends): (String, String, bool, i64) = sqlx::query_as(
        "SELECT status, lease_owner, lease_expires_at < now(), (SELECT count(*) FROM shop.notifications) FROM dedup_records",
    )
    .fetch_one(&world.db.pool)
    .await
    .unwrap();
    assert_eq!((status.as_str(), stuck, sends), ("processing", true, 0), "stuck, nothing re-sent");
    assert!(owner.contains(&format!(":{killed_pid}:")), "the stuck lease names the killed worker: {owner}");
    assert_eq!(world.broker.depth(&world.broker.settings.queue).await, 0, "the parked copy was acked");
    b.stop().await;
}

#[tokio::test]
async fn leased_reclaim_the_message_is_processed_once_after_the_lease_expires_never_before() {
    let world = World::new().await;
    let (_, expired_at) = kill_mid_sms(&world, "K3", "reclaim").await;
    let b = world
        .serve("b", &[("DEDUP_CONSUMER__LEASE_MS", "2000"), ("DEDUP_ORDERS__NOTIFY_ON_LEASE_EXPIRY", "reclaim")])
        .await;

    let status: String = world
        .wait_for(Duration::from_secs(30), "SELECT status FROM dedup_records", |s: &String| s == "succeeded")
        .await;
    assert_eq!(status, "succeeded", "log: {}", b.log_text());
    let (sends, sent_at, attempts, reentries): (i64, DateTime<Utc>, i32, i32) = sqlx::query_as(
        "SELECT (SELECT count(*) FROM shop.notifications), (SELECT max(sent_at) FROM shop.notifications), attempts, reentries
         FROM dedup_records",
    )
    .fetch_one(&world.db.pool)
    .await
    .unwrap();
    assert_eq!((sends, attempts, reentries), (1, 2, 1), "one SMS, on the second attempt, after one takeover");
    assert!(sent_at > expired_at, "sent after the lease expired ({sent_at} > {expired_at})");
    b.stop().await;
}
