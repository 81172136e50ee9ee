//! Exactly once across PostgreSQL restarts (DESIGN.md, "Recovery"): 10 000 orders with 20 %
//! duplicates through two `serve` processes on a PostgreSQL server of the test's own, restarted
//! twice (a fast shutdown, then a crash) while one process's connections are killed in between.
//! Nothing is lost or doubled, the consumers resume by themselves, and `/readyz` and the metrics
//! show the failed batches and the recovery.

use std::path::PathBuf;
use std::process::Stdio;
use std::time::{Duration, Instant};

use dedup_engine::testing::TestDatabase;
use dedup_example_orders::verify::verify;
use sqlx::PgPool;
use tokio::process::Command;

use crate::support::World;

/// A PostgreSQL cluster of the test's own (`initdb` in a temporary directory, a free port),
/// which it may stop and restart without disturbing other tests; removed when dropped.
struct PrivatePostgres {
    dir: PathBuf,
    port: u16,
}

impl PrivatePostgres {
    async fn start() -> Self {
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let dir = std::env::temp_dir().join(format!("dct-pg-{}", uuid::Uuid::new_v4().simple()));
        std::fs::create_dir(&dir).unwrap();
        let cluster = Self { dir, port };
        // PostgreSQL refuses to run as root: the cluster belongs to the `postgres` user then.
        if running_as_root() {
            let chown = Command::new("chown").args(["postgres:postgres"]).arg(&cluster.dir).status().await.unwrap();
            assert!(chown.success(), "chown of {}", cluster.dir.display());
        }
        cluster.pg(&["initdb", "-D", &cluster.data(), "-A", "trust", "-U", "postgres", "--no-sync"]).await;
        // `fsync=off` loses nothing when only the server crashes (the kernel keeps what it was
        // given); `synchronous_commit` stays on: a commit acknowledged must survive the crash.
        let options = format!(
            "-p {port} -k {dir} -c listen_addresses=127.0.0.1 -c fsync=off -c max_connections=200",
            dir = cluster.dir.display()
        );
        cluster.pg(&["pg_ctl", "-D", &cluster.data(), "-l", &cluster.log(), "-o", &options, "-w", "start"]).await;
        cluster
    }

    fn data(&self) -> String {
        self.dir.join("data").display().to_string()
    }

    fn log(&self) -> String {
        self.dir.join("server.log").display().to_string()
    }

    fn url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/postgres", self.port)
    }

    /// Runs one of PostgreSQL's programs (as `postgres` when the test runs as root); panics
    /// when it fails.
    async fn pg(&self, args: &[&str]) {
        let program = format!("{}/{}", bin_dir(), args[0]);
        let mut command = if running_as_root() {
            let mut c = Command::new("runuser");
            c.args(["-u", "postgres", "--", &program]);
            c
        } else {
            Command::new(&program)
        };
        let output = command.args(&args[1..]).stdin(Stdio::null()).output().await.unwrap();
        assert!(
            output.status.success(),
            "{args:?}: {}{}\nserver log: {}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr),
            std::fs::read_to_string(self.log()).unwrap_or_default()
        );
    }

    /// Stops the server (`mode`: `fast` rolls back open transactions and closes connections,
    /// `immediate` is a crash: recovery from the WAL at the next start) and starts it again;
    /// returns once it accepts connections.
    async fn restart(&self, mode: &str) {
        // `restart` starts it with the options it had (`postmaster.opts`).
        self.pg(&["pg_ctl", "-D", &self.data(), "-l", &self.log(), "-m", mode, "-w", "restart"]).await;
    }
}

