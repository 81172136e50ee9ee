//! The console served the ways a host serves it: under a base path chosen at run time, behind the
//! host's own auth (delegated), read-only, and without auth (loopback only).

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use axum::http::request::Parts;
use dedup_app::ssr::mount::AuthMode;
use dedup_app::ssr::mount::{ConsoleAuth, ConsoleConfig, DelegatedAuth, HostUser, Role, console_router, mount};
use dedup_app::ssr::web::router::policy;
use dedup_console::startup::Application;
use dedup_engine::testing::{TestBroker, TestDatabase, redis_url};
use dedup_engine::{Backoff, Engine, HealthProbes};
use reqwest::Method;
use serde_json::{Value, json};

use crate::helpers::{PASSWORD, TestApp, local_settings, spawn_app_with};

/// A stuck record (lease expired) in `pool`'s database; returns (id, lease token).
async fn stuck_record(pool: &sqlx::PgPool) -> (i64, String) {
    sqlx::query_as::<_, (i64, uuid::Uuid)>(
        "INSERT INTO dedup_records (consumer_group, message_id, message_type, status, handler_mode, attempts,
             max_attempts, lease_owner, lease_token, lease_expires_at, payload_hash, source_broker)
         VALUES ('order-service', 'ORDER.NOTIFY.M' || gen_random_uuid() || ':3', 'ORDER.NOTIFY', 'processing',
                 'leased', 1, 5, 'w', gen_random_uuid(), now() - interval '1 minute', '\\x00', 'rabbitmq')
         RETURNING id, lease_token",
    )
    .fetch_one(pool)
    .await
    .map(|(id, token)| (id, token.to_string()))
    .unwrap()
}

fn client() -> reqwest::Client {
    reqwest::Client::builder().cookie_store(true).redirect(reqwest::redirect::Policy::none()).build().unwrap()
}

/// The `content` of `<meta name="{name}">` in `html`.
fn meta(html: &str, name: &str) -> String {
    let marker = format!("name=\"{name}\" content=\"");
    let start = html.find(&marker).map(|i| i + marker.len()).unwrap_or_else(|| panic!("meta {name} in {html}"));
    html[start..].split('"').next().unwrap().to_owned()
}

#[tokio::test]
async fn one_build_serves_the_console_under_a_base_path_with_every_url_under_it() {
    let app = spawn_app_with(|s| s.console.base_path = "/x/y/".to_owned()).await;
    let base = format!("{}/x/y", app.address);
    let browser = client();
    let response = browser.get(format!("{base}/records")).send().await.unwrap();
    assert_eq!(response.status(), 303);
    assert_eq!(response.headers()["location"], "/x/y/login?next=%2Fx%2Fy%2Frecords", "sign in under the base");
    let login = browser.get(format!("{base}/login")).send().await.unwrap();
    assert_eq!(login.status(), 200);
    let html = login.text().await.unwrap();
    assert!(html.contains("action=\"/x/y/login\""), "the sign-in form posts under the base");
    let signed_in = browser
        .post(format!("{base}/login"))
        .header("accept", "text/html")
        .form(&[("username", "admin"), ("password", PASSWORD), ("next", "/x/y/records")])
        .send()
        .await
        .unwrap();
    assert_eq!(signed_in.headers()["location"], "/x/y/records");
    let cookie = signed_in.headers()["set-cookie"].to_str().unwrap();
    assert!(cookie.contains("Path=/x/y"), "the session cookie is the console's only: {cookie}");

    let html = browser.get(format!("{base}/records")).send().await.unwrap().text().await.unwrap();
    assert_eq!(meta(&html, "dedup-base"), "/x/y");
    for expected in ["href=\"/x/y/pkg/dedup-console.css\"", "/x/y/pkg/dedup-console", "href=\"/x/y/stuck\""] {
        assert!(html.contains(expected), "{expected} in the page");
    }
    for outside in ["href=\"/stuck\"", "href=\"/records\"", "\"/pkg/"] {
        assert!(!html.contains(outside), "{outside} is outside the base");
    }
    let csrf = meta(&html, "csrf-token");
    let overview =
        browser.post(format!("{base}/api/fn/get_overview")).header("x-csrf-token", &csrf).send().await.unwrap();
    assert_eq!(overview.status(), 200, "server functions answer under the base");
    let api = app.bearer(Role::Viewer).get(format!("{base}/api/v1/aggregates")).send().await.unwrap();
    assert_eq!(api.status(), 200, "the REST API answers under the base");
    let doc: Value =
        app.anonymous().get(format!("{base}/api/openapi.json")).send().await.unwrap().json().await.unwrap();
    assert_eq!(doc["servers"], json!([{"url": "/x/y"}]));
    assert_eq!(app.anonymous().get(format!("{base}/readyz")).send().await.unwrap().status(), 200);
    assert_eq!(browser.get(format!("{base}/stuck/")).send().await.unwrap().headers()["location"], "/x/y/stuck");
    let page = browser.get(&base).send().await.unwrap();
    assert_eq!(page.status(), 200, "the base is the overview");
    assert!(page.text().await.unwrap().contains("Overview"));
    let slash = browser.get(format!("{base}/")).send().await.unwrap();
    assert_eq!(
        (slash.status().as_u16(), &slash.headers()["location"]),
        (308, &"/x/y".parse::<reqwest::header::HeaderValue>().unwrap())
    );
    let outside = app.bearer(Role::Viewer).get(format!("{}/api/v1/aggregates", app.address)).send().await.unwrap();
    assert_eq!(outside.status(), 404, "nothing is served outside the base");
    let events = browser.get(format!("{base}/api/v1/events")).send().await.unwrap();
    assert_eq!(events.headers()["content-type"], "text/event-stream", "the event stream is under the base");
}

