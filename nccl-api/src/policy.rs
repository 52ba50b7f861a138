//! The automatic policy: for a call whose buffers are registered for it
//! ([`unicomm_core::Collective::register_auto`]), which path is fastest for its collective
//! and size. NCCL picks its algorithm from how a buffer is registered, and no fixed mode
//! wins at every size (2x H200, NCCL 2.28.9: windows win small all_reduce and lose 20% at
//! 512 MiB; the copy engines win large all_to_all/all_gather), so the policy switches.
//!
//! Thresholds come from `UNICOMM_TUNE_FILE` (written by `cargo xtask tune` on the machine)
//! or the built-in defaults below. The file is lines of `<collective> <up to bytes|max>
//! <path>`, `#` comments; for a call of `size` bytes (nccl-tests' size) the first line of
//! its collective whose bound is >= size wins.

use std::sync::OnceLock;

use unicomm_core::{Error, Kind, Result};

/// A path a call can take.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Path {
    /// The library on this communicator, the buffers in symmetric windows.
    Window,
    /// The library on the second communicator, where the buffers are `ncclCommRegister`ed.
    Registered,
    /// The copy engines (all_to_all, all_gather; ranks in one process).
    CopyEngine,
}

impl Path {
    /// Every path, in the order of [`Path::name`]'s words.
    pub const ALL: [Path; 3] = [Path::Window, Path::Registered, Path::CopyEngine];

    /// The path's one word: in tune files, in unicomm-bench's modes, in the routes the
    /// flight recorder and the ranks' comparison show.
    pub const fn name(self) -> &'static str {
        match self {
            Path::Window => "window",
            Path::Registered => "registered",
            Path::CopyEngine => "ce",
        }
    }

    /// The path named `s` ([`Path::name`]).
    pub fn parse(s: &str) -> Option<Path> {
        Path::ALL.into_iter().find(|p| p.name() == s)
    }
}

/// Where a call went: the one vocabulary of the ranks' comparison, the flight recorder and
/// the mock (which names its own calls as the library it stands for), the automatic
/// policy's words for its paths among them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Taken {
    /// The library's call on the communicator.
    Library,
    /// The library's call on the automatic registrations' second communicator.
    Registered,
    /// The copy engines.
    CopyEngine,
    /// Refused on this rank (its own error; the rank still takes part in a comparison).
    Refused,
    /// A composition of other calls, where the library has none of its own.
    Lowered,
}

impl Taken {
    /// Every route, in the order of [`Taken::code`].
    pub const ALL: [Taken; 5] = [
        Taken::Library,
        Taken::Registered,
        Taken::CopyEngine,
        Taken::Refused,
        Taken::Lowered,
    ];

    /// Every route's name, by [`Taken::code`] (what a comparison's numbers are shown as).
    pub const NAMES: [&'static str; 5] = [
        Taken::Library.name(),
        Taken::Registered.name(),
        Taken::CopyEngine.name(),
        Taken::Refused.name(),
        Taken::Lowered.name(),
    ];

    /// Its one word.
    pub const fn name(self) -> &'static str {
        match self {
            Taken::Library => "library",
            Taken::Registered => Path::Registered.name(),
            Taken::CopyEngine => Path::CopyEngine.name(),
            Taken::Refused => "refused",
            Taken::Lowered => "lowered",
        }
    }

    /// Its number, the same on every rank (a comparison's value).
    pub const fn code(self) -> u64 {
        match self {
            Taken::Library => 0,
            Taken::Registered => 1,
            Taken::CopyEngine => 2,
            Taken::Refused => 3,
            Taken::Lowered => 4,
        }
    }
}

/// Per collective (its [`Kind::code`]), ordered `(up to bytes, path)` rules.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Policy {
    /// In the file's order (the digest's).
    rules: Vec<(u8, usize, Path)>,
    /// The same, indexed by collective code: a call scans only its collective's rules.
    by_kind: Vec<Vec<(usize, Path)>>,
}

/// The collectives a tune file has rules for (those with more than one path).
fn tunable(kind: Kind) -> bool {
    matches!(
        kind,
        Kind::AllReduce { .. }
            | Kind::AllToAll
            | Kind::AllGather
            | Kind::ReduceScatter { .. }
            | Kind::Broadcast { .. }
            | Kind::Reduce { .. }
    )
}

/// Their names as tune files spell them ([`Kind::snake_name`]).
#[cfg(test)]
fn tunable_names() -> Vec<&'static str> {
    Kind::ALL
        .into_iter()
        .filter(|k| tunable(*k))
        .map(Kind::snake_name)
        .collect()
}

