use std::net::SocketAddr;
use std::time::{Duration, Instant};

use dedup_app::ssr::mount::{ConsoleAuth, ConsoleConfig, console_router};
use dedup_engine::testing::{TestDatabase, redis_url};
use dedup_engine::{Engine, HealthProbes};

use crate::helpers::spawn_app;

#[tokio::test]
async fn overview_is_server_rendered_with_navigation_and_health() {
    let app = spawn_app().await;
    let response = app.get("/").await;
    assert_eq!(response.status(), 200);
    let html = response.text().await.unwrap();
    for label in ["Overview", "Records", "Stuck", "Retries", "Dead letters", "Cleanup", "Audit"] {
        assert!(html.contains(&format!(">{label}<")), "nav has {label}");
    }
    assert!(html.contains("data-testid=\"health-table\""), "health rendered on the server");
    assert!(html.contains("data-dependency=\"database\" data-state=\"up\""));
    assert!(html.contains("/pkg/dedup-console.js"), "hydration script referenced");
    // The traffic figures say what a crash can cost them (counted in memory between flushes).
    let note = html.split("data-testid=\"traffic-flush-note\"").nth(1).expect("the traffic panel's note");
    assert!(note[..300].contains("loses up to that much of its counts, never a record"), "{}", &note[..300]);
}

#[tokio::test]
async fn unknown_pages_are_404_and_responses_are_compressed_on_request() {
    let app = spawn_app().await;
    let missing = app.get("/no-such-page").await;
    assert_eq!(missing.status(), 404);
    let html = missing.text().await.unwrap();
    assert!(!html.contains("internal error"), "the 404 page renders with the console's context: {html}");

    // A trailing slash is the page without it (the 404 page rendered /records/ with an error).
    let slash = app.get("/records/?status=dead").await;
    assert_eq!(slash.status(), 308);
    assert_eq!(slash.headers()["location"], "/records?status=dead");
    // Never a redirect off the site: `//host` would be another host to a browser.
    let off_site = app.get("//evil.example/").await;
    assert_eq!(off_site.status(), 404, "{:?}", off_site.headers().get("location"));

    let compressed =
        app.client.get(format!("{}/", app.address)).header("accept-encoding", "gzip").send().await.unwrap();
    assert_eq!(compressed.headers().get("content-encoding").map(|v| v.to_str().unwrap()), Some("gzip"));
}

#[tokio::test]
async fn the_health_server_function_answers_json() {
    let app = spawn_app().await;
    let response = app
        .client
        .post(format!("{}/api/fn/get_health", app.address))
        .header("content-type", "application/x-www-form-urlencoded")
        .body("")
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200, "{:?}", response.text().await);
}

