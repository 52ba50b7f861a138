//! The flight recorder: per communicator, a bounded ring of its last operations (PyTorch's
//! ProcessGroupNCCL keeps one per group), dumped as one JSON file per rank when something
//! went wrong (a deadline, a disagreement, an asynchronous error, an abort) or on demand,
//! so that `cargo xtask trace DIR` can name the first operation where the ranks part and
//! the ranks that never reached it.
//!
//! Every backend records each operation when it enqueues it ([`FlightRecorder::record`]);
//! the always-on part is an atomic increment, a clock read and one cache line of a fixed
//! ring written without a lock (`ring.rs`: one line per operation, allocated once). With `UNICOMM_FLIGHT_COMPLETION=1` each record also holds a marker recorded on
//! the operation's stream after it, whose state the dump reports: `passed` (the stream moved
//! past it: done, or failed and drained) or `pending` (the stream is still at it or before
//! it: where a hang sits).
//!
//! Settings: `UNICOMM_FLIGHT_ENTRIES` (ring size, default 1024, 64 bytes each; 0 switches
//! recording off),
//! `UNICOMM_FLIGHT_DIR` (where dumps go; unset: automatic dumps are not written, and
//! [`FlightRecorder::dump`] says so), `UNICOMM_FLIGHT_COMPLETION` (0 or 1).

use std::collections::VecDeque;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Weak};

use crate::kind::What;
use crate::marker::Marker;
use crate::{Error, Result};

mod ring;
pub use ring::Replay;

/// A communicator's flight recorder (see the module doc).
///
/// `repr(C, align(64))`: what every call reads (`completion`, then the ring's header with
/// its `cap`, 48 bytes) is laid out first, on one cache line, where Rust's order had put
/// them on two (one more first-level miss per call under callgrind).
#[repr(C, align(64))]
pub struct FlightRecorder {
    completion: bool,
    ring: ring::Ring,
    name: String,
    rank: usize,
    world: usize,
    dir: Option<PathBuf>,
    /// With completion tracking: the marker after each recorded operation, by its number
    /// (at most `cap`, oldest first).
    done: Mutex<VecDeque<(u64, Marker)>>,
    dumped: AtomicBool,
    /// The clock when it was made: with the dump's, it dates every stamp.
    born: crate::clock::Anchor,
}

/// Every live recorder of this process, for [`dump_all`].
static LIVE: Mutex<Vec<Weak<FlightRecorder>>> = Mutex::new(Vec::new());

fn json_str(s: &str) -> String {
    let mut o = String::with_capacity(s.len() + 2);
    o.push('"');
    for c in s.chars() {
        match c {
            '"' => o.push_str("\\\""),
            '\\' => o.push_str("\\\\"),
            c if (c as u32) < 0x20 => o.push_str(&format!("\\u{:04x}", c as u32)),
            c => o.push(c),
        }
    }
    o.push('"');
    o
}

impl FlightRecorder {
    /// The recorder of rank `rank` of `world` of the communicator `name` (the same name on
    /// every rank: "world", "world.split3.c1", ...), set from the environment.
    pub fn from_env(name: impl Into<String>, rank: usize, world: usize) -> Result<Arc<Self>> {
        let cap = crate::env::whole_number("UNICOMM_FLIGHT_ENTRIES", 1024, 0..=1 << 20, "entries")?
            as usize;
        let completion = crate::env::switch("UNICOMM_FLIGHT_COMPLETION", false)?;
        let dir = std::env::var_os("UNICOMM_FLIGHT_DIR")
            .filter(|d| !d.is_empty())
            .map(PathBuf::from);
        Ok(Self::new(name, rank, world, cap, completion, dir))
    }

    /// A recorder with explicit settings.
    pub fn new(
        name: impl Into<String>,
        rank: usize,
        world: usize,
        cap: usize,
        completion: bool,
        dir: Option<PathBuf>,
    ) -> Arc<Self> {
        let f = Arc::new(FlightRecorder {
            name: name.into(),
            rank,
            world,
            completion: completion && cap > 0,
            dir,
            ring: ring::Ring::new(cap),
            done: Mutex::new(VecDeque::new()),
            dumped: AtomicBool::new(false),
            born: crate::clock::Anchor::now(),
        });
        let mut live = LIVE.lock().unwrap_or_else(|e| e.into_inner());
        live.retain(|w| w.strong_count() > 0);
        live.push(Arc::downgrade(&f));
        f
    }

