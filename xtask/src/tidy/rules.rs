//! The rules, each a function from what was read to the violations found (one line each),
//! so that the tests can plant a violation of every rule and see it refused.

use std::collections::BTreeMap;
use std::path::Path;

use super::source::{functions, has_unsafe, has_unsafe_impl, Source};
use super::workspace::{circles, Crate, Module};

/// A layer table: groups of names, lowest first. A name may use its own group's (the
/// circle rule keeps those acyclic) and lower groups', never a higher one's.
pub(crate) type Layers = &'static [(&'static str, &'static [&'static str])];

fn layer_of(layers: Layers, name: &str) -> Option<(usize, &'static str)> {
    layers
        .iter()
        .enumerate()
        .find(|(_, (_, names))| names.contains(&name))
        .map(|(i, (label, _))| (i, *label))
}

/// Packages that depend on a package of a higher layer, or on one the table does not name.
pub(crate) fn crate_layers(layers: Layers, deps: &BTreeMap<String, Vec<String>>) -> Vec<String> {
    let mut out = Vec::new();
    for (pkg, ds) in deps {
        let Some((mine, label)) = layer_of(layers, pkg) else {
            out.push(format!("package {pkg} is in no layer of the crate table"));
            continue;
        };
        for d in ds {
            match layer_of(layers, d) {
                None => out.push(format!("{pkg} depends on {d}, which is in no layer")),
                Some((theirs, their_label)) if theirs > mine => out.push(format!(
                    "{pkg} ({label}) depends on {d} ({their_label}), a higher layer"
                )),
                _ => {}
            }
        }
    }
    out
}

/// Modules of `krate` that name a module of a higher layer (by their top-level module).
pub(crate) fn module_layers(layers: Layers, krate: &Crate) -> Vec<String> {
    let mut out = Vec::new();
    let top = |m: &Module| m.first().cloned().unwrap_or_default();
    for (m, targets) in krate.graph() {
        if m.is_empty() {
            continue;
        }
        let Some((mine, label)) = layer_of(layers, &top(&m)) else {
            out.push(format!(
                "{}: module {} is in no layer",
                krate.name,
                m.join("::")
            ));
            continue;
        };
        for t in targets {
            match layer_of(layers, &top(&t)) {
                Some((theirs, their)) if theirs > mine => out.push(format!(
                    "{}: {} ({label}) names {} ({their}), a higher layer",
                    krate.name,
                    m.join("::"),
                    t.join("::")
                )),
                None => out.push(format!(
                    "{}: module {} is in no layer",
                    krate.name,
                    t.join("::")
                )),
                _ => {}
            }
        }
    }
    out
}

/// Every import circle of `krate`'s files.
pub(crate) fn import_circles(krate: &Crate) -> Vec<String> {
    circles(&krate.graph())
        .into_iter()
        .map(|c| {
            let files: Vec<String> = c
                .iter()
                .filter_map(|m| krate.files.get(m))
                .map(|(p, _)| p.display().to_string())
                .collect();
            format!("import circle in {}: {}", krate.name, files.join(" -> "))
        })
        .collect()
}

/// Functions over `max` lines, beyond the allow-list of `(file, function, lines)`; an entry
/// whose function shrank to `max` or fewer, or grew, is refused as well: the list only
/// shrinks, and a listed function only gets shorter.
pub(crate) fn long_functions(
    max: usize,
    krates: &[&Crate],
    allowed: &[(&str, &str, usize)],
) -> Vec<String> {
    let mut out = Vec::new();
    let mut seen = vec![false; allowed.len()];
    for k in krates {
        for (path, src) in k.files.values() {
            let file = path.to_string_lossy().replace('\\', "/");
            for f in functions(&src.code).into_iter().filter(|f| f.lines > max) {
                match allowed
                    .iter()
                    .position(|(p, n, _)| *p == file && *n == f.name)
                {
                    Some(i) if f.lines <= allowed[i].2 => seen[i] = true,
                    Some(i) => {
                        seen[i] = true;
                        out.push(format!(
                            "{file}:{} fn {} grew to {} lines (allowed {} while it is split)",
                            f.line, f.name, f.lines, allowed[i].2
                        ))
                    }
                    None => out.push(format!(
                        "{file}:{} fn {} has {} lines (over {max}): split it by phase",
                        f.line, f.name, f.lines
                    )),
                }
            }
        }
    }
    for (i, (p, n, _)) in allowed.iter().enumerate() {
        if !seen[i] {
            out.push(format!(
                "{p} fn {n} is allowed to be long but is not (or is gone): remove its entry"
            ));
        }
    }
    out
}

/// Files whose code `holds` but that are not among `allowed`, each with `why`.
fn held_outside(
    krates: &[&Crate],
    allowed: &[&str],
    holds: fn(&str) -> bool,
    why: &str,
) -> Vec<String> {
    let mut out = Vec::new();
    for k in krates {
        for (path, src) in k.files.values() {
            let file = path.to_string_lossy().replace('\\', "/");
            if holds(&src.code) && !allowed.contains(&file.as_str()) {
                out.push(format!("{file} {why}"));
            }
        }
    }
    out
}

