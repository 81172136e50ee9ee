//! The crate's layers, read from its sources: every `use` and every `crate::`/`super::` path of
//! each module, resolved to the module it names. Two rules:
//!
//! - **Downward only.** Shared modules (`wire`, `error`, `format`, `base`, `csrf`) import only
//!   each other; the service layer (`ssr::service`) adds itself; the UI (the crate root,
//!   `pages`, `components`) adds the service layer; the web layer (`ssr::web`) may use all.
//!   So the service layer never reaches a page, a component or the HTTP side, and the UI never
//!   the HTTP side.
//! - **No circle.** No module imports, directly or through others, a module that imports it.
//!
//! A re-export (`pub use`) counts as an import. Doc comments and `#[cfg(test)] mod tests` are
//! not read.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Module path (`crate::ssr::web::router`) → its source text, without comments and tests.
fn modules() -> BTreeMap<String, String> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut found = BTreeMap::new();
    let mut dirs = vec![root.clone()];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                dirs.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                found.insert(module_of(&root, &path), code_of(&std::fs::read_to_string(&path).unwrap()));
            }
        }
    }
    found
}

fn module_of(root: &Path, file: &Path) -> String {
    let relative: PathBuf = file.strip_prefix(root).unwrap().with_extension("");
    let mut parts: Vec<String> = relative.iter().map(|p| p.to_string_lossy().into_owned()).collect();
    if matches!(parts.last().map(String::as_str), Some("mod" | "lib")) {
        parts.pop();
    }
    std::iter::once("crate".to_owned()).chain(parts).collect::<Vec<_>>().join("::")
}

/// The code of a file: comment lines dropped, and everything from its unit tests on.
fn code_of(text: &str) -> String {
    let mut code = String::new();
    let mut lines = text.lines().peekable();
    while let Some(line) = lines.next() {
        let trimmed = line.trim_start();
        if trimmed == "#[cfg(test)]" && lines.peek().is_some_and(|l| l.trim_start().starts_with("mod tests")) {
            break;
        }
        if !trimmed.starts_with("//") {
            code.push_str(line);
            code.push('\n');
        }
    }
    code
}

/// Every path `module`'s code names, absolute (`crate::…`), from `use` trees and inline paths.
fn paths_named(module: &str, code: &str) -> Vec<String> {
    let mut paths = Vec::new();
    // `use` trees, braces expanded.
    for statement in code.split(';') {
        let Some(at) = statement.match_indices("use ").map(|(i, _)| i).find(|&i| {
            let before = statement[..i].trim_end();
            before.is_empty() || before.ends_with("pub") || before.ends_with(')') || before.ends_with(['{', '}'])
        }) else {
            continue;
        };
        // Whitespace dropped but for the one of ` as `.
        let words = statement[at + 4..].split_whitespace().collect::<Vec<_>>().join(" ");
        let tree = words.replace(" as ", "\u{0}").replace(' ', "").replace('\u{0}', " as ");
        expand(&tree, &mut paths);
    }
    // Inline paths: `crate::a::b`, `super::a`.
    for start in ["crate::", "super::"] {
        let mut rest = code;
        while let Some(at) = rest.find(start) {
            let tail = &rest[at..];
            let end = tail.find(|c: char| !(c.is_alphanumeric() || c == '_' || c == ':')).unwrap_or(tail.len());
            paths.push(tail[..end].trim_end_matches(':').to_owned());
            rest = &tail[end..];
        }
    }
    paths.into_iter().filter_map(|p| absolute(module, &p)).collect()
}

/// `a::{b, c::{d}}` → `a::b`, `a::c::d`.
fn expand(tree: &str, out: &mut Vec<String>) {
    match tree.find('{') {
        None => {
            let path = tree.split(" as ").next().unwrap_or(tree).trim_end_matches("::*");
            out.push(path.to_owned());
        }
        Some(open) => {
            let prefix = &tree[..open];
            let inner = &tree[open + 1..tree.rfind('}').unwrap_or(tree.len())];
            let mut depth = 0;
            let mut part = String::new();
            for c in inner.chars().chain(std::iter::once(',')) {
                match c {
                    '{' => depth += 1,
                    '}' => depth -= 1,
                    ',' if depth == 0 => {
                        if !part.is_empty() {
                            let joined = if part == "self" {
                                prefix.trim_end_matches("::").to_owned()
                            } else {
                                format!("{prefix}{part}")
                            };
                            expand(&joined, out);
                        }
                        part.clear();
                        continue;
                    }
                    _ => {}
                }
                part.push(c);
            }
        }
    }
}

