//! No loop of imports between the files of one crate (issue 49): a file reads
//! top to bottom as one idea resting only on what lies below it.
//!
//! For every lib and bin target of every workspace package (`cargo
//! metadata`), the module tree is read from the target's root through its
//! `mod` declarations (`#[path]` included). Each file is a node, and so is
//! each inline `mod name { … }` (`file.rs#name`). An edge runs from a file to
//! the file that defines a name it takes:
//! - every leaf of a `use` (`crate::`, `super::`, `self::`, a child module or
//!   an earlier binding first; nested `{}` groups; `as`; `*`);
//! - every path in code that starts with `crate::`, `super::`, `self::`, a
//!   child module or a name the file imported (`config::Config` after
//!   `use crate::config;`).
//!
//! A name is followed through re-exports (`pub use` in a `mod.rs` or
//! `lib.rs`, glob re-exports too) to the file that defines it, so a `mod.rs`
//! that only re-exports is no part of a loop unless it defines something a
//! child takes. `mod x;` alone is no edge.
//!
//! Tests are not part of the graph: a module declared under `#[cfg(test)]`
//! (inline or a file of its own), any item under `#[cfg(test)]`, and any file
//! named `*_tests.rs` or `tests.rs`.
//!
//! `bench/code-shape.sh` prints this test's report (`--nocapture`).

mod common;

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::path::{Path, PathBuf};

/// Loops in parts that other hands are breaking in parallel (issue 49): a
/// loop whose files all lie under one of these prefixes is reported but does
/// not fail the test. Emptied when those branches are merged; an entry that
/// matches no loop fails the test, so none outlives its reason.
const KNOWN_LOOPS_OWNED_ELSEWHERE: &[&str] = &[];

fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

/// (package name, target name, root file) of every lib and bin target.
fn targets() -> Vec<(String, String, PathBuf)> {
    let m = common::workspace_metadata();
    let mut t = Vec::new();
    for p in m["packages"].as_array().unwrap() {
        for target in p["targets"].as_array().unwrap() {
            let kinds: Vec<&str> = target["kind"]
                .as_array()
                .unwrap()
                .iter()
                .filter_map(|k| k.as_str())
                .collect();
            if kinds
                .iter()
                .any(|k| ["lib", "rlib", "bin", "proc-macro"].contains(k))
            {
                t.push((
                    p["name"].as_str().unwrap().to_string(),
                    target["name"].as_str().unwrap().to_string(),
                    PathBuf::from(target["src_path"].as_str().unwrap()),
                ));
            }
        }
    }
    t.sort();
    t
}

// ---------------------------------------------------------------------------
// Lexing: comments dropped, strings one token each, structure kept.

fn is_ident(c: u8) -> bool {
    c.is_ascii_alphanumeric() || c == b'_'
}

#[derive(Clone, Debug, PartialEq)]
enum Tok {
    Ident(String),
    Punct(String),
    Str(String),
}