impl Drop for PrivatePostgres {
    fn drop(&mut self) {
        let program = format!("{}/pg_ctl", bin_dir());
        let args = ["-D", &self.data(), "-m", "immediate", "-w", "stop"];
        let _ = if running_as_root() {
            std::process::Command::new("runuser").args(["-u", "postgres", "--", &program]).args(args).output()
        } else {
            std::process::Command::new(&program).args(args).output()
        };
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn running_as_root() -> bool {
    std::process::Command::new("id").arg("-u").output().is_ok_and(|o| o.stdout.starts_with(b"0\n"))
}

/// The directory of the PostgreSQL server's programs (`pg_config --bindir`).
fn bin_dir() -> String {
    let output = std::process::Command::new("pg_config").arg("--bindir").output().expect("pg_config runs");
    String::from_utf8(output.stdout).unwrap().trim().to_owned()
}

/// Records `succeeded` so far; `None` while the database does not answer.
async fn succeeded(pool: &PgPool) -> Option<i64> {
    let query = sqlx::query_scalar("SELECT count(*) FROM dedup_records WHERE status = 'succeeded'").fetch_one(pool);
    tokio::time::timeout(Duration::from_secs(2), query).await.ok()?.ok()
}

/// Waits until at least `n` records succeeded (at most `within`).
async fn until_succeeded(pool: &PgPool, n: i64, within: Duration) -> i64 {
    let started = Instant::now();
    loop {
        let done = succeeded(pool).await.unwrap_or(0);
        if done >= n || started.elapsed() > within {
            return done;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// From now, how long until a record succeeds that had not before: the consumers' time to
/// resume once the database answers again.
async fn time_to_resume(pool: &PgPool) -> Duration {
    let started = Instant::now();
    let before = loop {
        if let Some(n) = succeeded(pool).await {
            break n;
        }
        assert!(started.elapsed() < Duration::from_secs(30), "the database did not come back");
    };
    let more = until_succeeded(pool, before + 1, Duration::from_secs(60)).await;
    assert!(more > before, "the consumers did not resume within 60 s of the database's return");
    started.elapsed()
}

#[tokio::test]
async fn exactly_once_across_postgresql_restarts_and_killed_connections() {
    let postgres = PrivatePostgres::start().await;
    let world = World::with_database(TestDatabase::create_on(&postgres.url()).await).await;
    let url_of = |name: &str| format!("{}?application_name=serve-{name}", world.db.url);
    let (url_a, url_b) = (url_of("a"), url_of("b"));
    let extra_a = [("DATABASE_URL", url_a.as_str()), ("DEDUP_CONSUMER__LEASE_MS", "5000")];
    let extra_b = [("DATABASE_URL", url_b.as_str()), ("DEDUP_CONSUMER__LEASE_MS", "5000")];

    // The queue first, then the whole run published, so the restarts fall during consumption
    // and not during the simulation's own writes.
    world.serve("a", &extra_a).await.stop().await;
    let run = world.simulate(10_000, 0.0, 0.2, 0.01).await;
    assert!(run.duplicates > 5_000, "about 20 % duplicates: {run:?}");
    let a = world.serve("a", &extra_a).await;
    let b = world.serve("b", &extra_b).await;
    let pool = &world.db.pool;
    let within = Duration::from_secs(120);

    let at_first = until_succeeded(pool, 2_000, within).await;
    postgres.restart("fast").await;
    let first_resume = time_to_resume(pool).await;

    let at_kill = until_succeeded(pool, 5_000, within).await;
    let killed: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM (SELECT pg_terminate_backend(pid) FROM pg_stat_activity
                                WHERE application_name LIKE 'serve-a%') AS t",
    )
    .fetch_one(pool)
    .await
    .unwrap();
    assert!(killed > 0, "process a's connections were found and killed");

    let at_crash = until_succeeded(pool, 7_500, within).await;
    postgres.restart("immediate").await;
    let second_resume = time_to_resume(pool).await;
    eprintln!(
        "restart (fast) at {at_first} succeeded: resumed in {first_resume:?}; {killed} connections of a killed at \
         {at_kill}; restart (crash) at {at_crash}: resumed in {second_resume:?}"
    );
    assert!(at_crash < 10_000, "the crash fell during the run, at {at_crash} of 10 000 orders' messages");

    let report = verify(pool, &world.db.schema, Some(run.run_id), Duration::from_secs(240)).await.unwrap();
    assert!(report.ok, "{report:#?}");
    assert_eq!(report.missing + report.failed + report.processing, 0, "{report:#?}");
    assert_eq!((report.double_reservations, report.double_payments, report.double_sms), (0, 0, 0), "{report:#?}");
    assert_eq!((report.orders_created, report.orders_paid), (10_000, 10_000), "{report:#?}");
    // An SMS whose call a restart cut is parked for an operator (sent or not), never sent twice.
    assert!(report.sms_sent <= 10_000 && report.sms_sent + report.parked >= 10_000, "{report:#?}");

    // Both processes count what they gave back, and say they resumed: on `/readyz`, the
    // overview's consumer row and the metrics.
    let token = world.operator_token().await;
    let mut failed_batches = 0;
    for server in [&a, &b] {
        // The last batches settle after their commits.
        let (_, readyz) = server.readyz_until(Duration::from_secs(20), |status, _| status == 200).await;
        let group = &readyz["groups"][0];
        assert_eq!(group["ready"], true, "{readyz}");
        assert!(group["failing"].is_null(), "{readyz}");
        failed_batches += group["failed_batches"].as_u64().unwrap();
        let overview = server.call(&token, reqwest::Method::GET, "/api/v1/aggregates", None).await;
        let consumer = &overview["consumers"][0];
        assert_eq!(consumer["failed_batches"], group["failed_batches"], "{consumer}");
        assert!(consumer["failing"].is_null(), "{consumer}");
        if group["failed_batches"].as_u64() > Some(0) {
            assert!(group["last_recovery"]["resumed_at"].is_string(), "{readyz}");
            assert!(consumer["last_recovery"].as_str().is_some_and(|r| r.starts_with("resumed ")), "{consumer}");
        }
        let metrics = reqwest::get(server.url("/metrics")).await.unwrap().text().await.unwrap();
        let counted = metrics
            .lines()
            .find(|l| l.starts_with("dedup_failed_batches_total"))
            .and_then(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
            .unwrap_or(0);
        assert_eq!(counted, group["failed_batches"].as_u64().unwrap(), "the metric counts them too");
    }
    assert!(failed_batches > 0, "the restarts failed batches in flight");
    eprintln!(
        "{failed_batches} batches given back; {} SMS parked for an operator (sent: {} of 10 000)",
        report.parked, report.sms_sent
    );
    a.stop().await;
    b.stop().await;
}
