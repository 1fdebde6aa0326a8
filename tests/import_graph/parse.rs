//! The module tree of a crate and the paths each module names.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use syn::visit::Visit;

/// One module: inline or a file of its own.
pub struct Module {
    /// Its path from the crate root (empty for the root).
    pub path: Vec<String>,
    /// Index of the file it is written in.
    pub file: usize,
    /// Its parent module (none for the root).
    pub parent: Option<usize>,
    /// Child modules by name.
    pub children: BTreeMap<String, usize>,
    /// Names its `use` items bind, each with the path as written.
    pub bindings: BTreeMap<String, Vec<String>>,
    /// Paths named in it, as written (`use` items included).
    pub named: Vec<Vec<String>>,
}

/// A crate's modules and files.
pub struct CrateGraph {
    /// Modules; 0 is the root.
    pub modules: Vec<Module>,
    files: Vec<String>,
}

impl CrateGraph {
    /// Reads the crate whose root is `root_file` (relative to `base`).
    pub fn load(base: &Path, root_file: &str) -> Result<Self, String> {
        let mut graph = Self { modules: Vec::new(), files: Vec::new() };
        graph.load_file(base, PathBuf::from(root_file), Vec::new(), None, true)?;
        Ok(graph)
    }

    fn load_file(
        &mut self,
        base: &Path,
        file: PathBuf,
        path: Vec<String>,
        parent: Option<usize>,
        owns_dir: bool,
    ) -> Result<usize, String> {
        let text = std::fs::read_to_string(base.join(&file)).map_err(|e| format!("{}: {e}", file.display()))?;
        let parsed = syn::parse_file(&text).map_err(|e| format!("{}: {e}", file.display()))?;
        let file_index = self.files.len();
        self.files.push(file.to_string_lossy().into_owned());
        // Where this file's `mod x;` children live.
        let dir =
            if owns_dir { file.parent().map(Path::to_path_buf).unwrap_or_default() } else { file.with_extension("") };
        let module = self.new_module(path, file_index, parent);
        self.read_items(base, &parsed.items, module, &dir)?;
        Ok(module)
    }

    fn new_module(&mut self, path: Vec<String>, file: usize, parent: Option<usize>) -> usize {
        let index = self.modules.len();
        if let (Some(p), Some(name)) = (parent, path.last()) {
            self.modules[p].children.insert(name.clone(), index);
        }
        let module =
            Module { path, file, parent, children: BTreeMap::new(), bindings: BTreeMap::new(), named: Vec::new() };
        self.modules.push(module);
        index
    }

    fn read_items(&mut self, base: &Path, items: &[syn::Item], module: usize, dir: &Path) -> Result<(), String> {
        for item in items {
            match item {
                // A module declared twice under opposite `cfg`s is read once.
                syn::Item::Mod(m)
                    if !is_test_only(&m.attrs) && !self.modules[module].children.contains_key(&m.ident.to_string()) =>
                {
                    let name = m.ident.to_string();
                    let mut path = self.modules[module].path.clone();
                    path.push(name.clone());
                    if let Some((_, inner)) = &m.content {
                        let file = self.modules[module].file;
                        let child = self.new_module(path, file, Some(module));
                        self.read_items(base, inner, child, &dir.join(&name))?;
                    } else {
                        let flat = dir.join(format!("{name}.rs"));
                        let (file, owns_dir) = if base.join(&flat).is_file() {
                            (flat, false)
                        } else {
                            (dir.join(&name).join("mod.rs"), true)
                        };
                        self.load_file(base, file, path, Some(module), owns_dir)?;
                    }
                }
                syn::Item::Mod(_) => {}
                syn::Item::Use(u) if !is_test_only(&u.attrs) => {
                    let mut found = Vec::new();
                    use_tree(&u.tree, Vec::new(), &mut found);
                    for (name, path) in found {
                        if let Some(name) = name {
                            self.modules[module].bindings.insert(name, path.clone());
                        }
                        self.modules[module].named.push(path);
                    }
                }
                other if !is_test_only(item_attrs(other)) => {
                    let mut paths = PathCollector::default();
                    paths.visit_item(other);
                    self.modules[module].named.extend(paths.0);
                }
                _ => {}
            }
        }
        Ok(())
    }