    /// The recorder of a communicator derived from this one (`step`: "split3.c1",
    /// "shrink0"), the same settings, named after it.
    pub fn derived(&self, step: &str, rank: usize, world: usize) -> Arc<Self> {
        Self::new(
            format!("{}.{step}", self.name),
            rank,
            world,
            self.cap(),
            self.completion,
            self.dir.clone(),
        )
    }

    /// Whether operations are recorded at all.
    #[inline]
    pub fn on(&self) -> bool {
        self.cap() > 0
    }

    /// The operations kept (0: the recorder is off).
    #[inline]
    fn cap(&self) -> usize {
        self.ring.cap()
    }

    /// Whether each record wants a marker after its operation (`UNICOMM_FLIGHT_COMPLETION`).
    #[inline]
    pub fn tracks_completion(&self) -> bool {
        self.completion
    }

    /// Runs `enqueue` (one operation, which returns the path it took) and records it: the
    /// one record every backend's `enqueue` makes. `mark` gives the marker after the
    /// operation where completion is tracked. A failure that explains a stuck or divergent
    /// job ([`FlightRecorder::explains`]) dumps the recorder.
    #[inline]
    pub fn enqueued(
        &self,
        what: What,
        stream: u64,
        enqueue: impl FnOnce() -> Result<&'static str>,
        mark: impl FnOnce() -> Option<Marker>,
    ) -> Result<()> {
        // One call site of `enqueue`, so that it is inlined here.
        let r = enqueue();
        // Under capture nothing runs yet: kept for the graph (what it holds, and its
        // launches' records), whatever the recorder's size.
        if let Ok(path) = r {
            if crate::capturing::note_captured(self as *const Self as usize, what, path) {
                return Ok(());
            }
        }
        if self.cap() == 0 {
            return r.map(drop);
        }
        let path = *r.as_ref().unwrap_or(&"refused");
        let done = if self.completion && r.is_ok() {
            mark()
        } else {
            None
        };
        self.record(what, path, stream, done);
        if let Err(e) = &r {
            self.dump_if_explains(e);
        }
        r.map(drop)
    }

    /// Whether `e` explains a stuck or divergent job: a deadline, a disagreement between the
    /// ranks, an abort. What dumps a recorder, on every backend.
    pub fn explains(e: &Error) -> bool {
        matches!(
            e,
            Error::Timeout { .. } | Error::Mismatch { .. } | Error::Aborted { .. }
        )
    }

    /// Dumps where `e` [explains](FlightRecorder::explains) a stuck or divergent job.
    pub fn dump_if_explains(&self, e: &Error) {
        if Self::explains(e) {
            self.dump_on(e);
        }
    }

    /// Records an operation (what it is, [`What`]) enqueued on `stream` by `path`; `done` is the marker after it (with
    /// completion tracking). Returns its sequence number.
    #[inline]
    pub fn record(&self, what: What, path: &'static str, stream: u64, done: Option<Marker>) -> u64 {
        self.push(what, path, stream, done, None)
    }

    #[inline]
    fn push(
        &self,
        what: What,
        path: &'static str,
        stream: u64,
        done: Option<Marker>,
        graph: Option<Replay>,
    ) -> u64 {
        if self.cap() == 0 {
            return 0;
        }
        let seq = self
            .ring
            .push(what, path, stream, crate::clock::stamp(), graph);
        if let Some(m) = done {
            let mut d = self.done.lock().unwrap_or_else(|e| e.into_inner());
            if d.len() == self.cap() {
                d.pop_front();
            }
            d.push_back((seq, m));
        }
        seq
    }

    /// Records a collective that a graph's launch replays; how replays show in a dump and
    /// in `cargo xtask trace`.
    pub fn record_replay(&self, what: What, path: &'static str, replay: Replay) {
        self.push(what, path, 0, None, Some(replay));
    }