/// The host's users, from headers its gateway would set: `x-user` and `x-role`.
fn gateway(parts: &Parts) -> Result<Option<HostUser>, String> {
    let header = |name| parts.headers.get(name).and_then(|v| v.to_str().ok());
    let Some(name) = header("x-user") else { return Ok(None) };
    let role = match header("x-role") {
        Some("viewer") => Role::Viewer,
        Some("operator") => Role::Operator,
        Some("admin") => Role::Admin,
        other => return Err(format!("the gateway sent no known role ({other:?}) for {name}")),
    };
    Ok(Some(HostUser { name: name.to_owned(), role }))
}

/// A host application with its own route at `/` and the console nested at `/ops/dedup` behind
/// the gateway's users; returns its address and its database.
async fn host_app(read_only: bool) -> (String, TestDatabase) {
    host_app_with(gateway, read_only).await
}

/// [`host_app`] with another resolver.
async fn host_app_with(
    resolver: impl Fn(&Parts) -> Result<Option<HostUser>, String> + Send + Sync + 'static,
    read_only: bool,
) -> (String, TestDatabase) {
    let db = TestDatabase::create().await;
    let engine = Engine::builder(db.pool.clone()).redis(redis_url()).consume(false).start().await.unwrap();
    let probes = HealthProbes::new(engine.handle().pool().clone(), &db.url, &redis_url(), Duration::from_secs(2));
    let auth = DelegatedAuth::new(resolver, "/signin").sign_out_url("/signout");
    let config =
        ConsoleConfig { read_only, ..ConsoleConfig::new("target/site", "/ops/dedup", ConsoleAuth::Delegated(auth)) };
    let console = console_router(engine.handle().clone(), probes, config).await.unwrap();
    let host = axum::Router::new().route("/", axum::routing::get(|| async { "the host's own page" }));
    let app = mount(host, "/ops/dedup", console);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move {
        let _engine = engine;
        axum::serve(listener, app.into_make_service_with_connect_info::<SocketAddr>()).await.unwrap();
    });
    (address, db)
}

fn as_user(name: &str, role: &str) -> reqwest::Client {
    let mut headers = reqwest::header::HeaderMap::new();
    headers.insert("x-user", name.parse().unwrap());
    headers.insert("x-role", role.parse().unwrap());
    reqwest::Client::builder().default_headers(headers).redirect(reqwest::redirect::Policy::none()).build().unwrap()
}

