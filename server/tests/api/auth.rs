//! Accounts on the wire: the authorisation matrix (every rule × anonymous, viewer, operator,
//! admin), CSRF, session fixation and expiry, sign-out, throttling, security headers, limits.

use std::time::Duration;

use dedup_app::ssr::web::router::{policy, unruled};
use dedup_app::ssr::web::security::access::{Access, RouteKind};
use dedup_engine::console::accounts::Role;
use reqwest::Method;
use serde_json::Value;

use crate::helpers::{PASSWORD, Session, TestApp, spawn_app, spawn_app_with};

/// A concrete URL for a route pattern (`{id}` → 1).
fn concrete(pattern: &str) -> String {
    pattern.replace("{id}", "1")
}

fn expected_ok(access: Access, role: Option<Role>) -> bool {
    match access.role() {
        None => true,
        Some(needed) => role.is_some_and(|r| r >= needed),
    }
}

#[tokio::test]
async fn every_route_has_a_rule_and_each_role_gets_what_its_rule_says() {
    assert_eq!(unruled(), Vec::<String>::new(), "pages or server functions without an access rule");
    let app = spawn_app().await;
    let sessions = [
        (Role::Viewer, app.session(Role::Viewer).await),
        (Role::Operator, app.session(Role::Operator).await),
        (Role::Admin, app.session(Role::Admin).await),
    ];
    let mut rules = policy().rules();
    // Signing out ends the session the other requests use: last.
    rules.sort_by_key(|(_, path, _)| path == "/logout");
    let mut checked = 0;
    for (method, pattern, rule) in rules {
        let url = app.url(&concrete(&pattern));
        let mut callers: Vec<(Option<Role>, reqwest::RequestBuilder)> =
            vec![(None, app.anonymous().request(method.clone(), &url))];
        for (role, Session { client, csrf }) in &sessions {
            callers.push((Some(*role), client.request(method.clone(), &url).header("x-csrf-token", csrf)));
        }
        for (role, request) in callers {
            let request = if method == Method::POST {
                request.header("content-type", "application/x-www-form-urlencoded").body("")
            } else {
                request
            };
            let response = request.timeout(Duration::from_secs(20)).send().await.expect("request sent");
            let status = response.status().as_u16();
            let location = response.headers().get("location").map(|l| l.to_str().unwrap().to_owned());
            let what = format!("{method} {pattern} as {role:?}: {status} {location:?}");
            if expected_ok(rule.access, role) {
                assert!(![401, 403].contains(&status), "{what}");
                assert!(!location.as_deref().is_some_and(|l| l.starts_with("/login?next")), "{what}");
            } else if role.is_none() && rule.kind == RouteKind::Page {
                assert_eq!(status, 303, "{what}");
                assert!(location.unwrap().starts_with("/login?next="), "{method} {pattern}");
            } else {
                assert_eq!(status, if role.is_none() { 401 } else { 403 }, "{what}");
            }
            checked += 1;
        }
    }
    assert!(checked > 100, "{checked} cases");
}

#[tokio::test]
async fn bearer_tokens_act_with_their_owners_role_and_bad_ones_are_401() {
    let app = spawn_app().await;
    assert_eq!(app.get("/api/v1/groups").await.status(), 200);
    let viewer = app.bearer(Role::Viewer);
    let users = viewer.post(app.url("/api/fn/list_users")).send().await.unwrap();
    assert_eq!(users.status(), 403);
    let admin = app.bearer(Role::Admin);
    assert_eq!(admin.post(app.url("/api/fn/list_users")).send().await.unwrap().status(), 200);
    let forged = crate::helpers::bearer_client("dct_not-a-token");
    let response = forged.get(app.url("/api/v1/groups")).send().await.unwrap();
    assert_eq!(response.status(), 401);
    assert_eq!(response.headers()["www-authenticate"], "Bearer");
    let body: Value = response.json().await.unwrap();
    assert_eq!(body["error"], "unauthorized");
}

