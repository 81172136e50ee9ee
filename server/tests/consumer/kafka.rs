//! `serve` consuming from Kafka: two processes in one consumer group, one killed with SIGKILL
//! mid-run and started again (two rebalances), against the local test broker.

use std::time::{Duration, Instant};

use dedup_engine::source::{Outbound, SourceFactory};
use dedup_example_orders::verify::{check_kafka_lag, verify};

use crate::support::World;

async fn succeeded(world: &World) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM dedup_records WHERE status = 'succeeded'")
        .fetch_one(&world.db.pool)
        .await
        .unwrap()
}

/// Waits until at least `n` records have succeeded.
async fn until_succeeded(world: &World, n: i64) {
    let started = Instant::now();
    while succeeded(world).await < n {
        assert!(started.elapsed() < Duration::from_secs(180), "{n} records succeeded");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test]
async fn ten_thousand_orders_through_a_kafka_group_with_a_member_killed_and_restarted_happen_exactly_once() {
    let world = World::with_kafka(4).await;
    let a = world.serve("a", &[]).await;
    let b = world.serve("b", &[]).await;
    let (pid_a, pid_b) = (a.pid(), b.pid());

    let simulation = world.simulate(10_000, 0.0, 0.2, 0.01);
    let chaos = async {
        until_succeeded(&world, 3000).await;
        a.kill().await;
        // b takes a's partitions once the session times out (first rebalance) ...
        let after_kill = succeeded(&world).await;
        until_succeeded(&world, after_kill + 3000).await;
        // ... and gives some back when a new process joins (second rebalance).
        world.serve("a2", &[]).await
    };
    let (run, a2) = tokio::join!(simulation, chaos);
    assert!(run.duplicates > 5_000, "about 20 % duplicates: {run:?}");

    let mut report =
        verify(&world.db.pool, &world.db.schema, Some(run.run_id), Duration::from_secs(300)).await.unwrap();
    let connector = world.kafka.as_ref().unwrap().connector();
    check_kafka_lag(&mut report, &connector, Duration::from_secs(60)).await.unwrap();
    assert!(report.ok, "{report:#?}");
    // Diagnostics when records are left `failed`: which ones, and their attempts.
    if report.failed > 0 {
        let rows: Vec<String> = sqlx::query_scalar(
            "SELECT row_to_json(x)::text FROM (
                 SELECT r.message_id, r.attempts, r.last_error, r.duplicate_count, r.next_attempt_at, r.updated_at,
                        (SELECT json_agg(json_build_object('attempt', a.attempt, 'worker', a.worker, 'outcome', a.outcome))
                           FROM record_attempts a WHERE a.record_id = r.id) AS attempts_made
                 FROM dedup_records r WHERE r.status = 'failed' ORDER BY r.updated_at LIMIT 15) x",
        )
        .fetch_all(&world.db.pool)
        .await
        .unwrap();
        for row in rows {
            eprintln!("failed record: {row}");
        }
    }
    assert_eq!((report.missing, report.failed), (0, 0), "{report:#?}");
    assert_eq!((report.orders_created, report.orders_paid), (10_000, 10_000), "{report:#?}");
    // A NOTIFY whose worker was killed mid-send stays stuck for an operator (hold), never sent
    // twice (`double_sms`, in `ok`); the kill may have come before or after the gateway took
    // the SMS. How many are stuck depends on what the killed process's workers held at that
    // instant (up to its concurrency × batch size), so what is checked is that only those are
    // left, and that every other order's SMS went out.
    let (not_from_the_kill, stuck_unsent): (i64, i64) = sqlx::query_as(
        "SELECT count(*) FILTER (WHERE NOT (message_type = 'ORDER.NOTIFY' AND lease_owner LIKE '%:' || $1 || ':%')),
                count(*) FILTER (WHERE NOT EXISTS (SELECT 1 FROM shop.notifications n WHERE n.message_id = r.message_id))
         FROM dedup_records r WHERE status = 'processing'",
    )
    .bind(pid_a.to_string())
    .fetch_one(&world.db.pool)
    .await
    .unwrap();
    assert_eq!(not_from_the_kill, 0, "records stuck other than the killed process's SMS sends: {report:#?}");
    assert_eq!(report.sms_sent + stuck_unsent, 10_000, "{report:#?}");
    assert_eq!(report.poison_dead, i64::try_from(run.poison).unwrap());

    let claims: Vec<i64> = sqlx::query_scalar(
        "SELECT count(*) FILTER (WHERE worker LIKE '%:' || p || ':%') FROM record_attempts, unnest($1::text[]) p GROUP BY p ORDER BY p",
    )
    .bind([pid_a.to_string(), pid_b.to_string(), a2.pid().to_string()])
    .fetch_all(&world.db.pool)
    .await
    .unwrap();
    assert!(
        claims.iter().all(|n| *n > 0),
        "the killed, the surviving and the restarted process all consumed: {claims:?}"
    );
    // The overview's consumer panel speaks of Kafka: connected, the group's lag as its depth.
    let token = world.operator_token().await;
    let fetch_aggregates = || async {
        let response = reqwest::Client::new().get(b.url("/api/v1/aggregates")).bearer_auth(&token).send().await;
        response.unwrap().json::<serde_json::Value>().await.unwrap()
    };
    let aggregates = fetch_aggregates().await;
    let consumer = &aggregates["consumers"][0];
    assert_eq!(
        (consumer["broker"].as_str(), consumer["connected"].as_bool()),
        (Some("kafka"), Some(true)),
        "{aggregates}"
    );
    assert_eq!(consumer["queue_depth"], 0, "verify saw the lag reach 0: {consumer}");
    // Every instance on the overview: the killed one gone, the running ones owning each of the
    // topic's 4 partitions once.
    let topic = world.kafka.as_ref().unwrap().topic().to_owned();
    let owners = || async {
        let agg = fetch_aggregates().await;
        let list = agg["instances"].as_array().cloned().unwrap_or_default();
        let pid_of = |i: &serde_json::Value| i["name"].as_str().and_then(|n| n.rsplit(':').next()?.parse::<u32>().ok());
        let mut owned: Vec<(u32, String)> = list
            .iter()
            .filter(|i| i["gone"] == false)
            .flat_map(|i| {
                let pid = pid_of(i).unwrap_or_default();
                let parts = i["consumers"][0]["owned"].as_array().cloned().unwrap_or_default();
                parts.into_iter().filter_map(move |p| Some((pid, p.as_str()?.to_owned())))
            })
            .filter(|(_, p)| p.starts_with(&format!("{topic}[")))
            .collect();
        owned.sort_by(|x, y| x.1.cmp(&y.1));
        let a_gone = list.iter().any(|i| pid_of(i) == Some(pid_a) && i["gone"] == true);
        (a_gone, owned, list)
    };
    let started = Instant::now();
    loop {
        let (a_gone, owned, list) = owners().await;
        let partitions: Vec<&str> = owned.iter().map(|(_, p)| p.as_str()).collect();
        let pids: std::collections::BTreeSet<u32> = owned.iter().map(|(pid, _)| *pid).collect();
        let expected: Vec<String> = (0..4).map(|n| format!("{topic}[{n}]")).collect();
        if a_gone && partitions == expected && pids.is_subset(&[pid_b, a2.pid()].into()) {
            break;
        }
        assert!(started.elapsed() < Duration::from_secs(45), "b and a2 own the 4 partitions once, a gone: {list:#?}");
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    b.stop().await;
    a2.stop().await;

    // The lag-only check an operator runs, for any producer: 0 now; 1 once a record arrives
    // that no member consumes.
    let lag_only =
        |wait: &'static str| world.command(&["verify", "--source", "kafka", "--lag-only", "--wait-secs", wait]);
    let done = lag_only("30").output().await.unwrap();
    let text = String::from_utf8_lossy(&done.stdout).into_owned();
    assert!(done.status.success() && text.contains("lag 0"), "{text}{}", String::from_utf8_lossy(&done.stderr));
    let kafka = world.kafka.as_ref().unwrap();
    let publisher = kafka.connector().open_publisher().await.unwrap();
    let headers = serde_json::Map::new();
    publisher
        .publish(Outbound {
            destination: kafka.topic(),
            routing_key: "",
            key: Some("late"),
            message_id: Some("ORDER.CREATE.LATE:1"),
            payload: b"{}",
            headers: &headers,
            content_type: Some("application/json"),
            type_property: None,
        })
        .await
        .unwrap();
    let waiting = lag_only("1").output().await.unwrap();
    let text = String::from_utf8_lossy(&waiting.stdout).into_owned();
    assert!(!waiting.status.success() && text.contains("lag 1"), "{text}");
}
