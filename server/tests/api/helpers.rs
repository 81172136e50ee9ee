//! `spawn_app`: the server on port 0 against a fresh database and the local Redis and RabbitMQ,
//! with one user per role (each with an API token) ready to use.

use std::sync::LazyLock;

use dedup_console::config::Settings;
use dedup_console::startup::Application;
use dedup_engine::console::accounts::AccountBooks;
use dedup_engine::console::accounts::passwords::hash_password;
use dedup_engine::console::accounts::tokens::token_create;
use dedup_engine::console::accounts::{Role, UserName};
use dedup_engine::testing::TestDatabase;
use reqwest::header::{AUTHORIZATION, HeaderMap, HeaderValue};

/// Every test user's password.
pub const PASSWORD: &str = "test password 123";
static PASSWORD_HASH: LazyLock<String> = LazyLock::new(|| hash_password(PASSWORD).unwrap());

/// A test user: named after the role (`viewer`, `operator`, `admin`), with an API token.
pub struct TestUser {
    /// Login name.
    pub name: String,
    /// Role.
    pub role: Role,
    /// API token (`Authorization: Bearer`).
    pub token: String,
}

/// A signed-in browser-like client: cookie store with the session, and the session's CSRF token.
pub struct Session {
    /// Client with the session cookie (no redirects followed).
    pub client: reqwest::Client,
    /// The session's CSRF token (from the page's `<meta name="csrf-token">`).
    pub csrf: String,
}

/// A running server and its database.
pub struct TestApp {
    /// `http://127.0.0.1:<port>`.
    pub address: String,
    /// HTTP client sending the viewer's API token (no redirects followed, so tests see them).
    pub client: reqwest::Client,
    /// The users: viewer, operator, admin.
    pub users: Vec<TestUser>,
    /// The test's database; dropped with the app.
    pub _db: TestDatabase,
}

/// Every test client gives up on a request after a minute: a request the server never answers
/// fails its test, naming the URL, instead of holding the whole run.
fn client_builder() -> reqwest::ClientBuilder {
    reqwest::Client::builder().redirect(reqwest::redirect::Policy::none()).timeout(std::time::Duration::from_secs(60))
}

impl TestApp {
    /// GET `path` with the viewer's token, returning the response.
    pub async fn get(&self, path: &str) -> reqwest::Response {
        self.client.get(self.url(path)).send().await.expect("request sent")
    }

    /// `address` + `path`.
    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.address)
    }

    /// The test user with this role.
    pub fn user(&self, role: Role) -> &TestUser {
        self.users.iter().find(|u| u.role == role).expect("a user per role")
    }

    /// A client without credentials.
    pub fn anonymous(&self) -> reqwest::Client {
        client_builder().build().unwrap()
    }

    /// A client sending `role`'s API token.
    pub fn bearer(&self, role: Role) -> reqwest::Client {
        bearer_client(&self.user(role).token)
    }

    /// Signs in as `name` with `password` (a form post like a browser's, without `Accept:
    /// text/html`); returns the response and the cookie-keeping client.
    pub async fn login_as(&self, name: &str, password: &str) -> (reqwest::Response, reqwest::Client) {
        let client = client_builder().cookie_store(true).build().unwrap();
        let response = client
            .post(self.url("/login"))
            .form(&[("username", name), ("password", password)])
            .send()
            .await
            .expect("request sent");
        (response, client)
    }

    /// Signs in as the user with `role`; panics unless it succeeds.
    pub async fn session(&self, role: Role) -> Session {
        let (response, client) = self.login_as(&self.user(role).name, PASSWORD).await;
        assert_eq!(response.status(), 204, "sign-in as {role}");
        let csrf = csrf_of(&client, &self.url("/account")).await;
        Session { client, csrf }
    }
}

/// The CSRF token in the `<meta name="csrf-token">` of the page at `url`.
pub async fn csrf_of(client: &reqwest::Client, url: &str) -> String {
    let html = client.get(url).send().await.unwrap().text().await.unwrap();
    let marker = "name=\"csrf-token\" content=\"";
    let start = html.find(marker).map(|i| i + marker.len()).expect("csrf meta rendered");
    html[start..].split('"').next().unwrap().to_owned()
}

/// A client sending `token` as `Authorization: Bearer`.
pub fn bearer_client(token: &str) -> reqwest::Client {
    let mut headers = HeaderMap::new();
    headers.insert(AUTHORIZATION, HeaderValue::from_str(&format!("Bearer {token}")).unwrap());
    client_builder().default_headers(headers).build().unwrap()
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
    let mut users = Vec::new();
    for role in Role::ALL {
        let name = UserName::parse(role.as_str()).unwrap();
        let user = db.pool.user_add(&name, role, &PASSWORD_HASH).await.expect("test user");
        let (_, token) = token_create(&db.pool, user.id, "tests").await.expect("test token");
        users.push(TestUser { name: user.name, role, token });
    }
    let mut settings = local_settings();
    settings.listen = "127.0.0.1:0".parse().unwrap();
    settings.database_url = db.url.as_str().into();
    // Its own exchange and queue: other test apps (and a demo server on the machine) publish to
    // the default ones.
    let tag = uuid::Uuid::new_v4().simple().to_string();
    settings.consumer.rabbitmq.exchange = format!("api-test.{tag}");
    settings.consumer.rabbitmq.queue = format!("api-test.{tag}");
    adjust(&mut settings);
    let app = Application::build(settings, false).await.expect("application builds");
    let address = format!("http://127.0.0.1:{}", app.port());
    tokio::spawn(app.run_until_stopped(std::future::pending()));
    let client = bearer_client(&users[0].token);
    TestApp { address, client, users, _db: db }
}

/// Spawns the app against the local services.
pub async fn spawn_app() -> TestApp {
    spawn_app_with(|_| {}).await
}

/// A `succeeded` record of `order-service` (first try, RabbitMQ), as a consumer would have
/// written it; returns its id.
pub async fn succeeded_record(app: &TestApp, message_id: &str, message_type: &str) -> i64 {
    sqlx::query_scalar(
        "INSERT INTO dedup_records (consumer_group, message_id, message_type, status, attempts, max_attempts,
             payload_hash, source_broker, completed_at)
         VALUES ('order-service', $1, $2, 'succeeded', 1, 5, '\\x00', 'rabbitmq', now())
         RETURNING id",
    )
    .bind(message_id)
    .bind(message_type)
    .fetch_one(&app._db.pool)
    .await
    .unwrap()
}