#[tokio::test]
async fn state_changing_requests_need_this_origin_and_the_session_token() {
    let app = spawn_app().await;
    let Session { client, csrf } = app.session(Role::Admin).await;
    let create = |origin: Option<&str>, token: Option<&str>, site: Option<&str>| {
        let mut request = client.post(app.url("/api/fn/create_token")).form(&[("name", "t")]);
        if let Some(origin) = origin {
            request = request.header("origin", origin);
        }
        if let Some(token) = token {
            request = request.header("x-csrf-token", token);
        }
        if let Some(site) = site {
            request = request.header("sec-fetch-site", site);
        }
        request.send()
    };
    // A cross-origin form post (a hostile page submitting to the console) carries no token and a
    // foreign Origin; even with the right token a foreign Origin is refused.
    let cross_site_form = client
        .post(app.url("/api/fn/add_user"))
        .header("origin", "https://evil.example")
        .form(&[("name", "mallory"), ("role", "admin"), ("password", "mallory password")])
        .send()
        .await
        .unwrap();
    assert_eq!(cross_site_form.status(), 403);
    assert_eq!(create(Some("https://evil.example"), Some(&csrf), None).await.unwrap().status(), 403);
    assert_eq!(create(Some("null"), Some(&csrf), None).await.unwrap().status(), 403);
    assert_eq!(create(None, Some(&csrf), Some("cross-site")).await.unwrap().status(), 403);
    // Same origin, but no token or a wrong one.
    assert_eq!(create(Some(&app.address), None, None).await.unwrap().status(), 403);
    let wrong = create(Some(&app.address), Some("0123456789abcdef0123456789abcdef"), None).await.unwrap();
    assert_eq!(wrong.status(), 403);
    let body: Value = wrong.json().await.unwrap();
    assert!(body["Forbidden"].as_str().unwrap().contains("CSRF"), "a ConsoleError the page can show: {body}");
    // The token in a form field works too (plain HTML forms: sign-out).
    let ok = create(Some(&app.address), Some(&csrf), Some("same-origin")).await.unwrap();
    assert_eq!(ok.status(), 200, "{:?}", ok.text().await);
    let users: i64 =
        sqlx::query_scalar("SELECT count(*) FROM users WHERE name = 'mallory'").fetch_one(&app._db.pool).await.unwrap();
    assert_eq!(users, 0, "the forged request changed nothing");

    // API tokens are not cookies: no CSRF token needed, whatever the Origin.
    let bearer = app.bearer(Role::Admin);
    let response = bearer.post(app.url("/api/fn/list_tokens")).header("origin", "https://elsewhere.example");
    assert_eq!(response.send().await.unwrap().status(), 200);
    // ... but a token cannot mint another token (it would outlive its own revocation).
    let response = bearer.post(app.url("/api/fn/create_token")).form(&[("name", "ci")]).send().await.unwrap();
    assert_eq!(response.status(), 403, "server functions answer an error with its status and the error as JSON");
    let body: Value = response.json().await.unwrap();
    assert!(body["Forbidden"].as_str().unwrap().contains("signed-in session"), "{body}");
}

fn session_cookie(response: &reqwest::Response) -> Option<String> {
    response
        .headers()
        .get_all("set-cookie")
        .iter()
        .map(|v| v.to_str().unwrap().to_owned())
        .find(|c| c.starts_with("dedup_session="))
}

fn cookie_id(cookie: &str) -> &str {
    cookie.trim_start_matches("dedup_session=").split(';').next().unwrap()
}