    /// The recorder's state as JSON, with why it was taken.
    pub fn to_json(&self, reason: &str) -> String {
        let entries = self.ring.read();
        let done = self.done.lock().unwrap_or_else(|e| e.into_inner());
        let dumped = crate::clock::Anchor::now();
        let mut o = format!(
            "{{\"format\":\"unicomm-flight-1\",\"comm\":{},\"rank\":{},\"world\":{},\"reason\":{},\"dumped_us\":{},\"next_seq\":{},\"entries\":[",
            json_str(&self.name),
            self.rank,
            self.world,
            json_str(reason),
            crate::clock::wall_now_us(),
            self.ring.next()
        );
        for (i, e) in entries.iter().enumerate() {
            // With completion tracking: whether the stream has moved past it (done, or failed
            // and drained) or is still at it or before it.
            let marker = done.iter().find(|(s, _)| *s == e.seq).map(|(_, m)| m);
            let state = match marker.and_then(|m| m.inner().reached()) {
                Some(true) => "passed",
                Some(false) => "pending",
                None => "enqueued",
            };
            let opt = |v: Option<String>| v.unwrap_or_else(|| "null".into());
            o.push_str(&format!(
                "{}{{\"seq\":{},\"kind\":{},\"count\":{},\"dtype\":{},\"op\":{},\"rank_arg\":{},\"path\":{},\"stream\":{},\"enqueued_us\":{},\"state\":{},\"graph\":{},\"replay\":{}}}",
                if i == 0 { "" } else { "," },
                e.seq,
                json_str(e.kind),
                e.count,
                json_str(e.dtype),
                opt(e.op.map(json_str)),
                opt(e.rank_arg.map(|r| r.to_string())),
                json_str(e.path),
                e.stream,
                self.born.wall_us(&dumped, e.stamp),
                json_str(state),
                opt(e.graph.map(|g| g.graph.to_string())),
                opt(e.graph.map(|g| g.replay.to_string())),
            ));
        }
        o.push_str("]}\n");
        o
    }

    /// Writes the dump to `UNICOMM_FLIGHT_DIR/unicomm-flight.<comm>.rank<r>.json` (written
    /// whole, then renamed into place) and returns its path.
    pub fn dump(&self, reason: &str) -> Result<PathBuf> {
        let Some(dir) = &self.dir else {
            return Err(Error::invalid(
                "UNICOMM_FLIGHT_DIR",
                "not set: the flight recorder has nowhere to write",
            ));
        };
        let io = |e: std::io::Error| Error::Bootstrap {
            reason: format!(
                "writing the flight recorder's dump in {}: {e}",
                dir.display()
            ),
        };
        std::fs::create_dir_all(dir).map_err(io)?;
        let path = dir.join(dump_name(&self.name, self.rank));
        write_new(dir, &path, self.to_json(reason).as_bytes()).map_err(io)?;
        Ok(path)
    }

    /// The automatic dump at a failure: written once per recorder (the first failure is the
    /// one that explains), where `UNICOMM_FLIGHT_DIR` is set; never an error of its own.
    pub fn dump_on(&self, error: &Error) {
        if self.cap() == 0 || self.dir.is_none() || self.dumped.swap(true, Ordering::AcqRel) {
            return;
        }
        match self.dump(&error.to_string()) {
            Ok(path) => {
                tracing::warn!(comm = %self.name, rank = self.rank, path = %path.display(), "flight recorder dumped at: {error}")
            }
            Err(e) => {
                tracing::warn!(comm = %self.name, rank = self.rank, "flight recorder dump failed: {e}")
            }
        }
    }
}

/// A dump's file name: `unicomm-flight.<comm>.rank<r>.json`, the communicator's name made
/// safe for a file name; a name grown past what a file system takes (each split and re-form
/// adds to it) keeps its start and ends in a hash of the whole, so the dump is never lost.
fn dump_name(comm: &str, rank: usize) -> String {
    const KEEP: usize = 160;
    let mut safe: String = comm
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '.' {
                c
            } else {
                '_'
            }
        })
        .collect();
    if safe.len() > KEEP {
        // FNV-1a over the whole name: names differing only past the kept start differ.
        let h = comm.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
            (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
        });
        safe.truncate(KEEP);
        safe = format!("{safe}~{h:016x}");
    }
    format!("unicomm-flight.{safe}.rank{rank}.json")
}

