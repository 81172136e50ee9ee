use std::time::Duration;

use dedup_example_orders::verify::verify;

use crate::support::World;

#[tokio::test]
async fn ten_thousand_orders_with_duplicates_through_two_processes_happen_exactly_once() {
    let world = World::new().await;
    let a = world.serve("a", &[]).await;
    let b = world.serve("b", &[]).await;
    let run = world.simulate(10_000, 0.0, 0.2, 0.01).await;
    assert!(run.duplicates > 5_000, "about 20 % duplicates: {run:?}");

    let report = verify(&world.db.pool, &world.db.schema, Some(run.run_id), Duration::from_secs(240)).await.unwrap();
    assert!(report.ok, "{report:#?}");
    assert_eq!(report.missing + report.failed + report.processing, 0, "{report:#?}");
    assert_eq!((report.orders_created, report.orders_paid, report.sms_sent), (10_000, 10_000, 10_000), "{report:#?}");
    assert_eq!(report.poison_dead, i64::try_from(run.poison).unwrap());

    let (claimed_by_a, claimed_by_b): (i64, i64) = sqlx::query_as(
        "SELECT count(*) FILTER (WHERE worker LIKE '%:' || $1 || ':%'), count(*) FILTER (WHERE worker LIKE '%:' || $2 || ':%')
         FROM record_attempts",
    )
    .bind(a.pid().to_string())
    .bind(b.pid().to_string())
    .fetch_one(&world.db.pool)
    .await
    .unwrap();
    assert!(claimed_by_a > 0 && claimed_by_b > 0, "both processes consumed: {claimed_by_a} / {claimed_by_b}");
    a.stop().await;
    b.stop().await;
}

#[tokio::test]
async fn redis_stopped_mid_run_changes_nothing_but_the_path_duplicates_take() {
    // A Redis of this test's own, so stopping it disturbs no other test.
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let mut redis = tokio::process::Command::new("redis-server")
        .args(["--port", &port.to_string(), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"])
        .stdout(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("redis-server runs");
    let mut world = World::new().await;
    world.redis_url = format!("redis://127.0.0.1:{port}");
    tokio::time::sleep(Duration::from_millis(300)).await;
    let server = world.serve("a", &[("DEDUP_FAST_PATH__TIMEOUT_MS", "50")]).await;

    let simulation = world.simulate(1500, 250.0, 0.3, 0.0);
    // Redis is stopped once it has caught a duplicate (aggregates are flushed every second), so
    // a slow start on a loaded machine cannot leave it nothing to catch; the run lasts ~6 s.
    let stopper = async {
        let started = std::time::Instant::now();
        while redis_duplicates(&world).await == 0 && started.elapsed() < Duration::from_secs(20) {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        redis.kill().await.unwrap();
    };
    let (run, ()) = tokio::join!(simulation, stopper);

    let report = verify(&world.db.pool, &world.db.schema, Some(run.run_id), Duration::from_secs(120)).await.unwrap();
    assert!(report.ok, "no duplicate effect: {report:#?}");
    assert_eq!(report.succeeded, i64::try_from(run.messages).unwrap(), "consumption went on: {report:#?}");
    // Aggregates are flushed every second.
    let started = std::time::Instant::now();
    let (fallbacks, redis_duplicates, db_duplicates) = loop {
        let counts: (i64, i64, i64) = sqlx::query_as(
            "SELECT COALESCE(sum(redis_fallbacks), 0)::bigint, COALESCE(sum(duplicates_redis), 0)::bigint,
                    COALESCE(sum(duplicates_db), 0)::bigint FROM stats_minute",
        )
        .fetch_one(&world.db.pool)
        .await
        .unwrap();
        if counts.0 > 0 && counts.2 > 0 || started.elapsed() > Duration::from_secs(10) {
            break counts;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert!(fallbacks > 0, "fallbacks counted");
    assert!(redis_duplicates > 0, "Redis caught duplicates before it stopped");
    assert!(db_duplicates > 0, "the database caught them after");
    server.stop().await;
}

/// Duplicates the Redis fast path caught so far, from the flushed aggregates.
async fn redis_duplicates(world: &World) -> i64 {
    sqlx::query_scalar("SELECT COALESCE(sum(duplicates_redis), 0)::bigint FROM stats_minute")
        .fetch_one(&world.db.pool)
        .await
        .unwrap()
}
