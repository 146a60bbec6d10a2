//! The layout rules of ARCHITECTURE.md that the source can show: no module imports a module
//! that imports it back (directly or around a longer circle), and ARCHITECTURE.md names every
//! module of this test binary. Read from the source files, so that a change that breaks a
//! rule fails here with the circle or the missing name.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// The workspace's root (this package's directory).
fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The sibling modules of `dir` (its `.rs` files but the crate and module roots, and its
/// directories holding a `mod.rs`), each with the text of its files, comments left out.
fn modules(dir: &Path) -> BTreeMap<String, String> {
    let mut modules = BTreeMap::new();
    for entry in std::fs::read_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
        let path = entry.expect("a directory entry").path();
        let name = path
            .file_stem()
            .and_then(|n| n.to_str())
            .expect("a UTF-8 file name")
            .to_owned();
        let files: Vec<PathBuf> = if path.is_dir() && path.join("mod.rs").is_file() {
            rust_files(&path)
        } else if path.extension().is_some_and(|e| e == "rs")
            && !["lib", "main", "mod"].contains(&name.as_str())
        {
            vec![path]
        } else {
            continue;
        };
        let text = files
            .iter()
            .map(|f| std::fs::read_to_string(f).expect("a readable source file"))
            .flat_map(|t| {
                t.lines()
                    .filter(|l| !l.trim_start().starts_with("//"))
                    .map(str::to_owned)
                    .collect::<Vec<_>>()
            })
            .collect::<Vec<_>>()
            .join("\n");
        modules.insert(name, text);
    }
    modules
}

fn rust_files(dir: &Path) -> Vec<PathBuf> {
    let mut files = Vec::new();
    for entry in std::fs::read_dir(dir).expect("a readable directory") {
        let path = entry.expect("a directory entry").path();
        if path.is_dir() {
            files.extend(rust_files(&path));
        } else if path.extension().is_some_and(|e| e == "rs") {
            files.push(path);
        }
    }
    files
}

/// Whether `text` names module `name` through one of `prefixes` (`crate::`, `super::`).
fn names(text: &str, prefixes: &[&str], name: &str) -> bool {
    prefixes.iter().any(|prefix| {
        let needle = format!("{prefix}{name}");
        text.match_indices(&needle).any(|(at, _)| {
            let before = text[..at].chars().next_back();
            let after = text[at + needle.len()..].chars().next();
            !before.is_some_and(|c| c.is_alphanumeric() || c == '_')
                && !after.is_some_and(|c| c.is_alphanumeric() || c == '_')
        })
    })
}

/// The circles of the import graph among the sibling modules of `dir`.
fn circles(dir: &str, prefixes: &[&str]) -> Vec<Vec<String>> {
    let modules = modules(&root().join(dir));
    let graph: BTreeMap<&str, BTreeSet<&str>> = modules
        .iter()
        .map(|(name, text)| {
            let uses = modules
                .keys()
                .filter(|other| *other != name && names(text, prefixes, other))
                .map(String::as_str)
                .collect();
            (name.as_str(), uses)
        })
        .collect();
    // Depth first; a module met again while on the path closes a circle.
    fn visit<'a>(
        node: &'a str,
        graph: &BTreeMap<&'a str, BTreeSet<&'a str>>,
        path: &mut Vec<&'a str>,
        done: &mut BTreeSet<&'a str>,
        found: &mut Vec<Vec<String>>,
    ) {
        if let Some(at) = path.iter().position(|n| *n == node) {
            let mut circle: Vec<String> = path[at..].iter().map(|n| n.to_string()).collect();
            circle.push(node.to_owned());
            found.push(circle);
            return;
        }
        if !done.insert(node) {
            return;
        }
        path.push(node);
        for next in &graph[node] {
            visit(next, graph, path, done, found);
        }
        path.pop();
    }
    let mut found = Vec::new();
    let mut done = BTreeSet::new();
    for node in graph.keys() {
        visit(node, &graph, &mut Vec::new(), &mut done, &mut found);
    }
    found
}

#[test]
fn no_module_imports_a_module_that_imports_it_back() {
    let dirs: &[(&str, &[&str])] = &[
        ("types/src", &["crate::"]),
        ("db/src", &["crate::"]),
        ("worker/src", &["crate::"]),
        ("worker/src/isolation", &["super::", "crate::isolation::"]),
        ("server/src", &["crate::"]),
        ("src", &["crate::"]),
        ("src/cli", &["super::", "crate::cli::"]),
        ("web/src", &["crate::"]),
        ("web/src/pages", &["super::", "crate::pages::"]),
        ("bench/src", &["crate::"]),
        ("xtask/src", &["crate::"]),
    ];
    let mut all = Vec::new();
    for (dir, prefixes) in dirs {
        for circle in circles(dir, prefixes) {
            all.push(format!("{dir}: {}", circle.join(" → ")));
        }
    }
    assert!(
        all.is_empty(),
        "modules import modules that import them back (move what both need into a module \
         of its own):\n{}",
        all.join("\n")
    );
}

#[test]
fn architecture_md_names_every_module_of_the_integration_tests() {
    let main = std::fs::read_to_string(root().join("tests/it/main.rs")).expect("tests/it/main.rs");
    let architecture =
        std::fs::read_to_string(root().join("ARCHITECTURE.md")).expect("ARCHITECTURE.md");
    let missing: Vec<&str> = main
        .lines()
        .filter_map(|l| l.trim().strip_prefix("mod ")?.strip_suffix(';'))
        .filter(|m| *m != "support" && !architecture.contains(&format!("`{m}`")))
        .collect();
    assert!(
        missing.is_empty(),
        "ARCHITECTURE.md's `tests/` section names every module of tests/it; missing: {missing:?}"
    );
}