/// Entries of `allowed` whose file no longer `holds` (or is gone): such a list only shrinks.
pub(crate) fn stale_allowed(
    krates: &[&Crate],
    allowed: &[&str],
    holds: fn(&str) -> bool,
    what: &str,
) -> Vec<String> {
    allowed
        .iter()
        .filter(|f| {
            !krates
                .iter()
                .flat_map(|c| c.files.values())
                .any(|(p, s)| rel(Path::new(""), p) == **f && holds(&s.code))
        })
        .map(|f| format!("{f} is allowed {what} but has none: remove it"))
        .collect()
}

/// Files that hold `unsafe` but are not among the files allowed it.
pub(crate) fn unsafe_outside(krates: &[&Crate], allowed: &[&str]) -> Vec<String> {
    held_outside(
        krates,
        allowed,
        has_unsafe,
        "uses `unsafe`, which belongs to the FFI layers that are allowed it",
    )
}

/// Files outside `allowed` that vouch for a type by hand (`unsafe impl`): a type owns what it
/// guards (a lock around the handle), so that `Send` and `Sync` follow from its fields.
pub(crate) fn unsafe_impl_outside(krates: &[&Crate], allowed: &[&str]) -> Vec<String> {
    held_outside(
        krates,
        allowed,
        has_unsafe_impl,
        "has an `unsafe impl`: own what the lock guards instead, or hold the raw handle in the files allowed it",
    )
}

/// The dependencies of `package` among `deps` that `forbidden` names.
pub(crate) fn forbidden_deps(package: &str, deps: &[String], forbidden: &[&str]) -> Vec<String> {
    deps.iter()
        .filter(|d| forbidden.contains(&d.as_str()))
        .map(|d| format!("{package} depends on {d}"))
        .collect()
}

/// The layers a document states, lowest first, as the backticked names of `known` in each:
/// for `list` the paragraph after the line starting with `marker`, its layers separated by
/// `→`; otherwise the numbered list after `marker`, one layer per item. So that the
/// document and the test's tables are one (rust-analyzer ties its docs to its code).
pub(crate) fn doc_layers(
    doc: &str,
    marker: &str,
    arrows: bool,
    known: &[&str],
) -> Vec<Vec<String>> {
    let Some(at) = doc.find(marker) else {
        return Vec::new();
    };
    let rest = &doc[at + marker.len()..];
    let text = match arrows {
        true => rest.split("\n\n").next().unwrap_or(""),
        false => rest
            .split("\n\n")
            .find(|p| p.trim_start().starts_with("1."))
            .unwrap_or(""),
    };
    let parts: Vec<String> = if arrows {
        text.split('→').map(str::to_string).collect()
    } else {
        let mut items: Vec<String> = Vec::new();
        for line in text.lines() {
            let t = line.trim_start();
            let numbered = t
                .split_once(". ")
                .is_some_and(|(n, _)| n.parse::<u32>().is_ok());
            match (numbered, items.last_mut()) {
                (false, Some(last)) => last.push_str(line),
                _ => items.push(line.to_string()),
            }
        }
        items
    };
    parts
        .iter()
        .map(|p| {
            p.split('`')
                .skip(1)
                .step_by(2)
                .filter(|n| known.contains(n))
                .map(str::to_string)
                .collect()
        })
        .collect()
}

/// Where `stated` (a document's layers) differs from `table`.
pub(crate) fn layers_differ(what: &str, stated: &[Vec<String>], table: Layers) -> Vec<String> {
    let want: Vec<Vec<String>> = table
        .iter()
        .map(|(_, names)| names.iter().map(|n| n.to_string()).collect())
        .collect();
    match stated == want.as_slice() {
        true => Vec::new(),
        false => vec![format!(
            "{what}: ARCHITECTURE.md states {stated:?}, the test's table is {want:?}"
        )],
    }
}

/// Identifiers in code (not comments or strings) that name a vendor's library (`word`,
/// any case, inside an identifier: `nccl`, `from_nccl_code`, `ncclDataType`): the contract
/// knows no vendor's codes or names.
pub(crate) fn vendor_identifiers(krate: &Crate, word: &str) -> Vec<String> {
    krate
        .files
        .values()
        .flat_map(|(path, src)| identifiers(path, &src.code))
        .filter(|(_, id)| id.to_ascii_lowercase().contains(word))
        .map(|(at, id)| format!("{at}: `{id}` names a vendor's library"))
        .collect()
}

/// Every identifier of `code` (comments and strings blanked) with its `file:line`.
fn identifiers<'a>(path: &Path, code: &'a str) -> impl Iterator<Item = (String, &'a str)> {
    let file = path.to_string_lossy().replace('\\', "/");
    code.lines().enumerate().flat_map(move |(line, text)| {
        let at = format!("{file}:{}", line + 1);
        text.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .filter(|id| !id.is_empty())
            .map(move |id| (at.clone(), id))
    })
}

