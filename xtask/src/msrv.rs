//! `msrv`: the workspace's `rust-version` must be at least that of every crate its published
//! packages build with (their normal and build dependencies, transitively, read from
//! `cargo metadata`), or a user on that toolchain could not build them. Tools that are not
//! published (the xtask, the benchmark) and dev-dependencies are not a user's concern.

use std::collections::{HashMap, HashSet};

use anyhow::{bail, Context, Result};
use cargo_metadata::{DependencyKind, MetadataCommand, PackageId};

use crate::cargo::root;

/// Checks the published packages' `rust-version` against what they build with.
pub(crate) fn msrv() -> Result<()> {
    let meta = MetadataCommand::new()
        .current_dir(root())
        .exec()
        .context("cargo metadata")?;
    let published: Vec<_> = meta
        .workspace_packages()
        .into_iter()
        .filter(|p| p.publish.as_ref().is_none_or(|r| !r.is_empty()))
        .collect();
    let ours = published
        .iter()
        .filter_map(|p| p.rust_version.clone())
        .min()
        .context("no published package has a rust-version")?;
    let resolve = meta
        .resolve
        .as_ref()
        .context("cargo metadata without a resolve")?;
    let nodes: HashMap<&PackageId, _> = resolve.nodes.iter().map(|n| (&n.id, n)).collect();
    let mut seen: HashSet<&PackageId> = HashSet::new();
    let mut todo: Vec<&PackageId> = published.iter().map(|p| &p.id).collect();
    while let Some(id) = todo.pop() {
        if !seen.insert(id) {
            continue;
        }
        let Some(node) = nodes.get(id) else { continue };
        for d in &node.deps {
            if d.dep_kinds
                .iter()
                .any(|k| k.kind != DependencyKind::Development)
            {
                todo.push(&d.pkg);
            }
        }
    }
    let mut newer: Vec<String> = meta
        .packages
        .iter()
        .filter(|p| seen.contains(&p.id))
        .filter_map(|p| {
            let theirs = p.rust_version.as_ref()?;
            (*theirs > ours).then(|| format!("{} {} needs Rust {theirs}", p.name, p.version))
        })
        .collect();
    newer.sort();
    if !newer.is_empty() {
        bail!(
            "rust-version {ours} is older than what the published packages build with:\n  {}",
            newer.join("\n  ")
        );
    }
    eprintln!(
        "rust-version {ours}: every one of the {} crates the published packages build with allows it",
        seen.len()
    );
    Ok(())
}
