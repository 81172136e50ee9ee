//! A reused id through `serve`, as a team whose producer sends the order number as every event's
//! message id meets it (issue 27 part 4): the PAY is a dead letter with its copy kept, the next
//! start warns, `dedup-console requeue-conflicts` counts and then requeues it under a new id,
//! and the order is paid once.

use std::time::Duration;

use serde_json::json;

use crate::support::World;

fn typed(message_type: &str) -> serde_json::Map<String, serde_json::Value> {
    serde_json::Map::from_iter([("x-type".to_owned(), json!(message_type))])
}

#[tokio::test]
async fn a_reused_id_warns_at_start_and_requeue_conflicts_pays_the_order_once() {
    let world = World::new().await;
    // The type from a header: the id ("order-R5") says nothing of the event.
    let env = [("DEDUP_CONSUMER__TYPES__FROM", r#"["header:x-type"]"#)];
    let a = world.serve("a", &env).await;
    assert!(a.log_text().contains("no console account yet"), "a start without accounts says how to add one");
    let create = json!({"orderNo": "R5", "sku": "SKU-0001", "quantity": 1, "amountCents": 100, "phone": "+1"});
    world.publish_with("order-R5", "order.create", &typed("ORDER.CREATE"), create).await;
    let pay = json!({"orderNo": "R5", "amountCents": 100, "expectedVersion": 1});
    world.publish_with("order-R5", "order.pay", &typed("ORDER.PAY"), pay).await;
    let open = "SELECT count(*) FROM record_conflicts WHERE settled_at IS NULL AND kind = 'type'";
    assert_eq!(world.wait_for(Duration::from_secs(30), open, |n: &i64| *n == 1).await, 1, "the PAY's copy kept");
    let metrics = reqwest::get(a.url("/metrics")).await.unwrap().text().await.unwrap();
    assert!(
        metrics.lines().any(|l| l.starts_with("dedup_reused_ids_total{group=\"order-service\"} 1")),
        "the metric counts it: {}",
        metrics.lines().filter(|l| l.contains("reused")).collect::<Vec<_>>().join("\n")
    );
    a.stop().await;

    let b = world.serve("b", &env).await;
    let started = std::time::Instant::now();
    while !b.log_text().contains("reused an existing record's message id") {
        assert!(started.elapsed() < Duration::from_secs(10), "the start warns: {}", b.log_text());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let cli = |args: &[&str]| {
        let mut cmd = world.command(args);
        cmd.env("USER", "olga").env("DEDUP_CONSUMER__TYPES__FROM", r#"["header:x-type"]"#);
        async move { cmd.output().await.expect("dedup-console runs") }
    };
    let count = cli(&["requeue-conflicts"]).await;
    let text = String::from_utf8_lossy(&count.stdout).into_owned();
    assert!(count.status.success() && text.contains("open reused-id copies: 1"), "{text}");
    assert!(text.contains("nothing requeued"), "without --yes nothing moves: {text}");
    let run = cli(&["requeue-conflicts", "--yes"]).await;
    let text = String::from_utf8_lossy(&run.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&run.stderr).into_owned();
    assert!(run.status.success() && text.contains("requeued: 1"), "{text}{stderr}");
    assert!(!stderr.contains("ERROR"), "a clean run logs no ERROR (a publisher channel left open did): {stderr}");

    let paid = "SELECT count(*) FROM shop.payments WHERE order_no = 'R5'";
    assert_eq!(world.wait_for(Duration::from_secs(30), paid, |n: &i64| *n == 1).await, 1, "the order paid");
    let (id, status): (String, String) =
        sqlx::query_as("SELECT message_id, status::text FROM dedup_records WHERE message_type = 'ORDER.PAY'")
            .fetch_one(&world.db.pool)
            .await
            .unwrap();
    assert!(id.starts_with("order-R5#conflict-") && status == "succeeded", "{id} {status}");
    let again = cli(&["requeue-conflicts", "--yes"]).await;
    assert!(String::from_utf8_lossy(&again.stdout).contains("requeued: 0"), "settled once");
    let audited: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM audit_log WHERE actor = 'cli:olga' AND action = 'conflict.requeue' AND outcome = 'ok'",
    )
    .fetch_one(&world.db.pool)
    .await
    .unwrap();
    assert_eq!(audited, 1);
    b.stop().await;
}