#[tokio::test]
async fn delegated_auth_takes_the_hosts_users_roles_and_names() {
    let (address, db) = host_app(false).await;
    let console = format!("{address}/ops/dedup");
    assert_eq!(reqwest::get(&address).await.unwrap().text().await.unwrap(), "the host's own page");
    let anonymous = client();
    let page = anonymous.get(format!("{console}/stuck")).send().await.unwrap();
    assert_eq!(page.headers()["location"], "/signin?next=%2Fops%2Fdedup%2Fstuck", "to the host's sign-in");
    let login = anonymous.get(format!("{console}/login")).send().await.unwrap();
    assert_eq!(login.headers()["location"], "/signin?next=%2Fops%2Fdedup", "back to the console, not to /login");
    let logout = as_user("olivia", "operator").get(format!("{console}/logout")).send().await.unwrap();
    assert_eq!(logout.headers()["location"], "/signout", "the host's sign-out");
    assert_eq!(anonymous.get(format!("{console}/api/v1/stuck")).send().await.unwrap().status(), 401);
    let refused = as_user("mallory", "root").get(format!("{console}/api/v1/stuck")).send().await.unwrap();
    assert_eq!(refused.status(), 403, "the resolver's refusal");
    assert!(refused.text().await.unwrap().contains("no known role"));
    let refused_page = as_user("mallory", "root").get(format!("{console}/stuck")).send().await.unwrap();
    assert_eq!(refused_page.status(), 403);
    let html = refused_page.text().await.unwrap();
    assert!(
        html.contains("<a href=\"/signout\">Sign out</a>"),
        "refused by the resolver: to the host's sign-out, {html}"
    );
    assert!(!html.contains("Back to the console"), "a link back would be refused again: {html}");
    let viewer_page = as_user("vera", "viewer").get(format!("{console}/users")).send().await.unwrap();
    assert_eq!(viewer_page.status(), 403, "an admin page");
    assert!(viewer_page.text().await.unwrap().contains("Back to the console"), "refused one page: back to the rest");

    let (id, token) = stuck_record(&db.pool).await;
    let release = json!({"lease_token": token, "reason": "the worker died", "expected_status": "processing"});
    let url = format!("{console}/api/v1/records/{id}/release");
    let viewer = as_user("vera", "viewer").post(&url).json(&release).send().await.unwrap();
    assert_eq!(viewer.status(), 403, "a viewer of the host cannot act");
    let page = as_user("olivia", "operator").get(format!("{console}/records/{id}")).send().await.unwrap();
    let html = page.text().await.unwrap();
    assert!(html.contains("olivia"), "the host's user is shown");
    let operator = as_user("olivia", "operator").post(&url).json(&release).send().await.unwrap();
    assert_eq!(operator.status(), 200, "an operator of the host can");
    let actor: String =
        sqlx::query_scalar("SELECT actor FROM audit_log WHERE action = 'record.release' AND outcome = 'ok'")
            .fetch_one(&db.pool)
            .await
            .unwrap();
    assert_eq!(actor, "host:olivia", "the audit log names the host's user");

    // From a browser (it names its origin) a change needs the page's token.
    let (id, token) = stuck_record(&db.pool).await;
    let url = format!("{console}/api/v1/records/{id}/release");
    let body = json!({"lease_token": token, "reason": "x"});
    let without_token =
        as_user("olivia", "operator").post(&url).header("origin", &address).json(&body).send().await.unwrap();
    assert_eq!(without_token.status(), 403, "no token from a browser: refused");
    let token = meta(&html, "csrf-token");
    let with_token = as_user("olivia", "operator")
        .post(&url)
        .header("origin", &address)
        .header("x-csrf-token", token)
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(with_token.status(), 200, "with the page's token: done");
    let logout = as_user("olivia", "operator").post(format!("{console}/logout")).send().await.unwrap();
    assert_eq!(logout.status(), 403, "signing out is the host's");
    assert!(html.contains("href=\"/signout\""), "the sign-out link goes to the host's");
}

/// `path` with its parameters filled in.
fn concrete(pattern: &str) -> String {
    pattern.replace("{id}", "1").replace("{control}", "pause")
}

