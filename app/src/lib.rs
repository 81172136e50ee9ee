//! The dedup console's user interface (Leptos 0.8, server-rendered and hydrated).
//!
//! - `ssr` (server build): renders pages and runs the server functions, which reach the engine
//!   through [`ssr::service::ConsoleState`], provided as Leptos context by the server.
//! - `hydrate` (wasm build by cargo-leptos): makes the server-rendered pages interactive.
//!
//! The two features are never enabled together.

// The table views of the operator pages nest deep enough to pass the default limit when the
// wasm build computes their layout.
#![recursion_limit = "256"]

pub mod base;
pub mod components;
pub mod csrf;
pub mod error;
pub mod format;
pub mod pages;
#[cfg(feature = "ssr")]
pub mod ssr;
pub mod wire;

use leptos::prelude::*;
use leptos_meta::{MetaTags, Stylesheet, Title, provide_meta_context};
use leptos_router::components::{Route, Router, Routes};
use leptos_router::{SsrMode, path};

use crate::base::{BASE_META, base_path, href};
use crate::components::session::provide_session;
use crate::components::shell::ConsoleLayout;
use crate::csrf::CSRF_META;
use crate::pages::account::AccountPage;
use crate::pages::audit::AuditPage;
use crate::pages::cleanup::CleanupPage;
use crate::pages::dead_letters::DeadLettersPage;
use crate::pages::handlers::HandlersPage;
use crate::pages::login::LoginPage;
use crate::pages::overview::OverviewPage;
use crate::pages::record::RecordPage;
use crate::pages::records::RecordsPage;
use crate::pages::requeue::RequeuePage;
use crate::pages::retries::RetriesPage;
use crate::pages::stuck::StuckPage;
use crate::pages::users::UsersPage;

/// The HTML document around the app, rendered on the server only. Carries the session's CSRF
/// token in `<meta name="csrf-token">` for [`csrf::CsrfClient`], and the base path the console is
/// served under in `<meta name="dedup-base">` (see [`base`]); loads the bundle from under it.
pub fn shell(options: LeptosOptions) -> impl IntoView {
    #[cfg(feature = "ssr")]
    let csrf_token = ssr::service::auth::request_auth().csrf_token.unwrap_or_default();
    #[cfg(not(feature = "ssr"))]
    let csrf_token = String::new();
    let base = base_path();
    view! {
        <!DOCTYPE html>
        <html lang="en">
            <head>
                <meta charset="utf-8" />
                <meta name="viewport" content="width=device-width, initial-scale=1" />
                <meta name=CSRF_META content=csrf_token />
                <meta name=BASE_META content=base.clone() />
                <link rel="icon" type="image/svg+xml" href=format!("{base}/favicon.svg") />
                <AutoReload options=options.clone() />
                <BundleScripts output_name=options.output_name.to_string() base=base />
                <MetaTags />
            </head>
            <body>
                <App />
            </body>
        </html>
    }
}

/// Loads the wasm bundle (`<base>/pkg/<output_name>.js` and `.wasm`) and hydrates the page.
///
/// Leptos's `HydrationScripts` also preloads the wasm with `<link rel="preload">`, and a preload
/// holds the page's `load` event until the whole bundle (2.4 MB) has been read, from the
/// browser's cache too, although the page is rendered without it; reading it also competed with
/// the page's own HTML. Here the module script fetches the wasm once the document is parsed
/// (module scripts run then), so `load` waits only for the HTML, the CSS and the small JS glue.
/// BENCHMARKS.md ("Page loads in Chromium") has both, and the time to hydrated.
#[component]
fn BundleScripts(output_name: String, base: String) -> impl IntoView {
    // A JSON string literal, safe inside `<script>` (no `</script>` can close it early).
    let literal = |url: String| serde_json::Value::String(url).to_string().replace('<', "\\u003c");
    let js = format!("{base}/pkg/{output_name}.js");
    let wasm = format!("{base}/pkg/{output_name}.wasm");
    let script = format!(
        "import({js}).then((m) => m.default({{ module_or_path: {wasm} }}).then(() => m.hydrate()));",
        js = literal(js.clone()),
        wasm = literal(wasm),
    );
    view! {
        <link rel="modulepreload" href=js />
        <script type="module" nonce=leptos::nonce::use_nonce()>
            {script}
        </script>
    }
}

/// The console: navigation shell and route table.
///
/// Every page is rendered whole once its data is in (`SsrMode::Async`), not streamed out of
/// order: the data takes under 21 ms at p95 on 10 M records (BENCHMARKS.md), and streaming sent
/// each `<Transition>` as a chunk of its own with a script that searched the whole document for
/// its place: 52 such scripts on the stuck page (one per row's action buttons), which held the
/// browser's parser for tens of milliseconds. The overview alone still streams: its dependency
/// probes wait up to their timeout for a hanging Redis or broker, and the rest of the page must
/// not wait with them.
#[component]
pub fn App() -> impl IntoView {
    provide_meta_context();
    provide_session();
    view! {
        <Stylesheet id="leptos" href=href("/pkg/dedup-console.css") />
        <Title text="dedup console" />
        <Router base=base_path()>
            <ConsoleLayout>
                <Routes fallback=|| view! { <p class="empty">"Page not found."</p> }>
                    <Route path=path!("/") view=OverviewPage />
                    <Route path=path!("/records") view=RecordsPage ssr=SsrMode::Async />
                    <Route path=path!("/records/:id") view=RecordPage ssr=SsrMode::Async />
                    <Route path=path!("/stuck") view=StuckPage ssr=SsrMode::Async />
                    <Route path=path!("/retries") view=RetriesPage ssr=SsrMode::Async />
                    <Route path=path!("/dead-letters") view=DeadLettersPage ssr=SsrMode::Async />
                    <Route path=path!("/requeue") view=RequeuePage ssr=SsrMode::Async />
                    <Route path=path!("/handlers") view=HandlersPage ssr=SsrMode::Async />
                    <Route path=path!("/cleanup") view=CleanupPage ssr=SsrMode::Async />
                    <Route path=path!("/audit") view=AuditPage ssr=SsrMode::Async />
                    <Route path=path!("/login") view=LoginPage ssr=SsrMode::Async />
                    <Route path=path!("/users") view=UsersPage ssr=SsrMode::Async />
                    <Route path=path!("/account") view=AccountPage ssr=SsrMode::Async />
                </Routes>
            </ConsoleLayout>
        </Router>
    }
}

/// Entry point of the wasm bundle: hydrates the server-rendered body.
#[cfg(feature = "hydrate")]
#[wasm_bindgen::prelude::wasm_bindgen]
pub fn hydrate() {
    console_error_panic_hook::set_once();
    base::init_from_page();
    leptos::mount::hydrate_body(App);
}
