//! The order example on MariaDB through the binary (issue 25): `DATABASE_URL=mysql://…`, two
//! `serve` processes consuming, one SIGKILLed mid-run and started again, `simulate` publishing
//! 10 000 orders with 20 % duplicates, and `verify`: no double effect, nothing lost. The console
//! is mounted on MariaDB: sign-in by session, the REST API's reads and a bulk requeue preview on
//! what the run left; cleanup schedules created, dry-run and run from the command line and read
//! through the API.

use std::time::{Duration, Instant};

use dedup_app::ssr::mount::{ConsoleAuth, ConsoleConfig, console_router};
use dedup_engine::testing::mysql::TestMySqlDatabase;
use sqlx::MySqlPool;

use crate::support::World;

/// `mysql://…/<database>` on the test server.
fn url_of(database: &str) -> String {
    let server = dedup_engine::testing::mysql::admin_url();
    format!("{}/{database}", server.rsplit_once('/').unwrap().0)
}

/// A world whose servers run on MariaDB: the engine's tables in `engine_db` (a fresh database),
/// the order example's in `shop`, a database the servers create.
async fn mysql_world(engine_db: &TestMySqlDatabase, shop: &str) -> World {
    let mut world = World::new().await;
    world.env.insert("DATABASE_URL".to_owned(), url_of(shop));
    world.env.insert("DEDUP_SCHEMA".to_owned(), engine_db.name.clone());
    world
}

/// Succeeded records in the engine's database.
async fn succeeded(pool: &MySqlPool, engine_db: &str) -> i64 {
    sqlx::query_scalar(&format!(
        "SELECT CAST(COUNT(*) AS SIGNED) FROM {engine_db}.dedup_records WHERE status = 'succeeded'"
    ))
    .fetch_one(pool)
    .await
    .unwrap_or(0)
}

