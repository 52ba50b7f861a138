//! The workspace as the rules see it: each package's library and binary sources as modules,
//! the module graph their paths make, and the shipped documents.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use super::source::{paths, Source};

/// A module path inside its crate (`[]` is the crate root).
pub(crate) type Module = Vec<String>;

/// One package's sources under `src/` (test-only files left out).
pub(crate) struct Crate {
    /// The package's name.
    pub name: String,
    /// Each module's file and parsed source.
    pub files: BTreeMap<Module, (PathBuf, Source)>,
}

impl Crate {
    /// Reads `dir/src` of package `name` (no files where it has no `src/`).
    pub(crate) fn read(root: &Path, dir: &Path, name: &str) -> std::io::Result<Crate> {
        let mut files = BTreeMap::new();
        let src = root.join(dir).join("src");
        for path in rust_files(&src)? {
            let base = path.file_name().and_then(|f| f.to_str()).unwrap_or("");
            if base == "tests.rs" || base.starts_with("tests_") || base.ends_with("_tests.rs") {
                continue;
            }
            let text = std::fs::read_to_string(&path)?;
            let rel = path.strip_prefix(root).unwrap_or(&path).to_path_buf();
            files.insert(module_of(&src, &path), (rel, Source::parse(&text)));
        }
        Ok(Crate {
            name: name.to_string(),
            files,
        })
    }

    /// Builds a crate from text, for the rules' own tests: `(file under src/, text)`.
    #[cfg(test)]
    pub(crate) fn from_texts(name: &str, texts: &[(&str, &str)]) -> Crate {
        let src = Path::new("src");
        let files = texts
            .iter()
            .map(|(f, t)| {
                let p = src.join(f);
                (module_of(src, &p), (p, Source::parse(t)))
            })
            .collect();
        Crate {
            name: name.to_string(),
            files,
        }
    }

    /// Module -> the other modules of this crate it names (the root left out: everything
    /// may name what the crate root re-exports).
    pub(crate) fn graph(&self) -> BTreeMap<Module, BTreeSet<Module>> {
        let mods: BTreeSet<&Module> = self.files.keys().collect();
        let resolve = |target: &[String]| -> Option<Module> {
            (1..=target.len())
                .rev()
                .map(|n| target[..n].to_vec())
                .find(|m| mods.contains(m))
        };
        let mut g = BTreeMap::new();
        for (m, (_, src)) in &self.files {
            // A module's `super` is its parent whether its file is `x.rs` or `x/mod.rs`.
            let here: Module = m.clone();
            let mut edges = BTreeSet::new();
            for p in paths(&src.code) {
                let target: Module = match p.first().map(String::as_str) {
                    Some("crate") => p[1..].to_vec(),
                    Some("self") => here.iter().chain(&p[1..]).cloned().collect(),
                    Some("super") => {
                        let ups = p.iter().take_while(|s| *s == "super").count();
                        let mut base = here.clone();
                        for _ in 0..ups {
                            base.pop();
                        }
                        base.into_iter().chain(p[ups..].iter().cloned()).collect()
                    }
                    // A bare path naming a child module (2018 paths), else an extern crate.
                    Some(first) => {
                        let mut child = here.clone();
                        child.push(first.to_string());
                        if !mods.contains(&child) {
                            continue;
                        }
                        here.iter().chain(&p).cloned().collect()
                    }
                    None => continue,
                };
                if let Some(t) = resolve(&target) {
                    if !t.is_empty() && t != *m {
                        edges.insert(t);
                    }
                }
            }
            g.insert(m.clone(), edges);
        }
        g
    }
}

/// The module a file under `src` defines.
fn module_of(src: &Path, path: &Path) -> Module {
    let rel = path.strip_prefix(src).unwrap_or(path).with_extension("");
    let mut m: Module = rel
        .components()
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .collect();
    if matches!(m.last().map(String::as_str), Some("lib" | "main" | "mod")) {
        m.pop();
    }
    m
}

/// Every `.rs` file under `dir`, sorted.
pub(crate) fn rust_files(dir: &Path) -> std::io::Result<Vec<PathBuf>> {
    let mut out = Vec::new();
    if !dir.is_dir() {
        return Ok(out);
    }
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d)? {
            let p = e?.path();
            if p.is_dir() {
                stack.push(p);
            } else if p.extension().is_some_and(|x| x == "rs") {
                out.push(p);
            }
        }
    }
    out.sort();
    Ok(out)
}

/// Strongly connected groups of two or more modules (Tarjan's algorithm).
pub(crate) fn circles(g: &BTreeMap<Module, BTreeSet<Module>>) -> Vec<Vec<Module>> {
    struct T<'a> {
        g: &'a BTreeMap<Module, BTreeSet<Module>>,
        index: BTreeMap<&'a Module, (usize, usize)>,
        stack: Vec<&'a Module>,
        on: BTreeSet<&'a Module>,
        out: Vec<Vec<Module>>,
    }
    fn visit<'a>(t: &mut T<'a>, v: &'a Module) {
        let n = t.index.len();
        t.index.insert(v, (n, n));
        t.stack.push(v);
        t.on.insert(v);
        for w in t.g.get(v).into_iter().flatten() {
            if !t.index.contains_key(w) {
                visit(t, w);
                let lw = t.index[w].1;
                let e = t.index.get_mut(v).map(|e| &mut e.1);
                e.into_iter().for_each(|l| *l = (*l).min(lw));
            } else if t.on.contains(w) {
                let iw = t.index[w].0;
                t.index
                    .get_mut(v)
                    .into_iter()
                    .for_each(|e| e.1 = e.1.min(iw));
            }
        }
        if t.index[v].0 == t.index[v].1 {
            let mut comp = Vec::new();
            while let Some(w) = t.stack.pop() {
                t.on.remove(w);
                comp.push(w.clone());
                if w == v {
                    break;
                }
            }
            if comp.len() > 1 {
                comp.sort();
                t.out.push(comp);
            }
        }
    }
    let mut t = T {
        g,
        index: BTreeMap::new(),
        stack: Vec::new(),
        on: BTreeSet::new(),
        out: Vec::new(),
    };
    for v in g.keys() {
        if !t.index.contains_key(v) {
            visit(&mut t, v);
        }
    }
    t.out
}
