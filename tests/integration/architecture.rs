//! `ARCHITECTURE.md` stays true: every path it names (in backticks, under
//! `src/`, `bench/` or `tests/`) exists, and every module directory and
//! top-level file of `src/` appears in it, so a new module cannot be added
//! without a place on the map.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn named_paths(text: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for (i, part) in text.split('`').enumerate() {
        // Odd parts are inside backticks.
        if i % 2 == 1
            && ["src/", "bench/", "tests/"]
                .iter()
                .any(|p| part.starts_with(p))
        {
            out.insert(part.trim_end_matches('/').to_owned());
        }
    }
    out
}

#[test]
fn every_path_the_architecture_page_names_exists() {
    let text = std::fs::read_to_string(root().join("ARCHITECTURE.md")).unwrap();
    let named = named_paths(&text);
    assert!(named.len() > 30, "too few paths found: {named:?}");
    let missing: Vec<_> = named.iter().filter(|p| !root().join(p).exists()).collect();
    assert!(
        missing.is_empty(),
        "ARCHITECTURE.md names paths that do not exist: {missing:?}"
    );
}

#[test]
fn every_module_of_the_crate_is_on_the_map() {
    let text = std::fs::read_to_string(root().join("ARCHITECTURE.md")).unwrap();
    let mut absent = Vec::new();
    for entry in std::fs::read_dir(root().join("src")).unwrap() {
        let entry = entry.unwrap();
        let name = entry.file_name().into_string().unwrap();
        let is_module = entry.file_type().unwrap().is_dir()
            || (name.ends_with(".rs") && !name.ends_with("_tests.rs") && name != "lib.rs");
        let shown = if entry.file_type().unwrap().is_dir() {
            format!("src/{name}/")
        } else {
            format!("src/{name}")
        };
        if is_module && !text.contains(&shown) {
            absent.push(shown);
        }
    }
    assert!(
        absent.is_empty(),
        "modules missing from ARCHITECTURE.md: {absent:?}"
    );
}

/// The crates whose module graphs must be acyclic, by source directory.
const CRATES: [&str; 3] = ["src", "demo/src", "bench/src"];

/// A crate's modules (path from the crate root) and their code, tests and
/// comments left out.
fn modules(src: &Path) -> BTreeMap<Vec<String>, String> {
    fn walk(dir: &Path, root: &Path, out: &mut BTreeMap<Vec<String>, String>) {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                walk(&path, root, out);
                continue;
            }
            let rel = path
                .strip_prefix(root)
                .unwrap()
                .to_str()
                .unwrap()
                .to_owned();
            let Some(stem) = rel.strip_suffix(".rs") else {
                continue;
            };
            // Test files, and binary roots (their own crates).
            if stem.ends_with("_tests") || stem.ends_with("testkit") || stem == "main" {
                continue;
            }
            let mut segs: Vec<String> = stem.split('/').map(str::to_owned).collect();
            if matches!(segs.last().map(String::as_str), Some("mod" | "lib")) {
                segs.pop();
            }
            let text = std::fs::read_to_string(&path).unwrap();
            out.insert(segs, code_only(&text));
        }
    }
    let mut out = BTreeMap::new();
    walk(src, src, &mut out);
    out
}

/// `text` without `//` comments and without `#[cfg(test)]` modules (a test
/// may reach anywhere).
fn code_only(text: &str) -> String {
    let lines: String = text
        .lines()
        .map(|l| l.find("//").map_or(l, |i| &l[..i]))
        .collect::<Vec<_>>()
        .join("\n");
    let mut out = String::new();
    let mut rest = lines.as_str();
    while let Some(i) = rest.find("#[cfg(test)]") {
        out.push_str(&rest[..i]);
        let after = &rest[i + "#[cfg(test)]".len()..];
        // Skip further attributes, then see whether a module follows.
        let mut item = after.trim_start();
        while item.starts_with("#[") {
            item = item[item.find(']').map_or(item.len(), |j| j + 1)..].trim_start();
        }
        if let Some(decl) = item.strip_prefix("mod ") {
            let semi = decl.find(';');
            let brace = decl.find('{');
            match (semi, brace) {
                (Some(s), b) if b.is_none_or(|b| s < b) => rest = &decl[s + 1..],
                (_, Some(b)) => {
                    let mut depth = 0usize;
                    let mut end = decl.len();
                    for (j, c) in decl[b..].char_indices() {
                        match c {
                            '{' => depth += 1,
                            '}' => {
                                depth -= 1;
                                if depth == 0 {
                                    end = b + j + 1;
                                    break;
                                }
                            }
                            _ => {}
                        }
                    }
                    rest = &decl[end..];
                }
                _ => rest = "",
            }
        } else {
            rest = after;
        }
    }
    out.push_str(rest);
    out
}

fn is_ident(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_'
}

