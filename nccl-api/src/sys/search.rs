//! The library search both vendors' loaders use (NCCL, RCCL, and the HIP runtime): an
//! explicit variable first, then a library of the same soname the process already holds,
//! then directories, then the bare sonames for the system loader; every candidate tried is
//! kept, with its reason, for `LibraryNotFound`.

#![allow(
    unsafe_code,
    reason = "calls the NCCL-API library or the device runtime at its call sites (the architecture test's UNSAFE_FILES lists them)"
)]

use std::path::{Path, PathBuf};

use unicomm_core::{Error, Result};

/// Where one library is looked for.
#[derive(Debug, Clone)]
pub struct Search {
    /// The library's name in errors ("NCCL", "RCCL", "HIP runtime").
    pub library: &'static str,
    /// The variable that names the library file explicitly (tried first).
    pub env_var: &'static str,
    /// Directories searched in order.
    pub dirs: Vec<PathBuf>,
    /// File names tried in each directory, then handed to the system loader as sonames.
    pub names: &'static [&'static str],
}

impl Search {
    /// The candidates, in order: the explicit variable, every name in every directory, then
    /// the bare names.
    pub fn candidates(&self) -> Vec<PathBuf> {
        let mut out = Vec::new();
        if let Some(p) = std::env::var_os(self.env_var) {
            out.push(PathBuf::from(p));
        }
        for dir in &self.dirs {
            out.extend(self.names.iter().map(|n| dir.join(n)));
        }
        out.extend(self.names.iter().map(PathBuf::from));
        out
    }

    /// Tries `open` on every candidate in order and returns the first success. Paths that
    /// do not exist are not handed to the loader; `LibraryNotFound` lists every candidate
    /// with why it was passed over (absent, the loader's message, a missing symbol).
    ///
    /// A path the variable names is the only one tried (a typo must not load another
    /// library silently), and only a regular file is handed to the loader (a FIFO would
    /// block `dlopen`'s open forever).
    ///
    /// Without the variable, a library of one of the sonames that the process already holds
    /// (an engine linked `libnccl.so.2`, or loaded it itself) comes first: a second copy of
    /// NCCL in one process shares its symbols with the first and fails (on 1x H200, NCCL
    /// 2.28.9 loaded beside a linked 2.28.3: `ncclAllReduce` answered `ncclInvalidArgument`).
    pub fn load<T>(&self, mut open: impl FnMut(&Path) -> Result<T>) -> Result<T> {
        let mut tried = Vec::new();
        let explicit = std::env::var_os(self.env_var).is_some();
        let cands = self.candidates();
        let cands = if explicit { &cands[..1] } else { &cands[..] };
        if !explicit {
            for name in self.names.iter().filter(|n| already_loaded(n)) {
                // The loader hands back the library it holds under that soname.
                match open(Path::new(name)) {
                    Ok(t) => return Ok(t),
                    Err(e) => tried.push(format!("{name}, already in this process ({e})")),
                }
            }
        }
        for cand in cands {
            if cand.components().count() > 1 {
                let why = match std::fs::metadata(cand) {
                    Err(_) => Some("absent"),
                    Ok(m) if !m.is_file() => Some("not a regular file"),
                    Ok(_) => None,
                };
                if let Some(why) = why {
                    let only = if explicit {
                        format!("; {} names the only file tried", self.env_var)
                    } else {
                        String::new()
                    };
                    tried.push(format!("{} ({why}{only})", cand.display()));
                    continue;
                }
            }
            match open(cand) {
                Ok(t) => return Ok(t),
                // The loader's own reason for this one path, not a nested "not found".
                Err(Error::LibraryNotFound { tried: why, .. }) if why.len() == 1 => {
                    tried.push(format!("{} ({})", cand.display(), why[0]))
                }
                Err(e) => tried.push(format!("{} ({e})", cand.display())),
            }
        }
        Err(Error::LibraryNotFound {
            library: self.library,
            tried,
        })
    }
}