#[tokio::test]
async fn read_only_refuses_every_route_that_changes_something_and_only_those() {
    let (address, _db) = host_app(true).await;
    let admin = as_user("ada", "admin");
    let mut refused = 0;
    for (method, pattern, rule) in policy().rules() {
        if ["/login", "/logout", dedup_app::components::live::LIVE_EVENTS_PATH].contains(&pattern.as_str()) {
            continue; // the host's with delegated auth; an endless stream
        }
        let url = format!("{address}/ops/dedup{}", concrete(&pattern));
        let request = admin.request(method.clone(), &url);
        let request = if method == Method::GET { request } else { request.json(&json!({})) };
        let response = request.timeout(Duration::from_secs(20)).send().await.unwrap();
        let status = response.status().as_u16();
        let text = response.text().await.unwrap_or_default();
        let read_only = status == 403 && text.contains("read-only");
        assert_eq!(read_only, rule.mutates, "{method} {pattern}: {status} {text}");
        refused += usize::from(read_only);
    }
    assert!(refused >= 15, "{refused} changing routes refused");
    let html = admin.get(format!("{address}/ops/dedup/cleanup")).send().await.unwrap().text().await.unwrap();
    assert!(html.contains("data-testid=\"read-only\""), "the console says it is read-only");
    for action in ["data-testid=\"new-schedule\"", "data-testid=\"run-now\""] {
        assert!(!html.contains(action), "{action} is hidden");
    }
}

#[tokio::test]
async fn without_auth_the_console_serves_loopback_clients_and_names_only_and_refuses_to_start_elsewhere() {
    let mut settings = local_settings();
    settings.auth.mode = AuthMode::Off;
    settings.listen = "0.0.0.0:0".parse().unwrap();
    let err = Application::build(settings, false).await.err().expect("refused");
    let message = format!("{err:#}");
    assert!(message.contains("loopback") && message.contains("auth.mode"), "{message}");

    let app: TestApp = spawn_app_with(|s| s.auth.mode = AuthMode::Off).await;
    let page = app.anonymous().get(app.url("/stuck")).send().await.unwrap();
    assert_eq!(page.status(), 200, "a loopback client is the local admin");
    let html = page.text().await.unwrap();
    assert!(html.contains("local"), "shown as local");
    // A page of another site that DNS rebinding points at 127.0.0.1 names its own host.
    let port = app.address.rsplit(':').next().unwrap().to_owned();
    let rebound = app.anonymous().get(app.url("/cleanup")).header("host", format!("evil.example:{port}")).send();
    assert_eq!(rebound.await.unwrap().status(), 403, "only loopback names are served");
    let by_name = app.anonymous().get(app.url("/cleanup")).header("host", format!("localhost:{port}")).send();
    assert_eq!(by_name.await.unwrap().status(), 200);
}

#[tokio::test]
async fn an_open_console_tab_does_not_hold_the_hosts_shutdown() {
    let db = TestDatabase::create().await;
    let engine = Engine::builder(db.pool.clone()).redis(redis_url()).consume(false).start().await.unwrap();
    let probes = HealthProbes::new(engine.handle().pool().clone(), &db.url, &redis_url(), Duration::from_secs(2));
    let config = ConsoleConfig::new("target/site", "", ConsoleAuth::Off);
    let console_shutdown = config.shutdown.clone();
    let console = console_router(engine.handle().clone(), probes, config).await.unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = format!("http://{}", listener.local_addr().unwrap());
    let (signal, signalled) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(
        axum::serve(listener, console.into_make_service_with_connect_info::<SocketAddr>())
            .with_graceful_shutdown(async move {
                let _ = signalled.await;
                console_shutdown.cancel();
            })
            .into_future(),
    );
    let mut tab = reqwest::get(format!("{address}/api/v1/events")).await.unwrap();
    assert!(tab.chunk().await.unwrap().is_some(), "the live stream is open");
    signal.send(()).unwrap();
    let stopped = tokio::time::timeout(Duration::from_secs(5), server).await;
    assert!(stopped.is_ok(), "the server stopped within 5 s although a console tab was open");
    engine.stop().await;
}