/// Parses a path at the start of `s` (`a::b`, `a::{b, c::{d}}`, `a::*`)
/// into every full path it names, each prefixed by `base`.
fn expand(s: &str, base: &[String], out: &mut Vec<Vec<String>>) -> usize {
    let bytes: Vec<char> = s.chars().collect();
    fn path(b: &[char], mut i: usize, prefix: Vec<String>, out: &mut Vec<Vec<String>>) -> usize {
        let mut segs = prefix;
        loop {
            while i < b.len() && b[i].is_whitespace() {
                i += 1;
            }
            if i < b.len() && b[i] == '{' {
                i += 1;
                loop {
                    while i < b.len() && (b[i].is_whitespace() || b[i] == ',') {
                        i += 1;
                    }
                    if i >= b.len() || b[i] == '}' {
                        return i + 1;
                    }
                    // Always move on, whatever an item looks like.
                    let next = path(b, i, segs.clone(), out);
                    i = next.max(i + 1);
                }
            }
            let start = i;
            while i < b.len() && is_ident(b[i]) {
                i += 1;
            }
            let seg: String = b[start..i].iter().collect();
            if !seg.is_empty() && seg != "self" {
                segs.push(seg);
            }
            if i + 1 < b.len() && b[i] == ':' && b[i + 1] == ':' {
                i += 2;
                continue;
            }
            out.push(segs);
            // Past `as name` and to the item's end.
            while i < b.len()
                && !matches!(b[i], ',' | '}' | ';' | '\n' | ')' | '(' | '>' | '<' | '.')
            {
                i += 1;
            }
            return i;
        }
    }
    path(&bytes, 0, base.to_vec(), out)
}

/// The modules `code` (of module `me`) refers to with `crate::`, `super::`
/// or `self::` paths, each resolved to the deepest module it names.
fn references(
    me: &[String],
    code: &str,
    known: &BTreeMap<Vec<String>, String>,
) -> BTreeSet<Vec<String>> {
    let mut found = Vec::new();
    let chars: Vec<(usize, char)> = code.char_indices().collect();
    for (k, &(i, _)) in chars.iter().enumerate() {
        let prev_ok = k == 0 || !(is_ident(chars[k - 1].1) || chars[k - 1].1 == ':');
        if !prev_ok {
            continue;
        }
        let rest = &code[i..];
        let (base, skip) = if rest.starts_with("crate::") {
            (Vec::new(), "crate::".len())
        } else if rest.starts_with("super::") {
            let mut n = 0;
            let mut r = rest;
            while let Some(t) = r.strip_prefix("super::") {
                n += 1;
                r = t;
            }
            (
                me[..me.len().saturating_sub(n)].to_vec(),
                rest.len() - r.len(),
            )
        } else if rest.starts_with("self::") {
            (me.to_vec(), "self::".len())
        } else {
            continue;
        };
        expand(&rest[skip..], &base, &mut found);
    }
    found
        .into_iter()
        .map(|p| {
            (0..=p.len())
                .rev()
                .map(|n| p[..n].to_vec())
                .find(|m| known.contains_key(m))
                .unwrap_or_default()
        })
        .filter(|m| m.as_slice() != me)
        .collect()
}

/// Every cycle among sibling modules, as `parent: a -> b -> a`.
fn cycles(crate_modules: &BTreeMap<Vec<String>, String>) -> Vec<String> {
    let mut graphs: BTreeMap<Vec<String>, BTreeMap<String, BTreeSet<String>>> = BTreeMap::new();
    for (me, code) in crate_modules {
        for to in references(me, code, crate_modules) {
            let k = me.iter().zip(&to).take_while(|(a, b)| a == b).count();
            if k < me.len() && k < to.len() {
                graphs
                    .entry(me[..k].to_vec())
                    .or_default()
                    .entry(me[k].clone())
                    .or_default()
                    .insert(to[k].clone());
            }
        }
    }
    let mut out = Vec::new();
    for (parent, graph) in &graphs {
        // Depth-first search; a back edge closes a cycle.
        fn visit(
            n: &str,
            g: &BTreeMap<String, BTreeSet<String>>,
            stack: &mut Vec<String>,
            done: &mut BTreeSet<String>,
            found: &mut Vec<Vec<String>>,
        ) {
            if let Some(at) = stack.iter().position(|s| s == n) {
                let mut c = stack[at..].to_vec();
                c.push(n.to_owned());
                found.push(c);
                return;
            }
            if done.contains(n) {
                return;
            }
            stack.push(n.to_owned());
            for m in g.get(n).into_iter().flatten() {
                visit(m, g, stack, done, found);
            }
            stack.pop();
            done.insert(n.to_owned());
        }
        let mut done = BTreeSet::new();
        let mut found = Vec::new();
        for n in graph.keys() {
            visit(n, graph, &mut Vec::new(), &mut done, &mut found);
        }
        let at = if parent.is_empty() {
            "crate".to_owned()
        } else {
            parent.join("::")
        };
        out.extend(
            found
                .into_iter()
                .map(|c| format!("{at}: {}", c.join(" -> "))),
        );
    }
    out
}

