//! The architecture test (rust-analyzer's `xtask/src/tidy.rs` is the model): the rules
//! docs/dev/ARCHITECTURE.md states, checked by `cargo test` over the workspace's sources, so
//! that the document cannot drift from the code. Each rule is a function in [`rules`]; the
//! tables below are the architecture, written once; `planted.rs` shows each rule refusing a
//! planted violation.

mod door;
mod forward;
#[cfg(test)]
mod manual;
mod package;
mod rules;
mod source;
mod workspace;

#[cfg(test)]
mod planted;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use rules::Layers;
use workspace::Crate;

/// The packages, lowest layer first. A package depends only on lower layers' packages.
pub(crate) const CRATE_LAYERS: Layers = &[
    ("the contract", &["unicomm-core"]),
    (
        "beside the contract",
        &["unicomm-bootstrap", "unicomm-conformance"],
    ),
    ("the NCCL-API layer", &["unicomm-nccl-api"]),
    (
        "the backends",
        &["unicomm-mock", "unicomm-nccl", "unicomm-rccl"],
    ),
    ("the facade", &["unicomm"]),
    ("integrations with engines' frameworks", &["unicomm-candle"]),
    ("programs", &["unicomm-bench", "unicomm-gpu-tests", "xtask"]),
];

/// What the contract must never depend on: cryptography and sockets belong to the
/// rendezvous.
const CONTRACT_MUST_NOT_DEPEND_ON: &[&str] = &[
    "hmac",
    "sha2",
    "getrandom",
    "socket2",
    "mio",
    "tokio",
    "cudarc",
    "libloading",
];

/// What the NCCL-API layer must never depend on: the rendezvous (re-forming is a trait of
/// the contract, handed in from above) and the cryptography and sockets it brings.
const NCCL_API_MUST_NOT_DEPEND_ON: &[&str] =
    &["unicomm-bootstrap", "hmac", "sha2", "mio", "socket2"];

/// nccl-api's modules, lowest layer first (by top-level module).
pub(crate) const NCCL_API_LAYERS: Layers = &[
    (
        "the C library: table, loader, one safe function per call, ncclConfig_t, the device runtime",
        &["sys"],
    ),
    (
        "tools: waiting, the thread's group, stream watchers, memory and markers, conversions, the policy's table",
        &["wait", "watch", "group", "memory", "marker", "conv", "policy"],
    ),
    ("one safe ncclComm_t and its creation", &["libcomm", "create"]),
    (
        "over one communicator: agreement, calls, split, shrink, registration bookkeeping",
        &["agree", "library", "split", "shrink", "base"],
    ),
    (
        "the other paths: copy engines, automatic registration, symmetric memory, the device API",
        &["copy_engine", "auto", "symmetric", "device_comm"],
    ),
    (
        "the composed communicator and its routing; a vendor crate's entry points",
        &["comm", "vendor"],
    ),
];

/// Library functions may have at most this many lines (100 until 2026-12-05; the functions
/// then between 81 and 100 lines wait in [`LONG_FUNCTIONS`] to be split by phase).
pub(crate) const MAX_FN_LINES: usize = 80;

/// The most parameters bound by tuple patterns in the library crates (none public): the
/// count only falls.
pub(crate) const MAX_TUPLE_PARAMS: usize = 33;

/// Functions over [`MAX_FN_LINES`] while they wait to be split by phase, with their length
/// today: an entry may only go (or its length fall), never be added. Empty since every one
/// of the 23 listed at the limit's fall was split by phase (2026-12-05).
pub(crate) const LONG_FUNCTIONS: &[(&str, &str, usize)] = &[];