#[tokio::test]
async fn pages_load_the_bundle_under_the_base_without_holding_their_load_event() {
    let site = std::env::temp_dir().join(format!("dedup-site-{}", uuid::Uuid::new_v4().simple()));
    std::fs::create_dir_all(site.join("pkg")).unwrap();
    std::fs::write(site.join("pkg/dedup-console.wasm"), b"\0asm-test").unwrap();
    let root = site.clone();
    let app = crate::helpers::spawn_app_with(move |s| {
        s.site_root = root;
        s.console.base_path = "/ops".to_owned();
    })
    .await;
    let html = app.anonymous().get(app.url("/ops/login")).send().await.unwrap().text().await.unwrap();
    assert!(html.contains(r#"<link rel="modulepreload" href="/ops/pkg/dedup-console.js">"#), "{html}");
    assert!(html.contains(r#"import("/ops/pkg/dedup-console.js")"#), "the module script imports the glue");
    assert!(html.contains(r#"module_or_path: "/ops/pkg/dedup-console.wasm""#), "and fetches the wasm");
    // A `<link rel="preload">` of the wasm would hold `load` until the whole bundle is read.
    assert!(!html.contains(r#"rel="preload""#), "no preload of the wasm");
    let wasm = app.anonymous().get(app.url("/ops/pkg/dedup-console.wasm")).send().await.unwrap();
    assert_eq!(wasm.status(), 200);
    assert_eq!(&wasm.bytes().await.unwrap()[..], b"\0asm-test", "the bundle's file is served under that name");
    std::fs::remove_dir_all(site).unwrap();
}

#[tokio::test]
async fn pages_are_sent_whole_not_in_out_of_order_chunks() {
    let app = spawn_app().await;
    for page in ["/records", "/stuck", "/retries", "/dead-letters", "/audit"] {
        let response = app.get(page).await;
        assert_eq!(response.status(), 200, "{page}");
        let html = response.text().await.unwrap();
        // Streamed out of order, each `<Transition>` came as a `<template>` and a script that
        // searched the document for its place (the user box among them).
        assert!(!html.contains("<template"), "{page} was streamed in chunks");
        assert!(html.contains("data-testid=\"userbox\""), "{page} has the user box in place");
    }
}

/// The overview streams: a dependency that accepts connections and never answers holds its
/// health probe for the whole timeout, and the rest of the page is sent before that.
#[tokio::test]
async fn the_overview_is_shown_before_a_hanging_dependencys_probe_times_out() {
    let black_hole = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let redis = format!("redis://{}", black_hole.local_addr().unwrap());
    tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((socket, _)) = black_hole.accept().await {
            held.push(socket);
        }
    });
    let db = TestDatabase::create().await;
    let engine = Engine::builder(db.pool.clone()).redis(redis_url()).consume(false).start().await.unwrap();
    let probes = HealthProbes::new(engine.handle().pool().clone(), &db.url, &redis, Duration::from_secs(3));
    let config = ConsoleConfig::new("target/site", "", ConsoleAuth::Off);
    let console = console_router(engine.handle().clone(), probes, config).await.unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(axum::serve(listener, console.into_make_service_with_connect_info::<SocketAddr>()).into_future());

    let started = Instant::now();
    let mut page = reqwest::get(&address).await.unwrap();
    let mut html = String::new();
    while !html.contains("data-testid=\"live-toggle\"") {
        let chunk = page.chunk().await.unwrap().expect("the page goes on");
        html.push_str(&String::from_utf8_lossy(&chunk));
    }
    let shown = started.elapsed();
    while let Some(chunk) = page.chunk().await.unwrap() {
        html.push_str(&String::from_utf8_lossy(&chunk));
    }
    let whole = started.elapsed();
    assert!(shown < Duration::from_millis(1500), "the overview waited {shown:?} for the probe");
    assert!(whole >= Duration::from_millis(2500), "the probe hung for its timeout ({whole:?})");
    assert!(html.contains("data-dependency=\"redis\" data-state=\"down\""), "and then says so");
    engine.stop().await;
}

/// Client-side navigation calls the list functions with no filter at all: an empty form body.
#[tokio::test]
async fn list_server_functions_take_an_empty_filter() {
    let app = spawn_app().await;
    for endpoint in ["list_records", "get_audit"] {
        let response = app
            .client
            .post(app.url(&format!("/api/fn/{endpoint}")))
            .header("content-type", "application/x-www-form-urlencoded")
            .body("")
            .send()
            .await
            .unwrap();
        let status = response.status();
        let body = response.text().await.unwrap();
        assert!(!body.contains("missing field"), "{endpoint}: {status} {body}");
        assert_eq!(status, 200, "{endpoint}: {body}");
    }
}

/// A page whose data does not come in time says so: its statements end at the console's
/// statement timeout and the page shows that the database did not answer in time. Never 408:
/// browsers send a 408 again on their own, and the database would run the page's queries once
/// more each time.
#[tokio::test]
async fn a_page_whose_data_does_not_come_in_time_says_so() {
    let app = crate::helpers::spawn_app_with(|s| {
        s.request_timeout_ms = 5_000;
        s.console.statement_timeout_ms = 400;
    })
    .await;
    let mut lock = app._db.pool.begin().await.unwrap();
    sqlx::query("LOCK TABLE dedup_records IN ACCESS EXCLUSIVE MODE").execute(&mut *lock).await.unwrap();
    let started = Instant::now();
    let response = app.get("/records").await;
    let status = response.status();
    let html = response.text().await.unwrap();
    assert!(status == 200 || status == 503, "{status}");
    assert!(html.contains("the database did not answer in time"), "{html}");
    assert!(started.elapsed() < Duration::from_secs(3), "answered after {:?}", started.elapsed());
    lock.rollback().await.unwrap();
}