/// Whether the process already holds a library of soname `name` (linked or loaded):
/// `dlopen` with `RTLD_NOLOAD`, which loads nothing.
#[cfg(unix)]
pub fn already_loaded(name: &str) -> bool {
    // SAFETY: with RTLD_NOLOAD the loader only looks the name up among the libraries it
    // holds: nothing is loaded and no initialiser runs; the handle taken (a reference) is
    // released when dropped.
    unsafe { libloading::os::unix::Library::open(Some(name), libc::RTLD_NOW | libc::RTLD_NOLOAD) }
        .is_ok()
}

/// Elsewhere no library is looked up among those already held.
#[cfg(not(unix))]
pub fn already_loaded(_name: &str) -> bool {
    false
}

/// Opens one shared library, mapping the loader's failure to `LibraryNotFound` for `path`.
pub fn open_library(library: &'static str, path: &Path) -> Result<libloading::Library> {
    // SAFETY: loading a shared library runs its initialisers; NCCL's, RCCL's and HIP's are
    // made to be loaded with dlopen (PyTorch and cudarc load them the same way).
    unsafe { libloading::Library::new(path) }.map_err(|e| Error::LibraryNotFound {
        library,
        tried: vec![loader_reason(&e)],
    })
}

/// The loader's failure with its causes: libloading's own message is only "dlopen failed";
/// the system loader's reason (`file too short`, a missing dependency, a wrong ELF class)
/// is its source.
fn loader_reason(e: &libloading::Error) -> String {
    let mut out = e.to_string();
    let mut cause = std::error::Error::source(e);
    while let Some(c) = cause {
        out.push_str(": ");
        out.push_str(&c.to_string());
        cause = c.source();
    }
    out
}

/// `site-packages/<rel>` of every Python installation visible through the usual variables
/// and paths (virtualenvs, conda, `/usr/lib/python3*`, `/usr/local/lib/python3*`,
/// `/opt/*/.venv`): where pip's NCCL wheel (`nvidia/nccl/lib`) lives.
pub fn python_wheel_dirs(rel: &str) -> Vec<PathBuf> {
    let mut roots: Vec<PathBuf> = Vec::new();
    for var in ["VIRTUAL_ENV", "CONDA_PREFIX"] {
        if let Some(v) = std::env::var_os(var) {
            roots.push(PathBuf::from(v).join("lib"));
        }
    }
    roots.extend(["/usr/lib", "/usr/local/lib"].map(PathBuf::from));
    if let Ok(rd) = std::fs::read_dir("/opt") {
        for e in rd.flatten() {
            for sub in [".venv/lib", "venv/lib", "lib"] {
                roots.push(e.path().join(sub));
            }
        }
    }
    let mut out = Vec::new();
    for root in roots {
        let Ok(rd) = std::fs::read_dir(&root) else {
            continue;
        };
        let mut pys: Vec<PathBuf> = rd
            .flatten()
            .map(|e| e.path())
            .filter(|p| {
                p.file_name()
                    .and_then(|n| n.to_str())
                    .is_some_and(|n| n.starts_with("python3"))
            })
            .collect();
        pys.sort();
        for py in pys.into_iter().rev() {
            for sp in ["site-packages", "dist-packages"] {
                let d = py.join(sp).join(rel);
                if d.is_dir() {
                    out.push(d);
                }
            }
        }
    }
    out
}