    /// File names, by index.
    pub fn file_names(&self) -> Vec<String> {
        self.files.clone()
    }

    /// Modules with children, and their children.
    pub fn parents(&self) -> Vec<(usize, Vec<usize>)> {
        let mut out = Vec::new();
        for (i, m) in self.modules.iter().enumerate() {
            if !m.children.is_empty() {
                out.push((i, m.children.values().copied().collect()));
            }
        }
        out
    }

    /// The file module `m` is written in.
    pub fn file_of(&self, m: usize) -> usize {
        self.modules[m].file
    }

    /// Files of `m` and its descendants.
    pub fn files_under(&self, m: usize) -> Vec<usize> {
        let mut out = vec![self.modules[m].file];
        for &child in self.modules[m].children.values() {
            out.extend(self.files_under(child));
        }
        out
    }

    /// `crate::a::b` for module `m`.
    pub fn module_name(&self, m: usize) -> String {
        let mut name = String::from("crate");
        for segment in &self.modules[m].path {
            name.push_str("::");
            name.push_str(segment);
        }
        name
    }
}

/// `#[cfg(test)]`, or a `cfg` that holds only under test.
fn is_test_only(attrs: &[syn::Attribute]) -> bool {
    attrs.iter().any(|a| {
        a.path().is_ident("cfg") && {
            let tokens = a.meta.require_list().map(|l| l.tokens.to_string()).unwrap_or_default();
            tokens == "test" || tokens.starts_with("all (test")
        }
    })
}

fn item_attrs(item: &syn::Item) -> &[syn::Attribute] {
    match item {
        syn::Item::Const(i) => &i.attrs,
        syn::Item::Enum(i) => &i.attrs,
        syn::Item::Fn(i) => &i.attrs,
        syn::Item::Impl(i) => &i.attrs,
        syn::Item::Static(i) => &i.attrs,
        syn::Item::Struct(i) => &i.attrs,
        syn::Item::Trait(i) => &i.attrs,
        syn::Item::Type(i) => &i.attrs,
        syn::Item::Union(i) => &i.attrs,
        syn::Item::Macro(i) => &i.attrs,
        _ => &[],
    }
}

/// The names a `use` tree binds (none for a glob) and the paths they stand for.
fn use_tree(tree: &syn::UseTree, prefix: Vec<String>, out: &mut Vec<(Option<String>, Vec<String>)>) {
    match tree {
        syn::UseTree::Path(p) => {
            let mut prefix = prefix;
            prefix.push(p.ident.to_string());
            use_tree(&p.tree, prefix, out);
        }
        syn::UseTree::Name(n) => {
            let name = n.ident.to_string();
            if name == "self" {
                out.push((prefix.last().cloned(), prefix));
            } else {
                let mut path = prefix;
                path.push(name.clone());
                out.push((Some(name), path));
            }
        }
        syn::UseTree::Rename(r) => {
            let mut path = prefix;
            if r.ident != "self" {
                path.push(r.ident.to_string());
            }
            out.push((Some(r.rename.to_string()), path));
        }
        syn::UseTree::Glob(_) => out.push((None, prefix)),
        syn::UseTree::Group(g) => {
            for tree in &g.items {
                use_tree(tree, prefix.clone(), out);
            }
        }
    }
}

/// Every path of more than one segment in an item, and single names too (they may be
/// bindings), skipping nested `#[cfg(test)]` items.
#[derive(Default)]
struct PathCollector(Vec<Vec<String>>);

impl<'ast> Visit<'ast> for PathCollector {
    fn visit_path(&mut self, path: &'ast syn::Path) {
        self.0.push(path.segments.iter().map(|s| s.ident.to_string()).collect());
        syn::visit::visit_path(self, path);
    }

    /// `pub(in crate::a)` names a module that may see an item, not a dependency.
    fn visit_visibility(&mut self, _: &'ast syn::Visibility) {}

    fn visit_item(&mut self, item: &'ast syn::Item) {
        if !is_test_only(item_attrs(item)) {
            syn::visit::visit_item(self, item);
        }
    }

    fn visit_impl_item_fn(&mut self, f: &'ast syn::ImplItemFn) {
        if !is_test_only(&f.attrs) {
            syn::visit::visit_impl_item_fn(self, f);
        }
    }
}