#[tokio::test]
async fn ten_thousand_orders_on_mariadb_through_two_processes_one_killed_happen_exactly_once() {
    let db = TestMySqlDatabase::create().await;
    let (engine_db, shop) = (db.name.clone(), format!("{}_shop", db.name));
    let world = mysql_world(&db, &shop).await;
    let a = world.serve("a", &[]).await;
    let b = world.serve("b", &[]).await;

    let (status, ready) = a.readyz_until(Duration::from_secs(30), |status, _| status == 200).await;
    assert_eq!(status, 200, "{ready}");
    assert_eq!(ready["database"]["name"], "MySQL", "{ready}");

    // The whole run published by the command line, a killed while it is consumed.
    let simulate = world
        .command(&[
            "simulate",
            "--orders",
            "10000",
            "--rate",
            "0",
            "--duplicate-rate",
            "0.2",
            "--poison-rate",
            "0.01",
            "--seed",
            "25",
            "--json",
        ])
        .output();
    let killer = async {
        let started = Instant::now();
        while succeeded(&db.pool, &engine_db).await < 4_000 {
            assert!(started.elapsed() < Duration::from_secs(240), "consumption did not reach 4 000 records");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        a.kill().await;
        world.serve("a2", &[]).await
    };
    let (simulated, a2) = tokio::join!(simulate, killer);
    let simulated = simulated.unwrap();
    assert!(simulated.status.success(), "simulate: {}", String::from_utf8_lossy(&simulated.stderr));
    let run: serde_json::Value = serde_json::from_slice(&simulated.stdout).unwrap();
    assert!(run["duplicates"].as_i64().unwrap() > 5_000, "about 20 % duplicates: {run}");

    let verified = world
        .command(&["verify", "--run", &run["run_id"].to_string(), "--wait-secs", "240", "--json"])
        .output()
        .await
        .unwrap();
    let report: serde_json::Value = serde_json::from_slice(&verified.stdout)
        .unwrap_or_else(|e| panic!("verify printed no report ({e}): {}", String::from_utf8_lossy(&verified.stderr)));
    eprintln!("verify on MariaDB: {report}");
    for double in ["double_reservations", "double_payments", "double_sms"] {
        assert_eq!(report[double], 0, "{double}: {report}");
    }
    assert_eq!(
        (report["orders_created"].as_i64(), report["orders_paid"].as_i64()),
        (Some(10_000), Some(10_000)),
        "{report}"
    );
    assert_eq!(report["missing"].as_i64().unwrap() + report["failed"].as_i64().unwrap(), 0, "nothing lost: {report}");
    // An SMS whose call the SIGKILL cut is held for an operator (sent or not), never sent twice.
    let (sent, parked) = (report["sms_sent"].as_i64().unwrap(), report["parked"].as_i64().unwrap());
    assert!(sent <= 10_000 && sent + parked >= 10_000, "{report}");
    assert_eq!(report["poison_dead"], run["poison"], "{report}");
    let dead: i64 = sqlx::query_scalar(&format!(
        "SELECT CAST(COUNT(*) AS SIGNED) FROM {engine_db}.dedup_records WHERE status = 'dead'"
    ))
    .fetch_one(&db.pool)
    .await
    .unwrap();
    console_on_mariadb(&world, &a2, dead, run["poison"].as_i64().unwrap()).await;

    a2.stop().await;
    b.stop().await;
    sqlx::query(&format!("DROP DATABASE IF EXISTS {shop}")).execute(&db.pool).await.unwrap();
}

/// The console of `server` on MariaDB after the run, which left `dead` dead records of
/// `poison` poison messages among others: an operator signs in (the session kept by MySQL's session store) and
/// calls the REST API with a token.
async fn console_on_mariadb(world: &World, server: &crate::support::Server, dead: i64, poison: i64) {
    use reqwest::Method;
    let token = world.operator_token().await;
    let client =
        reqwest::Client::builder().cookie_store(true).redirect(reqwest::redirect::Policy::none()).build().unwrap();
    let signed_in = client
        .post(server.url("/login"))
        .form(&[("username", "operator"), ("password", "operator password")])
        .send()
        .await
        .unwrap();
    assert_eq!(signed_in.status(), 204, "sign-in on MariaDB");
    let page = client.get(server.url("/records?status=dead")).send().await.unwrap();
    assert_eq!(page.status(), 200, "a page in the session, not a redirect to the sign-in page");

    let overview = server.call(&token, Method::GET, "/api/v1/aggregates", None).await;
    let counted: i64 =
        overview["groups"].as_array().unwrap().iter().map(|g| g["counts"]["dead"].as_i64().unwrap()).sum();
    assert_eq!(counted, dead, "{overview}");
    let letters = server.call(&token, Method::GET, "/api/v1/dead-letters", None).await;
    let lettered: i64 = letters.as_array().unwrap().iter().map(|g| g["records"].as_i64().unwrap()).sum();
    assert_eq!(lettered, dead, "{letters}");
    let page = server.call(&token, Method::GET, "/api/v1/records?status=dead&type=POISON", None).await;
    let rows = page["rows"].as_array().unwrap();
    assert!(!rows.is_empty() && rows.iter().all(|r| r["status"] == "dead" && r["message_type"] == "POISON"), "{page}");
    let id = rows[0]["id"].as_i64().unwrap();
    let record = server.call(&token, Method::GET, &format!("/api/v1/records/{id}"), None).await;
    assert_eq!(record["record"]["status"], "dead", "{record}");
    let preview =
        server.call(&token, Method::POST, "/api/v1/requeue/preview", Some(serde_json::json!({"status": "dead"}))).await;
    assert_eq!(preview["matched"].as_i64(), Some(dead), "{preview}");
    let skipped = preview["skipped"].as_array().unwrap();
    // Every poison message's record is skipped as poison.
    let poisoned = skipped.iter().find(|s| s["reason"] == "poison message").map(|s| s["count"].as_i64().unwrap());
    assert!(poisoned.is_some_and(|n| n >= poison), "{preview}");
    // The operator commands run on MariaDB too: the bulk preview, and a poison record's requeue
    // refused.
    let preview = world.command(&["requeue-bulk", "--status", "dead"]).output().await.unwrap();
    let printed = String::from_utf8_lossy(&preview.stdout);
    assert!(printed.contains(&format!("matched now: {dead}; would be requeued: 0")), "{printed}");
    let requeue = world.command(&["requeue", &id.to_string()]).output().await.unwrap();
    let refused = String::from_utf8_lossy(&requeue.stderr);
    assert!(!requeue.status.success() && refused.contains("poison"), "{refused}");
    // Cleanup schedules run on MariaDB: created, dry-run and run from the command line (the
    // run's records are a day old at most: nothing is deleted), read through the API.
    let cli = |args: &'static [&'static str]| {
        let mut command = world.command(args);
        async move {
            let out = command.output().await.unwrap();
            assert!(out.status.success(), "{args:?}: {}", String::from_utf8_lossy(&out.stderr));
            String::from_utf8_lossy(&out.stdout).into_owned()
        }
    };
    assert_eq!(server.call(&token, Method::GET, "/api/v1/cleanup", None).await["schedules"], serde_json::json!([]));
    let created = cli(&["cleanup", "create", "--name", "nightly", "--retention-days", "1"]).await;
    assert!(created.starts_with("schedule 1 created"), "{created}");
    assert!(cli(&["cleanup", "list"]).await.contains("nightly"));
    assert_eq!(cli(&["cleanup", "run", "1", "--dry-run"]).await.trim(), "0 records would be deleted");
    let ran = cli(&["cleanup", "run", "1"]).await;
    // A batch that finds nothing ends the run and is not counted.
    assert!(ran.contains(": 0 records deleted in 0 batches"), "{ran}");
    let view = server.call(&token, Method::GET, "/api/v1/cleanup", None).await;
    assert_eq!(view["schedules"][0]["settings"]["name"], "nightly", "{view}");
    assert_eq!(
        (view["runs"][0]["rows_deleted"].as_i64(), view["runs"][0]["batches"].as_i64()),
        (Some(0), Some(0)),
        "{view}"
    );
}

