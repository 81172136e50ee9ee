//! The engine's public surface, listed and compared with `engine/public-api.txt`, so that it does
//! not grow (or shrink) by accident. `cargo public-api` needs a nightly toolchain; this reads the
//! sources with `syn` instead.
//!
//! Listed: every path a dependent crate can name with the default features (`rabbitmq`, `kafka`),
//! starting at `lib.rs` and following public modules and `pub use` re-exports; for each item its
//! public fields, enum variants, trait items and inherent `pub` methods and constants (wherever
//! in the crate their `impl` block sits); then, separately, what each optional feature (`http`,
//! `testing`) adds. A path that re-exports an item listed elsewhere is one `use` line. Not
//! listed: trait implementations, and the engine's internal modules the `testing` feature opens
//! for this crate's own tests (`#[doc(hidden)]`, not an API).
//!
//! After a deliberate change: `UPDATE_PUBLIC_API=1 cargo test -p dedup-engine --test public_api`
//! rewrites the file; commit it with the change. `PUBLIC_API_SRC=<dir>` lists another source tree
//! (an older commit's `engine/src`) and prints it, to compare surfaces.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::path::{Path, PathBuf};

use syn::punctuated::Punctuated;
use syn::{Attribute, Fields, ImplItem, Item, Meta, TraitItem, UseTree, Visibility};

const CRATE: &str = "dedup_engine";
const DEFAULT_FEATURES: &[&str] = &["rabbitmq", "kafka"];
/// The optional features that add to the API, and what for.
const OPTIONAL_FEATURES: &[(&str, &str)] = &[
    ("http", "HTTP handlers"),
    ("mysql", "MySQL 8 / MariaDB"),
    ("testing", "test support for this crate's and its hosts' tests"),
];

#[test]
fn the_public_api_is_the_listed_one() {
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
    if let Ok(src) = std::env::var("PUBLIC_API_SRC") {
        let listing = listing(Path::new(&src));
        println!("{listing}\n{}", summary(&listing));
        return;
    }
    let listing = listing(&manifest.join("src"));
    let file = manifest.join("public-api.txt");
    if std::env::var_os("UPDATE_PUBLIC_API").is_some() {
        std::fs::write(&file, &listing).expect("writing public-api.txt");
        return;
    }
    let committed = std::fs::read_to_string(&file).unwrap_or_default();
    if committed != listing {
        let (old, new): (BTreeSet<&str>, BTreeSet<&str>) = (committed.lines().collect(), listing.lines().collect());
        let added: Vec<&str> = new.difference(&old).copied().collect();
        let removed: Vec<&str> = old.difference(&new).copied().collect();
        panic!(
            "the engine's public API differs from engine/public-api.txt\n\nadded:\n  {}\n\nremoved:\n  {}\n\n\
             If the change is deliberate (a host needs it, and it is documented), run\n  \
             UPDATE_PUBLIC_API=1 cargo test -p dedup-engine --test public_api\nand commit engine/public-api.txt \
             with it. Otherwise keep the item pub(crate), or inside the `console` module if only the console \
             crates need it.\n\n{}",
            added.join("\n  "),
            removed.join("\n  "),
            summary(&listing)
        );
    }
}

/// The crates of this workspace that use the engine, outside their tests (which may use the
/// `testing` feature's internal modules), the engine's own doc examples and the README's code:
/// they must name public paths only. A workspace build with `--all-targets` turns `testing` on
/// for everyone, so a `dedup_engine::<internal module>` path compiles there (doc tests too) and
/// fails in `cargo build` of the binaries alone, or in a host's crate.
#[test]
fn the_workspace_crates_use_public_paths_only() {
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
    let internal: Vec<String> = parse(&manifest.join("src/lib.rs"))
        .iter()
        .filter_map(|item| match item {
            Item::Macro(m) if m.mac.path.is_ident("internal") => Some(m.mac.tokens.to_string()),
            _ => None,
        })
        .flat_map(|names| names.split(',').map(|n| n.trim().to_owned()).collect::<Vec<_>>())
        .filter(|n| !n.is_empty())
        .collect();
    assert!(internal.contains(&"pipeline".to_owned()), "internal!(…) of lib.rs not found: {internal:?}");
    let root = manifest.parent().expect("the workspace");
    let mut dirs =
        vec![manifest.join("src"), root.join("app/src"), root.join("server/src"), root.join("server/benches")];
    for example in std::fs::read_dir(root.join("examples")).expect("examples/").flatten() {
        dirs.push(example.path().join("src"));
    }
    let files = dirs.iter().flat_map(|dir| rust_files(dir)).chain([root.join("README.md")]);
    let mut found = Vec::new();
    for file in files {
        let text = std::fs::read_to_string(&file).expect("a source file");
        for module in internal_paths(&text, &internal) {
            found.push(format!("{}: dedup_engine::{module}", file.strip_prefix(root).unwrap_or(&file).display()));
        }
    }
    assert!(
        found.is_empty(),
        "these name the engine's internal modules (public only to the engine's own tests, with the \
         feature `testing`), so the binaries do not build without it:\n  {}\nUse the root re-exports \
         (dedup_engine::Engine, …), dedup_engine::rabbitmq / kafka / http, or, for the console crates, \
         dedup_engine::console.",
        found.join("\n  ")
    );
}

