//! The console as a library: [`console_router`] returns the whole console — pages, server
//! functions, REST API, server-sent events, OpenAPI document, static assets — as an
//! [`axum::Router`] for a running engine, to serve at the root or nest under any prefix of a
//! host application ([`mount`]). The prefix is chosen at run time ([`ConsoleConfig::base_path`]):
//! one build serves any.
//!
//! ```no_run
//! # async fn host(engine: &dedup_engine::Engine, probes: dedup_engine::HealthProbes,
//! #               resolver: impl dedup_app::ssr::AuthResolver) -> anyhow::Result<()> {
//! use dedup_app::ssr::mount::{ConsoleAuth, ConsoleConfig, DelegatedAuth, console_router, mount};
//!
//! let auth = ConsoleAuth::Delegated(DelegatedAuth::new(resolver, "/login"));
//! let config = ConsoleConfig::new("target/site", "/ops/dedup", auth);
//! let console = console_router(engine.handle().clone(), probes, config).await?;
//! let app = mount(axum::Router::new() /* the host's routes */, "/ops/dedup", console);
//! # Ok(()) }
//! ```
//!
//! Who may do what: the console's own accounts ([`ConsoleAuth::Accounts`], sessions and API
//! tokens), the host's ([`ConsoleAuth::Delegated`]: a resolver from the request to a user and a
//! role), or none ([`ConsoleAuth::Off`], answered to loopback clients only). Roles, CSRF checks
//! and the audit log work the same in all three. The console installs no global state: no
//! tracing subscriber (it logs through the host's), no metrics recorder (give it a Prometheus
//! handle to serve `/metrics`, or collect the engine's `dedup_*` metrics with the host's own).

use std::sync::Arc;

use axum::Router;
use dedup_engine::{EngineHandle, HealthProbes};
use leptos::prelude::LeptosOptions;

pub use super::config::{AuthMode, AuthResolver, AuthSettings, ConsoleAuth, ConsoleConfig, DelegatedAuth, HostUser};
use super::router;
use super::security::session;
use super::state::{AppState, TaskGuard};
use crate::base::ConsoleBase;
use crate::ssr::service::{ConsoleState, console_pool};
/// The axum [`console_router`] builds its router with (0.8): a host's router must be of the same
/// version to merge or nest it.
pub use axum;
/// A console user's role ([`HostUser::role`]): viewer, operator or admin.
pub use dedup_engine::console::accounts::Role;

/// The console for `engine`, with `probes` for its health panel and `/readyz`.
///
/// May be called again while other consoles serve (a second mount, a rebuild): the console's
/// page list is generated once per process. A host with its own Leptos app should generate its
/// route list before serving too: Leptos suspends data loading process-wide while it does.
///
/// Errors: a base path with characters a URL path cannot carry as they are
/// ([`ConsoleBase::validate`]); with [`ConsoleAuth::Accounts`], creating the session table (in
/// the engine's schema or, on MySQL, database) failed.
pub async fn console_router(
    engine: EngineHandle,
    probes: HealthProbes,
    config: ConsoleConfig,
) -> anyhow::Result<Router> {
    ConsoleBase::validate(&config.base_path).map_err(anyhow::Error::msg)?;
    if config.statement_timeout.is_zero() || config.statement_timeout >= config.request_timeout {
        anyhow::bail!(
            "the console's statement timeout ({} ms) must be above zero and shorter than its request timeout ({} ms)",
            config.statement_timeout.as_millis(),
            config.request_timeout.as_millis()
        );
    }
    if let Some(problem) = bundle_problem(&config.site_root) {
        tracing::warn!("{problem}");
    }
    let engine_pool = engine.pool().clone();
    let base = config.base();
    let sessions = match &config.auth {
        ConsoleAuth::Accounts(_) => Some(session::store(&engine_pool, engine.schema().as_str()).await?),
        _ => None,
    };
    let cleanup = sessions.clone().map(|store| Arc::new(TaskGuard(tokio::spawn(session::delete_expired(store)))));
    let leptos_options = LeptosOptions::builder()
        .output_name("dedup-console")
        .site_root(config.site_root.to_string_lossy().into_owned())
        .site_pkg_dir("pkg")
        .env(leptos::config::Env::PROD)
        .build();
    let host_sign_out = match &config.auth {
        ConsoleAuth::Delegated(d) => d.sign_out_url.clone(),
        _ => None,
    };
    let pool = console_pool(&engine_pool, config.statement_timeout, config.pool_size);
    let console = ConsoleState { probes, engine, pool, engine_pool, read_only: config.read_only, host_sign_out };
    let state = AppState { leptos_options, console, base, config: Arc::new(config), _cleanup: cleanup };
    Ok(router::router(state, sessions))
}

/// The script every console page loads from `<site_root>/pkg/` to hydrate (cargo-leptos's
/// output name, `[[workspace.metadata.leptos]]` in the workspace's Cargo.toml).
const BUNDLE_SCRIPT: &str = "dedup-console.js";

/// Why `site_root` cannot serve the console's browser bundle, if it cannot. The console still
/// starts: its pages render, but they never hydrate (buttons do nothing), which is easy to miss.
fn bundle_problem(site_root: &std::path::Path) -> Option<String> {
    let script = site_root.join("pkg").join(BUNDLE_SCRIPT);
    (!script.is_file()).then(|| {
        format!(
            "the console's browser bundle is missing ({} is not a file): its pages will render but not \
             hydrate, and their buttons will do nothing; build it with scripts/console-bundle from the \
             commit of your dedup-app dependency and pass that directory as site_root",
            script.display()
        )
    })
}

/// `console` served by `host` under `base_path`: nested there (`<base>/` redirects to
/// `<base>`, the console's root), or merged at the root.
pub fn mount(host: Router, base_path: &str, console: Router) -> Router {
    let base = ConsoleBase::new(base_path);
    if base.as_str().is_empty() {
        return host.merge(console);
    }
    let root = base.as_str().to_owned();
    host.route(
        &format!("{root}/"),
        axum::routing::get(move || async move { axum::response::Redirect::permanent(&root) }),
    )
    .nest(base.as_str(), console)
}

#[cfg(test)]
mod tests {
    use super::{BUNDLE_SCRIPT, bundle_problem};

    #[test]
    fn a_site_root_without_the_bundle_is_named_in_the_warning() {
        let root = std::env::temp_dir().join(format!("dedup-site-{}", std::process::id()));
        let problem = bundle_problem(&root).expect("no directory: a problem");
        assert!(problem.contains(&root.display().to_string()), "{problem}");
        assert!(problem.contains("scripts/console-bundle"), "{problem}");

        std::fs::create_dir_all(root.join("pkg")).unwrap();
        assert!(bundle_problem(&root).is_some(), "an empty pkg/ is no bundle");
        std::fs::write(root.join("pkg").join(BUNDLE_SCRIPT), "// the bundle").unwrap();
        assert_eq!(bundle_problem(&root), None);
        std::fs::remove_dir_all(&root).unwrap();
    }
}
