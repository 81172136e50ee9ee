//! Consumer groups and message types as a team configures them: the order example split into two
//! groups on two queues, and a Spring-style producer whose types are in `__TypeId__`, with a
//! type that has no handler until the configuration maps it.

use std::time::{Duration, Instant};

use dedup_example_orders::simulate::SimulatedGroup;
use dedup_example_orders::verify::verify;
use reqwest::Method;
use serde_json::{Value, json};

use crate::support::{ConfigFile, World};

#[tokio::test]
async fn the_order_example_split_into_two_groups_on_two_queues_passes_verify_and_shows_both() {
    let mut world = World::new().await;
    let orders_queue = world.broker.another_queue("orders");
    let notify_queue = world.broker.another_queue("notify");
    let config = ConfigFile::new(
        &world,
        &format!(
            r#"
[[groups]]
group = "order-service"
handlers = ["ORDER.CREATE", "ORDER.PAY"]
rabbitmq.queue = "{orders_queue}"
rabbitmq.binding_keys = ["order.create", "order.pay", "order.poison"]

[[groups]]
group = "notify-service"
handlers = ["ORDER.NOTIFY"]
lease_ms = 5000
rabbitmq.queue = "{notify_queue}"
rabbitmq.binding_keys = ["order.notify"]
"#
        ),
    );
    let server = world.serve_on("split", &[("DEDUP_CONFIG", config.path())], &[&orders_queue, &notify_queue]).await;
    let groups = vec![
        SimulatedGroup {
            name: "order-service".to_owned(),
            binding_keys: vec!["order.create".into(), "order.pay".into(), "order.poison".into()],
        },
        SimulatedGroup { name: "notify-service".to_owned(), binding_keys: vec!["order.notify".into()] },
    ];
    let run = world.simulate_to(groups, 500, 0.0, 0.2, 0.02).await;
    let report = verify(&world.db.pool, &world.db.schema, Some(run.run_id), Duration::from_secs(120)).await.unwrap();
    assert!(report.ok, "{report:#?}");
    assert_eq!((report.orders_created, report.orders_paid, report.sms_sent), (500, 500, 500), "{report:#?}");
    let by_group: Vec<(String, String, i64)> = sqlx::query_as(
        "SELECT consumer_group, message_type, count(*) FROM dedup_records
         WHERE message_type IN ('ORDER.CREATE', 'ORDER.PAY', 'ORDER.NOTIFY') GROUP BY 1, 2 ORDER BY 1, 2",
    )
    .fetch_all(&world.db.pool)
    .await
    .unwrap();
    let counts: Vec<(&str, &str, i64)> = by_group.iter().map(|(g, t, n)| (g.as_str(), t.as_str(), *n)).collect();
    assert_eq!(
        counts,
        [
            ("notify-service", "ORDER.NOTIFY", 500),
            ("order-service", "ORDER.CREATE", 500),
            ("order-service", "ORDER.PAY", 500)
        ],
        "each group holds the records of its own types"
    );

    let token = world.operator_token().await;
    let overview = server.call(&token, Method::GET, "/api/v1/aggregates", None).await;
    let consumers: Vec<(String, Value)> = overview["consumers"]
        .as_array()
        .expect("consumers")
        .iter()
        .map(|c| (c["group"].as_str().unwrap().to_owned(), c["types"].clone()))
        .collect();
    assert_eq!(
        consumers,
        [
            ("order-service".to_owned(), json!(["ORDER.CREATE", "ORDER.PAY"])),
            ("notify-service".to_owned(), json!(["ORDER.NOTIFY"]))
        ],
        "the overview shows both groups with their handlers"
    );
    let listed = server.call(&token, Method::GET, "/api/v1/groups", None).await;
    let names: Vec<&str> = listed.as_array().unwrap().iter().map(|g| g["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["notify-service", "order-service"], "the group filter offers both");
    server.stop().await;
}

const TYPED: &str = r#"
[consumer.types]
from = ["id_prefix", "header:__TypeId__"]
[consumer.types.map]
"com.example.order.OrderCreateEvent" = "ORDER.CREATE"
"com.example.order.OrderPayEvent" = "ORDER.PAY"
"#;

/// Publishes a Spring-style message: id `<order>:<EVENT>:<version>` in `message_id`, the class in
/// `__TypeId__`, a JSON body.
async fn publish_spring(world: &World, id: &str, class: &str, body: Value) {
    let mut headers = serde_json::Map::new();
    headers.insert("__TypeId__".to_owned(), Value::String(format!("com.example.order.{class}")));
    world.publish_with(id, "order.spring", &headers, body).await;
}

#[tokio::test]
async fn spring_style_messages_typed_by_header_run_once_and_unmapped_ones_run_once_after_a_requeue() {
    const ORDERS: usize = 40;
    let world = World::new().await;
    let config = ConfigFile::new(&world, TYPED);
    let server = world.serve("typed", &[("DEDUP_CONFIG", config.path())]).await;
    for i in 0..ORDERS {
        let order = format!("2025012810{i:05}");
        let create = json!({"orderNo": order, "sku": "SKU-0001", "quantity": 1, "amountCents": 990, "phone": "+86"});
        let pay = json!({"orderNo": order, "amountCents": 990, "expectedVersion": 1});
        let notify = json!({"orderNo": order, "kind": "PAID", "phone": "+86", "text": "paid"});
        // Every fifth message twice, as a producer retrying after a lost confirm.
        for _ in 0..(if i % 5 == 0 { 2 } else { 1 }) {
            publish_spring(&world, &format!("{order}:CREATE:1"), "OrderCreateEvent", create.clone()).await;
            publish_spring(&world, &format!("{order}:PAY:2"), "OrderPayEvent", pay.clone()).await;
            publish_spring(&world, &format!("{order}:NOTIFY:3"), "OrderNotifyEvent", notify.clone()).await;
        }
    }
    let n = ORDERS as i64;
    let paid = world
        .wait_for(Duration::from_secs(60), "SELECT count(*) FROM shop.orders WHERE status = 'PAID'", |v: &i64| *v == n)
        .await;
    assert_eq!(paid, n, "every order created and paid");
    let no_handler = "SELECT count(*) FROM dedup_records WHERE status = 'dead' AND NOT poison
                      AND error_class = 'NO_HANDLER: com.example.order.OrderNotifyEvent'";
    assert_eq!(world.wait_for(Duration::from_secs(30), no_handler, |v: &i64| *v == n).await, n);
    let (payments, reservations, sms): (i64, i64, i64) = sqlx::query_as(
        "SELECT (SELECT count(*) FROM shop.payments), (SELECT count(*) FROM shop.inventory_reservations),
                (SELECT count(*) FROM shop.notifications)",
    )
    .fetch_one(&world.db.pool)
    .await
    .unwrap();
    assert_eq!((payments, reservations, sms), (n, n, 0), "paid and reserved once each; no SMS without a handler");
    let reason: String =
        sqlx::query_scalar("SELECT last_error FROM dedup_records WHERE NOT poison AND status = 'dead' LIMIT 1")
            .fetch_one(&world.db.pool)
            .await
            .unwrap();
    assert!(reason.contains("com.example.order.OrderNotifyEvent"), "the raw type is in the reason: {reason}");
    server.stop().await;

    // The handler exists now: the configuration maps the type, and the dead letters are requeued.
    let mapped =
        ConfigFile::new(&world, &format!("{TYPED}\"com.example.order.OrderNotifyEvent\" = \"ORDER.NOTIFY\"\n"));
    let server = world.serve("mapped", &[("DEDUP_CONFIG", mapped.path())]).await;
    let token = world.operator_token().await;
    let filter = json!({"status": "dead", "error_class": "NO_HANDLER: com.example.order.OrderNotifyEvent"});
    let preview = server.call(&token, Method::POST, "/api/v1/requeue/preview", Some(filter.clone())).await;
    assert_eq!(preview["would_requeue"].as_i64(), Some(n), "{preview}");
    let start = json!({"filter": filter, "rate_per_sec": 200.0, "expected_count": n, "reason": "handler added"});
    let job = server.call(&token, Method::POST, "/api/v1/requeue/jobs", Some(start)).await;
    let path = format!("/api/v1/requeue/jobs/{}", job["id"]);
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut job = job;
    while job["state"] == "running" && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(200)).await;
        job = server.call(&token, Method::GET, &path, None).await;
    }
    assert_eq!((job["state"].as_str(), job["done"].as_i64()), (Some("completed"), Some(n)), "{job}");
    let notified = "SELECT count(*) FROM dedup_records WHERE message_type = 'ORDER.NOTIFY' AND status = 'succeeded'";
    assert_eq!(world.wait_for(Duration::from_secs(60), notified, |v: &i64| *v == n).await, n);
    let sms: (i64, i64) = sqlx::query_as("SELECT count(*), count(DISTINCT order_no) FROM shop.notifications")
        .fetch_one(&world.db.pool)
        .await
        .unwrap();
    assert_eq!(sms, (n, n), "each requeued message ran once");
    server.stop().await;
}