/// The `.rs` files below `dir`.
fn rust_files(dir: &Path) -> Vec<PathBuf> {
    let mut files = Vec::new();
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let path = entry.path();
        if path.is_dir() {
            files.extend(rust_files(&path));
        } else if path.extension().is_some_and(|e| e == "rs") {
            files.push(path);
        }
    }
    files
}

/// The internal modules `text` names after `dedup_engine::`, directly or in a `{…}` group.
fn internal_paths(text: &str, internal: &[String]) -> Vec<String> {
    let mut found = Vec::new();
    let is_internal = |name: &str| internal.iter().any(|m| m == name);
    for (at, _) in text.match_indices("dedup_engine::") {
        let rest = &text[at + "dedup_engine::".len()..];
        if let Some(group) = rest.strip_prefix('{') {
            // Top-level names of the group that go on with `::`.
            let mut depth = 0;
            let mut start = 0;
            for (i, c) in group.char_indices() {
                match c {
                    '{' => depth += 1,
                    '}' if depth == 0 => break,
                    '}' => depth -= 1,
                    ',' if depth == 0 => start = i + 1,
                    ':' if depth == 0 => {
                        let name = group[start..i].trim();
                        if is_internal(name) {
                            found.push(name.to_owned());
                        }
                        start = i + 1;
                    }
                    _ => {}
                }
            }
        } else {
            let name: String = rest.chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect();
            if rest[name.len()..].starts_with("::") && is_internal(&name) {
                found.push(name);
            }
        }
    }
    found
}

/// Counts of a listing by kind, for the failure message and for comparing trees.
fn summary(listing: &str) -> String {
    let mut kinds: BTreeMap<&str, usize> = BTreeMap::new();
    for line in listing.lines().filter(|l| !l.starts_with('#') && !l.is_empty()) {
        *kinds.entry(line.split(' ').next().unwrap_or_default()).or_default() += 1;
    }
    let total: usize = kinds.values().sum();
    let by_kind: Vec<String> = kinds.iter().map(|(k, n)| format!("{n} {k}")).collect();
    format!("{total} lines: {}", by_kind.join(", "))
}

/// The listing of the crate whose `lib.rs` is in `src`: the default features' paths, then what
/// each optional feature adds to them.
fn listing(src: &Path) -> String {
    let mut out = format!("# {CRATE}: public API with the default features ({})\n", DEFAULT_FEATURES.join(", "));
    let default = Crate::load(src, DEFAULT_FEATURES).list();
    out.push_str(&default.join("\n"));
    out.push('\n');
    for (feature, what) in OPTIONAL_FEATURES {
        let mut features = DEFAULT_FEATURES.to_vec();
        features.push(feature);
        let added: Vec<String> =
            Crate::load(src, &features).list().into_iter().filter(|line| !default.contains(line)).collect();
        if !added.is_empty() {
            out.push_str(&format!("# added by the feature `{feature}` ({what})\n{}\n", added.join("\n")));
        }
    }
    out
}

/// An item of the crate: the module it is declared in, and its name there.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
struct Def {
    module: Vec<String>,
    name: String,
}

/// What a path resolves to.
#[derive(Debug, Clone)]
enum Target {
    Def(Def),
    External(String),
}