/// Leptos builds a router's page list with resource loading switched off for the whole process
/// (leptos issue 4773); a page served while a host built another console router waited forever
/// for its data (this hung a CI run). Pages keep rendering however many routers are built.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn building_another_console_router_does_not_stall_pages_being_served() {
    let (address, db) = host_app(false).await;
    let engine = Engine::builder(db.pool.clone()).redis(redis_url()).consume(false).start().await.unwrap();
    let building = Arc::new(AtomicBool::new(true));
    let builder = tokio::spawn({
        let building = building.clone();
        let handle = engine.handle().clone();
        let url = db.url.clone();
        async move {
            let mut built = 0_u32;
            while building.load(Ordering::Relaxed) {
                let probes = HealthProbes::new(handle.pool().clone(), &url, &redis_url(), Duration::from_secs(2));
                let auth = DelegatedAuth::new(gateway, "/signin");
                let config = ConsoleConfig::new("target/site", "/other", ConsoleAuth::Delegated(auth));
                drop(console_router(handle.clone(), probes, config).await.unwrap());
                built += 1;
                tokio::task::yield_now().await;
            }
            built
        }
    });
    let viewer = as_user("vera", "viewer");
    for (i, page) in ["/records", "/stuck", "/retries", "/dead-letters", ""].iter().cycle().take(40).enumerate() {
        let url = format!("{address}/ops/dedup{page}");
        let fetched = tokio::time::timeout(Duration::from_secs(10), async {
            let response = viewer.get(&url).send().await.unwrap();
            (response.status(), response.text().await.unwrap())
        });
        let (status, body) = fetched.await.unwrap_or_else(|_| panic!("request {i}: {url} stalled for 10 s"));
        assert_eq!(status, 200, "{url}");
        // Leptos ends a streamed page with the list of chunks it could not resolve.
        assert!(body.contains("__INCOMPLETE_CHUNKS=[];"), "request {i}: {url} left data unresolved");
    }
    building.store(false, Ordering::Relaxed);
    let built = builder.await.unwrap();
    assert!(built >= 10, "only {built} routers were built while pages were served");
    engine.stop().await;
}

/// A base path with characters a URL path cannot carry as they are panicked in the router
/// (`{id}` is a route parameter) or was served where no browser could reach it (a space).
#[tokio::test]
async fn a_base_path_a_url_cannot_carry_is_refused_with_a_clear_error() {
    let db = TestDatabase::create().await;
    let engine = Engine::builder(db.pool.clone()).redis(redis_url()).consume(false).start().await.unwrap();
    let build = |base: &str| {
        let probes = HealthProbes::new(engine.handle().pool().clone(), &db.url, &redis_url(), Duration::from_secs(2));
        console_router(engine.handle().clone(), probes, ConsoleConfig::new("target/site", base, ConsoleAuth::Off))
    };
    for bad in ["/{id}", "/{*rest}", "/ops dedup", "/ünï", "/a\"b", "/x</script>"] {
        let err = build(bad).await.err().unwrap_or_else(|| panic!("{bad} was accepted"));
        assert!(err.to_string().contains("base path"), "{bad}: {err}");
    }
    for good in ["", "/", "/ops/dedup/", "/a%20b", "/x-y_z~1.2"] {
        assert!(build(good).await.is_ok(), "{good} was refused");
    }
    engine.stop().await;
}

/// A start that fails after the engine started (here on the console's base path) stops that
/// engine: its consumers do not run on in the host's runtime, holding the queue.
#[tokio::test]
async fn a_start_that_fails_after_the_engine_started_stops_the_engine() {
    let db = TestDatabase::create().await;
    let mut settings = local_settings();
    settings.listen = "127.0.0.1:0".parse().unwrap();
    settings.database_url = db.url.as_str().into();
    let broker = TestBroker::new(settings.amqp_url.expose(), Backoff::default());
    let queue = broker.settings.queue.clone();
    settings.consumer.rabbitmq.exchange = broker.settings.exchange.clone();
    settings.consumer.rabbitmq.queue = queue.clone();
    settings.console.base_path = "/{id}".to_owned();
    let refused = Application::build(settings, false).await.err().expect("a base path with a route parameter");
    assert!(format!("{refused:#}").contains("base path"), "{refused:#}");
    // A running engine's consumer would have declared the queue and attached within this.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let consumers = broker.queue_state(&queue).await.map_or(0, |(_, consumers)| consumers);
    assert_eq!(consumers, 0, "no consumer left on {queue}");
}

/// A resolver with bugs and hostile answers: `x-user: panic` panics, `x-user: evil` refuses with
/// markup, a newline and a terminal escape; everyone else is [`gateway`]'s.
fn hostile_resolver(parts: &Parts) -> Result<Option<HostUser>, String> {
    match parts.headers.get("x-user").and_then(|v| v.to_str().ok()) {
        Some("panic") => panic!("the host's resolver has a bug"),
        Some("evil") => Err("<script>alert(1)</script>\n\u{1b}[31m<img src=x onerror=alert(2)>".to_owned()),
        _ => gateway(parts),
    }
}

