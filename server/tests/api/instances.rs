//! Every instance on the overview (issue 27 part 6; DESIGN.md, "Instances"): two `serve`
//! processes on one database each list the other, with the queue they read; a stopped one
//! leaves the list, one that went silent shows as gone, one silent for an hour is forgotten.

use std::time::Duration;

use dedup_console::startup::Application;
use serde_json::Value;

use crate::helpers::{local_settings, spawn_app_with};

/// The overview's instances, as the API answers them.
async fn instances(app: &crate::helpers::TestApp) -> Vec<Value> {
    let agg: Value = app.get("/api/v1/aggregates").await.json().await.unwrap();
    agg["instances"].as_array().cloned().unwrap_or_default()
}

/// Polls `instances` until `check` holds (20 s at most: a heartbeat is written every 5 s).
async fn until(app: &crate::helpers::TestApp, what: &str, check: impl Fn(&[Value]) -> bool) -> Vec<Value> {
    let started = std::time::Instant::now();
    loop {
        let list = instances(app).await;
        if check(&list) {
            return list;
        }
        assert!(started.elapsed() < Duration::from_secs(20), "{what}: {list:#?}");
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

fn live_reading_the_queue(list: &[Value], queue: &str) -> usize {
    let owns = format!("queue {queue}");
    list.iter().filter(|i| i["gone"] == false && i["consumers"][0]["owned"] == serde_json::json!([owns])).count()
}

#[tokio::test]
async fn two_processes_on_one_database_each_show_both_and_a_stopped_one_leaves() {
    let tag = uuid::Uuid::new_v4().simple().to_string();
    let queue = format!("instances.{tag}");
    let (exchange, q) = (queue.clone(), queue.clone());
    let app = spawn_app_with(move |s| {
        s.consumer.rabbitmq.exchange = exchange;
        s.consumer.rabbitmq.queue = q;
    })
    .await;
    let mut second = local_settings();
    second.listen = "127.0.0.1:0".parse().unwrap();
    second.database_url = app._db.url.as_str().into();
    second.consumer.rabbitmq.exchange = queue.clone();
    second.consumer.rabbitmq.queue = queue.clone();
    let other = Application::build(second, false).await.expect("a second process builds");
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let running = tokio::spawn(other.run_until_stopped(async {
        let _ = stopped.await;
    }));

    let both = until(&app, "two live instances reading the queue", |l| live_reading_the_queue(l, &queue) == 2).await;
    assert_eq!(both[0]["consumers"][0]["group"], "order-service");
    assert_eq!(both[0]["consumers"][0]["broker"], "rabbitmq");
    assert!(both.iter().all(|i| i["consumers"][0]["workers"].as_u64() >= Some(1)), "{both:#?}");
    let serving: Vec<bool> = both.iter().map(|i| i["this_process"] == true).collect();
    assert_eq!(serving.iter().filter(|s| **s).count(), 1, "only the engine that answered is this one: {both:#?}");
    assert_ne!(both[0]["instance_id"], both[1]["instance_id"]);

    let _ = stop.send(());
    running.await.unwrap().unwrap();
    until(&app, "the stopped instance deleted its row", |l| l.len() == 1 && live_reading_the_queue(l, &queue) == 1)
        .await;

    // One killed a minute ago (no clean stop), and one silent for two days.
    sqlx::query(
        "INSERT INTO consumer_instances (instance_id, host, pid, started_at, last_seen_at, consumers) VALUES
             ('lost-host:7:00000000', 'lost-host', 7, now() - interval '1 hour', now() - interval '1 minute', '[]'),
             ('old-host:8:00000000', 'old-host', 8, now() - interval '3 days', now() - interval '2 days', '[]')",
    )
    .execute(&app._db.pool)
    .await
    .unwrap();
    let list = until(&app, "the old row forgotten at the next heartbeat", |l| l.len() == 2).await;
    assert_eq!((&list[0]["gone"], &list[1]["gone"]), (&false.into(), &true.into()), "live first: {list:#?}");
    let lost = list.iter().find(|i| i["name"] == "lost-host:7").expect("the killed one is listed");
    assert_eq!(lost["gone"], true);
    assert_eq!(lost["this_process"], false);

    let page = app.get("/").await.text().await.unwrap();
    assert!(page.contains("data-testid=\"instances\"") && page.contains("lost-host:7"), "the overview lists them");
}