#[tokio::test]
async fn the_session_id_changes_at_sign_in_and_the_cookie_is_locked_down() {
    let app = spawn_app().await;
    let (first, client) = app.login_as("viewer", PASSWORD).await;
    let first_cookie = session_cookie(&first).expect("a session cookie");
    for attribute in ["HttpOnly", "SameSite=Strict", "Path=/"] {
        assert!(first_cookie.contains(attribute), "{first_cookie}");
    }
    assert!(!first_cookie.contains("Secure"), "no TLS, no Secure: {first_cookie}");
    // Signing in again on the same session (as a planted id would be) gives a new id.
    let second =
        client.post(app.url("/login")).form(&[("username", "admin"), ("password", PASSWORD)]).send().await.unwrap();
    assert_eq!(second.status(), 204);
    let second_cookie = session_cookie(&second).expect("a new session cookie");
    assert_ne!(cookie_id(&first_cookie), cookie_id(&second_cookie));
    // The old id is worthless now.
    let stale = app
        .anonymous()
        .get(app.url("/api/v1/groups"))
        .header("cookie", format!("dedup_session={}", cookie_id(&first_cookie)))
        .send()
        .await
        .unwrap();
    assert_eq!(stale.status(), 401);

    let secure = spawn_app_with(|s| s.auth.secure_cookies = true).await;
    let (response, _) = secure.login_as("viewer", PASSWORD).await;
    assert!(session_cookie(&response).unwrap().contains("Secure"));
}