/// Writes `bytes` to `path` through a temporary of its own in `dir`: created exclusively
/// (never an existing entry, so never a FIFO, a device or through a symbolic link),
/// non-blocking, readable by its owner only, then renamed over `path` (which replaces a link
/// or a FIFO there rather than opening it). A directory shared between ranks and users (as
/// a flight directory is) can thus neither block a dump nor redirect it.
fn write_new(dir: &std::path::Path, path: &std::path::Path, bytes: &[u8]) -> std::io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    static SEQ: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let stem = path
        .file_name()
        .map_or_else(Default::default, |n| n.to_string_lossy());
    for _ in 0..16 {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos());
        let seq = SEQ.fetch_add(1, Ordering::Relaxed);
        let tmp = dir.join(format!(".{stem}.{}.{nanos:x}.{seq}", std::process::id()));
        let opened = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC)
            .open(&tmp);
        let mut f = match opened {
            Ok(f) => f,
            // Someone else's entry at that name (planted or not): another name.
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
            Err(e) => return Err(e),
        };
        let written = f
            .write_all(bytes)
            .and_then(|()| std::fs::rename(&tmp, path));
        if written.is_err() {
            let _ = std::fs::remove_file(&tmp);
        }
        return written;
    }
    Err(std::io::Error::new(
        std::io::ErrorKind::AlreadyExists,
        "no free temporary name for the dump after 16 tries",
    ))
}