#[tokio::test]
async fn a_resolver_that_panics_or_refuses_with_markup_fails_closed_and_is_shown_escaped() {
    let (address, _db) = host_app_with(hostile_resolver, false).await;
    let console = format!("{address}/ops/dedup");
    for path in ["/stuck", "/api/v1/stuck"] {
        let evil =
            as_user("evil", "viewer").get(format!("{console}{path}")).timeout(Duration::from_secs(10)).send().await;
        let evil = evil.unwrap();
        assert_eq!(evil.status(), 403, "{path}: the resolver's refusal");
        let json = evil.headers()["content-type"].to_str().unwrap().starts_with("application/json");
        let text = evil.text().await.unwrap();
        if json {
            let body: Value = serde_json::from_str(&text).unwrap();
            assert!(body["message"].as_str().unwrap().contains("<script>alert(1)"), "{path}: as JSON data: {text}");
        } else {
            assert!(!text.contains("<script>alert") && !text.contains("<img src"), "{path}: markup escaped: {text}");
            assert!(text.contains("alert(1)"), "{path}: the reason is still shown: {text}");
        }
        assert_eq!(json, path.starts_with("/api/"), "{path}: a page is HTML, the API's answer JSON");

        let panicked =
            as_user("panic", "viewer").get(format!("{console}{path}")).timeout(Duration::from_secs(10)).send().await;
        let panicked = panicked.expect("a panicking resolver answers, not a dropped connection");
        assert_eq!(panicked.status(), 500, "{path}");
        let text = panicked.text().await.unwrap();
        assert!(text.contains("internal") && !text.contains("bug"), "{path}: no panic message shown: {text}");
    }
    let after = as_user("vera", "viewer").get(format!("{console}/stuck")).send().await.unwrap();
    assert_eq!(after.status(), 200, "the console still serves everyone else");
}

#[tokio::test]
async fn a_viewer_of_the_host_is_refused_every_route_that_changes_something() {
    let (address, _db) = host_app(false).await;
    let viewer = as_user("vera", "viewer");
    let mut refused = 0;
    for (method, pattern, rule) in policy().rules() {
        if !rule.mutates || rule.access.role().is_none_or(|role| role == Role::Viewer) {
            continue;
        }
        let url = format!("{address}/ops/dedup{}", concrete(&pattern));
        let response = viewer
            .request(method.clone(), &url)
            .json(&json!({}))
            .timeout(Duration::from_secs(20))
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 403, "{method} {pattern}");
        refused += 1;
    }
    assert!(refused >= 15, "{refused} changing routes refused");
}

#[tokio::test]
async fn a_browser_like_call_without_the_csrf_token_is_refused() {
    let (address, db) = host_app(false).await;
    let (id, token) = stuck_record(&db.pool).await;
    let url = format!("{address}/ops/dedup/api/v1/records/{id}/release");
    let body = json!({"lease_token": token, "reason": "x"});
    let operator = || as_user("olivia", "operator").post(&url).json(&body);
    for (header, value) in [
        ("cookie", "session=anything"),
        ("sec-fetch-site", "same-origin"),
        ("sec-fetch-site", "cross-site"),
        ("origin", "http://evil.example"),
    ] {
        let response = operator().header(header, value).send().await.unwrap();
        assert_eq!(response.status(), 403, "{header}: {value}: refused without the token");
        assert!(response.text().await.unwrap().contains("CSRF"), "{header}: {value}: says why");
    }
    let page = as_user("olivia", "operator").get(format!("{address}/ops/dedup/stuck")).send().await.unwrap();
    let csrf = meta(&page.text().await.unwrap(), "csrf-token");
    let foreign =
        operator().header("origin", "http://evil.example").header("x-csrf-token", &csrf).send().await.unwrap();
    assert_eq!(foreign.status(), 403, "a foreign origin is refused even with the token");
    let forged = operator().header("cookie", "session=anything").header("x-csrf-token", "forged").send().await.unwrap();
    assert_eq!(forged.status(), 403, "a token that is not the user's is refused");
    let ok = operator().header("cookie", "session=anything").header("x-csrf-token", &csrf).send().await.unwrap();
    assert_eq!(ok.status(), 200, "with the user's token: done");
}