#[tokio::test]
async fn serve_demo_on_mariadb_publishes_orders_whose_records_the_console_lists() {
    let db = TestMySqlDatabase::create().await;
    let (engine_db, shop) = (db.name.clone(), format!("{}_shop", db.name));
    let world = mysql_world(&db, &shop).await;
    // `serve --demo` on MySQL: the order example's tables in the shop, its traffic published
    // to the world's exchange and consumed by the server itself.
    let server = world.serve_demo("demo").await;
    let token = world.operator_token().await;
    let started = Instant::now();
    let rows = loop {
        let page = server.call(&token, reqwest::Method::GET, "/api/v1/records", None).await;
        let rows = page["rows"].as_array().cloned().unwrap_or_default();
        if !rows.is_empty() {
            break rows;
        }
        assert!(
            started.elapsed() < Duration::from_secs(90),
            "the console lists no record of the demo's traffic; log: {}",
            server.log_text()
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    assert!(rows.iter().all(|r| r["message_type"].as_str().is_some_and(|t| !t.is_empty())), "{rows:?}");
    // The records are the engine's, in its database; the demo's runs are recorded in the shop.
    let records: i64 = sqlx::query_scalar(&format!("SELECT CAST(COUNT(*) AS SIGNED) FROM {engine_db}.dedup_records"))
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert!(records > 0, "records in the engine's database");
    let runs: i64 = sqlx::query_scalar(&format!("SELECT CAST(COUNT(*) AS SIGNED) FROM {shop}.simulation_runs"))
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert!(runs > 0, "the demo's bursts are runs of the shop");
    let (status, _, log) = server.terminate().await;
    assert!(status.success(), "clean exit after SIGTERM; log: {log}");
    sqlx::query(&format!("DROP DATABASE IF EXISTS {shop}")).execute(&db.pool).await.unwrap();
}

#[tokio::test]
async fn on_mysql_the_demo_starts_and_seed_accounts_and_the_console_work() {
    let db = TestMySqlDatabase::create().await;
    let shop = format!("{}_shop", db.name);
    let world = mysql_world(&db, &shop).await;
    // The demo runs on MySQL as on PostgreSQL (it was refused here): it starts, consumes, and
    // records its first burst of traffic as a run in the shop (the records the console then
    // lists: the test above).
    let demo = world.serve_demo("demo").await;
    let runs = format!("SELECT CAST(COUNT(*) AS SIGNED) FROM {shop}.simulation_runs");
    let started = Instant::now();
    while sqlx::query_scalar::<_, i64>(&runs).fetch_one(&db.pool).await.unwrap_or(0) == 0 {
        assert!(started.elapsed() < Duration::from_secs(30), "no demo run; log: {}", demo.log_text());
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let (status, _, log) = demo.terminate().await;
    assert!(status.success(), "clean exit after SIGTERM; log: {log}");
    // `seed` runs on MySQL: synthetic records in the engine's database.
    let out = world.command(&["seed", "--records", "3000", "--days", "2"]).output().await.unwrap();
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success() && stdout.contains("seeded 3000 records first seen from"), "{stdout}{stderr}");
    // Accounts run on MySQL: the first admin, a token, the list, the audit log.
    let run = |args: &'static [&'static str]| {
        let mut command = world.command(args);
        command.env("DEDUP_USER_PASSWORD", "a long enough password");
        async move {
            let out = command.output().await.unwrap();
            let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
            assert!(out.status.success(), "{args:?}: {stderr}");
            stdout.into_owned()
        }
    };
    assert!(run(&["user", "add", "Admin", "--role", "admin"]).await.contains("added user Admin (admin)"));
    let token = run(&["user", "token", "admin", "--label", "ci"]).await;
    assert!(token.trim().starts_with("dct_"), "{token}");
    let out = world.command(&["user", "add", "ADMIN"]).env("DEDUP_USER_PASSWORD", "another password!").output().await;
    let stderr = String::from_utf8_lossy(&out.as_ref().unwrap().stderr);
    assert!(stderr.contains("a user named \"ADMIN\" exists already"), "{stderr}");
    let listed = run(&["user", "list"]).await;
    assert!(listed.contains("Admin") && listed.contains("admin") && listed.contains("enabled"), "{listed}");
    assert!(run(&["user", "tokens", "ADMIN"]).await.contains("ci"));
    let actions: Vec<String> =
        sqlx::query_scalar("SELECT CAST(action AS CHAR) FROM audit_log ORDER BY id").fetch_all(&db.pool).await.unwrap();
    assert_eq!(actions, ["user.add", "token.create"], "the refused add is not an entry, as on PostgreSQL");

    // The engine's database as the team's: the two migration histories would collide.
    let out = world.command(&["migrate"]).env("DATABASE_URL", url_of(&db.name)).output().await.unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && stderr.contains("need a database of their own"), "{stderr}");
    // A URL database the example cannot use is refused before the engine's database is made.
    let engine_database = format!("{}_unused", db.name);
    let not_a_shop = format!("Shop_{}", db.name); // upper case: no name for the example's tables
    let out = world
        .command(&["migrate"])
        .env("DATABASE_URL", url_of(&not_a_shop))
        .env("DEDUP_SCHEMA", &engine_database)
        .output()
        .await
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && stderr.contains("cannot hold the order example's tables"), "{stderr}");
    let made: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM information_schema.SCHEMATA WHERE SCHEMA_NAME = ?")
        .bind(&engine_database)
        .fetch_one(&db.pool)
        .await
        .unwrap();
    sqlx::query(&format!("DROP DATABASE IF EXISTS {not_a_shop}")).execute(&db.pool).await.unwrap();
    assert_eq!(made, 0, "the engine's database was not made");

    // A host mounts the console on an engine on MySQL.
    let pool = dedup_engine::mysql::connect(&url_of(&shop), &Default::default()).await.unwrap();
    let engine = dedup_engine::Engine::builder(pool.clone())
        .schema(dedup_engine::Schema::parse(db.name.clone()).unwrap())
        .consume(false)
        .start()
        .await
        .unwrap();
    let probes = dedup_engine::HealthProbes::new(
        engine.handle().pool().clone(),
        &url_of(&shop),
        &dedup_engine::testing::redis_url(),
        Duration::from_secs(2),
    );
    let config = ConsoleConfig::new("target/site", "/ops/dedup", ConsoleAuth::Off);
    let mounted = console_router(engine.handle().clone(), probes, config).await;
    assert!(mounted.is_ok(), "the console mounts on MySQL: {:?}", mounted.err());
    engine.stop().await;
    sqlx::query(&format!("DROP DATABASE IF EXISTS {shop}")).execute(&db.pool).await.unwrap();
}
