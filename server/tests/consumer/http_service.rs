//! The example in another language (examples/http-service/): the Python charge service behind
//! `serve` with the example's own configuration (our-service.toml, only the service's URL
//! changed), as its README walks through it — signed calls, duplicates published, the service
//! answering 500 for a while, then killed and started again, messages published by
//! `dedup-console publish` too. Each key's charge row is in the service's SQLite exactly once, and
//! every record succeeded. And the walk-through run again on a new database beside the same Redis.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::json;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

use crate::support::{ConfigFile, World};

const EXAMPLE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../examples/http-service");
/// The Standard Webhooks specification's example secret: the gateway signs, the service checks.
const SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";

/// `python3 charge_service.py` on a SQLite file of the test; its output lines are kept.
struct ChargeService {
    child: Child,
    port: u16,
    lines: Arc<Mutex<Vec<String>>>,
}

impl ChargeService {
    /// Starts the service on `port` (0: a free one) and waits for its start-up line.
    async fn start(db: &Path, port: u16) -> Self {
        let mut child = Command::new("python3")
            .arg(format!("{EXAMPLE}/charge_service.py"))
            .args(["--port", &port.to_string(), "--db", db.to_str().unwrap()])
            .env("CHARGE_WEBHOOK_SECRET", SECRET)
            .stdout(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("python3 starts");
        let mut stdout = BufReader::new(child.stdout.take().unwrap()).lines();
        let first = tokio::time::timeout(Duration::from_secs(20), stdout.next_line())
            .await
            .expect("the service starts within 20 s")
            .unwrap()
            .expect("a start-up line");
        let address = first.split("http://127.0.0.1:").nth(1).expect("the service prints its address");
        let port = address.split(' ').next().unwrap().parse().expect("a port");
        let lines = Arc::new(Mutex::new(vec![first]));
        let kept = lines.clone();
        tokio::spawn(async move {
            while let Ok(Some(line)) = stdout.next_line().await {
                kept.lock().unwrap().push(line);
            }
        });
        Self { child, port, lines }
    }

    fn url(&self, path: &str) -> String {
        format!("http://127.0.0.1:{}{path}", self.port)
    }

    /// `POST /admin/mode`: `ok`, `fail`, `error` or `hang`.
    async fn set_mode(&self, mode: &str) {
        let response = reqwest::Client::new().post(self.url("/admin/mode")).json(&json!({"mode": mode})).send().await;
        assert_eq!(response.expect("the service answers").status(), 200);
    }

    fn log(&self) -> String {
        self.lines.lock().unwrap().join("\n")
    }
}

/// Each idempotency key's charge rows in the service's SQLite, read by Python's sqlite3.
async fn charges_per_key(db: &Path) -> Vec<(String, i64)> {
    let script = "import json, sqlite3, sys\n\
                  db = sqlite3.connect(sys.argv[1])\n\
                  rows = db.execute('SELECT idempotency_key, count(*) FROM charges GROUP BY 1 ORDER BY 1')\n\
                  print(json.dumps(rows.fetchall()))";
    let out = Command::new("python3").args(["-c", script, db.to_str().unwrap()]).output().await.unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap()
}

/// The charge of key `i`: its message id (`ch_0007`), its body, and how many copies a producer
/// sends (every third twice, as one retrying after a lost confirm).
fn charge(i: usize) -> (String, serde_json::Value, usize) {
    (
        format!("ch_{i:04}"),
        json!({"orderNo": format!("A-{i}"), "amountCents": 100 + i}),
        if i.is_multiple_of(3) { 2 } else { 1 },
    )
}

/// Publishes the charges `keys` from the test.
async fn publish_charges(world: &World, keys: std::ops::Range<usize>) {
    for (id, body, copies) in keys.map(charge) {
        for _ in 0..copies {
            world.publish(&id, "payment.charge", body.clone()).await;
        }
    }
}

/// Publishes the charges `keys` with `dedup-console publish`, as the walk-through does.
async fn publish_charges_by_cli(world: &World, config: &ConfigFile, keys: std::ops::Range<usize>) {
    for (id, body, copies) in keys.map(charge) {
        let copies = copies.to_string();
        let args = ["publish", "--message-id", &id, "--routing-key", "payment.charge", "--copies", &copies];
        let out = world.command(&args).arg(body.to_string()).env("DEDUP_CONFIG", config.path()).output().await.unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "{stdout}{}", String::from_utf8_lossy(&out.stderr));
        assert!(stdout.contains(&format!("published {id} ({copies} cop")), "{stdout}");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!stderr.contains("ERROR"), "a publish that worked logs no error: {stderr}");
    }
}

/// The example's configuration, calling `service`.
fn shipped_config(world: &World, service: &ChargeService) -> ConfigFile {
    let shipped = std::fs::read_to_string(format!("{EXAMPLE}/our-service.toml")).unwrap();
    let url = "http://127.0.0.1:8080/charge";
    assert!(shipped.contains(url), "the example's configuration calls {url}");
    ConfigFile::new(world, &shipped.replace(url, &service.url("/charge")))
}

