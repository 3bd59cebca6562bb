//! The serve modules stack one way (ARCHITECTURE.md, "Frontends over the
//! fast path"): no two of the crate's source files import each other,
//! directly or through a circle. This reads the crate's own sources: every
//! `crate::...` and `super::...` path, and a `mod.rs`'s paths into its
//! own child modules, is an arrow from the file that writes it to the file
//! that defines the module it names (the deepest module file on the path;
//! the crate root, `lib.rs`, only declares and re-exports and is left
//! out). Unit-test modules (from `#[cfg(test)]` on) are not read.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};

/// A module path (segments under the crate root) -> its file, relative to
/// `src`.
fn module_files(src: &Path) -> BTreeMap<Vec<String>, PathBuf> {
    let mut modules = BTreeMap::new();
    let mut dirs = vec![src.to_path_buf()];
    while let Some(dir) = dirs.pop() {
        for entry in fs::read_dir(&dir).expect("read src") {
            let path = entry.expect("entry").path();
            if path.is_dir() {
                dirs.push(path);
                continue;
            }
            if path.extension().is_none_or(|e| e != "rs") {
                continue;
            }
            let relative = path.strip_prefix(src).expect("under src").to_path_buf();
            let mut segments: Vec<String> = relative
                .with_extension("")
                .iter()
                .map(|s| s.to_string_lossy().into_owned())
                .collect();
            if segments.last().is_some_and(|s| s == "mod") {
                segments.pop();
            }
            if segments == ["lib"] {
                segments.clear();
            }
            modules.insert(segments, relative);
        }
    }
    modules
}

/// The identifiers following `prefix` wherever it stands in `code` (a
/// path such as `crate::nvme::queue::NvmeQueue` gives its segments).
fn paths_after<'a>(code: &'a str, prefix: &str) -> Vec<Vec<&'a str>> {
    let mut found = Vec::new();
    let mut rest = code;
    while let Some(at) = rest.find(prefix) {
        let before = rest[..at].chars().next_back();
        rest = &rest[at + prefix.len()..];
        if before.is_some_and(|c| c.is_alphanumeric() || c == '_' || c == ':') {
            continue;
        }
        let mut segments = Vec::new();
        let mut tail = rest;
        loop {
            let end = tail
                .find(|c: char| !(c.is_alphanumeric() || c == '_'))
                .unwrap_or(tail.len());
            if end == 0 {
                break;
            }
            segments.push(&tail[..end]);
            match tail[end..].strip_prefix("::") {
                Some(next) => tail = next,
                None => break,
            }
        }
        found.push(segments);
    }
    found
}

/// Each source file -> the files it imports.
fn arrows(src: &Path) -> BTreeMap<PathBuf, BTreeSet<PathBuf>> {
    let modules = module_files(src);
    let mut arrows = BTreeMap::new();
    for (module, file) in &modules {
        let text = fs::read_to_string(src.join(file)).expect("read source");
        let code: String = text
            .lines()
            .take_while(|line| line.trim() != "#[cfg(test)]")
            .map(|line| line.split("//").next().unwrap_or(""))
            .collect::<Vec<_>>()
            .join("\n");
        let is_mod_file = file.ends_with("mod.rs") || file.ends_with("lib.rs");
        // What `super` names: `a` in `a/b.rs`, the root in `a/mod.rs`.
        let above = module[..module.len().saturating_sub(1)].to_vec();
        let mut named: Vec<Vec<String>> = Vec::new();
        for segments in paths_after(&code, "crate::") {
            named.push(segments.iter().map(|s| s.to_string()).collect());
        }
        for segments in paths_after(&code, "super::") {
            let mut base = above.clone();
            base.extend(segments.iter().map(|s| s.to_string()));
            named.push(base);
        }
        if is_mod_file {
            // A mod.rs's relative paths into its own children.
            for other in modules.keys() {
                if other.len() == module.len() + 1 && other.starts_with(module) {
                    let child = &other[module.len()];
                    for segments in paths_after(&code, &format!("{child}::")) {
                        let mut path = other.clone();
                        path.extend(segments.iter().map(|s| s.to_string()));
                        named.push(path);
                    }
                }
            }
        }
        let mut targets = BTreeSet::new();
        for path in named {
            let deepest = (1..=path.len())
                .rev()
                .find_map(|n| modules.get(&path[..n]).map(|f| (n, f)));
            if let Some((_, target)) = deepest {
                if target != file {
                    targets.insert(target.clone());
                }
            }
        }
        arrows.insert(file.clone(), targets);
    }
    arrows
}

/// A circle of imports, if any (files in order, the first repeated last).
fn find_circle(arrows: &BTreeMap<PathBuf, BTreeSet<PathBuf>>) -> Option<Vec<PathBuf>> {
    fn visit(
        at: &PathBuf,
        arrows: &BTreeMap<PathBuf, BTreeSet<PathBuf>>,
        done: &mut BTreeSet<PathBuf>,
        route: &mut Vec<PathBuf>,
    ) -> Option<Vec<PathBuf>> {
        if let Some(start) = route.iter().position(|f| f == at) {
            let mut circle = route[start..].to_vec();
            circle.push(at.clone());
            return Some(circle);
        }
        if done.contains(at) {
            return None;
        }
        route.push(at.clone());
        for next in arrows.get(at).into_iter().flatten() {
            if let Some(circle) = visit(next, arrows, done, route) {
                return Some(circle);
            }
        }
        route.pop();
        done.insert(at.clone());
        None
    }
    let mut done = BTreeSet::new();
    for file in arrows.keys() {
        if let Some(circle) = visit(file, arrows, &mut done, &mut Vec::new()) {
            return Some(circle);
        }
    }
    None
}

#[test]
fn no_two_serve_files_import_each_other_through_a_circle() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let arrows = arrows(&src);
    if let Some(circle) = find_circle(&arrows) {
        let names: Vec<String> = circle.iter().map(|f| f.display().to_string()).collect();
        panic!("import circle: {}", names.join(" -> "));
    }
    // The reading itself works: the arrows the NVMe/TCP target's stack
    // rests on are seen (so that no circle is not for want of arrows).
    let worker = arrows.get(Path::new("worker.rs")).expect("worker.rs");
    assert!(worker.contains(Path::new("nvme/queue.rs")), "{worker:?}");
    let shared = arrows.get(Path::new("shared.rs")).expect("shared.rs");
    assert!(shared.contains(Path::new("worker.rs")), "{shared:?}");
    let setup = arrows.get(Path::new("nvme/setup.rs")).expect("setup.rs");
    assert!(setup.contains(Path::new("shared.rs")), "{setup:?}");
}

#[test]
fn the_circle_finder_sees_a_circle() {
    let code = "use crate::b::Thing;\nfn f() { super::c::g(); }";
    assert_eq!(
        paths_after(code, "crate::"),
        vec![vec!["b", "Thing"]],
        "crate:: paths"
    );
    let file = |s: &str| PathBuf::from(s);
    let mut arrows = BTreeMap::new();
    arrows.insert(file("a.rs"), BTreeSet::from([file("b.rs")]));
    arrows.insert(file("b.rs"), BTreeSet::from([file("c.rs")]));
    arrows.insert(file("c.rs"), BTreeSet::new());
    assert_eq!(find_circle(&arrows), None);
    arrows.insert(file("c.rs"), BTreeSet::from([file("a.rs")]));
    assert_eq!(
        find_circle(&arrows),
        Some(vec![file("a.rs"), file("b.rs"), file("c.rs"), file("a.rs")])
    );
}