fn tokens(text: &str) -> Vec<Tok> {
    let b = text.as_bytes();
    let mut t = Vec::new();
    let mut i = 0;
    while i < b.len() {
        let c = b[i];
        if c.is_ascii_whitespace() {
            i += 1;
        } else if c == b'/' && b.get(i + 1) == Some(&b'/') {
            while i < b.len() && b[i] != b'\n' {
                i += 1;
            }
        } else if c == b'/' && b.get(i + 1) == Some(&b'*') {
            let mut depth = 0;
            while i < b.len() {
                if b[i..].starts_with(b"/*") {
                    depth += 1;
                    i += 2;
                } else if b[i..].starts_with(b"*/") {
                    depth -= 1;
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    i += 1;
                }
            }
        } else if let Some((s, end)) = raw_string(b, i) {
            t.push(Tok::Str(text[s.0..s.1].to_string()));
            i = end;
        } else if c == b'"' || (c == b'b' && b.get(i + 1) == Some(&b'"')) {
            let s = if c == b'b' { i + 2 } else { i + 1 };
            let mut k = s;
            while k < b.len() && b[k] != b'"' {
                k += if b[k] == b'\\' { 2 } else { 1 };
            }
            let k = k.min(b.len());
            t.push(Tok::Str(text[s..k].to_string()));
            i = k + 1;
        } else if c == b'\'' || (c == b'b' && b.get(i + 1) == Some(&b'\'')) {
            // A char literal ('a', '\n', '\u{..}', 'é') or a lifetime ('a).
            let s = if c == b'b' { i + 1 } else { i };
            if b.get(s + 1) == Some(&b'\\') {
                let mut k = s + 2;
                while k < b.len() && b[k] != b'\'' {
                    k += 1;
                }
                i = k + 1;
            } else if let Some(ch) = text[s + 1..].chars().next() {
                let after = s + 1 + ch.len_utf8();
                if b.get(after) == Some(&b'\'') {
                    i = after + 1;
                } else {
                    t.push(Tok::Punct("'".into()));
                    i = s + 1;
                }
            } else {
                i = s + 1;
            }
        } else if is_ident(c) {
            let s = i;
            while i < b.len() && is_ident(b[i]) {
                i += 1;
            }
            t.push(Tok::Ident(text[s..i].to_string()));
        } else if c == b':' && b.get(i + 1) == Some(&b':') {
            t.push(Tok::Punct("::".into()));
            i += 2;
        } else {
            let ch = text[i..].chars().next().unwrap();
            t.push(Tok::Punct(ch.to_string()));
            i += ch.len_utf8();
        }
    }
    t
}

/// A raw string at `i` (`r"…"`, `r#"…"#`, `br"…"`): its body and its end.
fn raw_string(b: &[u8], i: usize) -> Option<((usize, usize), usize)> {
    if i > 0 && is_ident(b[i - 1]) {
        return None;
    }
    let r = if b.get(i) == Some(&b'b') { i + 1 } else { i };
    if b.get(r) != Some(&b'r') {
        return None;
    }
    let mut k = r + 1;
    while b.get(k) == Some(&b'#') {
        k += 1;
    }
    if b.get(k) != Some(&b'"') {
        return None;
    }
    let hashes = k - r - 1;
    let mut close = vec![b'"'];
    close.extend(std::iter::repeat_n(b'#', hashes));
    let body = k + 1;
    let mut e = body;
    while e < b.len() && !b[e..].starts_with(&close) {
        e += 1;
    }
    Some(((body, e.min(b.len())), (e + close.len()).min(b.len())))
}

fn is_p(t: Option<&Tok>, p: &str) -> bool {
    matches!(t, Some(Tok::Punct(x)) if x == p)
}

fn is_i(t: Option<&Tok>, p: &str) -> bool {
    matches!(t, Some(Tok::Ident(x)) if x == p)
}

/// The index past the item starting at `i`: its `;` at depth 0 or its
/// closing brace, whichever comes first.
fn item_end(t: &[Tok], mut i: usize) -> usize {
    let mut depth = 0i32;
    while i < t.len() {
        match &t[i] {
            Tok::Punct(p) if p == "{" || p == "(" || p == "[" => depth += 1,
            Tok::Punct(p) if p == "}" || p == ")" || p == "]" => {
                depth -= 1;
                if depth == 0 && p == "}" {
                    return i + 1;
                }
            }
            Tok::Punct(p) if p == ";" && depth == 0 => return i + 1,
            _ => {}
        }
        i += 1;
    }
    t.len()
}

/// The index past an attribute `#[ … ]` or `#![ … ]` starting at `i`.
fn attr_end(t: &[Tok], i: usize) -> usize {
    let mut k = i + 1;
    if is_p(t.get(k), "!") {
        k += 1;
    }
    let mut depth = 0;
    while k < t.len() {
        if is_p(t.get(k), "[") {
            depth += 1;
        } else if is_p(t.get(k), "]") {
            depth -= 1;
            if depth == 0 {
                return k + 1;
            }
        }
        k += 1;
    }
    t.len()
}

