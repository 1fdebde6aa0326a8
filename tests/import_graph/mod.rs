//! The `use` graph of one crate's sources, and its strongly connected groups.
//!
//! `parse.rs` reads the module tree (skipping `#[cfg(test)]` modules and items) and the
//! paths each module names; `resolve.rs` turns those paths into edges between files;
//! `scc.rs` finds the loops.

mod parse;
mod resolve;
mod scc;

pub use parse::CrateGraph;
use std::collections::{BTreeMap, BTreeSet};

/// The loops of one crate: files in strongly connected groups, and, per parent module,
/// groups of its children.
pub struct Report {
    file_groups: Vec<Vec<String>>,
    module_groups: Vec<(String, Vec<String>)>,
    files: usize,
    edges: usize,
}

impl Report {
    /// Measures `graph`.
    pub fn of(graph: &CrateGraph) -> Self {
        let edges = resolve::file_edges(graph);
        let files = graph.file_names();
        let file_groups = scc::groups(files.len(), &edges)
            .into_iter()
            .map(|group| group.into_iter().map(|f| files[f].clone()).collect())
            .collect();
        let mut module_groups = Vec::new();
        for (parent, children) in graph.parents() {
            // Node 0 is the parent's own file; node i + 1 its child i with its subtree.
            let mut node_of_file = BTreeMap::new();
            node_of_file.insert(graph.file_of(parent), 0);
            for (i, child) in children.iter().enumerate() {
                for file in graph.files_under(*child) {
                    node_of_file.insert(file, i + 1);
                }
            }
            let mut collapsed = BTreeSet::new();
            for &(from, to) in &edges {
                if let (Some(&a), Some(&b)) = (node_of_file.get(&from), node_of_file.get(&to)) {
                    if a != b {
                        collapsed.insert((a, b));
                    }
                }
            }
            let collapsed: Vec<_> = collapsed.into_iter().collect();
            for group in scc::groups(children.len() + 1, &collapsed) {
                let names = group
                    .into_iter()
                    .map(|n| if n == 0 { "(own file)".to_string() } else { graph.module_name(children[n - 1]) })
                    .collect();
                module_groups.push((graph.module_name(parent), names));
            }
        }
        Self { file_groups, module_groups, files: files.len(), edges: edges.len() }
    }

    /// No loop of files or of sibling modules.
    pub fn is_acyclic(&self) -> bool {
        self.file_groups.is_empty() && self.module_groups.is_empty()
    }

    /// Files that are in some loop.
    pub fn files_in_cycles(&self) -> usize {
        self.file_groups.iter().map(Vec::len).sum()
    }

    /// Loops among the children of one module.
    pub fn module_loops(&self) -> usize {
        self.module_groups.len()
    }

    /// Members of the largest loop among the children of one module.
    pub fn largest_module_group(&self) -> usize {
        self.module_groups.iter().map(|(_, group)| group.len()).max().unwrap_or(0)
    }

    /// One line of figures.
    pub fn summary(&self) -> String {
        let top = self.module_groups.iter().filter(|(parent, _)| parent == "crate").map(|(_, g)| g.len()).max();
        format!(
            "{} files, {} edges; {} files in {} loops (largest {}); {} module loops (largest {}, top level {})",
            self.files,
            self.edges,
            self.files_in_cycles(),
            self.file_groups.len(),
            self.file_groups.iter().map(Vec::len).max().unwrap_or(0),
            self.module_groups.len(),
            self.largest_module_group(),
            top.unwrap_or(0),
        )
    }

    /// Every loop, one a line.
    pub fn details(&self) -> String {
        let mut out = String::new();
        for group in &self.file_groups {
            out.push_str(&format!("  files: {}\n", group.join(", ")));
        }
        for (parent, group) in &self.module_groups {
            out.push_str(&format!("  modules of {parent}: {}\n", group.join(", ")));
        }
        out
    }
}
