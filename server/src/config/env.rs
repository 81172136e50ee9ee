//! `DEDUP_*` environment variables as settings, with map keys kept as written.
//!
//! A variable names a key path with `__` between its parts (`DEDUP_CONSUMER__WORKERS__BATCH_SIZE`).
//! Setting names match in any case. Where the path enters a map whose keys are data (a message
//! type `ORDER.PAY`, a producer's class name `com.acme.OrderPaid`, a header name), the part is
//! that key exactly as written, dots and case kept (figment's own environment provider lower-cases
//! it and splits it at its dots). A value that is a JSON object or array is read as JSON, so a
//! whole map or list is one variable; other values are read as figment reads them (numbers,
//! booleans, `[a, b]`, strings).

use figment::value::{Dict, Map, Value};
use figment::{Error, Metadata, Profile, Provider};

/// The paths whose `*` part is a map key, kept as written.
const MAP_KEYS: [&[&str]; 3] = [
    // Raw type value (a producer's class name) → handler type.
    &["consumer", "types", "map", "*"],
    // Message type → HTTP handler.
    &["consumer", "http", "*"],
    // An HTTP handler's extra request headers.
    &["consumer", "http", "*", "headers", "*"],
];

/// Variables `DEDUP_<KEY>` whose first part is one of `top_level` (other tools use `DEDUP_`
/// variables too: `DEDUP_BIN`, `DEDUP_CACHE_DIR`).
pub(super) struct DedupEnv {
    pub(super) top_level: &'static [&'static str],
}

impl DedupEnv {
    const PREFIX: &'static str = "DEDUP_";

    /// The variables read, sorted by name (a whole map before its single entries, which then
    /// add to it), with their key paths.
    fn variables(&self) -> Vec<(Vec<String>, String)> {
        let mut found: Vec<(String, String)> = std::env::vars_os()
            .filter_map(|(k, v)| Some((k.into_string().ok()?, v.into_string().ok()?)))
            .filter_map(|(k, v)| Some((k.strip_prefix(Self::PREFIX)?.to_owned(), v)))
            .filter(|(k, _)| {
                let top = k.split("__").next().unwrap_or_default();
                self.top_level.iter().any(|t| t.eq_ignore_ascii_case(top))
            })
            .collect();
        found.sort();
        found.into_iter().map(|(k, v)| (key_path(&k.split("__").collect::<Vec<_>>()), v)).collect()
    }
}

/// Whether part `i` of a path that begins with `before` is a map key.
fn is_map_key(before: &[String], i: usize) -> bool {
    MAP_KEYS.iter().any(|pattern| {
        pattern.len() > i
            && pattern[i] == "*"
            && pattern[..i].iter().zip(before).all(|(p, part)| *p == "*" || p.eq_ignore_ascii_case(part))
    })
}

/// The key path of a variable's parts: setting names lower-cased, map keys as written.
fn key_path(parts: &[&str]) -> Vec<String> {
    let mut path = Vec::with_capacity(parts.len());
    for (i, part) in parts.iter().enumerate() {
        let part = if is_map_key(&path, i) { (*part).to_owned() } else { part.to_ascii_lowercase() };
        path.push(part);
    }
    path
}

/// A variable's value: JSON for an object or an array, else as figment reads it.
fn value(text: &str) -> Value {
    let trimmed = text.trim_start();
    if (trimmed.starts_with('{') || trimmed.starts_with('['))
        && let Some(json) = serde_json::from_str::<serde_json::Value>(text).ok().and_then(|j| Value::serialize(j).ok())
    {
        return json;
    }
    text.parse().unwrap_or_else(|never| match never {})
}

/// Puts `value` at `path` in `dict`, making the tables on the way (a value in the way is
/// replaced: the later, longer variable wins).
fn insert(dict: &mut Dict, path: &[String], value: Value) {
    let Some((first, rest)) = path.split_first() else { return };
    if rest.is_empty() {
        dict.insert(first.clone(), value);
        return;
    }
    let entry = dict.entry(first.clone()).or_insert_with(|| Value::from(Dict::new()));
    if !matches!(entry, Value::Dict(..)) {
        *entry = Value::from(Dict::new());
    }
    if let Value::Dict(_, inner) = entry {
        insert(inner, rest, value);
    }
}

impl Provider for DedupEnv {
    fn metadata(&self) -> Metadata {
        // Errors name the variable as it would be written.
        Metadata::named("`DEDUP_` environment variable").interpolater(|_: &Profile, keys: &[&str]| {
            let mut parts: Vec<String> = Vec::with_capacity(keys.len());
            for (i, key) in keys.iter().enumerate() {
                let part = if is_map_key(&parts, i) { (*key).to_owned() } else { key.to_ascii_uppercase() };
                parts.push(part);
            }
            format!("{}{}", DedupEnv::PREFIX, parts.join("__"))
        })
    }

    fn data(&self) -> Result<Map<Profile, Dict>, Error> {
        let mut dict = Dict::new();
        for (path, text) in self.variables() {
            insert(&mut dict, &path, value(&text));
        }
        Ok(Profile::Default.collect(dict))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn map_keys_keep_their_dots_and_case_setting_names_match_in_any_case() {
        assert_eq!(key_path(&["CONSUMER", "WORKERS", "BATCH_SIZE"]), ["consumer", "workers", "batch_size"]);
        assert_eq!(
            key_path(&["CONSUMER", "TYPES", "MAP", "com.acme.OrderPaid"]),
            ["consumer", "types", "map", "com.acme.OrderPaid"]
        );
        assert_eq!(
            key_path(&["CONSUMER", "HTTP", "ORDER.PAY", "TIMEOUT_MS"]),
            ["consumer", "http", "ORDER.PAY", "timeout_ms"]
        );
        assert_eq!(
            key_path(&["consumer", "http", "ORDER.PAY", "HEADERS", "X-Api-Key"]),
            ["consumer", "http", "ORDER.PAY", "headers", "X-Api-Key"]
        );
    }
}