/// The files that may hold `unsafe`: FFI layers and the memory they own. The list may only
/// shrink, but for a new layer of that kind (the mock's symmetric kernels reach peers'
/// memory through its mappings' addresses, as a GPU kernel does; NCCL's device API is a
/// new library call file and a new kernel launch).
pub(crate) const UNSAFE_FILES: &[&str] = &[
    "backend-mock/src/exec.rs",
    "backend-mock/src/memory.rs",
    "backend-mock/src/reduce.rs",
    "backend-mock/src/shm.rs",
    "backend-mock/src/symmetric/kernels.rs",
    "backend-nccl/src/graph.rs",
    "backend-rccl/src/graph.rs",
    "backend-nccl/src/interop.rs",
    "backend-nccl/src/dependent.rs",
    "backend-nccl/src/kernels.rs",
    "backend-nccl/src/runtime.rs",
    "backend-nccl/src/vmm.rs",
    "backend-rccl/src/interop.rs",
    "backend-rccl/src/kernels.rs",
    "backend-rccl/src/load.rs",
    "backend-rccl/src/streams.rs",
    "backend-rccl/src/runtime.rs",
    "backend-rccl/src/sys.rs",
    "backend-rccl/src/vmm.rs",
    "bench/src/run/modes.rs",
    "candle/src/ops/cuda.rs",
    "bootstrap/src/secret.rs",
    "comm-core/src/clock.rs",
    "comm-core/src/element.rs",
    "comm-core/src/registration.rs",
    "gpu-tests/src/ipc.rs",
    "gpu-tests/src/signals.rs",
    "gpu-tests/src/signals_cases.rs",
    "nccl-api/src/auto.rs",
    "nccl-api/src/base.rs",
    "nccl-api/src/copy_engine/ipc.rs",
    "nccl-api/src/copy_engine/mod.rs",
    "nccl-api/src/copy_engine/pending.rs",
    "nccl-api/src/copy_engine/signals.rs",
    "nccl-api/src/device_comm.rs",
    "nccl-api/src/libcomm/mod.rs",
    "nccl-api/src/memory.rs",
    "nccl-api/src/sys/api.rs",
    "nccl-api/src/sys/calls/check.rs",
    "nccl-api/src/sys/calls/comm.rs",
    "nccl-api/src/sys/calls/window.rs",
    "nccl-api/src/sys/calls/data.rs",
    "nccl-api/src/sys/calls/device.rs",
    "nccl-api/src/sys/calls/grow.rs",
    "nccl-api/src/sys/calls/handles.rs",
    "nccl-api/src/sys/config.rs",
    "nccl-api/src/sys/ep/library.rs",
    "nccl-api/src/symmetric/engine.rs",
    "nccl-api/src/sys/ep/calls.rs",
    "nccl-api/src/sys/runtime.rs",
    "nccl-api/src/sys/search.rs",
    "nccl-api/src/symmetric/control.rs",
    "nccl-api/src/symmetric/mod.rs",
    "xtask/src/launch/mod.rs",
];

/// The files that may vouch for a type by hand (`unsafe impl Send`/`Sync`): the owners of raw
/// handles and memory. The list may only shrink (a communicator's owner is not on it: it
/// owns what its lock guards).
pub(crate) const UNSAFE_IMPL_FILES: &[&str] = &[
    "backend-mock/src/memory.rs",
    "backend-nccl/src/graph.rs",
    "backend-rccl/src/graph.rs",
    "backend-rccl/src/interop.rs",
    "nccl-api/src/auto.rs",
    "nccl-api/src/base.rs",
    "nccl-api/src/memory.rs",
    "nccl-api/src/sys/calls/handles.rs",
    "nccl-api/src/sys/config.rs",
];

/// The workspace root.
pub(crate) fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .map_or_else(|| PathBuf::from("."), Path::to_path_buf)
}

/// Every workspace package with its folder and its unicomm dependencies (normal ones).
pub(crate) fn packages() -> Vec<(String, PathBuf, Vec<String>, Vec<String>)> {
    let root = root();
    let meta = cargo_metadata::MetadataCommand::new()
        .manifest_path(root.join("Cargo.toml"))
        .no_deps()
        .exec()
        .unwrap_or_else(|e| panic!("cargo metadata: {e}"));
    meta.workspace_packages()
        .into_iter()
        .map(|p| {
            let dir = p
                .manifest_path
                .parent()
                .map(|d| {
                    d.as_std_path()
                        .strip_prefix(&root)
                        .unwrap_or(Path::new(""))
                        .to_path_buf()
                })
                .unwrap_or_default();
            let normal: Vec<&cargo_metadata::Dependency> = p
                .dependencies
                .iter()
                .filter(|d| d.kind == cargo_metadata::DependencyKind::Normal)
                .collect();
            let ours = normal
                .iter()
                .filter(|d| d.name.starts_with("unicomm") || d.name == "xtask")
                .map(|d| d.name.clone())
                .collect();
            let all = normal.iter().map(|d| d.name.clone()).collect();
            (p.name.to_string(), dir, ours, all)
        })
        .collect()
}

