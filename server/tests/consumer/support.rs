//! Running `dedup-console serve` (and other commands) as a child process with a test's own
//! database, queues (or Kafka topic and group) and Redis prefix.

use std::collections::HashMap;
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::Arc;
use std::time::{Duration, Instant};

use dedup_engine::testing::kafka::TestKafka;
use dedup_engine::testing::{TestBroker, TestDatabase, amqp_url, redis_url};
use dedup_engine::{Backoff, IdPolicy, SourceFactory};
use dedup_example_orders::OrderSettings;
use dedup_example_orders::simulate::{SimulateParams, SimulatedGroup, SimulationReport, simulate};
use tokio::process::{Child, Command};

/// One test's world: database, broker names, Redis prefix, shared server environment.
pub struct World {
    pub db: TestDatabase,
    pub broker: TestBroker,
    /// Set by [`World::with_kafka`]: the servers consume from this topic and group instead.
    pub kafka: Option<TestKafka>,
    pub redis_url: String,
    pub env: HashMap<String, String>,
}

impl World {
    /// A fresh world; retry back-off 500 ms doubling to 2 s so tests run quickly.
    pub async fn new() -> Self {
        Self::with_database(TestDatabase::create().await).await
    }

    /// A fresh world on `db` (a database of a server of the test's own, say).
    pub async fn with_database(db: TestDatabase) -> Self {
        dedup_example_orders::migrate(&db.pool).await.expect("the order example's tables");
        let broker = TestBroker::new(&amqp_url(), Backoff { initial_ms: 500, max_ms: 2000 });
        let s = &broker.settings;
        let env = HashMap::from([
            ("DATABASE_URL".to_owned(), db.url.clone()),
            ("DEDUP_CONSUMER__RABBITMQ__EXCHANGE".to_owned(), s.exchange.clone()),
            ("DEDUP_CONSUMER__RABBITMQ__QUEUE".to_owned(), s.queue.clone()),
            ("DEDUP_CONSUMER__RABBITMQ__CONNECTION_NAME".to_owned(), s.connection_name.clone()),
            ("DEDUP_CONSUMER__BACKOFF__INITIAL_MS".to_owned(), "500".to_owned()),
            ("DEDUP_CONSUMER__BACKOFF__MAX_MS".to_owned(), "2000".to_owned()),
            ("DEDUP_FAST_PATH__PREFIX".to_owned(), format!("t{}", uuid::Uuid::new_v4().simple())),
            ("RUST_LOG".to_owned(), "warn,dedup_engine=info".to_owned()),
        ]);
        Self { db, broker, kafka: None, redis_url: redis_url(), env }
    }

    /// A world whose servers consume from Kafka: its own topic with `partitions` partitions and
    /// its own group; session timeout 10 s (the test broker answers slowly on a loaded machine),
    /// revoke grace 1 s, leases of 5 s.
    pub async fn with_kafka(partitions: i32) -> Self {
        let mut world = Self::new().await;
        let mut kafka = TestKafka::new(partitions, Backoff { initial_ms: 500, max_ms: 2000 });
        kafka.settings.session_timeout_ms = 10_000;
        let s = &kafka.settings;
        world.env.extend(
            [
                ("DEDUP_CONSUMER__SOURCE", "kafka".to_owned()),
                ("DEDUP_CONSUMER__KAFKA__BROKERS", s.brokers.clone()),
                ("DEDUP_CONSUMER__KAFKA__GROUP_ID", kafka.group.clone()),
                ("DEDUP_CONSUMER__KAFKA__TOPICS", format!("[\"{}\"]", kafka.topic())),
                ("DEDUP_CONSUMER__KAFKA__PARTITIONS", partitions.to_string()),
                ("DEDUP_CONSUMER__KAFKA__SESSION_TIMEOUT_MS", s.session_timeout_ms.to_string()),
                ("DEDUP_CONSUMER__KAFKA__REVOKE_GRACE_MS", s.revoke_grace_ms.to_string()),
                ("DEDUP_CONSUMER__LEASE_MS", "5000".to_owned()),
            ]
            .map(|(k, v)| (k.to_owned(), v)),
        );
        world.kafka = Some(kafka);
        world
    }

    /// Starts a server with the world's environment plus `extra`; waits until its consumer is
    /// subscribed to the work queue.
    pub async fn serve(&self, name: &str, extra: &[(&str, &str)]) -> Server {
        self.serve_on(name, extra, &[&self.broker.settings.queue]).await
    }

    /// Starts a server with the world's environment plus `extra`; waits until it consumes from
    /// every one of `queues` (RabbitMQ), or has subscribed (Kafka).
    pub async fn serve_on(&self, name: &str, extra: &[(&str, &str)], queues: &[&str]) -> Server {
        self.serve_command(name, &["serve"], extra, queues).await
    }

