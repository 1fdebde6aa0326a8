//! Paths as written → the files that define what they name.

use super::parse::CrateGraph;
use std::collections::BTreeSet;

/// Re-exports followed at most this deep (a guard against a binding naming itself).
const MAX_HOPS: usize = 16;

/// Edges (naming file, defining file) between different files of the crate.
pub fn file_edges(graph: &CrateGraph) -> Vec<(usize, usize)> {
    let mut edges = BTreeSet::new();
    for (m, module) in graph.modules.iter().enumerate() {
        for path in &module.named {
            if let Some(target) = resolve_from(graph, m, path, 0) {
                if target != module.file {
                    edges.insert((module.file, target));
                }
            }
        }
    }
    edges.into_iter().collect()
}

/// The file that defines what `path`, written in module `m`, names; none for another
/// crate's item, a local name or a generic.
fn resolve_from(graph: &CrateGraph, m: usize, path: &[String], hops: usize) -> Option<usize> {
    let first = path.first()?;
    if path.len() == 1 && matches!(first.as_str(), "crate" | "self" | "super") {
        return None; // `pub(crate)`, `pub(super)`, a method's `self`
    }
    let module = &graph.modules[m];
    match first.as_str() {
        "crate" => walk(graph, 0, &path[1..], hops),
        "self" => walk(graph, m, &path[1..], hops),
        "super" => {
            let mut at = module.parent?;
            let mut rest = &path[1..];
            while rest.first().map(String::as_str) == Some("super") {
                at = graph.modules[at].parent?;
                rest = &rest[1..];
            }
            walk(graph, at, rest, hops)
        }
        _ if module.children.contains_key(first) || module.bindings.contains_key(first) => walk(graph, m, path, hops),
        _ => None,
    }
}

/// Follows `rest` down from module `at`: child modules, then bindings (re-exports);
/// the first name that is neither is an item of the module reached.
fn walk(graph: &CrateGraph, at: usize, rest: &[String], hops: usize) -> Option<usize> {
    let mut at = at;
    for (i, segment) in rest.iter().enumerate() {
        let module = &graph.modules[at];
        if let Some(&child) = module.children.get(segment) {
            at = child;
            continue;
        }
        if let Some(target) = module.bindings.get(segment) {
            if hops >= MAX_HOPS || target.last() == Some(segment) && target.len() == 1 {
                return None;
            }
            let mut full = target.clone();
            full.extend_from_slice(&rest[i + 1..]);
            return resolve_from(graph, at, &full, hops + 1);
        }
        return Some(module.file);
    }
    Some(graph.modules[at].file)
}