/// Dumps every live recorder of this process (a program's own signal or watchdog thread
/// calls this: the library installs no signal handler); the paths written.
pub fn dump_all(reason: &str) -> Vec<PathBuf> {
    let live: Vec<Arc<FlightRecorder>> = LIVE
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .iter()
        .filter_map(Weak::upgrade)
        .collect();
    live.iter().filter_map(|f| f.dump(reason).ok()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{DataType, Kind, ReduceOp};

    fn op(kind: Kind, count: usize) -> What {
        What::Collective(kind, count, DataType::F32)
    }

    #[test]
    fn the_ring_keeps_the_last_operations_numbered_from_the_first() {
        let f = FlightRecorder::new("world", 1, 4, 3, false, None);
        for i in 0..5 {
            let seq = f.record(
                op(Kind::AllReduce { op: ReduceOp::Sum }, i),
                "library",
                7,
                None,
            );
            assert_eq!(seq, i as u64);
        }
        let j = f.to_json("on demand");
        assert!(j.contains("\"next_seq\":5"), "{j}");
        assert!(
            !j.contains("\"seq\":1,") && j.contains("\"seq\":2,") && j.contains("\"seq\":4,"),
            "{j}"
        );
        assert!(
            j.contains("\"kind\":\"all_reduce\"") && j.contains("\"op\":\"sum\""),
            "{j}"
        );
        // Off: nothing recorded.
        let off = FlightRecorder::new("world", 0, 1, 0, true, None);
        off.record(op(Kind::Barrier, 1), "library", 0, None);
        assert!(off.to_json("x").contains("\"entries\":[]"));
    }

    #[test]
    fn a_dump_needs_a_directory_and_names_comm_and_rank() {
        let f = FlightRecorder::new("world.split0.c1", 2, 4, 8, false, None);
        assert!(matches!(f.dump("x"), Err(Error::InvalidArgument { .. })));
        let dir = std::env::temp_dir().join(format!("unicomm-flight-{}", std::process::id()));
        let f = FlightRecorder::new("world.split0.c1", 2, 4, 8, false, Some(dir.clone()));
        f.record(op(Kind::Broadcast { root: 3 }, 16), "library", 0, None);
        let p = f.dump("a \"quoted\" reason").unwrap();
        assert!(
            p.ends_with("unicomm-flight.world.split0.c1.rank2.json"),
            "{p:?}"
        );
        let text = std::fs::read_to_string(&p).unwrap();
        assert!(
            text.contains("\"rank_arg\":3") && text.contains("a \\\"quoted\\\" reason"),
            "{text}"
        );
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// Every backend records through `enqueued`: a refused call is recorded as refused, and
    /// a deadline, a disagreement or an abort dumps the recorder while an invalid argument
    /// (the caller's own mistake, explained by the error itself) does not.
    #[test]
    fn an_enqueue_records_its_path_or_its_refusal_and_dumps_only_what_explains_a_hang() {
        let dir = std::env::temp_dir().join(format!("unicomm-flight-enq-{}", std::process::id()));
        let f = FlightRecorder::new("world", 0, 2, 8, false, Some(dir.clone()));
        let file = dir.join("unicomm-flight.world.rank0.json");
        let ar = op(Kind::AllReduce { op: ReduceOp::Sum }, 4);
        f.enqueued(ar, 1, || Ok("library"), || None).unwrap();
        let bad = f.enqueued(ar, 1, || Err(Error::invalid("count", "x")), || None);
        assert!(bad.is_err());
        let j = f.to_json("x");
        assert!(
            j.contains("\"path\":\"library\"") && j.contains("\"path\":\"refused\""),
            "{j}"
        );
        assert!(!file.exists(), "an invalid argument dumped the recorder");
        let aborted = Error::aborted("peer");
        let _ = f.enqueued(ar, 1, || Err(aborted), || None);
        assert!(file.exists(), "an abort did not dump the recorder");
        let _ = std::fs::remove_dir_all(&dir);
    }

    fn mkfifo(p: &std::path::Path) {
        let ok = std::process::Command::new("mkfifo").arg(p).status();
        assert!(ok.is_ok_and(|s| s.success()), "mkfifo {}", p.display());
    }

    /// A shared flight directory may hold anything at the names a dump uses: a FIFO at the
    /// dump's name or at the temporary name older builds used, a symbolic link to a file of
    /// the user's. The dump neither blocks on them nor writes through them, and ends at once.
    #[test]
    fn a_fifo_or_a_link_at_the_dumps_names_neither_blocks_nor_redirects_it() {
        let dir = std::env::temp_dir().join(format!("unicomm-flight-fifo-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let f = FlightRecorder::new("world", 0, 2, 8, false, Some(dir.clone()));
        let path = dir.join("unicomm-flight.world.rank0.json");
        mkfifo(&path);
        mkfifo(&path.with_extension(format!("json.tmp.{}", std::process::id())));
        let (tx, rx) = std::sync::mpsc::channel();
        let f2 = f.clone();
        std::thread::spawn(move || {
            let _ = tx.send(f2.dump("fifo"));
        });
        let r = rx.recv_timeout(std::time::Duration::from_secs(5));
        assert!(matches!(r, Ok(Ok(_))), "the dump blocked or failed: {r:?}");
        assert!(std::fs::metadata(&path).unwrap().is_file());
        // A link at the dump's name is replaced, its target untouched.
        let target = dir.join("precious");
        std::fs::write(&target, "keep").unwrap();
        std::fs::remove_file(&path).unwrap();
        std::os::unix::fs::symlink(&target, &path).unwrap();
        f.dump("link").unwrap();
        assert_eq!(std::fs::read_to_string(&target).unwrap(), "keep");
        assert!(!std::fs::symlink_metadata(&path)
            .unwrap()
            .file_type()
            .is_symlink());
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// Each split and re-form adds to a communicator's name; past what a file system takes
    /// the name keeps its start and a hash of the whole, so the dump is still written.
    #[test]
    fn a_name_grown_by_many_re_forms_still_dumps() {
        let long: String = (0..40).map(|i| format!("shrink{i}.")).collect::<String>() + "c0";
        let name = dump_name(&long, 3);
        assert!(name.len() < 255, "{}", name.len());
        assert_ne!(name, dump_name(&(long.clone() + "x"), 3));
        let dir = std::env::temp_dir().join(format!("unicomm-flight-long-{}", std::process::id()));
        let f = FlightRecorder::new(long, 3, 4, 8, false, Some(dir.clone()));
        assert!(f.dump("long").unwrap().is_file());
        let _ = std::fs::remove_dir_all(&dir);
    }
}