    /// `serve --demo` with the world's environment; waits until its consumer is subscribed to
    /// the work queue (the demo publishes to the world's exchange).
    pub async fn serve_demo(&self, name: &str) -> Server {
        self.serve_command(name, &["serve", "--demo"], &[], &[&self.broker.settings.queue]).await
    }

    /// Starts `dedup-console <args>` (a `serve`) with the world's environment plus `extra`;
    /// waits until it consumes from every one of `queues` (RabbitMQ), or has subscribed (Kafka).
    async fn serve_command(&self, name: &str, args: &[&str], extra: &[(&str, &str)], queues: &[&str]) -> Server {
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let log = std::env::temp_dir().join(format!("{}-{name}.log", self.db.name));
        let mut cmd = self.command(args);
        cmd.env("DEDUP_LISTEN", format!("127.0.0.1:{port}"))
            .envs(extra.iter().map(|(k, v)| (k.to_string(), v.to_string())))
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .kill_on_drop(true);
        let child = cmd.spawn().expect("dedup-console starts");
        let server = Server { child, log, address: format!("http://127.0.0.1:{port}") };
        // Its own log says so: the broker's consumer count would still hold a server just killed.
        let subscribed = |server: &Server| match self.kafka {
            Some(_) => server.log_text().contains("Kafka consumer subscribed"),
            None => queues.iter().all(|queue| server.consumes_from(queue)),
        };
        let started = Instant::now();
        while !subscribed(&server) {
            assert!(
                started.elapsed() < Duration::from_secs(60),
                "server {name} did not subscribe; log: {}",
                server.log_text()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        server
    }

    /// `dedup-console <args>` with the world's environment (database, queues, Redis).
    pub fn command(&self, args: &[&str]) -> Command {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_dedup-console"));
        cmd.args(args).envs(&self.env).env("REDIS_URL", &self.redis_url);
        cmd
    }

    /// Adds the user `operator` (role operator) to the world's database and returns a new API
    /// token of theirs, for `Authorization: Bearer` calls to the REST API of its servers — as a
    /// team's script would, headless: `user add`, then `user token`, which prints the token alone.
    pub async fn operator_token(&self) -> String {
        let add = self
            .command(&["user", "add", "operator", "--role", "operator"])
            .env("DEDUP_USER_PASSWORD", "operator password")
            .output()
            .await
            .unwrap();
        assert!(add.status.success(), "user add: {}", String::from_utf8_lossy(&add.stderr));
        let token = self.command(&["user", "token", "operator", "--label", "tests"]).output().await.unwrap();
        assert!(token.status.success(), "user token: {}", String::from_utf8_lossy(&token.stderr));
        let token = String::from_utf8(token.stdout).unwrap();
        assert_eq!(token.lines().count(), 1, "the token alone on stdout: {token:?}");
        token.trim().to_owned()
    }

    /// Publishes a simulation run through the world's exchange (or Kafka topic) to the one
    /// group `order-service`.
    pub async fn simulate(&self, orders: u64, rate: f64, duplicate_rate: f64, poison_rate: f64) -> SimulationReport {
        let group = SimulatedGroup { name: "order-service".to_owned(), binding_keys: Vec::new() };
        self.simulate_to(vec![group], orders, rate, duplicate_rate, poison_rate).await
    }

    /// Publishes a simulation run through the world's exchange (or Kafka topic) that reaches
    /// `groups`.
    pub async fn simulate_to(
        &self,
        groups: Vec<SimulatedGroup>,
        orders: u64,
        rate: f64,
        duplicate_rate: f64,
        poison_rate: f64,
    ) -> SimulationReport {
        let source: Arc<dyn SourceFactory> = match &self.kafka {
            Some(kafka) => kafka.connector(),
            None => self.broker.connector(),
        };
        let publisher = source.open_publisher().await.unwrap();
        let params = SimulateParams {
            orders,
            rate,
            duplicate_rate,
            duplicate_delay_ms: 2000,
            reorder_window: 8,
            poison_rate,
            groups,
            exchange: source.destination(),
            seed: 42,
        };
        let report = simulate(
            &self.db.pool,
            publisher.as_ref(),
            &params,
            &OrderSettings::default(),
            &IdPolicy::default(),
            |_, _| {},
        )
        .await
        .expect("simulation publishes");
        source.close().await;
        report
    }

    /// Publishes one JSON message with `id` as its message id.
    pub async fn publish(&self, id: &str, routing_key: &str, body: serde_json::Value) {
        self.publish_with(id, routing_key, &serde_json::Map::new(), body).await;
    }

    /// Publishes one JSON message with `id` as its message id and `headers`.
    pub async fn publish_with(
        &self,
        id: &str,
        routing_key: &str,
        headers: &serde_json::Map<String, serde_json::Value>,
        body: serde_json::Value,
    ) {
        use dedup_engine::rabbitmq::properties_for;
        let publisher = self.broker.connector().publisher().await.unwrap();
        let props = properties_for(Some(id), headers, Some("application/json"));
        let payload = serde_json::to_vec(&body).unwrap();
        publisher.publish(&self.broker.settings.exchange, routing_key, &payload, props).await.unwrap();
    }

    /// Polls a scalar query until `ok(value)` or `within` passes; returns the last value.
    pub async fn wait_for<T>(&self, within: Duration, sql: &str, ok: impl Fn(&T) -> bool) -> T
    where
        T: for<'r> sqlx::Decode<'r, sqlx::Postgres> + sqlx::Type<sqlx::Postgres> + Send + Unpin,
    {
        let started = Instant::now();
        loop {
            let value: T = sqlx::query_scalar(sql).fetch_one(&self.db.pool).await.unwrap();
            if ok(&value) || started.elapsed() >= within {
                return value;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
}

/// A running `dedup-console serve`.
pub struct Server {
    child: Child,
    log: PathBuf,
    /// `http://127.0.0.1:<port>`: its console and REST API.
    address: String,
}

impl Server {
    /// SIGKILL: no shutdown handling at all, as in a crash.
    pub async fn kill(mut self) {
        self.child.kill().await.unwrap();
    }

    /// SIGTERM, then waits (at most 30 s) for the exit: its status, the time from the signal,
    /// and the log.
    pub async fn terminate(mut self) -> (std::process::ExitStatus, Duration, String) {
        let pid = self.child.id().expect("running");
        let signalled = Instant::now();
        let _ = Command::new("kill").args(["-TERM", &pid.to_string()]).status().await;
        let status = tokio::time::timeout(Duration::from_secs(30), self.child.wait()).await.expect("exits").unwrap();
        (status, signalled.elapsed(), self.log_text())
    }

    /// SIGTERM, then waits for a clean exit that logged no ERROR while stopping.
    pub async fn stop(self) {
        let (status, _, log) = self.terminate().await;
        assert!(status.success(), "clean exit after SIGTERM; log: {log}");
        // A normal shutdown is not an incident: an operator's alerting must not page on it (the
        // RabbitMQ client used to log an ERROR on most stops).
        let shutdown = log.split_once("shutdown signal received").map_or("", |(_, after)| after);
        assert!(!shutdown.contains("ERROR"), "a clean stop logs no ERROR: {shutdown}");
    }

    /// The process id (part of its workers' names, `<host>:<pid>:<n>`).
    pub fn pid(&self) -> u32 {
        self.child.id().expect("running")
    }

    /// `path` (`/api/v1/...`) on this server.
    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.address)
    }

    /// `method` on the server's REST API with `token`; returns the JSON body of a 200.
    pub async fn call(
        &self,
        token: &str,
        method: reqwest::Method,
        path: &str,
        body: Option<serde_json::Value>,
    ) -> serde_json::Value {
        let mut builder = reqwest::Client::new().request(method, self.url(path)).bearer_auth(token);
        if let Some(body) = body {
            builder = builder.json(&body);
        }
        let response = builder.send().await.expect("request sent");
        let status = response.status();
        let body: serde_json::Value = response.json().await.expect("JSON body");
        assert_eq!(status, 200, "{path}: {body}");
        body
    }

    /// `/readyz`'s status and body once `ok(status, body)` holds, polled every 100 ms for at
    /// most `within`; else its last answer.
    pub async fn readyz_until(
        &self,
        within: Duration,
        ok: impl Fn(u16, &serde_json::Value) -> bool,
    ) -> (u16, serde_json::Value) {
        let started = Instant::now();
        loop {
            let response = reqwest::get(self.url("/readyz")).await.expect("readyz answers");
            let status = response.status().as_u16();
            let body: serde_json::Value = response.json().await.expect("readyz JSON");
            if ok(status, &body) || started.elapsed() > within {
                return (status, body);
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// The server's log so far.
    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Whether the log says a worker of this server consumes from `queue` (RabbitMQ).
    fn consumes_from(&self, queue: &str) -> bool {
        let field = format!("queue={queue} ");
        self.log_text().lines().any(|line| line.contains("consuming from RabbitMQ") && line.contains(&field))
    }
}

/// A TOML configuration file of the test, removed with the returned guard.
pub struct ConfigFile(std::path::PathBuf);

impl ConfigFile {
    pub fn new(world: &World, text: &str) -> Self {
        let path = std::env::temp_dir().join(format!("{}-{}.toml", world.db.name, uuid::Uuid::new_v4().simple()));
        std::fs::write(&path, text).unwrap();
        Self(path)
    }

    pub fn path(&self) -> &str {
        self.0.to_str().unwrap()
    }
}

impl Drop for ConfigFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}