/// The built-in defaults, from the 2x H200 measurements (docs/performance.md): windows for
/// small all_reduce (latency), registration for large; copy engines for large all_to_all
/// and all_gather.
const DEFAULTS: &str = "\
all_reduce 4194304 window
all_reduce max registered
all_to_all 1048576 registered
all_to_all max ce
all_gather 1048576 registered
all_gather max ce
reduce_scatter max registered
broadcast max registered
reduce max registered
";

/// A tune file's most bytes: `cargo xtask tune` writes about a kilobyte.
const MAX_FILE: usize = 64 << 10;
/// A policy's most rules (every call of a live automatic registration scans them).
const MAX_RULES: usize = 256;
/// The first words of a file `cargo xtask tune` wrote: such a file ends with its digest.
const HEADER: &str = "# unicomm automatic policy";

impl Policy {
    /// Parses a tune file: its rules ([`Policy::parse`]), and where it is one that `cargo
    /// xtask tune` wrote (its first line says so), its last line `# digest <hex>` must be
    /// there and match the rules, so a truncated or edited file is refused rather than
    /// loaded as other rules.
    pub fn parse_file(text: &str, source: &str) -> Result<Policy> {
        let p = Policy::parse(text, source)?;
        let last = text
            .lines()
            .rev()
            .find(|l| !l.trim().is_empty())
            .unwrap_or("");
        let written = last
            .strip_prefix("# digest ")
            .and_then(|r| r.split_whitespace().next())
            .map(|h| u64::from_str_radix(h, 16));
        let bad = |why: String| Error::invalid("UNICOMM_TUNE_FILE", format!("{source}: {why}"));
        match written {
            Some(Ok(d)) if d == p.digest() => Ok(p),
            Some(Ok(d)) => Err(bad(format!(
                "the rules' digest is {:016x}, its digest line says {d:016x} (edited or damaged: run `cargo xtask tune` again, or remove the line)",
                p.digest()
            ))),
            Some(Err(_)) => Err(bad("its digest line is not a hexadecimal number".into())),
            None if text.starts_with(HEADER) => Err(bad(
                "written by `cargo xtask tune` but its last line is not the digest (truncated?)"
                    .into(),
            )),
            None => Ok(p),
        }
    }

    /// The tune file at `path` ([`Policy::parse_file`]), read without blocking and at most
    /// 64 KiB (a FIFO, a device or a giant file is refused, never waited on or read whole).
    pub fn from_file(path: &std::path::Path) -> Result<Policy> {
        let shown = path.display().to_string();
        let cannot = |e: &dyn std::fmt::Display| {
            Error::invalid("UNICOMM_TUNE_FILE", format!("cannot read {shown}: {e}"))
        };
        let bytes = unicomm_core::env::read_bounded(path, MAX_FILE).map_err(|e| cannot(&e))?;
        let text = String::from_utf8(bytes).map_err(|e| cannot(&e))?;
        Policy::parse_file(&text, &shown)
    }

    /// Parses a tune file's text; `source` names it in errors.
    pub fn parse(text: &str, source: &str) -> Result<Policy> {
        let mut rules = Vec::new();
        for (i, line) in text.lines().enumerate() {
            let line = line.split('#').next().unwrap_or("").trim();
            if line.is_empty() {
                continue;
            }
            let bad = |why: &str| {
                Error::invalid(
                    "UNICOMM_TUNE_FILE",
                    format!("{source} line {}: {why} (want `<collective> <bytes|max> <window|registered|ce>`)", i + 1),
                )
            };
            let f: Vec<&str> = line.split_whitespace().collect();
            let [coll, bound, path] = f[..] else {
                return Err(bad("three fields"));
            };
            let short = unicomm_core::env::short;
            let coll = Kind::from_snake_name(coll)
                .filter(|k| tunable(*k))
                .ok_or_else(|| bad(&format!("unknown collective {:?}", short(coll))))?
                .code();
            let bound = match bound {
                "max" => usize::MAX,
                b => b
                    .parse::<usize>()
                    .map_err(|_| bad(&format!("{:?} is not a byte count", short(b))))?,
            };
            let path =
                Path::parse(path).ok_or_else(|| bad(&format!("unknown path {:?}", short(path))))?;
            if rules.len() == MAX_RULES {
                return Err(bad(&format!("more than {MAX_RULES} rules")));
            }
            rules.push((coll, bound, path));
        }
        let mut by_kind = vec![Vec::new(); Kind::ALL.len() + 1];
        for &(coll, bound, path) in &rules {
            if let Some(v) = by_kind.get_mut(usize::from(coll)) {
                v.push((bound, path));
            }
        }
        Ok(Policy { rules, by_kind })
    }