/// `path` as `crate::…` seen from `module` (`None` for other crates' paths).
fn absolute(module: &str, path: &str) -> Option<String> {
    if path.starts_with("crate::") || path == "crate" {
        return Some(path.to_owned());
    }
    let mut base: Vec<&str> = module.split("::").collect();
    let mut rest = path;
    let mut moved = false;
    while let Some(after) = rest.strip_prefix("super::").or_else(|| (rest == "super").then_some("")) {
        base.pop();
        rest = after;
        moved = true;
    }
    if !moved {
        return None;
    }
    Some(if rest.is_empty() { base.join("::") } else { format!("{}::{rest}", base.join("::")) })
}

/// The module a path lands in: its longest prefix that is a module.
fn target<'a>(modules: &'a BTreeMap<String, String>, path: &str) -> Option<&'a str> {
    let mut candidate = path.to_owned();
    loop {
        if let Some((name, _)) = modules.get_key_value(&candidate) {
            return Some(name);
        }
        let cut = candidate.rfind("::")?;
        candidate.truncate(cut);
    }
}

/// module → the modules it imports (itself and its ancestors' declarations left out).
fn graph() -> BTreeMap<String, BTreeSet<String>> {
    let modules = modules();
    let mut edges = BTreeMap::new();
    for (module, code) in &modules {
        let targets: BTreeSet<String> = paths_named(module, code)
            .iter()
            .filter_map(|p| target(&modules, p))
            .filter(|t| *t != module)
            .map(str::to_owned)
            .collect();
        edges.insert(module.clone(), targets);
    }
    edges
}

#[derive(Debug, PartialEq, PartialOrd)]
enum Layer {
    Shared,
    Service,
    Ui,
    Web,
}

fn layer(module: &str) -> Layer {
    let under = |prefix: &str| module == prefix || module.starts_with(&format!("{prefix}::"));
    if ["crate::wire", "crate::error", "crate::format", "crate::base", "crate::csrf"].iter().any(|p| under(p)) {
        Layer::Shared
    } else if under("crate::ssr::service") {
        Layer::Service
    } else if under("crate::ssr") {
        Layer::Web
    } else {
        Layer::Ui
    }
}

#[test]
fn each_layer_imports_only_downward() {
    let mut upward = Vec::new();
    for (module, targets) in graph() {
        for target in targets {
            // `crate::ssr` itself (the two layers' parent) re-exports the web layer's mount.
            let allowed = layer(&target) <= layer(&module) || module == "crate::ssr";
            if !allowed {
                upward.push(format!("{module} ({:?}) → {target} ({:?})", layer(&module), layer(&target)));
            }
        }
    }
    assert!(upward.is_empty(), "imports that run upward:\n{}", upward.join("\n"));
}

#[test]
fn no_module_imports_itself_through_others() {
    let graph = graph();
    let mut circles = Vec::new();
    for start in graph.keys() {
        // Depth-first from `start`: a path back to it is a circle.
        let mut stack: Vec<(String, Vec<String>)> = vec![(start.clone(), vec![start.clone()])];
        let mut seen = BTreeSet::new();
        while let Some((at, path)) = stack.pop() {
            for next in graph.get(&at).into_iter().flatten() {
                if next == start {
                    circles.push(path.iter().chain([start]).cloned().collect::<Vec<_>>().join(" → "));
                } else if seen.insert(next.clone()) {
                    let mut longer = path.clone();
                    longer.push(next.clone());
                    stack.push((next.clone(), longer));
                }
            }
        }
    }
    assert!(circles.is_empty(), "import circles:\n{}", circles.join("\n"));
}

#[test]
fn the_reader_sees_imports_and_circles() {
    // The checks above read what they should: a known edge of each kind is found.
    let graph = graph();
    assert!(graph["crate::ssr::web::router"].contains("crate::ssr::web::security::middleware"), "use super::…");
    assert!(graph["crate::ssr::web::api::reads"].contains("crate::ssr::service::console"), "use crate::…");
    assert!(graph["crate::pages::records"].contains("crate::ssr::service"), "inline crate:: paths");
    assert_eq!(absolute("crate::a::b", "super::c::d").as_deref(), Some("crate::a::c::d"));
    let mut expanded = Vec::new();
    expand("a::{b,c::{d,e},self}", &mut expanded);
    assert_eq!(expanded, ["a::b", "a::c::d", "a::c::e", "a"]);
}