#[tokio::test]
async fn the_python_charge_service_books_each_key_once_behind_serve() {
    const KEYS: usize = 45;
    let world = World::new().await;
    let dir: PathBuf = std::env::temp_dir().join(format!("{}-charges", world.db.name));
    std::fs::create_dir_all(&dir).unwrap();
    let db = dir.join("charges.sqlite3");
    let mut service = ChargeService::start(&db, 0).await;
    let config = shipped_config(&world, &service);
    // The world's database, exchange, queue and back-off (500 ms to 2 s) override the file's;
    // attempts 10, not 4: no record may go dead before the service is well again, however slow
    // this machine.
    let env =
        [("DEDUP_CONFIG", config.path()), ("CHARGE_WEBHOOK_SECRET", SECRET), ("DEDUP_CONSUMER__MAX_ATTEMPTS", "10")];
    let server = world.serve("charges", &env).await;
    let succeeded = "SELECT count(*) FROM dedup_records WHERE status = 'succeeded'";
    let retried_after = |error: &str| {
        format!("SELECT count(*) FROM dedup_records WHERE status = 'failed' AND error_class LIKE '{error}%'")
    };

    // A third of them while the service answers 500: retried, then charged once it is well.
    service.set_mode("error").await;
    publish_charges(&world, 0..KEYS / 3).await;
    let unavailable = retried_after("HTTP_UNAVAILABLE");
    assert!(world.wait_for(Duration::from_secs(30), &unavailable, |v: &i64| *v >= 3).await >= 3, "{}", service.log());
    service.set_mode("ok").await;
    publish_charges(&world, KEYS / 3..2 * KEYS / 3).await;

    // The service killed: the calls fail to connect and are retried; started again, they land.
    let third = (2 * KEYS / 3) as i64;
    assert_eq!(world.wait_for(Duration::from_secs(30), succeeded, |v: &i64| *v == third).await, third);
    service.child.kill().await.unwrap();
    publish_charges_by_cli(&world, &config, 2 * KEYS / 3..KEYS).await;
    let connect = retried_after("HTTP_CONNECT");
    assert!(world.wait_for(Duration::from_secs(30), &connect, |v: &i64| *v >= 3).await >= 3);
    let killed_log = service.log();
    service = ChargeService::start(&db, service.port).await;

    let n = KEYS as i64;
    let done = world.wait_for(Duration::from_secs(60), succeeded, |v: &i64| *v == n).await;
    assert_eq!(
        done,
        n,
        "every record succeeded; service: {killed_log}\n{}\nserve: {}",
        service.log(),
        server.log_text()
    );
    let charges = charges_per_key(&db).await;
    let expected: Vec<(String, i64)> = (0..KEYS).map(|i| (format!("ch_{i:04}"), 1)).collect();
    assert_eq!(charges, expected, "each key charged exactly once");
    let duplicates = "SELECT COALESCE(sum(duplicate_count), 0)::bigint FROM dedup_records";
    let twice = KEYS.div_ceil(3) as i64;
    assert_eq!(world.wait_for(Duration::from_secs(30), duplicates, |v: &i64| *v == twice).await, twice, "absorbed");
    let retried: i64 = sqlx::query_scalar("SELECT count(*) FROM dedup_records WHERE attempts > 1")
        .fetch_one(&world.db.pool)
        .await
        .unwrap();
    assert!(retried >= 6, "the 500s and the refused connections were retried: {retried}");
    let refused = format!("{killed_log}\n{}", service.log());
    assert!(!refused.contains("-> 401") && !refused.contains("-> 400"), "signed and keyed as it expects: {refused}");
    // A group the configuration does not have: refused with the groups it has, nothing sent.
    let out = world
        .command(&["publish", "--group", "refunds", "--message-id", "ch_lost", "{}"])
        .env("DEDUP_CONFIG", config.path())
        .output()
        .await
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && stderr.contains("(groups: charge-gateway)"), "{stderr}");
    server.stop().await;
    drop(service);
    let _ = std::fs::remove_dir_all(&dir);
}

/// The walk-through run a second time on a database created anew, beside the same Redis: the
/// first database's fast-path markers are not this one's, so its messages are processed, not
/// acked unseen as duplicates (all but the first were, before markers were scoped by database).
#[tokio::test]
async fn a_second_database_on_the_same_redis_gets_its_messages() {
    let first = World::new().await;
    let mut second = World::new().await;
    let prefix = first.env["DEDUP_FAST_PATH__PREFIX"].clone();
    second.env.insert("DEDUP_FAST_PATH__PREFIX".to_owned(), prefix);
    let dir: PathBuf = std::env::temp_dir().join(format!("{}-charges", first.db.name));
    std::fs::create_dir_all(&dir).unwrap();
    let db = dir.join("charges.sqlite3");
    let service = ChargeService::start(&db, 0).await;
    let succeeded = "SELECT count(*) FROM dedup_records WHERE status = 'succeeded'";
    for world in [&first, &second] {
        let config = shipped_config(world, &service);
        let server = world.serve("again", &[("DEDUP_CONFIG", config.path()), ("CHARGE_WEBHOOK_SECRET", SECRET)]).await;
        publish_charges(world, 0..4).await;
        let done = world.wait_for(Duration::from_secs(30), succeeded, |v: &i64| *v == 4).await;
        assert_eq!(done, 4, "each database records its own; serve: {}", server.log_text());
        server.stop().await;
    }
    // The service was called again for the second database, and answered from its store.
    let replayed = service.log().matches("(replayed)").count();
    assert!(replayed >= 4, "{}", service.log());
    assert_eq!(charges_per_key(&db).await.len(), 4, "charged once each");
    drop(service);
    let _ = std::fs::remove_dir_all(&dir);
}