// ---------------------------------------------------------------------------
// One node: a file, or an inline module of one.

/// A path as written: absolute in the crate (`crate`, then segments), or
/// outside the crate.
#[derive(Clone, Debug)]
enum Target {
    Crate(Vec<String>),
    Extern,
}

#[derive(Default, Debug)]
struct Node {
    label: String,
    module: Vec<String>,
    children: HashMap<String, usize>,
    /// Raw `use` leaves: (path as written, bound name or None for a glob).
    uses: Vec<(Vec<String>, Option<String>)>,
    /// Paths in code (two or more segments).
    code_paths: Vec<Vec<String>>,
    items: HashSet<String>,
    /// Resolved later from `uses`.
    bindings: HashMap<String, Target>,
    globs: Vec<Target>,
}

struct Tree {
    nodes: Vec<Node>,
}

const ITEM_KEYWORDS: [&str; 8] = [
    "struct", "enum", "fn", "const", "static", "type", "trait", "union",
];

impl Tree {
    fn read(root: &Path) -> Tree {
        let mut tree = Tree { nodes: Vec::new() };
        tree.file(root, Vec::new(), root.parent().unwrap().to_path_buf());
        tree.resolve_bindings();
        tree
    }

    fn label(path: &Path) -> String {
        path.strip_prefix(workspace_root())
            .unwrap_or(path)
            .display()
            .to_string()
    }

    /// Reads one file as module `module`, whose child files lie in `dir`.
    fn file(&mut self, path: &Path, module: Vec<String>, dir: PathBuf) -> Option<usize> {
        let src = std::fs::read_to_string(path).ok()?;
        let t = tokens(&src);
        Some(self.node(Self::label(path), module, dir, path, &t))
    }

