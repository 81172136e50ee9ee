//! Who may use what: every route, page and server function has an [`Access`] level; the
//! [`Policy`] maps each (method, route pattern) to its rule. A route without a rule is refused
//! (403), and the authorisation-matrix test fails on it.

use std::collections::HashMap;

use axum::http::Method;
use dedup_engine::console::accounts::Role;

/// The least a caller needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    /// Anyone, signed in or not (sign-in page, health probes, metrics, the OpenAPI document).
    Public,
    /// Any signed-in user: reading everything.
    Viewer,
    /// Acting on records: release, mark succeeded, requeue, drill.
    Operator,
    /// Cleanup schedules, users, settings.
    Admin,
}

impl Access {
    /// The role needed; `None` for [`Access::Public`].
    pub fn role(self) -> Option<Role> {
        match self {
            Access::Public => None,
            Access::Viewer => Some(Role::Viewer),
            Access::Operator => Some(Role::Operator),
            Access::Admin => Some(Role::Admin),
        }
    }
}

/// What kind of route a rule guards, which decides how a refusal looks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RouteKind {
    /// A console page: anonymous visitors are redirected to `/login`.
    Page,
    /// A Leptos server function: refusals are a `ConsoleError` as JSON.
    ServerFn,
    /// REST and other endpoints: refusals are the API's JSON error body.
    Api,
}

/// One rule.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rule {
    /// Who may call it.
    pub access: Access,
    /// How refusals look.
    pub kind: RouteKind,
    /// Whether it changes anything: a read-only console refuses it (403) whatever the role.
    pub mutates: bool,
}

/// The rules by (method, route pattern as axum matched it, e.g. `/api/v1/records/{id}`).
#[derive(Debug, Clone, Default)]
pub struct Policy {
    rules: HashMap<(Method, String), Rule>,
}

impl Policy {
    /// Adds a rule.
    pub fn insert(&mut self, method: Method, path: &str, rule: Rule) {
        self.rules.insert((method, path.to_owned()), rule);
    }

    /// The rule of a route; `HEAD` uses the `GET` rule.
    pub fn rule(&self, method: &Method, path: &str) -> Option<Rule> {
        let method = if method == Method::HEAD { &Method::GET } else { method };
        self.rules.get(&(method.clone(), path.to_owned())).copied()
    }

    /// The methods with a rule for `path`, sorted.
    pub fn methods(&self, path: &str) -> Vec<Method> {
        let mut methods: Vec<Method> = self.rules.keys().filter(|(_, p)| p == path).map(|(m, _)| m.clone()).collect();
        methods.sort_by(|a, b| a.as_str().cmp(b.as_str()));
        methods
    }

    /// Every rule, sorted by path then method.
    pub fn rules(&self) -> Vec<(Method, String, Rule)> {
        let mut all: Vec<_> = self.rules.iter().map(|((m, p), r)| (m.clone(), p.clone(), *r)).collect();
        all.sort_by(|a, b| (&a.1, a.0.as_str()).cmp(&(&b.1, b.0.as_str())));
        all
    }
}
