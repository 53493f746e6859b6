//! `ARCHITECTURE.md` stays true: every path it names (in backticks, under
//! `src/`, `bench/` or `tests/`) exists, and every module directory and
//! top-level file of `src/` appears in it, so a new module cannot be added
//! without a place on the map.

use std::collections::BTreeSet;
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