    fn node(
        &mut self,
        label: String,
        module: Vec<String>,
        dir: PathBuf,
        file: &Path,
        t: &[Tok],
    ) -> usize {
        let id = self.nodes.len();
        self.nodes.push(Node {
            label: label.clone(),
            module: module.clone(),
            ..Node::default()
        });
        let mut i = 0;
        let mut path_attr: Option<String> = None;
        while i < t.len() {
            if is_p(t.get(i), "#") && (is_p(t.get(i + 1), "[") || is_p(t.get(i + 1), "!")) {
                let end = attr_end(t, i);
                let inner: Vec<&Tok> = t[i..end].iter().collect();
                let is_test = inner.len() >= 6
                    && is_i(inner.get(2).copied(), "cfg")
                    && is_p(inner.get(3).copied(), "(")
                    && is_i(inner.get(4).copied(), "test")
                    && is_p(inner.get(5).copied(), ")");
                if is_i(inner.get(2).copied(), "path") {
                    if let Some(Tok::Str(p)) = inner.get(4) {
                        path_attr = Some(p.to_string());
                    }
                }
                if is_test && !is_p(t.get(i + 1), "!") {
                    // Skip the attributes that follow, then the item.
                    let mut k = end;
                    while is_p(t.get(k), "#") {
                        k = attr_end(t, k);
                    }
                    i = item_end(t, k);
                    path_attr = None;
                    continue;
                }
                i = end;
                continue;
            }
            if is_i(t.get(i), "mod") {
                if let Some(Tok::Ident(name)) = t.get(i + 1) {
                    let name = name.clone();
                    if is_p(t.get(i + 2), ";") {
                        let child_path = match path_attr.take() {
                            Some(p) => file.parent().unwrap().join(p),
                            None => {
                                let a = dir.join(format!("{name}.rs"));
                                if a.exists() {
                                    a
                                } else {
                                    dir.join(&name).join("mod.rs")
                                }
                            }
                        };
                        let fname = child_path
                            .file_name()
                            .unwrap()
                            .to_string_lossy()
                            .to_string();
                        let mut m = module.clone();
                        m.push(name.clone());
                        let child_dir = if fname == "mod.rs" {
                            child_path.parent().unwrap().to_path_buf()
                        } else {
                            child_path.with_extension("")
                        };
                        if !(fname.ends_with("_tests.rs") || fname == "tests.rs") {
                            if let Some(c) = self.file(&child_path, m, child_dir) {
                                self.nodes[id].children.insert(name, c);
                            }
                        }
                        i += 3;
                        continue;
                    }
                    if is_p(t.get(i + 2), "{") {
                        let end = item_end(t, i + 2);
                        let mut m = module.clone();
                        m.push(name.clone());
                        let c = self.node(
                            format!("{label}#{name}"),
                            m,
                            dir.join(&name),
                            file,
                            &t[i + 3..end - 1],
                        );
                        self.nodes[id].children.insert(name, c);
                        i = end;
                        continue;
                    }
                }
            }
            path_attr = None;
            if is_i(t.get(i), "use") && (i == 0 || !is_p(t.get(i - 1), "::")) {
                let end = (i..t.len())
                    .find(|&k| is_p(t.get(k), ";"))
                    .map_or(t.len(), |k| k + 1);
                let mut leaves = Vec::new();
                use_tree(&t[i + 1..end - 1], Vec::new(), &mut leaves);
                self.nodes[id].uses.extend(leaves);
                i = end;
                continue;
            }
            if let Some(Tok::Ident(kw)) = t.get(i) {
                if ITEM_KEYWORDS.contains(&kw.as_str()) || kw == "macro_rules" {
                    let mut k = i + 1;
                    if is_p(t.get(k), "!") {
                        k += 1;
                    }
                    if let Some(Tok::Ident(n)) = t.get(k) {
                        if !ITEM_KEYWORDS.contains(&n.as_str()) && n != "mut" {
                            self.nodes[id].items.insert(n.clone());
                        }
                    }
                }
                // A path in code: ident (:: ident)+, not after `::`.
                if !(i > 0 && is_p(t.get(i - 1), "::")) && is_p(t.get(i + 1), "::") {
                    let mut p = vec![kw.clone()];
                    let mut k = i + 1;
                    while is_p(t.get(k), "::") {
                        match t.get(k + 1) {
                            Some(Tok::Ident(n)) => p.push(n.clone()),
                            _ => break,
                        }
                        k += 2;
                    }
                    if p.len() >= 2 {
                        self.nodes[id].code_paths.push(p);
                    }
                    i = k;
                    continue;
                }
            }
            i += 1;
        }
        id
    }

    /// Turns each node's `use` leaves into bindings (name -> target).
    fn resolve_bindings(&mut self) {
        for id in 0..self.nodes.len() {
            let uses = std::mem::take(&mut self.nodes[id].uses);
            for (path, bound) in &uses {
                let target = self.absolute(id, path);
                match bound {
                    Some(name) if name != "_" => {
                        self.nodes[id].bindings.insert(name.clone(), target);
                    }
                    Some(_) => {}
                    None => self.nodes[id].globs.push(target),
                }
            }
            self.nodes[id].uses = uses;
        }
    }

    /// A path as written in node `id`, made absolute.
    fn absolute(&self, id: usize, path: &[String]) -> Target {
        let n = &self.nodes[id];
        let first = match path.first() {
            Some(f) => f.as_str(),
            None => return Target::Extern,
        };
        let mut m = match first {
            "crate" => Vec::new(),
            "self" => n.module.clone(),
            "super" => n.module.clone(),
            _ if n.children.contains_key(first) => {
                let mut m = n.module.clone();
                m.extend(path.iter().cloned());
                return Target::Crate(m);
            }
            _ => match n.bindings.get(first) {
                Some(Target::Crate(b)) => {
                    let mut m = b.clone();
                    m.extend(path[1..].iter().cloned());
                    return Target::Crate(m);
                }
                _ => return Target::Extern,
            },
        };
        let mut rest = &path[1..];
        if first == "super" {
            m.pop();
        }
        while rest.first().map(String::as_str) == Some("super") {
            m.pop();
            rest = &rest[1..];
        }
        m.extend(rest.iter().cloned());
        Target::Crate(m)
    }

