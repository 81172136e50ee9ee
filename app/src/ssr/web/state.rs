//! What the web layer's handlers share: the [`AppState`] of one console and the [`RouteSpec`]
//! every route is declared with (its access rule beside its handler).

use std::sync::Arc;

use axum::http::Method;
use axum::routing::MethodRouter;
use leptos::prelude::LeptosOptions;

use super::config::ConsoleConfig;
use super::security::access::Access;
use crate::base::ConsoleBase;
use crate::ssr::service::ConsoleState;

/// State shared by the axum handlers of one console.
#[derive(Clone)]
pub struct AppState {
    /// Leptos rendering options (site root, output name).
    pub leptos_options: LeptosOptions,
    /// What the console's server functions get as context.
    pub console: ConsoleState,
    /// The base path the console is served under.
    pub base: ConsoleBase,
    /// How the console is served.
    pub config: Arc<ConsoleConfig>,
    /// The session store's cleanup, stopped with the last router.
    pub(crate) _cleanup: Option<Arc<TaskGuard>>,
}

impl axum::extract::FromRef<AppState> for LeptosOptions {
    fn from_ref(state: &AppState) -> Self {
        state.leptos_options.clone()
    }
}

/// One axum route, who may call it and whether it changes anything.
pub struct RouteSpec {
    /// The method the rule is for.
    pub method: Method,
    /// The route pattern (axum syntax, `{param}`).
    pub path: &'static str,
    /// Who may call it.
    pub access: Access,
    /// Whether it changes anything (a read-only console refuses it).
    pub mutates: bool,
    /// The handler.
    pub handler: MethodRouter<AppState>,
}

impl RouteSpec {
    /// A `GET` route (changes nothing).
    pub fn get(path: &'static str, access: Access, handler: MethodRouter<AppState>) -> Self {
        RouteSpec { method: Method::GET, path, access, mutates: false, handler }
    }

    /// A `POST` route that changes something.
    pub fn post(path: &'static str, access: Access, handler: MethodRouter<AppState>) -> Self {
        RouteSpec { method: Method::POST, path, access, mutates: true, handler }
    }

    /// A `PUT` route that changes something.
    pub fn put(path: &'static str, access: Access, handler: MethodRouter<AppState>) -> Self {
        RouteSpec { method: Method::PUT, path, access, mutates: true, handler }
    }

    /// This route changes no data (a preview, a dry run, signing in or out): a read-only
    /// console serves it.
    pub fn changes_nothing(mut self) -> Self {
        self.mutates = false;
        self
    }
}

/// Aborts its task when the last router holding it is dropped (the session store's cleanup).
pub(crate) struct TaskGuard(pub(crate) tokio::task::JoinHandle<()>);

impl Drop for TaskGuard {
    fn drop(&mut self) {
        self.0.abort();
    }
}
