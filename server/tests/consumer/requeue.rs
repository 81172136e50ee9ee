//! Issue 5's acceptance run on the real order domain: the SMS gateway down until 10 000
//! `ORDER.NOTIFY` records are dead, a server restart with the gateway back, a bulk requeue of
//! them through the REST API at a set rate run by the server's own background runner, then
//! `dedup-console verify`.

use std::time::{Duration, Instant};

use reqwest::Method;
use serde_json::{Value, json};

use crate::support::World;

/// One `ORDER.NOTIFY` per order (simulate.rs), so as many dead records.
const ORDERS: i64 = 10_000;
/// The bulk requeue's rate, messages per second: below what this 2-core machine sustains while
/// the server's consumer takes the copies (450–570 msg/s measured with other builds running).
const RATE: f64 = 300.0;

#[tokio::test]
async fn ten_thousand_dead_sms_requeued_at_the_set_rate_after_a_restart_then_verify_passes() {
    let started = Instant::now();
    let world = World::new().await;
    // The gateway rejects every send: a NOTIFY goes dead after 3 attempts (back-off 500 ms, 1 s).
    // A PAY that arrives before its CREATE (the simulation reorders) needs a second attempt;
    // with only 2, a PAY went dead about once in 10 000.
    let outage =
        world.serve("outage", &[("DEDUP_ORDERS__SMS_FAILURE_RATE", "1"), ("DEDUP_CONSUMER__MAX_ATTEMPTS", "3")]).await;
    let run = world.simulate(ORDERS as u64, 0.0, 0.2, 0.0).await;
    assert!(run.duplicates > 5_000, "about 20 % duplicates: {run:?}");
    eprintln!("{} copies published by {:.1} s", run.published, started.elapsed().as_secs_f64());
    let settled: i64 = world
        .wait_for(
            Duration::from_secs(240),
            "SELECT count(*) FROM dedup_records WHERE status IN ('succeeded', 'dead')",
            |n: &i64| *n == 3 * ORDERS,
        )
        .await;
    assert_eq!(settled, 3 * ORDERS, "every message settled");
    let (dead_notify, succeeded_other, records, sms): (i64, i64, i64, i64) = sqlx::query_as(
        "SELECT count(*) FILTER (WHERE status = 'dead' AND message_type = 'ORDER.NOTIFY'),
                count(*) FILTER (WHERE status = 'succeeded' AND message_type IN ('ORDER.CREATE', 'ORDER.PAY')),
                count(*), (SELECT count(*) FROM shop.notifications)
         FROM dedup_records",
    )
    .fetch_one(&world.db.pool)
    .await
    .unwrap();
    assert_eq!((dead_notify, succeeded_other, records, sms), (ORDERS, 2 * ORDERS, 3 * ORDERS, 0));
    outage.stop().await;
    eprintln!("{ORDERS} NOTIFY records dead by {:.1} s", started.elapsed().as_secs_f64());

    let server = world.serve("healthy", &[]).await;
    let token = world.operator_token().await;
    let filter = json!({"status": "dead", "type": "ORDER.NOTIFY"});
    let preview = server.call(&token, Method::POST, "/api/v1/requeue/preview", Some(filter.clone())).await;
    assert_eq!((preview["matched"].as_i64(), preview["would_requeue"].as_i64()), (Some(ORDERS), Some(ORDERS)));
    let start = json!({
        "filter": filter, "rate_per_sec": RATE, "expected_count": preview["would_requeue"],
        "reason": "SMS gateway back",
    });
    let job = server.call(&token, Method::POST, "/api/v1/requeue/jobs", Some(start)).await;
    let path = format!("/api/v1/requeue/jobs/{}", job["id"]);
    let deadline = Instant::now() + Duration::from_secs(120);
    let mut job = job;
    while job["state"] == "running" && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(200)).await;
        job = server.call(&token, Method::GET, &path, None).await;
    }
    let counts = ["done", "skipped", "failed"].map(|k| job[k].as_i64());
    assert_eq!((job["state"].as_str(), counts), (Some("completed"), [Some(ORDERS), Some(0), Some(0)]), "{job}");
    // Requeued per second between the job's start and finish (database clock); judged last.
    let measured = job["observed_rate"].as_f64().unwrap();
    eprintln!("requeued at {measured:.0} msg/s (set {RATE}) by {:.1} s", started.elapsed().as_secs_f64());

    let run_id = run.run_id.to_string();
    let output = world.command(&["verify", "--run", &run_id, "--wait-secs", "60", "--json"]).output().await.unwrap();
    let report: Value = serde_json::from_slice(&output.stdout).expect("verify prints JSON");
    assert!(output.status.success() && report["ok"] == true, "{report:#}");
    let orders = Some(ORDERS);
    let effects = ["orders_created", "orders_paid", "sms_sent", "double_sms"].map(|k| report[k].as_i64());
    assert_eq!(effects, [orders, orders, orders, Some(0)], "one SMS per order: {report:#}");
    let statuses = ["succeeded", "dead", "failed", "processing", "missing"].map(|k| report[k].as_i64());
    assert_eq!(statuses, [Some(3 * ORDERS), Some(0), Some(0), Some(0), Some(0)], "{report:#}");
    // Three failed attempts in the outage, then exactly one after the requeue.
    let requeued_once: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM dedup_records WHERE message_type = 'ORDER.NOTIFY' AND status = 'succeeded' AND attempts = 4",
    )
    .fetch_one(&world.db.pool)
    .await
    .unwrap();
    assert_eq!(requeued_once, ORDERS);
    server.stop().await;
    eprintln!("verified by {:.1} s", started.elapsed().as_secs_f64());
    // The rate is a ceiling the runner must hold; how closely it tracks the rate while the
    // consumer shares the 2 cores is a benchmark figure, so below it only a stall fails (243
    // msg/s was measured once at 300 while the Kafka tests ran beside it).
    assert!((RATE * 0.5..=RATE * 1.1).contains(&measured), "measured {measured:.0} msg/s, set {RATE}: {job}");
}