#[test]
fn no_module_imports_a_module_that_imports_it_back() {
    let mut all = Vec::new();
    for dir in CRATES {
        let mods = modules(&root().join(dir));
        assert!(mods.len() > 5, "{dir}: too few modules found");
        all.extend(cycles(&mods).into_iter().map(|c| format!("{dir}: {c}")));
    }
    assert!(
        all.is_empty(),
        "import cycles between sibling modules:\n{}",
        all.join("\n")
    );
}

#[test]
fn the_cycle_check_finds_cycles_through_every_kind_of_path() {
    let m = |pairs: &[(&str, &str)]| -> BTreeMap<Vec<String>, String> {
        pairs
            .iter()
            .map(|(p, code)| {
                let segs = if p.is_empty() {
                    Vec::new()
                } else {
                    p.split("::").map(str::to_owned).collect()
                };
                (segs, code_only(code))
            })
            .collect()
    };
    // crate:: with a group, and super:: from a file module.
    let tree = m(&[
        ("", "pub mod a; pub mod b;"),
        ("a", "use crate::{b::{Thing, other}, c};"),
        ("b", "use super::a::Other;"),
        ("c", ""),
    ]);
    assert_eq!(cycles(&tree), vec!["crate: a -> b -> a".to_owned()]);
    // A path in code, three modules around, nested one level down.
    let tree = m(&[
        ("", ""),
        ("p", ""),
        ("p::x", "fn f() { crate::p::y::go(); }"),
        ("p::y", "fn g() { super::z::go(); }"),
        ("p::z", "fn h() -> self::Q { super::x::T }"),
    ]);
    assert_eq!(cycles(&tree), vec!["p: x -> y -> z -> x".to_owned()]);
    // Comments, test modules and edges to a parent are no cycles.
    let tree = m(&[
        ("", "pub mod a;"),
        (
            "a",
            "// crate::b::x\n#[cfg(test)]\nmod tests { use crate::b::y; }\nuse super::Root;",
        ),
        ("b", "use crate::a::Thing;"),
    ]);
    assert_eq!(cycles(&tree), Vec::<String>::new());
}

#[test]
fn the_dependency_order_on_the_page_is_the_crates() {
    let text = std::fs::read_to_string(root().join("ARCHITECTURE.md")).unwrap();
    let start = text
        .find("Dependencies point one way.")
        .expect("ARCHITECTURE.md gives the dependency order");
    let end = start
        + text[start..]
            .find("Inside `src/proxy/`")
            .expect("the paragraph ends");
    let order: Vec<String> = named_modules(&text[start..end]);
    let mods = modules(&root().join("src"));
    let top: BTreeSet<&str> = mods
        .keys()
        .filter(|m| m.len() == 1)
        .map(|m| m[0].as_str())
        .collect();
    let listed: BTreeSet<&str> = order.iter().map(String::as_str).collect();
    assert_eq!(listed, top, "the order names every top-level module once");
    let rank = |m: &str| order.iter().position(|o| o == m).unwrap();
    let mut upward = Vec::new();
    for (me, code) in &mods {
        for to in references(me, code, &mods) {
            if let (Some(a), Some(b)) = (me.first(), to.first()) {
                if a != b && rank(b) > rank(a) {
                    upward.push(format!("{a} -> {b}"));
                }
            }
        }
    }
    upward.sort();
    upward.dedup();
    assert!(
        upward.is_empty(),
        "modules importing one listed after them on ARCHITECTURE.md: {upward:?}"
    );
}

/// The backticked names in `text` that are plain module names.
fn named_modules(text: &str) -> Vec<String> {
    text.split('`')
        .enumerate()
        .filter(|(i, part)| i % 2 == 1 && part.chars().all(|c| c.is_ascii_lowercase() || c == '_'))
        .map(|(_, part)| part.to_owned())
        .collect()
}

/// The command line (`test`, `explain`, `audit replay`, `pins`) and the
/// shadow policy decide with the verdicts and reach upstreams with the
/// upstream client; none of them depends on the request path, so neither
/// can drift into being a second evaluator inside it.
#[test]
fn the_command_line_imports_nothing_from_the_request_path() {
    let mods = modules(&root().join("src"));
    let mut into_proxy = Vec::new();
    for (me, code) in &mods {
        if me.first().map(String::as_str) != Some("cli") {
            continue;
        }
        for to in references(me, code, &mods) {
            if to.first().map(String::as_str) == Some("proxy") {
                into_proxy.push(format!("{} -> {}", me.join("::"), to.join("::")));
            }
        }
    }
    assert!(
        into_proxy.is_empty(),
        "src/cli/ imports from src/proxy/: {into_proxy:?}"
    );
    // The check sees an import when there is one.
    let planted: BTreeMap<Vec<String>, String> = BTreeMap::from([
        (
            vec!["cli".to_owned()],
            "use crate::proxy::request::decide::X;".to_owned(),
        ),
        (vec!["proxy".to_owned()], String::new()),
        (vec!["proxy".to_owned(), "decide".to_owned()], String::new()),
    ]);
    let found = references(
        &["cli".to_owned()],
        &planted[&vec!["cli".to_owned()]],
        &planted,
    );
    assert!(found
        .iter()
        .any(|m| m.first().map(String::as_str) == Some("proxy")));
}