#[tokio::test]
async fn sessions_end_when_idle_after_the_absolute_limit_and_at_sign_out() {
    let idle = spawn_app_with(|s| s.auth.idle_timeout_secs = 1).await;
    let Session { client, .. } = idle.session(Role::Viewer).await;
    assert_eq!(client.get(idle.url("/api/v1/groups")).send().await.unwrap().status(), 200);
    tokio::time::sleep(Duration::from_millis(2500)).await;
    assert_eq!(client.get(idle.url("/api/v1/groups")).send().await.unwrap().status(), 401, "idle expiry");

    let absolute = spawn_app_with(|s| s.auth.absolute_timeout_secs = 2).await;
    let Session { client, .. } = absolute.session(Role::Viewer).await;
    for _ in 0..4 {
        assert_eq!(client.get(absolute.url("/api/v1/groups")).send().await.unwrap().status(), 200);
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(client.get(absolute.url("/api/v1/groups")).send().await.unwrap().status(), 401, "absolute expiry");

    let app = spawn_app().await;
    let Session { client, csrf } = app.session(Role::Operator).await;
    let out = client.post(app.url("/logout")).form(&[("csrf_token", csrf.as_str())]).send().await.unwrap();
    assert_eq!(out.status(), 204);
    assert_eq!(client.get(app.url("/api/v1/groups")).send().await.unwrap().status(), 401);
    let page = client.get(app.url("/records")).send().await.unwrap();
    assert_eq!(page.status(), 303, "pages send signed-out visitors to the sign-in page");
    assert_eq!(page.headers()["location"], "/login?next=%2Frecords");
    let actions = audit_actions(&app).await;
    assert!(actions.contains(&("auth.login".to_owned(), "user:operator".to_owned())), "{actions:?}");
    assert!(actions.contains(&("auth.logout".to_owned(), "user:operator".to_owned())), "{actions:?}");
}

async fn audit_actions(app: &TestApp) -> Vec<(String, String)> {
    sqlx::query_as("SELECT action, actor FROM audit_log ORDER BY id").fetch_all(&app._db.pool).await.unwrap()
}

#[tokio::test]
async fn failed_sign_ins_are_generic_throttled_per_account_and_address_and_audited() {
    let app = spawn_app_with(|s| {
        s.auth.max_failures_per_account = 3;
        s.auth.max_failures_per_address = 6;
    })
    .await;
    let (unknown, _) = app.login_as("nobody", PASSWORD).await;
    assert_eq!(unknown.status(), 401);
    let unknown: Value = unknown.json().await.unwrap();
    for _ in 0..3 {
        let (wrong, _) = app.login_as("operator", "wrong password 1").await;
        assert_eq!(wrong.status(), 401);
        assert_eq!(wrong.json::<Value>().await.unwrap(), unknown, "same answer for a wrong name or password");
    }
    let (throttled, _) = app.login_as("operator", PASSWORD).await;
    assert_eq!(throttled.status(), 429, "even the right password waits");
    assert!(throttled.headers()["retry-after"].to_str().unwrap().parse::<u64>().unwrap() > 0);
    // Another account from the same address still signs in…
    let (other, _) = app.login_as("viewer", PASSWORD).await;
    assert_eq!(other.status(), 204);
    // …until the address has failed too often (4 failures so far, 6 allowed).
    for name in ["a", "b"] {
        assert_eq!(app.login_as(name, "wrong password 1").await.0.status(), 401);
    }
    assert_eq!(app.login_as("admin", PASSWORD).await.0.status(), 429, "per address");

    // Browsers are sent back to the sign-in page with a generic message code.
    let browser = app
        .anonymous()
        .post(app.url("/login"))
        .header("accept", "text/html")
        .form(&[("username", "admin"), ("password", PASSWORD), ("next", "/stuck")])
        .send()
        .await
        .unwrap();
    assert_eq!(browser.headers()["location"], "/login?error=throttled&next=%2Fstuck");

    let actions = audit_actions(&app).await;
    let count = |action: &str| actions.iter().filter(|(a, _)| a == action).count();
    assert_eq!(count("auth.login_failed"), 6, "{actions:?}");
    assert!(count("auth.login_throttled") >= 3, "{actions:?}");
    assert!(actions.iter().filter(|(a, _)| a != "auth.login").all(|(_, actor)| actor == "anonymous"));
}

#[tokio::test]
async fn pages_carry_a_nonce_csp_and_the_other_security_headers() {
    let app = spawn_app().await;
    let response = app.get("/").await;
    assert_eq!(response.status(), 200);
    let headers = response.headers().clone();
    let csp = headers["content-security-policy"].to_str().unwrap().to_owned();
    let nonce = csp.split("'nonce-").nth(1).and_then(|s| s.split('\'').next()).expect("a nonce").to_owned();
    let script_src = csp.split(';').find(|d| d.trim().starts_with("script-src")).unwrap();
    assert!(!script_src.contains("unsafe-inline"), "{csp}");
    assert!(csp.contains("frame-ancestors 'none'"), "{csp}");
    assert_eq!(headers["x-frame-options"], "DENY");
    assert_eq!(headers["referrer-policy"], "same-origin");
    assert_eq!(headers["x-content-type-options"], "nosniff");
    let html = response.text().await.unwrap();
    let scripts = html.matches("<script").count();
    assert!(scripts > 0);
    assert_eq!(html.matches(&format!("nonce=\"{nonce}\"")).count(), scripts, "every inline script has the nonce");
    let again = app.get("/").await.headers()["content-security-policy"].to_str().unwrap().to_owned();
    assert_ne!(again, csp, "a new nonce per response");
}

#[tokio::test]
async fn oversized_bodies_and_hostile_filters_are_refused_with_clear_errors() {
    let app = spawn_app_with(|s| s.max_body_bytes = 64 * 1024).await;
    let big = "x".repeat(100 * 1024);
    let response = app.anonymous().post(app.url("/login")).form(&[("username", "a"), ("password", &big)]).send();
    assert_eq!(response.await.unwrap().status(), 413);
    for (query, says) in [
        ("status=deleted", "unknown status"),
        (&format!("prefix={}", "%41".repeat(10_000)) as &str, "the limit is 512"),
        (&format!("group={}", "g".repeat(10_000)), "the limit is 512"),
        ("stauts=dead", "unknown field `stauts`"),
    ] {
        let response = app.get(&format!("/api/v1/records?{query}")).await;
        assert_eq!(response.status(), 400, "{}", &query[..20]);
        let body: Value = response.json().await.unwrap();
        assert!(body["message"].as_str().unwrap().contains(says), "{body}");
    }
}

#[tokio::test]
async fn the_openapi_document_declares_the_bearer_scheme_and_the_401s() {
    let app = spawn_app().await;
    let doc: Value = app.anonymous().get(app.url("/api/openapi.json")).send().await.unwrap().json().await.unwrap();
    assert_eq!(doc["components"]["securitySchemes"]["bearer"]["scheme"], "bearer");
    for (path, item) in doc["paths"].as_object().unwrap() {
        for (method, operation) in item.as_object().unwrap() {
            assert!(operation["responses"]["401"].is_object(), "{method} {path} documents 401");
        }
    }
}