    /// The node defining the item at `path` (from the crate root) and the
    /// item's name; None for a module or something outside the crate.
    fn find(&self, path: &[String], depth: usize) -> Option<(usize, String, bool)> {
        if depth > 24 {
            return None;
        }
        let mut cur = 0;
        for (k, seg) in path.iter().enumerate() {
            let n = &self.nodes[cur];
            if let Some(&c) = n.children.get(seg) {
                cur = c;
                continue;
            }
            if let Some(Target::Crate(b)) = n.bindings.get(seg) {
                let mut p = b.clone();
                p.extend(path[k + 1..].iter().cloned());
                return self.find(&p, depth + 1);
            }
            if n.bindings.contains_key(seg) {
                return None;
            }
            if n.items.contains(seg) {
                return Some((cur, seg.clone(), true));
            }
            for g in &n.globs {
                if let Target::Crate(b) = g {
                    let mut p = b.clone();
                    p.extend(path[k..].iter().cloned());
                    if let Some(found) = self.find(&p, depth + 1) {
                        if found.2 {
                            return Some(found);
                        }
                    }
                }
            }
            return Some((cur, seg.clone(), false));
        }
        None
    }

    /// Edges: (from, to) -> names taken.
    fn edges(&self) -> BTreeMap<(usize, usize), BTreeSet<String>> {
        let mut e: BTreeMap<(usize, usize), BTreeSet<String>> = BTreeMap::new();
        for (id, n) in self.nodes.iter().enumerate() {
            let mut add = |path: &[String], glob: bool| {
                if let Target::Crate(p) = self.absolute(id, path) {
                    let found = if glob {
                        self.module_node(&p).map(|m| (m, "*".to_string()))
                    } else {
                        self.find(&p, 0).map(|(f, name, _)| (f, name))
                    };
                    if let Some((to, name)) = found {
                        if to != id {
                            e.entry((id, to)).or_default().insert(name);
                        }
                    }
                }
            };
            for (path, bound) in &n.uses {
                add(path, bound.is_none());
            }
            for p in &n.code_paths {
                let first = p[0].as_str();
                if matches!(first, "crate" | "self" | "super")
                    || n.children.contains_key(first)
                    || matches!(n.bindings.get(first), Some(Target::Crate(_)))
                {
                    add(p, false);
                }
            }
        }
        e
    }

    /// The node of the module at `path`, following re-exported modules.
    fn module_node(&self, path: &[String]) -> Option<usize> {
        let mut cur = 0;
        for (k, seg) in path.iter().enumerate() {
            let n = &self.nodes[cur];
            if let Some(&c) = n.children.get(seg) {
                cur = c;
            } else if let Some(Target::Crate(b)) = n.bindings.get(seg) {
                let mut p = b.clone();
                p.extend(path[k + 1..].iter().cloned());
                return self.module_node(&p);
            } else {
                return None;
            }
        }
        Some(cur)
    }
}

