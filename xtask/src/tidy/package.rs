//! What a package's sources read at build time (`include_str!`, `include_bytes!`) ships in
//! its package: a crate whose `include` list leaves out a file its source embeds builds in
//! the workspace and fails from the registry (found: backend-nccl's PTX).

use std::path::{Component, Path, PathBuf};

/// The `include = [...]` globs of a manifest (empty where it has none: everything ships).
pub(crate) fn include_globs(manifest: &str) -> Vec<String> {
    let Some(line) = manifest
        .lines()
        .find(|l| l.trim_start().starts_with("include") && l.contains('['))
    else {
        return Vec::new();
    };
    line.split('"')
        .skip(1)
        .step_by(2)
        .map(|g| g.trim_start_matches('/').to_string())
        .collect()
}

/// The files `text` (a source at `file`, relative to its package) embeds, relative to the
/// package.
pub(crate) fn embedded(file: &Path, text: &str) -> Vec<String> {
    let dir = file.parent().unwrap_or(Path::new(""));
    let mut out = Vec::new();
    for mac in ["include_str!(\"", "include_bytes!(\""] {
        for (at, _) in text.match_indices(mac) {
            let rest = &text[at + mac.len()..];
            let Some(end) = rest.find('"') else { continue };
            out.push(normal(&dir.join(&rest[..end])));
        }
    }
    out
}

/// `p` with its `..` and `.` resolved, `/`-separated.
fn normal(p: &Path) -> String {
    let mut v: Vec<String> = Vec::new();
    for c in p.components() {
        match c {
            Component::ParentDir => {
                v.pop();
            }
            Component::Normal(s) => v.push(s.to_string_lossy().into_owned()),
            _ => {}
        }
    }
    v.join("/")
}

/// Whether `path` matches `glob` (`**` any number of folders, `*` within one name).
pub(crate) fn matches(glob: &str, path: &str) -> bool {
    fn segs(g: &[&str], p: &[&str]) -> bool {
        match (g.first(), p.first()) {
            (None, None) => true,
            (Some(&"**"), _) => segs(&g[1..], p) || (!p.is_empty() && segs(g, &p[1..])),
            (Some(g0), Some(p0)) => name(g0.as_bytes(), p0.as_bytes()) && segs(&g[1..], &p[1..]),
            _ => false,
        }
    }
    fn name(g: &[u8], p: &[u8]) -> bool {
        match (g.first(), p.first()) {
            (None, None) => true,
            (Some(b'*'), _) => name(&g[1..], p) || (!p.is_empty() && name(g, &p[1..])),
            (Some(a), Some(b)) => a == b && name(&g[1..], &p[1..]),
            _ => false,
        }
    }
    let g: Vec<&str> = glob.split('/').collect();
    let p: Vec<&str> = path.split('/').collect();
    segs(&g, &p)
}

/// The embedded files of package `name` that its `include` globs leave out.
pub(crate) fn unshipped(name: &str, globs: &[String], files: &[String]) -> Vec<String> {
    if globs.is_empty() {
        return Vec::new();
    }
    files
        .iter()
        .filter(|f| !globs.iter().any(|g| matches(g, f)))
        .map(|f| {
            format!("{name}: {f} is embedded by its source but not in its package's `include`")
        })
        .collect()
}

/// Every `.rs` file under `dir`, relative to `base`.
pub(crate) fn rust_files(base: &Path, dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let Ok(rd) = std::fs::read_dir(base.join(dir)) else {
        return out;
    };
    for e in rd.flatten() {
        let p = dir.join(e.file_name());
        if e.path().is_dir() {
            out.extend(rust_files(base, &p));
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
    out
}
