//! `spawn_app`: the server on port 0 against a fresh database and the local Redis and RabbitMQ.

use dedup_console::config::Settings;
use dedup_console::startup::Application;
use dedup_engine::testing::TestDatabase;

/// A running server and its database.
pub struct TestApp {
    /// `http://127.0.0.1:<port>`.
    pub address: String,
    /// HTTP client (no redirects followed, so tests see them).
    pub client: reqwest::Client,
    /// The test's database; dropped with the app.
    pub _db: TestDatabase,
}

impl TestApp {
    /// GET `path`, returning the response.
    pub async fn get(&self, path: &str) -> reqwest::Response {
        self.client.get(format!("{}{path}", self.address)).send().await.expect("request sent")
    }
}

/// Local service URLs, overridable like the server's own configuration.
pub fn local_settings() -> Settings {
    let mut settings = Settings::default();
    if let Ok(url) = std::env::var("REDIS_URL") {
        settings.redis_url = url.as_str().into();
    }
    if let Ok(url) = std::env::var("AMQP_URL") {
        settings.amqp_url = url.as_str().into();
    }
    settings
}

/// Spawns the app with `adjust` applied to the local settings.
pub async fn spawn_app_with(adjust: impl FnOnce(&mut Settings)) -> TestApp {
    let db = TestDatabase::create().await;
    let mut settings = local_settings();
    settings.listen = "127.0.0.1:0".parse().unwrap();
    settings.database_url = db.url.as_str().into();
    adjust(&mut settings);
    let app = Application::build(settings, false).await.expect("application builds");
    let address = format!("http://127.0.0.1:{}", app.port());
    tokio::spawn(app.run_until_stopped(std::future::pending()));
    let client = reqwest::Client::builder().redirect(reqwest::redirect::Policy::none()).build().unwrap();
    TestApp { address, client, _db: db }
}

/// Spawns the app against the local services.
pub async fn spawn_app() -> TestApp {
    spawn_app_with(|_| {}).await
}