/// The crate's modules (all of them, whatever their visibility), with their items as compiled
/// under one set of features.
struct Crate {
    modules: HashMap<Vec<String>, Vec<Item>>,
    features: Vec<String>,
}

impl Crate {
    fn load(src: &Path, features: &[&str]) -> Self {
        let mut krate = Crate { modules: HashMap::new(), features: features.iter().map(|f| f.to_string()).collect() };
        let root = vec![CRATE.to_owned()];
        let items = parse(&src.join("lib.rs"));
        krate.add_module(root, items, src.to_path_buf());
        krate
    }

    /// Adds a module and, recursively, its child modules (`dir` holds their files).
    fn add_module(&mut self, path: Vec<String>, items: Vec<Item>, dir: PathBuf) {
        let items: Vec<Item> =
            items.into_iter().filter(|i| self.enabled(attrs(i))).flat_map(|i| self.expand_internal(i)).collect();
        for item in &items {
            let Item::Mod(m) = item else { continue };
            let name = m.ident.to_string();
            let mut child = path.clone();
            child.push(name.clone());
            let child_items = match &m.content {
                Some((_, items)) => items.clone(),
                None => {
                    let file = dir.join(format!("{name}.rs"));
                    let file = if file.exists() { file } else { dir.join(&name).join("mod.rs") };
                    parse(&file)
                }
            };
            self.add_module(child, child_items, dir.join(&name));
        }
        self.modules.insert(path, items);
    }