/// Every workspace package's sources.
pub(crate) fn crates() -> Vec<Crate> {
    let root = root();
    packages()
        .into_iter()
        .map(|(name, dir, _, _)| {
            Crate::read(&root, &dir, &name).unwrap_or_else(|e| panic!("reading {name}: {e}"))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn assert_none(what: &str, v: Vec<String>) {
        assert!(v.is_empty(), "{what}:\n  {}", v.join("\n  "));
    }

    /// The facade's `AnyComm` implements every method of `Collective` (none is left to
    /// the trait's default, which would answer `Unsupported` through `unicomm::Comm`).
    #[test]
    fn the_facade_forwards_every_backend_call() {
        let root = root();
        let read =
            |p: &str| std::fs::read_to_string(root.join(p)).unwrap_or_else(|e| panic!("{p}: {e}"));
        let methods =
            forward::block_methods(&read("comm-core/src/backend.rs"), "pub trait Collective");
        assert!(methods.len() > 30, "{methods:?}");
        let implemented =
            forward::block_methods(&read("src/dispatch.rs"), "impl Collective for AnyComm");
        assert_none(
            "the facade's forwarding",
            forward::unforwarded(&methods, &implemented),
        );
    }

    /// The one door (docs/dev/ARCHITECTURE.md): every stream-ordered operation reaches a
    /// backend through `Collective::enqueue`, and only the backends' doors record work.
    #[test]
    fn every_stream_ordered_operation_goes_through_the_one_door() {
        let root = root();
        let contract = std::fs::read_to_string(root.join("comm-core/src/backend.rs"))
            .unwrap_or_else(|e| panic!("comm-core/src/backend.rs: {e}"));
        let code = source::Source::parse(&contract).code;
        let mut v = door::second_doors(&code, "pub trait Collective");
        let cs = crates();
        let refs: Vec<&Crate> = cs.iter().collect();
        v.extend(door::records_outside_doors(&refs, door::DOOR_FILES));
        assert_none("the one door", v);
    }

    /// What a source embeds at build time ships in its package (`include`).
    #[test]
    fn every_file_a_source_embeds_ships_in_its_package() {
        let root = root();
        let mut bad = Vec::new();
        for (name, dir, _, _) in packages() {
            let manifest = std::fs::read_to_string(root.join(&dir).join("Cargo.toml"))
                .unwrap_or_else(|e| panic!("{name}'s manifest: {e}"));
            let pkg = root.join(&dir);
            let files: Vec<String> = package::rust_files(&pkg, Path::new("src"))
                .into_iter()
                .flat_map(|f| {
                    let text = std::fs::read_to_string(pkg.join(&f)).unwrap_or_default();
                    package::embedded(&f, &text)
                })
                .collect();
            bad.extend(package::unshipped(
                &name,
                &package::include_globs(&manifest),
                &files,
            ));
        }
        assert_none("embedded files left out of packages", bad);
    }

    #[test]
    fn every_package_depends_only_on_lower_layers() {
        let deps: BTreeMap<String, Vec<String>> =
            packages().into_iter().map(|(n, _, d, _)| (n, d)).collect();
        assert_none("package layers", rules::crate_layers(CRATE_LAYERS, &deps));
    }

    /// The contract knows no cryptography, socket or vendor library: those are the
    /// rendezvous' and the backends'.
    #[test]
    fn the_contract_depends_on_no_cryptography_socket_or_vendor_crate() {
        let core = packages().into_iter().find(|p| p.0 == "unicomm-core");
        let Some((_, _, _, all)) = core else {
            panic!("no unicomm-core package")
        };
        let bad = rules::forbidden_deps("unicomm-core", &all, CONTRACT_MUST_NOT_DEPEND_ON);
        assert_none("unicomm-core's dependencies", bad);
    }

    /// The GPU layer compiles no rendezvous: re-forming after a shrink reaches it as the
    /// contract's `Rejoin` trait, handed in from above.
    #[test]
    fn nccl_api_depends_on_no_rendezvous() {
        let api = packages().into_iter().find(|p| p.0 == "unicomm-nccl-api");
        let Some((_, _, _, all)) = api else {
            panic!("no unicomm-nccl-api package")
        };
        let bad = rules::forbidden_deps("unicomm-nccl-api", &all, NCCL_API_MUST_NOT_DEPEND_ON);
        assert_none("unicomm-nccl-api's dependencies", bad);
    }

    /// ARCHITECTURE.md: "comm-core knows no vendor's library" (its codes and names live in
    /// nccl-api's `sys::codes` and conversions).
    #[test]
    fn the_contract_names_no_vendor_library_in_code() {
        let c = crates().into_iter().find(|c| c.name == "unicomm-core");
        let c = c.unwrap_or_else(|| panic!("no unicomm-core"));
        let mut v = rules::vendor_identifiers(&c, "nccl");
        v.extend(rules::vendor_identifiers(&c, "rccl"));
        assert_none("vendor identifiers in unicomm-core", v);
    }

    #[test]
    fn architecture_md_states_the_test_s_layer_tables() {
        let doc = std::fs::read_to_string(root().join("docs/dev/ARCHITECTURE.md"))
            .unwrap_or_else(|e| panic!("docs/dev/ARCHITECTURE.md: {e}"));
        let crates: Vec<&str> = CRATE_LAYERS
            .iter()
            .flat_map(|l| l.1.iter().copied())
            .collect();
        let stated = rules::doc_layers(&doc, "Packages, lowest first", true, &crates);
        let mut v = rules::layers_differ("packages", &stated, CRATE_LAYERS);
        let modules: Vec<&str> = NCCL_API_LAYERS
            .iter()
            .flat_map(|l| l.1.iter().copied())
            .collect();
        let stated = rules::doc_layers(&doc, "nccl-api's modules, lowest first", false, &modules);
        v.extend(rules::layers_differ(
            "nccl-api modules",
            &stated,
            NCCL_API_LAYERS,
        ));
        assert_none("ARCHITECTURE.md's layers", v);
    }

    #[test]
    fn the_library_s_progress_code_is_read_only_in_the_call_layer() {
        let c = crates().into_iter().find(|c| c.name == "unicomm-nccl-api");
        let c = c.unwrap_or_else(|| panic!("no unicomm-nccl-api"));
        assert_none(
            "ncclInProgress outside sys",
            rules::names_outside(&c, "IN_PROGRESS", &["sys"]),
        );
    }

    #[test]
    fn nccl_api_modules_name_only_their_own_and_lower_layers() {
        let c = crates().into_iter().find(|c| c.name == "unicomm-nccl-api");
        let c = c.unwrap_or_else(|| panic!("no unicomm-nccl-api"));
        assert_none("nccl-api layers", rules::module_layers(NCCL_API_LAYERS, &c));
    }

    /// The library is called in one layer (`sys`: its calls carry the version gates and
    /// the typed results); above it the table is only asked whether an entry exists.
    #[test]
    fn nccl_api_calls_the_library_only_in_its_layer_of_calls() {
        let c = crates().into_iter().find(|c| c.name == "unicomm-nccl-api");
        let c = c.unwrap_or_else(|| panic!("no unicomm-nccl-api"));
        assert_none("library calls", rules::library_calls_outside(&c, &["sys"]));
    }

    #[test]
    fn no_crate_has_an_import_circle() {
        let v = crates().iter().flat_map(rules::import_circles).collect();
        assert_none("import circles", v);
    }

    #[test]
    fn no_function_is_over_the_limit_beyond_the_shrinking_allow_list() {
        let cs = crates();
        let refs: Vec<&Crate> = cs.iter().collect();
        assert_none(
            "long functions",
            rules::long_functions(MAX_FN_LINES, &refs, LONG_FUNCTIONS),
        );
    }

    /// Settings passed by position hide which is which (`(op, algorithm)`); the anchors
    /// name them (wgpu's descriptors, burn's `CollectiveConfig`). None in a public
    /// function; the internal ones only fewer.
    #[test]
    fn no_public_function_takes_its_settings_as_a_tuple() {
        let cs = crates();
        let refs: Vec<&Crate> = cs.iter().collect();
        assert_none(
            "tuple parameters",
            rules::tuple_parameters(&refs, MAX_TUPLE_PARAMS),
        );
    }

    #[test]
    fn unsafe_appears_only_in_the_files_allowed_it() {
        let cs = crates();
        let refs: Vec<&Crate> = cs.iter().collect();
        assert_none("unsafe", rules::unsafe_outside(&refs, UNSAFE_FILES));
        // The list only shrinks: a file allowed `unsafe` that has none loses its place.
        let stale = rules::stale_allowed(&refs, UNSAFE_FILES, source::has_unsafe, "`unsafe`");
        assert_none("stale unsafe entries", stale);
    }

    #[test]
    fn types_are_vouched_for_by_hand_only_in_the_files_allowed_it() {
        let cs = crates();
        let refs: Vec<&Crate> = cs.iter().collect();
        assert_none(
            "unsafe impl",
            rules::unsafe_impl_outside(&refs, UNSAFE_IMPL_FILES),
        );
        let stale = rules::stale_allowed(
            &refs,
            UNSAFE_IMPL_FILES,
            source::has_unsafe_impl,
            "`unsafe impl`",
        );
        assert_none("stale unsafe impl entries", stale);
    }

    /// Shipped docs and library comments cite figures and decisions, not a commit's file.
    #[test]
    fn shipped_docs_and_library_comments_cite_no_commit() {
        let root = root();
        let mut docs = vec![];
        let listed = std::fs::read_dir(root.join("docs")).map(|d| {
            d.filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|p| p.extension().is_some_and(|x| x == "md"))
                .collect::<Vec<_>>()
        });
        docs.extend(listed.unwrap_or_default());
        docs.extend(packages().iter().map(|p| root.join(&p.1).join("README.md")));
        docs.sort();
        docs.dedup();
        let mut v = Vec::new();
        for d in docs.iter().filter(|d| d.is_file()) {
            let text = std::fs::read_to_string(d).unwrap_or_default();
            v.extend(rules::commit_citations(&rules::rel(&root, d), &text));
        }
        let cs = crates();
        let refs: Vec<&Crate> = cs.iter().collect();
        for (name, text) in rules::comment_texts(&refs) {
            v.extend(rules::commit_citations(&name, &text));
        }
        assert_none("commit citations", v);
    }

    /// `cargo xtask` builds where the user's cargo builds: an alias with its own
    /// `--target-dir` wrote into the checkout's `target/` whatever `CARGO_TARGET_DIR` said.
    #[test]
    fn the_xtask_alias_builds_where_cargo_target_dir_says() {
        let config = std::fs::read_to_string(root().join(".cargo/config.toml"))
            .unwrap_or_else(|e| panic!(".cargo/config.toml: {e}"));
        let alias = config.lines().find(|l| l.trim_start().starts_with("xtask"));
        let alias = alias.unwrap_or_else(|| panic!("no xtask alias in .cargo/config.toml"));
        assert!(!alias.contains("--target-dir"), "{alias}");
    }

    /// A GPU kernel ships with its source and the command that builds it: each PTX the CUDA
    /// backend embeds names, on its first line, the digest of the source it was built from
    /// (`cargo xtask kernels`), and that source is the one in the tree.
    #[test]
    fn every_kernel_s_ptx_was_built_from_the_source_beside_it() {
        let sources = crate::kernels::sources().unwrap_or_else(|e| panic!("{e:#}"));
        assert!(!sources.is_empty(), "no kernel sources found");
        for src in sources {
            let text = std::fs::read_to_string(&src).unwrap_or_else(|e| panic!("{e}"));
            let ptx = std::fs::read_to_string(src.with_extension("ptx"))
                .unwrap_or_else(|e| panic!("{}'s PTX: {e}", src.display()));
            assert_eq!(
                ptx.lines().next(),
                Some(crate::kernels::header(&text).as_str()),
                "{}'s PTX was not built from it: run `cargo xtask kernels`",
                src.display()
            );
        }
    }
}