/// Directories from `VAR/suffix` for each variable that is set, in order.
pub fn env_dirs(vars: &[(&str, &str)]) -> Vec<PathBuf> {
    vars.iter()
        .filter_map(|(var, suffix)| std::env::var_os(var).map(|v| PathBuf::from(v).join(suffix)))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A path the variable names is the only one tried: absent, it is an error naming the
    /// variable (not the default search's library); a FIFO is passed over without blocking.
    #[cfg(target_os = "linux")]
    #[test]
    fn the_named_file_is_the_only_one_tried_and_a_fifo_is_never_opened() {
        let dir = std::env::temp_dir().join(format!("unicomm-named-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("libthere.so"), b"").unwrap();
        let fifo = dir.join("libfifo.so");
        nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
        let var = "UNICOMM_TEST_LIBRARY_NAMED";
        std::env::set_var(var, dir.join("libtypo.so"));
        let search = Search {
            library: "test library",
            env_var: var,
            dirs: vec![dir.clone()],
            names: &["libthere.so"],
        };
        let mut opened = Vec::new();
        let r = search.load(|p| {
            opened.push(p.to_path_buf());
            Ok(())
        });
        let Err(Error::LibraryNotFound { tried, .. }) = r else {
            panic!("the default search was taken: {r:?}");
        };
        assert!(opened.is_empty(), "{opened:?}");
        assert_eq!(tried.len(), 1, "{tried:?}");
        assert!(
            tried[0].contains("absent") && tried[0].contains(var),
            "{tried:?}"
        );
        std::env::set_var(var, &fifo);
        let t0 = std::time::Instant::now();
        let r = search.load(|p| {
            opened.push(p.to_path_buf());
            Ok(())
        });
        std::env::remove_var(var);
        let _ = std::fs::remove_dir_all(&dir);
        assert!(t0.elapsed() < std::time::Duration::from_secs(2));
        let Err(Error::LibraryNotFound { tried, .. }) = r else {
            panic!("a FIFO was handed to the loader: {r:?}");
        };
        assert!(tried[0].contains("not a regular file"), "{tried:?}");
        assert!(opened.is_empty(), "{opened:?}");
    }

    /// A library the process already holds under one of the sonames comes before the
    /// directories (a second copy of NCCL beside an engine's fails): `libc.so.6` is held by
    /// every test process, and a file of that name in a searched directory is not opened.
    #[cfg(target_os = "linux")]
    #[test]
    fn a_library_the_process_already_holds_is_taken_before_the_directories() {
        let dir = std::env::temp_dir().join(format!("unicomm-held-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("libc.so.6"), b"not the loaded one").unwrap();
        let search = Search {
            library: "test library",
            env_var: "UNICOMM_TEST_LIBRARY_UNSET",
            dirs: vec![dir.clone()],
            names: &["libc.so.6"],
        };
        let mut opened = Vec::new();
        let r = search.load(|p| {
            opened.push(p.to_path_buf());
            open_library("test library", p).map(drop)
        });
        let _ = std::fs::remove_dir_all(&dir);
        assert!(r.is_ok(), "{r:?}");
        assert_eq!(opened, vec![PathBuf::from("libc.so.6")], "{opened:?}");
        assert!(already_loaded("libc.so.6"));
        assert!(!already_loaded("libunicomm-never-loaded.so.9"));
    }

    /// A file that exists but is no library keeps the system loader's reason in
    /// `LibraryNotFound` (what a user needs to see a truncated download), not just
    /// "dlopen failed".
    #[test]
    fn a_library_that_exists_but_fails_to_load_keeps_the_loaders_reason() {
        let dir = std::env::temp_dir().join(format!("unicomm-search-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let lib = dir.join("libempty.so");
        std::fs::write(&lib, b"").unwrap();
        let search = Search {
            library: "test library",
            env_var: "UNICOMM_TEST_LIBRARY_UNSET",
            dirs: vec![dir.clone()],
            names: &["libempty.so"],
        };
        let r = search.load(|p| open_library("test library", p).map(|_| ()));
        let _ = std::fs::remove_dir_all(&dir);
        let Err(Error::LibraryNotFound { tried, .. }) = r else {
            panic!("expected LibraryNotFound, got {r:?}");
        };
        assert!(tried[0].contains("libempty.so"), "{tried:?}");
        assert!(
            tried[0].contains("too short") || tried[0].contains("ELF"),
            "the system loader's reason is lost: {tried:?}"
        );
    }
}
