//! The console's base path: the prefix it is served under (`""` at the root, `/ops/dedup` when a
//! host nests it there), chosen at run time, so one build serves any prefix.
//!
//! On the server it comes from [`ConsoleBase`], provided as context for every request; the
//! shell writes it into `<meta name="dedup-base">`, and the browser reads it from there at
//! hydration (`init_from_page`, built for the browser only), so both render the same links. Every link, form action and
//! URL the app builds goes through [`href`]; the router matches routes under the base, and
//! server functions are called under it (`server_fn`'s server URL, set at hydration).

use leptos::prelude::*;

/// The `name` of the `<meta>` element holding the base path.
pub const BASE_META: &str = "dedup-base";

/// The base path of the console on the server side: empty, or `/`-prefixed without a trailing
/// slash (`/ops/dedup`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ConsoleBase(pub String);

impl ConsoleBase {
    /// Normalises a configured base path: `""` and `"/"` are the root; otherwise one leading
    /// slash, no trailing slash (`ops/dedup/` → `/ops/dedup`).
    pub fn new(path: &str) -> Self {
        let trimmed = path.trim().trim_matches('/');
        if trimmed.is_empty() { Self(String::new()) } else { Self(format!("/{trimmed}")) }
    }

    /// Checks a configured base path before it is served: only the characters a URL path carries
    /// as they are (RFC 3986 `pchar`: letters, digits, `-._~!$&'()*+,;=:@`, `%` escapes, and
    /// `/`). Others (spaces, non-ASCII, quotes, `{}`) would reach the router encoded and never
    /// match, or be taken for route parameters.
    ///
    /// Errors: the first character that is not allowed, with its position.
    pub fn validate(path: &str) -> Result<(), String> {
        let allowed = |c: char| c.is_ascii_alphanumeric() || "-._~!$&'()*+,;=:@%/".contains(c);
        match path.trim().char_indices().find(|(_, c)| !allowed(*c)) {
            None => Ok(()),
            Some((at, c)) => Err(format!(
                "the console's base path {path:?} has {c:?} at byte {at}: use letters, digits, `/` and \
                 -._~!$&'()*+,;=:@ (percent-encode anything else)"
            )),
        }
    }

    /// The base path (`""` at the root).
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// `path` (absolute, `/`-prefixed) under the base. The console's root under a base is the
    /// base itself (`/ops/dedup`, not `/ops/dedup/`: a nested router answers only the former).
    pub fn join(&self, path: &str) -> String {
        join(&self.0, path)
    }
}

#[cfg(feature = "hydrate")]
static PAGE_BASE: std::sync::OnceLock<String> = std::sync::OnceLock::new();

/// Reads the base path from the page's `<meta name="dedup-base">` and makes server functions
/// call under it. Called once, at hydration.
#[cfg(feature = "hydrate")]
pub fn init_from_page() {
    let base = document()
        .query_selector(&format!("meta[name=\"{BASE_META}\"]"))
        .ok()
        .flatten()
        .and_then(|meta| meta.get_attribute("content"))
        .unwrap_or_default();
    let base = PAGE_BASE.get_or_init(|| base);
    if !base.is_empty() {
        // Server functions are registered under `/api/fn/…`; the host serves them under the base.
        let _ = leptos::server_fn::client::try_set_server_url(base.as_str());
    }
}

/// The base path of this page (`""` at the root).
pub fn base_path() -> String {
    #[cfg(feature = "hydrate")]
    {
        PAGE_BASE.get().cloned().unwrap_or_default()
    }
    #[cfg(not(feature = "hydrate"))]
    {
        use_context::<ConsoleBase>().unwrap_or_default().0
    }
}

/// `path` (absolute, `/`-prefixed: `/records/7`, `/?range=7d`) under the console's base path.
pub fn href(path: &str) -> String {
    join(&base_path(), path)
}

/// `base` + `path`, without the slash of the root under a base (`/x/y` + `/?a` → `/x/y?a`).
fn join(base: &str, path: &str) -> String {
    match path.strip_prefix('/') {
        Some(rest) if !base.is_empty() && (rest.is_empty() || rest.starts_with('?') || rest.starts_with('#')) => {
            format!("{base}{rest}")
        }
        _ => format!("{base}{path}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base_paths_are_normalised() {
        assert_eq!(ConsoleBase::new("").as_str(), "");
        assert_eq!(ConsoleBase::new("/").as_str(), "");
        assert_eq!(ConsoleBase::new("ops/dedup/").as_str(), "/ops/dedup");
        assert_eq!(ConsoleBase::new("/x/y").join("/records"), "/x/y/records");
        assert_eq!(ConsoleBase::new("").join("/records"), "/records");
        assert_eq!(ConsoleBase::new("/x/y").join("/"), "/x/y");
        assert_eq!(ConsoleBase::new("/x/y").join("/?range=7d"), "/x/y?range=7d");
        assert_eq!(ConsoleBase::new("").join("/"), "/");
    }
}
