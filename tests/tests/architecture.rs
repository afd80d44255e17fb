//! docs/architecture.md against the tree: every module of the product's
//! crates is named in it (a new file without a line there fails), and
//! every file it names exists (a removed or renamed one fails), so the
//! map cannot go stale.

use std::{
    collections::BTreeSet,
    path::{Path, PathBuf},
};

/// The product's source trees the map covers.
const TREES: &[&str] = &[
    "limiter-common/src",
    "limiter-ebpf/src",
    "limiter-user/src",
    "ebpf-build/src",
];

/// Files every crate or module has, named by what holds them.
const IMPLIED: &[&str] = &["mod.rs", "lib.rs", "main.rs", "tests.rs"];

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// Every word between backticks in the document.
fn named(doc: &str) -> BTreeSet<String> {
    doc.split('`')
        .skip(1)
        .step_by(2)
        .flat_map(|code| {
            code.split(|c: char| c.is_whitespace() || ",()".contains(c))
                .map(str::to_string)
                .collect::<Vec<_>>()
        })
        .filter(|w| !w.is_empty())
        .collect()
}

/// The tree's modules, relative to its root: `daemon/`, `daemon/state.rs`.
fn modules(tree: &Path) -> Vec<String> {
    let mut found = Vec::new();
    let mut dirs = vec![tree.to_path_buf()];
    while let Some(dir) = dirs.pop() {
        let mut only_tests = true;
        let mut files = Vec::new();
        for entry in std::fs::read_dir(&dir).expect("a source directory") {
            let path = entry.expect("an entry").path();
            let name = path.file_name().unwrap().to_string_lossy().into_owned();
            if path.is_dir() {
                only_tests = false;
                dirs.push(path);
            } else if name.ends_with(".rs") {
                if name != "tests.rs" {
                    only_tests = false;
                }
                if !IMPLIED.contains(&name.as_str()) {
                    files.push(path);
                }
            }
        }
        let rel = |p: &Path| p.strip_prefix(tree).unwrap().to_string_lossy().into_owned();
        // A directory that only holds a module's tests is the module's.
        if dir != tree && !only_tests {
            found.push(format!("{}/", rel(&dir)));
        }
        found.extend(files.iter().map(|f| rel(f)));
    }
    found
}

#[test]
fn every_module_is_in_the_architecture_doc_and_every_file_it_names_exists() {
    let root = root();
    let doc = std::fs::read_to_string(root.join("docs/architecture.md")).expect("the doc");
    let words = named(&doc);

    let mut missing = Vec::new();
    for tree in TREES {
        for module in modules(&root.join(tree)) {
            let name = match module.strip_suffix('/') {
                Some(dir) => format!("{}/", dir.rsplit('/').next().unwrap()),
                None => module.rsplit('/').next().unwrap().to_string(),
            };
            // Named by itself (`state.rs`, `daemon/`), or by a path that
            // ends with it or runs through it (`maps/table.rs`).
            let found = words.contains(&name)
                || words.iter().filter(|w| w.contains('/')).any(|w| {
                    module.ends_with(w.as_str())
                        || w.ends_with(&module)
                        || (module.ends_with('/') && w.contains(&name))
                });
            if !found {
                missing.push(format!("{tree}/{module}"));
            }
        }
    }
    assert!(
        missing.is_empty(),
        "modules docs/architecture.md does not name (add a line on what each holds):\n  {}",
        missing.join("\n  ")
    );

    // A file the doc names must be one of the repository's: a path by
    // its end (`maps/table.rs`), a bare name by its name.
    let repo = repo_files(&root);
    let mut stale = Vec::new();
    for word in &words {
        let word = word.trim_end_matches(['.', ':', ';']);
        if !word.ends_with(".rs") || word.contains('*') {
            continue;
        }
        let exists = repo
            .iter()
            .any(|f| f == word || f.ends_with(&format!("/{word}")));
        if !exists {
            stale.push(word.to_string());
        }
    }
    assert!(
        stale.is_empty(),
        "files docs/architecture.md names that do not exist: {stale:?}"
    );
}

/// Every `.rs` file of the repository (not `target/`), relative to it.
fn repo_files(root: &Path) -> Vec<String> {
    let mut found = Vec::new();
    let mut dirs = vec![root.to_path_buf()];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).expect("a directory") {
            let path = entry.expect("an entry").path();
            let name = path.file_name().unwrap().to_string_lossy();
            if path.is_dir() {
                if !name.starts_with('.') && name != "target" {
                    dirs.push(path);
                }
            } else if name.ends_with(".rs") {
                found.push(
                    path.strip_prefix(root)
                        .unwrap()
                        .to_string_lossy()
                        .into_owned(),
                );
            }
        }
    }
    found
}