    /// `internal!(a, b)` of `lib.rs` as the module declarations it makes: private ones, or
    /// hidden public ones with the feature `testing`. Any other item as it is.
    fn expand_internal(&self, item: Item) -> Vec<Item> {
        let Item::Macro(m) = &item else { return vec![item] };
        if !m.mac.path.is_ident("internal") {
            return vec![item];
        }
        let names = m.mac.parse_body_with(Punctuated::<syn::Ident, syn::Token![,]>::parse_terminated);
        let testing = self.features.iter().any(|f| f == "testing");
        let declare = |name: syn::Ident| -> Item {
            if testing { syn::parse_quote!(#[doc(hidden)] pub mod #name;) } else { syn::parse_quote!(mod #name;) }
        };
        names.expect("internal!(module, …)").into_iter().map(declare).collect()
    }

    /// Whether the `#[cfg]` attributes among `attrs` hold under the crate's features (`test` never does).
    fn enabled(&self, attrs: &[Attribute]) -> bool {
        attrs.iter().filter(|a| a.path().is_ident("cfg")).all(|a| {
            let meta: Meta = a.parse_args().expect("a #[cfg] predicate");
            self.holds(&meta)
        })
    }

    fn holds(&self, meta: &Meta) -> bool {
        match meta {
            Meta::Path(_) => false, // `test`, `doc`, …
            Meta::NameValue(nv) if nv.path.is_ident("feature") => match &nv.value {
                syn::Expr::Lit(syn::ExprLit { lit: syn::Lit::Str(s), .. }) => self.features.contains(&s.value()),
                _ => false,
            },
            Meta::NameValue(_) => false,
            Meta::List(list) => {
                let inner: Vec<Meta> = list
                    .parse_args_with(Punctuated::<Meta, syn::Token![,]>::parse_terminated)
                    .expect("cfg arguments")
                    .into_iter()
                    .collect();
                if list.path.is_ident("any") {
                    inner.iter().any(|m| self.holds(m))
                } else if list.path.is_ident("all") {
                    inner.iter().all(|m| self.holds(m))
                } else if list.path.is_ident("not") {
                    !inner.iter().all(|m| self.holds(m))
                } else {
                    false
                }
            }
        }
    }

    /// What `name` means inside `module`: an item declared there, or one it imports.
    fn lookup(&self, module: &[String], name: &str, seen: &mut HashSet<(Vec<String>, String)>) -> Option<Target> {
        if !seen.insert((module.to_vec(), name.to_owned())) {
            return None;
        }
        let items = self.modules.get(module)?;
        if items.iter().any(|i| ident(i).as_deref() == Some(name)) {
            return Some(Target::Def(Def { module: module.to_vec(), name: name.to_owned() }));
        }
        for item in items {
            let Item::Use(u) = item else { continue };
            for leaf in leaves(&u.tree) {
                let found = match &leaf {
                    Leaf::Named { path, alias } if alias == name => Some(self.resolve(module, path, seen)),
                    Leaf::Glob { path } => match self.resolve(module, path, seen) {
                        Target::Def(d) => self.lookup(&d.child(), name, seen),
                        Target::External(_) => None,
                    },
                    Leaf::Named { .. } => None,
                };
                if let Some(target) = found {
                    return Some(target);
                }
            }
        }
        None
    }

    /// What `path`, written inside `module`, points to.
    fn resolve(&self, module: &[String], path: &[String], seen: &mut HashSet<(Vec<String>, String)>) -> Target {
        let external = || Target::External(path.join("::"));
        let mut current: Vec<String> = module.to_vec();
        let mut rest = path;
        while let Some(first) = rest.first() {
            match first.as_str() {
                "crate" => current = vec![CRATE.to_owned()],
                "self" => {}
                "super" => {
                    current.pop();
                }
                _ => break,
            }
            rest = &rest[1..];
        }
        let Some((last, init)) = rest.split_last() else {
            let (name, module) = current.split_last().expect("a module path");
            return Target::Def(Def { module: module.to_vec(), name: name.clone() });
        };
        for segment in init {
            match self.lookup(&current, segment, seen) {
                Some(Target::Def(d)) if self.modules.contains_key(&d.child()) => current = d.child(),
                Some(Target::Def(_)) | None | Some(Target::External(_)) => return external(),
            }
        }
        self.lookup(&current, last, seen).unwrap_or_else(external)
    }

    fn item(&self, def: &Def) -> Option<&Item> {
        self.modules.get(&def.module)?.iter().find(|i| ident(i).as_deref() == Some(def.name.as_str()))
    }

    /// Inherent `pub` methods and constants, by the type they belong to.
    fn inherent_members(&self) -> HashMap<Def, Vec<(String, &'static str, bool)>> {
        let mut members: HashMap<Def, Vec<(String, &'static str, bool)>> = HashMap::new();
        for (module, items) in &self.modules {
            for item in items {
                let Item::Impl(imp) = item else { continue };
                if imp.trait_.is_some() || !self.enabled(&imp.attrs) {
                    continue;
                }
                let syn::Type::Path(ty) = imp.self_ty.as_ref() else { continue };
                let path: Vec<String> = ty.path.segments.iter().map(|s| s.ident.to_string()).collect();
                let Target::Def(def) = self.resolve(module, &path, &mut HashSet::new()) else { continue };
                for member in &imp.items {
                    let (name, kind, vis, attrs) = match member {
                        ImplItem::Fn(f) => (f.sig.ident.to_string(), "method", &f.vis, &f.attrs),
                        ImplItem::Const(c) => (c.ident.to_string(), "assoc-const", &c.vis, &c.attrs),
                        _ => continue,
                    };
                    if is_pub(vis) && self.enabled(attrs) {
                        members.entry(def.clone()).or_default().push((name, kind, hidden(attrs)));
                    }
                }
            }
        }
        members
    }

    /// The public paths, one line each, sorted.
    fn list(&self) -> Vec<String> {
        let mut paths: BTreeMap<String, Target> = BTreeMap::new();
        let mut visited = HashSet::new();
        self.walk(&[CRATE.to_owned()], CRATE, &mut paths, &mut visited);
        let mut canonical: HashMap<Def, String> = HashMap::new();
        for (path, target) in &paths {
            if let Target::Def(def) = target {
                // The shortest path names an item, the prelude only when nothing else does.
                let rank = |p: &str| (p.starts_with(&format!("{CRATE}::prelude::")), p.matches("::").count());
                let best = canonical.entry(def.clone()).or_insert_with(|| path.clone());
                if (rank(path), path) < (rank(best), &*best) {
                    *best = path.clone();
                }
            }
        }
        let members = self.inherent_members();
        let mut lines = Vec::new();
        for (path, target) in &paths {
            match target {
                Target::External(to) => lines.push(format!("use {path} = {to}")),
                Target::Def(def) if &canonical[def] != path => lines.push(format!("use {path} = {}", canonical[def])),
                Target::Def(def) => {
                    let Some(item) = self.item(def) else { continue };
                    let mark = if hidden(attrs(item)) { " #[doc(hidden)]" } else { "" };
                    lines.push(format!("{} {path}{mark}", kind(item)));
                    lines.extend(self.item_members(item, path));
                    for (name, kind, hidden) in members.get(def).into_iter().flatten() {
                        let mark = if *hidden { " #[doc(hidden)]" } else { "" };
                        lines.push(format!("{kind} {path}::{name}{mark}"));
                    }
                }
            }
        }
        lines.sort();
        lines.dedup();
        lines
    }

    /// Records the public paths of `module`, named `prefix`, and of its public modules.
    fn walk(
        &self,
        module: &[String],
        prefix: &str,
        paths: &mut BTreeMap<String, Target>,
        visited: &mut HashSet<(Vec<String>, String)>,
    ) {
        if !visited.insert((module.to_vec(), prefix.to_owned())) {
            return;
        }
        for item in self.modules.get(module).into_iter().flatten() {
            if !item_is_pub(item) {
                continue;
            }
            let mut record = |name: &str, target: Target, paths: &mut BTreeMap<String, Target>| {
                let path = format!("{prefix}::{name}");
                if let Target::Def(def) = &target
                    && self.modules.contains_key(&def.child())
                {
                    self.walk(&def.child(), &path, paths, visited);
                }
                paths.insert(path, target);
            };
            match item {
                // The internal modules the `testing` feature opens to the engine's tests.
                Item::Mod(m) if hidden(&m.attrs) => {}
                Item::Use(u) => {
                    for leaf in leaves(&u.tree) {
                        match leaf {
                            Leaf::Named { path, alias } => {
                                let target = self.resolve(module, &path, &mut HashSet::new());
                                record(&alias, target, paths);
                            }
                            Leaf::Glob { path } => {
                                let Target::Def(d) = self.resolve(module, &path, &mut HashSet::new()) else { continue };
                                for item in self.modules.get(&d.child()).into_iter().flatten() {
                                    if let (Some(name), true) = (ident(item), item_is_pub(item)) {
                                        let target = Target::Def(Def { module: d.child(), name: name.clone() });
                                        record(&name, target, paths);
                                    }
                                }
                            }
                        }
                    }
                }
                _ => {
                    let Some(name) = ident(item) else { continue };
                    record(&name, Target::Def(Def { module: module.to_vec(), name: name.clone() }), paths);
                }
            }
        }
    }
    /// The public fields, variants and trait items of `item`, listed at `path`.
    fn item_members(&self, item: &Item, path: &str) -> Vec<String> {
        let mut out = Vec::new();
        match item {
            Item::Struct(s) => match &s.fields {
                Fields::Named(named) => {
                    for f in named.named.iter().filter(|f| is_pub(&f.vis) && self.enabled(&f.attrs)) {
                        out.push(format!("field {path}.{}", f.ident.as_ref().expect("a named field")));
                    }
                }
                Fields::Unnamed(unnamed) => {
                    for (n, _) in unnamed.unnamed.iter().enumerate().filter(|(_, f)| is_pub(&f.vis)) {
                        out.push(format!("field {path}.{n}"));
                    }
                }
                Fields::Unit => {}
            },
            Item::Enum(e) => out.extend(
                e.variants.iter().filter(|v| self.enabled(&v.attrs)).map(|v| format!("variant {path}::{}", v.ident)),
            ),
            Item::Trait(t) => {
                for member in &t.items {
                    match member {
                        TraitItem::Fn(f) if self.enabled(&f.attrs) => {
                            out.push(format!("trait-method {path}::{}", f.sig.ident))
                        }
                        TraitItem::Const(c) => out.push(format!("assoc-const {path}::{}", c.ident)),
                        TraitItem::Type(t) => out.push(format!("assoc-type {path}::{}", t.ident)),
                        _ => {}
                    }
                }
            }
            _ => {}
        }
        out
    }
}

impl Def {
    /// The module path this item would be, if it is a module.
    fn child(&self) -> Vec<String> {
        let mut path = self.module.clone();
        path.push(self.name.clone());
        path
    }
}

/// One name a `use` tree brings in.
enum Leaf {
    Named { path: Vec<String>, alias: String },
    Glob { path: Vec<String> },
}

fn leaves(tree: &UseTree) -> Vec<Leaf> {
    fn go(tree: &UseTree, prefix: &mut Vec<String>, out: &mut Vec<Leaf>) {
        match tree {
            UseTree::Path(p) => {
                prefix.push(p.ident.to_string());
                go(&p.tree, prefix, out);
                prefix.pop();
            }
            UseTree::Name(n) if n.ident == "self" => {
                let alias = prefix.last().cloned().unwrap_or_default();
                out.push(Leaf::Named { path: prefix.clone(), alias });
            }
            UseTree::Name(n) => {
                let mut path = prefix.clone();
                path.push(n.ident.to_string());
                out.push(Leaf::Named { path, alias: n.ident.to_string() });
            }
            UseTree::Rename(r) => {
                let mut path = prefix.clone();
                if r.ident != "self" {
                    path.push(r.ident.to_string());
                }
                out.push(Leaf::Named { path, alias: r.rename.to_string() });
            }
            UseTree::Glob(_) => out.push(Leaf::Glob { path: prefix.clone() }),
            UseTree::Group(g) => g.items.iter().for_each(|t| go(t, prefix, out)),
        }
    }
    let mut out = Vec::new();
    go(tree, &mut Vec::new(), &mut out);
    out
}

fn parse(file: &Path) -> Vec<Item> {
    let text = std::fs::read_to_string(file).unwrap_or_else(|e| panic!("reading {}: {e}", file.display()));
    syn::parse_file(&text).unwrap_or_else(|e| panic!("parsing {}: {e}", file.display())).items
}

fn ident(item: &Item) -> Option<String> {
    Some(
        match item {
            Item::Const(i) => &i.ident,
            Item::Enum(i) => &i.ident,
            Item::Fn(i) => &i.sig.ident,
            Item::Mod(i) => &i.ident,
            Item::Static(i) => &i.ident,
            Item::Struct(i) => &i.ident,
            Item::Trait(i) => &i.ident,
            Item::Type(i) => &i.ident,
            Item::Union(i) => &i.ident,
            Item::Macro(i) => i.ident.as_ref()?,
            _ => return None,
        }
        .to_string(),
    )
}

fn kind(item: &Item) -> &'static str {
    match item {
        Item::Const(_) => "const",
        Item::Enum(_) => "enum",
        Item::Fn(_) => "fn",
        Item::Mod(_) => "mod",
        Item::Static(_) => "static",
        Item::Struct(_) => "struct",
        Item::Trait(_) => "trait",
        Item::Type(_) => "type",
        Item::Union(_) => "union",
        Item::Macro(_) => "macro",
        _ => "item",
    }
}

fn attrs(item: &Item) -> &[Attribute] {
    match item {
        Item::Const(i) => &i.attrs,
        Item::Enum(i) => &i.attrs,
        Item::Fn(i) => &i.attrs,
        Item::Impl(i) => &i.attrs,
        Item::Mod(i) => &i.attrs,
        Item::Static(i) => &i.attrs,
        Item::Struct(i) => &i.attrs,
        Item::Trait(i) => &i.attrs,
        Item::Type(i) => &i.attrs,
        Item::Union(i) => &i.attrs,
        Item::Use(i) => &i.attrs,
        Item::Macro(i) => &i.attrs,
        _ => &[],
    }
}

/// Whether the item is `pub`; exported `macro_rules!` count as public.
fn item_is_pub(item: &Item) -> bool {
    match item {
        Item::Const(i) => is_pub(&i.vis),
        Item::Enum(i) => is_pub(&i.vis),
        Item::Fn(i) => is_pub(&i.vis),
        Item::Mod(i) => is_pub(&i.vis),
        Item::Static(i) => is_pub(&i.vis),
        Item::Struct(i) => is_pub(&i.vis),
        Item::Trait(i) => is_pub(&i.vis),
        Item::Type(i) => is_pub(&i.vis),
        Item::Union(i) => is_pub(&i.vis),
        Item::Use(i) => is_pub(&i.vis),
        Item::Macro(i) => i.attrs.iter().any(|a| a.path().is_ident("macro_export")),
        _ => false,
    }
}

/// `pub`, not `pub(crate)`, `pub(super)` nor `pub(in …)`.
fn is_pub(vis: &Visibility) -> bool {
    matches!(vis, Visibility::Public(_))
}

fn hidden(attrs: &[Attribute]) -> bool {
    attrs.iter().any(|a| {
        a.path().is_ident("doc")
            && matches!(&a.meta, Meta::List(list) if list.tokens.to_string().split(',').any(|t| t.trim() == "hidden"))
    })
}