/// The leaves of a use tree: (path, bound name; None for a glob).
fn use_tree(t: &[Tok], prefix: Vec<String>, out: &mut Vec<(Vec<String>, Option<String>)>) {
    // Split at top-level commas.
    let mut parts: Vec<&[Tok]> = Vec::new();
    let (mut depth, mut start) = (0, 0);
    for (k, tok) in t.iter().enumerate() {
        if is_p(Some(tok), "{") {
            depth += 1;
        } else if is_p(Some(tok), "}") {
            depth -= 1;
        } else if is_p(Some(tok), ",") && depth == 0 {
            parts.push(&t[start..k]);
            start = k + 1;
        }
    }
    parts.push(&t[start..]);
    for part in parts {
        let mut path = prefix.clone();
        let mut k = 0;
        // `pub(crate) use` was cut at `use`; a leading `::` means extern.
        if is_p(part.first(), "::") {
            path.push("::".into());
            k = 1;
        }
        let mut done = false;
        while k < part.len() {
            match &part[k] {
                Tok::Ident(s) if s == "as" => {
                    if let Some(Tok::Ident(alias)) = part.get(k + 1) {
                        out.push((path.clone(), Some(alias.clone())));
                    }
                    done = true;
                    break;
                }
                Tok::Ident(s) => path.push(s.clone()),
                Tok::Punct(p) if p == "::" => {}
                Tok::Punct(p) if p == "*" => {
                    out.push((path.clone(), None));
                    done = true;
                    break;
                }
                Tok::Punct(p) if p == "{" => {
                    let end = part.len() - 1;
                    use_tree(&part[k + 1..end], path.clone(), out);
                    done = true;
                    break;
                }
                _ => {}
            }
            k += 1;
        }
        if !done && path.len() > prefix.len() {
            let last = path.last().unwrap().clone();
            if last == "self" {
                path.pop();
                let name = path.last().cloned();
                out.push((path, name));
            } else {
                out.push((path, Some(last)));
            }
        }
    }
}

// ---------------------------------------------------------------------------
// Loops: strongly connected components (Tarjan).

fn components(n: usize, edges: &BTreeMap<(usize, usize), BTreeSet<String>>) -> Vec<Vec<usize>> {
    let mut adj = vec![Vec::new(); n];
    for &(a, b) in edges.keys() {
        adj[a].push(b);
    }
    struct S<'a> {
        adj: &'a [Vec<usize>],
        index: Vec<Option<usize>>,
        low: Vec<usize>,
        on: Vec<bool>,
        stack: Vec<usize>,
        next: usize,
        out: Vec<Vec<usize>>,
    }
    fn visit(s: &mut S, v: usize) {
        s.index[v] = Some(s.next);
        s.low[v] = s.next;
        s.next += 1;
        s.stack.push(v);
        s.on[v] = true;
        for &w in &s.adj[v].clone() {
            match s.index[w] {
                None => {
                    visit(s, w);
                    s.low[v] = s.low[v].min(s.low[w]);
                }
                Some(iw) if s.on[w] => s.low[v] = s.low[v].min(iw),
                _ => {}
            }
        }
        if Some(s.low[v]) == s.index[v] {
            let mut c = Vec::new();
            loop {
                let w = s.stack.pop().unwrap();
                s.on[w] = false;
                c.push(w);
                if w == v {
                    break;
                }
            }
            if c.len() > 1 {
                c.sort();
                s.out.push(c);
            }
        }
    }
    let mut s = S {
        adj: &adj,
        index: vec![None; n],
        low: vec![0; n],
        on: vec![false; n],
        stack: Vec::new(),
        next: 0,
        out: Vec::new(),
    };
    for v in 0..n {
        if s.index[v].is_none() {
            visit(&mut s, v);
        }
    }
    s.out
}

/// Every loop of every target: (package, files, lines "a takes X, Y from b").
fn loops() -> Vec<(String, Vec<String>, Vec<String>)> {
    let mut seen = BTreeSet::new();
    let mut all = Vec::new();
    for (package, _target, root) in targets() {
        let tree = Tree::read(&root);
        let edges = tree.edges();
        for c in components(tree.nodes.len(), &edges) {
            let files: Vec<String> = c.iter().map(|&i| tree.nodes[i].label.clone()).collect();
            if !seen.insert(files.clone()) {
                continue;
            }
            let mut lines = Vec::new();
            for (&(a, b), names) in &edges {
                if c.contains(&a) && c.contains(&b) {
                    let names: Vec<&str> = names.iter().map(String::as_str).collect();
                    lines.push(format!(
                        "{} takes {} from {}",
                        tree.nodes[a].label,
                        names.join(", "),
                        tree.nodes[b].label
                    ));
                }
            }
            all.push((package.clone(), files, lines));
        }
    }
    all
}