/// The identifier `word` in code outside the modules `allowed` (by top-level module): what
/// only the call layer may name (the library's raw progress code), so that the rest reads
/// typed results.
pub(crate) fn names_outside(krate: &Crate, word: &str, allowed: &[&str]) -> Vec<String> {
    krate
        .files
        .iter()
        .filter(|(module, _)| {
            !module
                .first()
                .is_some_and(|m| allowed.contains(&m.as_str()))
        })
        .flat_map(|(_, (path, src))| identifiers(path, &src.code))
        .filter(|(_, id)| *id == word)
        .map(|(at, id)| {
            format!(
                "{at}: `{id}` belongs to the call layer ({})",
                allowed.join(", ")
            )
        })
        .collect()
}

/// Uses of the library's function table (`fns.NAME`) outside the modules `allowed` (by
/// top-level module) other than asking whether an entry exists: the library is called in one
/// layer, whose functions carry the version gates and the typed results.
pub(crate) fn library_calls_outside(krate: &Crate, allowed: &[&str]) -> Vec<String> {
    let mut out = Vec::new();
    for (module, (path, src)) in &krate.files {
        if module
            .first()
            .is_some_and(|m| allowed.contains(&m.as_str()))
        {
            continue;
        }
        for (n, line) in src.code.lines().enumerate() {
            for (i, _) in line.match_indices("fns.") {
                let rest = &line[i + 4..];
                let name_end = rest
                    .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                    .unwrap_or(rest.len());
                let after = rest[name_end..].trim_start();
                let word_before = i > 0 && {
                    let c = line.as_bytes()[i - 1];
                    c.is_ascii_alphanumeric() || c == b'_'
                };
                if word_before || name_end == 0 {
                    continue;
                }
                if !(after.starts_with(".is_some()") || after.starts_with(".is_none()")) {
                    out.push(format!(
                        "{}:{}: uses the library's table ({}) outside the layer of library calls",
                        path.display(),
                        n + 1,
                        &line[i..i + 4 + name_end]
                    ));
                }
            }
        }
    }
    out
}

/// Citations of a commit's file (a commit id, a colon, a path): a reader of the published crate or
/// docs cannot open them. Figures and decisions are cited instead.
pub(crate) fn commit_citations(name: &str, text: &str) -> Vec<String> {
    let mut out = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let b = line.as_bytes();
        for (i, _) in line.match_indices(':') {
            let start = line[..i]
                .rfind(|c: char| !c.is_ascii_hexdigit())
                .map_or(0, |s| s + 1);
            let hex = &line[start..i];
            let word_start = start == 0 || !b[start - 1].is_ascii_alphanumeric();
            let path_follows = line[i + 1..]
                .chars()
                .next()
                .is_some_and(|c| c.is_ascii_alphabetic() || c == '.');
            let digit = hex.bytes().any(|c| c.is_ascii_digit());
            if (7..=40).contains(&hex.len()) && word_start && path_follows && digit {
                out.push(format!(
                    "{name}:{}: cites a commit's file ({hex}:...)",
                    n + 1
                ));
            }
        }
    }
    out
}

/// The comments of every library file, as one text per file, for [`commit_citations`].
pub(crate) fn comment_texts(krates: &[&Crate]) -> Vec<(String, String)> {
    krates
        .iter()
        .flat_map(|k| k.files.values())
        .map(|(p, src): &(std::path::PathBuf, Source)| {
            let text: Vec<&str> = src.comments.iter().map(|(_, c)| c.as_str()).collect();
            (p.display().to_string(), text.join("\n"))
        })
        .collect()
}

/// `path` relative to `root`, with `/`.
pub(crate) fn rel(root: &Path, path: &Path) -> String {
    path.strip_prefix(root)
        .unwrap_or(path)
        .to_string_lossy()
        .replace('\\', "/")
}

/// Parameters bound by a tuple pattern: every one in a public function (a group of
/// settings the caller must pass by position: name it, as `SymmetricOptions`), and one
/// line saying how many there are in all when that is over `ceiling`.
pub(crate) fn tuple_parameters(krates: &[&Crate], ceiling: usize) -> Vec<String> {
    let mut out = Vec::new();
    let mut total = 0;
    for k in krates {
        for (path, src) in k.files.values() {
            let file = path.to_string_lossy().replace('\\', "/");
            for t in super::source::tuple_params(&src.code) {
                total += 1;
                if t.public {
                    out.push(format!(
                        "{file}:{} pub fn {} binds a parameter by a tuple pattern: name the group (an options struct)",
                        t.line, t.function
                    ));
                }
            }
        }
    }
    if total > ceiling {
        out.push(format!(
            "{total} parameters bound by tuple patterns, over the ceiling of {ceiling}"
        ));
    }
    out
}