    /// `UNICOMM_TUNE_FILE` when set (an unreadable or malformed file is an error, never
    /// silently the defaults), else the built-in defaults. Read once per process.
    pub fn current() -> Result<&'static Policy> {
        static P: OnceLock<Result<Policy>> = OnceLock::new();
        P.get_or_init(|| match std::env::var_os("UNICOMM_TUNE_FILE") {
            Some(path) => Policy::from_file(std::path::Path::new(&path)),
            None => Policy::parse(DEFAULTS, "built-in"),
        })
        .as_ref()
        .map_err(Clone::clone)
    }

    /// A digest of the rules (FNV-1a over collective, bound and path, in order), the same
    /// in every process for the same rules; never `u64::MAX`, which stands for "no policy".
    pub fn digest(&self) -> u64 {
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        let mut eat = |bytes: &[u8]| {
            for b in bytes {
                h = (h ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3);
            }
        };
        for (coll, bound, path) in &self.rules {
            eat(Kind::ALL[usize::from(*coll) - 1].snake_name().as_bytes());
            // `max` is the same in a 32-bit process as in a 64-bit one.
            let b = if *bound == usize::MAX {
                u64::MAX
            } else {
                *bound as u64
            };
            eat(&b.to_le_bytes());
            eat(&[*path as u8]);
        }
        h >> 1
    }

    /// The path for `kind` at `size` bytes (nccl-tests' size), or `Registered` when no rule
    /// matches.
    pub fn choose(&self, kind: Kind, size: usize) -> Path {
        if !tunable(kind) {
            return Path::Registered;
        }
        self.by_kind
            .get(usize::from(kind.code()))
            .and_then(|rules| rules.iter().find(|(bound, _)| size <= *bound))
            .map_or(Path::Registered, |r| r.1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use unicomm_core::ReduceOp;

    #[test]
    fn rules_pick_by_collective_and_size_and_bad_files_are_errors() {
        let p = Policy::parse(DEFAULTS, "built-in").unwrap();
        let ar = Kind::AllReduce { op: ReduceOp::Sum };
        assert_eq!(p.choose(ar, 8), Path::Window);
        assert_eq!(p.choose(ar, 4 << 20), Path::Window);
        assert_eq!(p.choose(ar, (4 << 20) + 1), Path::Registered);
        assert_eq!(p.choose(Kind::AllToAll, 512 << 20), Path::CopyEngine);
        assert_eq!(p.choose(Kind::Barrier, 8), Path::Registered);
        for bad in [
            "all_reduce 8",
            "allreduce 8 window",
            "all_reduce x window",
            "all_reduce 8 fast",
        ] {
            let e = Policy::parse(bad, "t").unwrap_err();
            assert!(
                matches!(
                    e,
                    Error::InvalidArgument {
                        argument: "UNICOMM_TUNE_FILE",
                        ..
                    }
                ),
                "{e}"
            );
        }
        let p = Policy::parse("# comment\nall_to_all max window # trailing\n", "t").unwrap();
        assert_eq!(p.choose(Kind::AllToAll, 1 << 30), Path::Window);
    }

    /// What the tune file's reader refuses: a FIFO (waited on forever before), a device that
    /// never ends, a truncated or edited file of `cargo xtask tune`, more rules than a call
    /// should scan; an error quotes a huge token short.
    #[cfg(target_os = "linux")]
    #[test]
    fn tune_files_that_would_hang_exhaust_or_mislead_are_refused() {
        let dir = std::env::temp_dir().join(format!("unicomm-tune-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let fifo = dir.join("fifo");
        nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
        let t0 = std::time::Instant::now();
        for p in [fifo.as_path(), std::path::Path::new("/dev/zero")] {
            let e = Policy::from_file(p).unwrap_err().to_string();
            assert!(e.contains("regular file"), "{e}");
        }
        assert!(t0.elapsed() < std::time::Duration::from_secs(2));
        let big = dir.join("big");
        std::fs::write(&big, "all_reduce max window\n".repeat(4000)).unwrap();
        let e = Policy::from_file(&big).unwrap_err().to_string();
        assert!(e.contains("longer than"), "{e}");
        let many = "all_reduce 8 window\n".repeat(MAX_RULES + 1);
        assert!(Policy::parse(&many, "t").is_err());
        let e = Policy::parse(&format!("all_reduce {} window", "9x".repeat(5 << 20)), "t")
            .unwrap_err()
            .to_string();
        assert!(e.len() < 400, "{} bytes of error", e.len());

        let rules = "all_reduce 4096 window\nall_reduce max registered\n";
        let d = Policy::parse(rules, "t").unwrap().digest();
        let written = format!("{HEADER}, measured by: x\n{rules}# digest {d:016x} (...)\n");
        assert_eq!(Policy::parse_file(&written, "t").unwrap().digest(), d);
        // Truncated after the first rule: the digest line is gone.
        let cut = &written[..written.find("all_reduce max").unwrap()];
        assert!(Policy::parse_file(cut, "t")
            .unwrap_err()
            .to_string()
            .contains("truncated"));
        // A bound edited: the rules no longer match the line.
        let edited = written.replace("4096", "8192");
        assert!(Policy::parse_file(&edited, "t")
            .unwrap_err()
            .to_string()
            .contains("digest"));
        // A hand-written file (no header) needs no digest.
        assert!(Policy::parse_file(rules, "t").is_ok());
        let _ = std::fs::remove_dir_all(&dir);
    }

    use proptest::strategy::Strategy as _;

    proptest::proptest! {
        /// A tune file is the environment's: any text parses or is refused as
        /// `InvalidArgument` naming the variable, never a panic; and comments, blank lines
        /// and spacing do not change what the ranks compare.
        #[test]
        fn any_tune_text_parses_or_is_refused_and_layout_keeps_the_digest(
            lines in proptest::collection::vec(
                (
                    proptest::prop_oneof![
                        8 => proptest::sample::select(tunable_names()),
                        1 => proptest::sample::select(vec!["allreduce", "", "#", "x"]),
                    ],
                    proptest::prop_oneof![
                        8 => (0usize..1 << 30).prop_map(|b| b.to_string()),
                        2 => proptest::strategy::Just("max".to_string()),
                        1 => proptest::sample::select(vec!["18446744073709551616", "-1", "1e3", "", "ö"]).prop_map(String::from),
                    ],
                    proptest::prop_oneof![
                        8 => proptest::sample::select(vec!["window", "registered", "ce"]),
                        1 => proptest::sample::select(vec!["fast", "", "# note"]),
                    ],
                    proptest::sample::select(vec![" ", "  ", "\t"]),
                ),
                0..12,
            ),
            junk in proptest::prop_oneof![3 => proptest::strategy::Just(String::new()), 1 => "[ -~\t]{0,40}"],
        ) {
            let text: String = lines
                .iter()
                .map(|(c, b, p, sp)| format!("{c}{sp}{b}{sp}{p}\n"))
                .chain(std::iter::once(junk))
                .collect();
            match Policy::parse(&text, "t") {
                Ok(p) => {
                    let spaced: String = text
                        .lines()
                        .map(|l| format!("  {}  # c\n\n", l.split('#').next().unwrap_or("")))
                        .collect();
                    let again = Policy::parse(&spaced, "t").unwrap();
                    proptest::prop_assert_eq!(again.digest(), p.digest());
                    proptest::prop_assert_ne!(p.digest(), u64::MAX);
                }
                Err(e) => proptest::prop_assert!(
                    matches!(e, Error::InvalidArgument { argument: "UNICOMM_TUNE_FILE", .. }),
                    "{e}"
                ),
            }
        }
    }

    #[test]
    fn digests_tell_policies_apart_and_ignore_comments() {
        let d = |t: &str| Policy::parse(t, "t").unwrap().digest();
        let a = "all_reduce 4096 window\nall_reduce max registered\n";
        assert_eq!(
            d(a),
            d("# tuned\nall_reduce  4096 window # latency\nall_reduce max registered")
        );
        for other in [
            "all_reduce 4097 window\nall_reduce max registered\n",
            "all_reduce 4096 registered\nall_reduce max registered\n",
            "all_gather 4096 window\nall_reduce max registered\n",
            "all_reduce max registered\nall_reduce 4096 window\n",
            "all_reduce 4096 window\n",
            "",
        ] {
            assert_ne!(d(a), d(other), "{other:?}");
        }
        // u64::MAX is what a rank without a policy offers.
        assert_ne!(d(""), u64::MAX);
        assert_ne!(d(DEFAULTS), u64::MAX);
    }

    /// Each collective's rule is found by its index: a file naming one collective steers
    /// that collective only, whatever the others' rules say.
    #[test]
    fn each_collective_reads_its_own_rules() {
        // Reductions other than the sum choose by the collective alone.
        let kinds: Vec<Kind> = Kind::ALL
            .into_iter()
            .filter(|k| tunable(*k))
            .map(|k| match k {
                Kind::ReduceScatter { .. } => Kind::ReduceScatter { op: ReduceOp::Max },
                k => k,
            })
            .collect();
        for (i, name) in tunable_names().iter().enumerate() {
            let p = Policy::parse(&format!("{name} 100 window\n{name} max ce\n"), "t").unwrap();
            for (j, k) in kinds.iter().enumerate() {
                let (small, large) = if i == j {
                    (Path::Window, Path::CopyEngine)
                } else {
                    (Path::Registered, Path::Registered)
                };
                assert_eq!(p.choose(*k, 100), small, "{name} rules, {k:?}");
                assert_eq!(p.choose(*k, 101), large, "{name} rules, {k:?}");
            }
        }
    }
}