fn owned_elsewhere(files: &[String]) -> Option<&'static str> {
    KNOWN_LOOPS_OWNED_ELSEWHERE
        .iter()
        .copied()
        .find(|p| files.iter().all(|f| f.starts_with(p)))
}

#[test]
fn no_file_imports_loop_back_inside_a_crate() {
    let loops = loops();
    let mut report = String::new();
    let mut failing = 0;
    let mut used = BTreeSet::new();
    for (package, files, lines) in &loops {
        let known = owned_elsewhere(files);
        if let Some(p) = known {
            used.insert(p);
        } else {
            failing += 1;
        }
        report += &format!(
            "{package}: loop of {} files{}: {}\n",
            files.len(),
            known
                .map(|p| format!(" (known, under {p})"))
                .unwrap_or_default(),
            files.join(" <-> ")
        );
        for l in lines {
            report += &format!("    {l}\n");
        }
    }
    let packages: BTreeSet<String> = targets().into_iter().map(|t| t.0).collect();
    for p in &packages {
        let n = loops.iter().filter(|l| &l.0 == p).count();
        report += &format!("{p}: {n} loop(s)\n");
    }
    println!("{report}");
    assert_eq!(
        failing, 0,
        "file-level import loops inside crates:\n{report}"
    );
    let stale: Vec<&&str> = KNOWN_LOOPS_OWNED_ELSEWHERE
        .iter()
        .filter(|p| !used.contains(**p))
        .collect();
    assert!(
        stale.is_empty(),
        "KNOWN_LOOPS_OWNED_ELSEWHERE names {stale:?}, where no loop is left: remove it"
    );
}

/// The reader sees what it must: a loop through `super::`, a nested group,
/// a re-export and a path in code; none through a test module or a
/// re-export alone.
#[test]
fn the_reader_finds_a_loop_through_each_kind_of_path() {
    let dir = tempfile::tempdir().unwrap();
    let w = |p: &str, s: &str| {
        let f = dir.path().join(p);
        std::fs::create_dir_all(f.parent().unwrap()).unwrap();
        std::fs::write(f, s).unwrap();
    };
    w(
        "lib.rs",
        "mod a;\nmod b;\nmod c;\nmod d;\npub use d::Dee;\n#[cfg(test)]\nmod t { use crate::a::A; }\n",
    );
    w("a.rs", "use crate::{b::{B, Bee as _}};\npub struct A;\n");
    w(
        "b.rs",
        "pub struct B; pub struct Bee;\nfn f() -> super::a::A { todo!() }\n",
    );
    w(
        "c.rs",
        "use crate::Dee; // re-exported from d\npub struct C;\n",
    );
    w(
        "d.rs",
        "pub struct Dee;\n#[cfg(test)]\nmod tests { use crate::c::C; }\n",
    );
    let tree = Tree::read(&dir.path().join("lib.rs"));
    let edges = tree.edges();
    let c = components(tree.nodes.len(), &edges);
    let names: Vec<Vec<String>> = c
        .iter()
        .map(|c| {
            c.iter()
                .map(|&i| {
                    let l = &tree.nodes[i].label;
                    l[l.rfind('/').unwrap() + 1..].to_string()
                })
                .collect()
        })
        .collect();
    assert_eq!(names, vec![vec!["a.rs".to_string(), "b.rs".to_string()]]);
    let a = tree
        .nodes
        .iter()
        .position(|n| n.label.ends_with("/a.rs"))
        .unwrap();
    let b = tree
        .nodes
        .iter()
        .position(|n| n.label.ends_with("/b.rs"))
        .unwrap();
    assert_eq!(
        edges[&(a, b)].iter().collect::<Vec<_>>(),
        ["B", "Bee"],
        "{edges:?}"
    );
    assert_eq!(edges[&(b, a)].iter().collect::<Vec<_>>(), ["A"]);
}
