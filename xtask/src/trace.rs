//! `cargo xtask trace DIR`: reads every rank's flight-recorder dump in DIR
//! (`unicomm-flight.<comm>.rank<r>.json`, written at a failure or on demand) and says, per
//! communicator, the first operation where the ranks part: a sequence number some ranks
//! reached and others never did (and what each was doing then), or one the ranks called
//! differently. What PyTorch's flight-recorder analyser does for ProcessGroupNCCL.

use std::collections::BTreeMap;
use std::path::Path;

use anyhow::{bail, Context, Result};
use serde::Deserialize;

/// One dump (the library's `unicomm-flight-1` format).
#[derive(Debug, Deserialize)]
pub(crate) struct Dump {
    pub format: String,
    pub comm: String,
    pub rank: usize,
    pub world: usize,
    pub reason: String,
    pub next_seq: u64,
    pub entries: Vec<Entry>,
}

#[derive(Debug, Deserialize, Clone)]
pub(crate) struct Entry {
    pub seq: u64,
    pub kind: String,
    pub count: usize,
    pub dtype: String,
    pub op: Option<String>,
    pub rank_arg: Option<usize>,
    pub path: String,
    pub state: String,
    /// A collective a graph's launch replayed: the graph's id (absent in dumps before
    /// graphs were recorded).
    #[serde(default)]
    pub graph: Option<u64>,
    /// And which replay of it.
    #[serde(default)]
    pub replay: Option<u64>,
}

impl Entry {
    /// What the ranks must agree on, in words.
    fn call(&self) -> String {
        let mut s = format!("{} of {} {}", self.kind, self.count, self.dtype);
        if let Some(op) = &self.op {
            s.push_str(&format!(" ({op})"));
        }
        if let Some(r) = self.rank_arg {
            s.push_str(&format!(" with rank {r}"));
        }
        s
    }

    /// What happened to it, in words (a replayed one names its graph and replay).
    fn fate(&self) -> String {
        let by = match (self.graph, self.replay) {
            (Some(g), Some(k)) => format!("replay {k} of graph {g} ({})", self.path),
            _ => self.path.clone(),
        };
        format!("{}, {}, by {by}", self.call(), self.state)
    }
}

/// The largest dump read (the largest ring, 2^20 entries, is about 200 MiB of JSON; a dump of
/// the default 1024 entries about 200 KiB).
const MAX_DUMP_BYTES: u64 = 256 << 20;
/// The largest world a dump may name (the library's own limit on ranks is far below).
const MAX_WORLD: usize = 1 << 24;

/// Every dump in `dir`: regular files only (a FIFO, a device or a link named like a dump is
/// refused, never opened in a way that blocks or followed), read with a bound, each header
/// checked.
pub(crate) fn read_dir(dir: &Path) -> Result<Vec<Dump>> {
    let mut out = Vec::new();
    let rd = std::fs::read_dir(dir).with_context(|| format!("reading {}", dir.display()))?;
    for e in rd.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        if !(name.starts_with("unicomm-flight.") && name.ends_with(".json")) {
            continue;
        }
        let path = e.path();
        let text = read_bounded(&path)?;
        let d: Dump = serde_json::from_str(&text)
            .with_context(|| format!("{} is not a flight-recorder dump", path.display()))?;
        if d.format != "unicomm-flight-1" {
            bail!("{}: unknown format {:?}", path.display(), d.format);
        }
        if d.world == 0 || d.world > MAX_WORLD || d.rank >= d.world {
            bail!(
                "{}: rank {} of a world of {}: not a dump of this library",
                path.display(),
                d.rank,
                d.world
            );
        }
        out.push(d);
    }
    Ok(out)
}

/// A dump's text: a regular file (checked without following a link), opened non-blocking,
/// at most [`MAX_DUMP_BYTES`].
fn read_bounded(path: &Path) -> Result<String> {
    use std::io::Read;
    use std::os::unix::fs::OpenOptionsExt;
    let meta =
        std::fs::symlink_metadata(path).with_context(|| format!("reading {}", path.display()))?;
    if !meta.file_type().is_file() {
        bail!(
            "{}: not a regular file (a link, FIFO or device named like a dump)",
            path.display()
        );
    }
    let f = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_NOFOLLOW)
        .open(path)
        .with_context(|| format!("opening {}", path.display()))?;
    // Its size, known before a byte is read: a larger file is refused at once (it was read
    // up to the bound first, 256 MiB of a 1 GiB file).
    let size = f.metadata().map(|m| m.len()).unwrap_or(0);
    if size > MAX_DUMP_BYTES {
        bail!(
            "{}: {} MiB, larger than {} MiB: not a dump",
            path.display(),
            size >> 20,
            MAX_DUMP_BYTES >> 20
        );
    }
    let mut text = String::new();
    // Bounded still: the file may grow while it is read.
    f.take(MAX_DUMP_BYTES + 1)
        .read_to_string(&mut text)
        .with_context(|| format!("reading {}", path.display()))?;
    if text.len() as u64 > MAX_DUMP_BYTES {
        bail!(
            "{}: larger than {} MiB: not a dump",
            path.display(),
            MAX_DUMP_BYTES >> 20
        );
    }
    Ok(text)
}

/// The analysis, one paragraph per communicator.
pub(crate) fn analyze(dumps: &[Dump]) -> Vec<String> {
    let mut by_comm: BTreeMap<&str, Vec<&Dump>> = BTreeMap::new();
    for d in dumps {
        by_comm.entry(&d.comm).or_default().push(d);
    }
    let mut out = Vec::new();
    for (comm, mut ds) in by_comm {
        ds.sort_by_key(|d| d.rank);
        let world = ds.iter().map(|d| d.world).max().unwrap_or(0);
        let mut lines = vec![format!(
            "communicator {comm:?} ({world} ranks): dumps of rank(s) {}",
            list(ds.iter().map(|d| d.rank))
        )];
        // The ranks without a dump, as ranges from the sorted ranks that have one: a header
        // may claim a world of 2^24 ranks, and the output stays a line.
        let mut missing = Vec::new();
        let mut next = 0;
        for r in ds.iter().map(|d| d.rank).chain([world]) {
            if r > next {
                missing.push((next, r - 1));
            }
            next = next.max(r + 1);
        }
        if !missing.is_empty() {
            lines.push(format!(
                "  no dump from rank(s) {}: they died, hung outside unicomm, or were never told of the failure",
                ranges(&missing)
            ));
        }
        for d in &ds {
            lines.push(format!("  rank {}: {}", d.rank, d.reason));
        }
        lines.push(verdict(&ds));
        out.push(lines.join("\n"));
    }
    out
}

/// The first sequence number where the ranks part, in words. Linear in the entries: each
/// dump's entries indexed once, and only the sequence numbers some dump holds or ends at are
/// looked at (a header's `next_seq` may be anything).
fn verdict(ds: &[&Dump]) -> String {
    // Only numbers every dump still holds (the rings keep the last operations).
    let from = ds
        .iter()
        .map(|d| d.entries.first().map_or(d.next_seq, |e| e.seq))
        .max()
        .unwrap_or(0);
    let upto = ds.iter().map(|d| d.next_seq).max().unwrap_or(0);
    let index: Vec<std::collections::HashMap<u64, &Entry>> = ds
        .iter()
        .map(|d| d.entries.iter().map(|e| (e.seq, e)).collect())
        .collect();
    let mut candidates: Vec<u64> = ds
        .iter()
        .flat_map(|d| d.entries.iter().map(|e| e.seq).chain([d.next_seq]))
        .filter(|&q| q >= from && q < upto)
        .collect();
    candidates.sort_unstable();
    candidates.dedup();
    for seq in candidates {
        let reached: Vec<(usize, &Entry)> = ds
            .iter()
            .zip(&index)
            .filter_map(|(d, ix)| ix.get(&seq).map(|e| (d.rank, *e)))
            .collect();
        let Some(&(first_rank, first_entry)) = reached.first() else {
            // No dump holds it: a gap in every ring, not a divergence between ranks.
            continue;
        };
        if reached.len() < ds.len() {
            return missed(ds, &index, seq, &reached);
        }
        let first = first_entry.call();
        if let Some((r, e)) = reached.iter().find(|(_, e)| e.call() != first) {
            return format!(
                "  first divergence at sequence number {seq}: the ranks called different operations: rank {first_rank} {first}, rank {r} {}",
                e.call()
            );
        }
    }
    no_divergence(ds)
}

/// Sequence number `seq`, reached by the ranks of `reached` only: who never did, and each
/// of those ranks' last operation.
fn missed(
    ds: &[&Dump],
    index: &[std::collections::HashMap<u64, &Entry>],
    seq: u64,
    reached: &[(usize, &Entry)],
) -> String {
    let never: Vec<usize> = ds
        .iter()
        .zip(index)
        .filter(|(_, ix)| !ix.contains_key(&seq))
        .map(|(d, _)| d.rank)
        .collect();
    let mut s = format!(
        "  first divergence at sequence number {seq}: rank(s) {} reached it ({}); rank(s) {} never did",
        list(reached.iter().map(|(r, _)| *r)),
        reached[0].1.fate(),
        list(never.iter().copied())
    );
    for d in ds.iter().filter(|d| never.contains(&d.rank)) {
        match d.entries.last() {
            Some(e) => s.push_str(&format!(
                "\n    rank {}'s last operation: sequence number {}, {}",
                d.rank,
                e.seq,
                e.fate()
            )),
            None => s.push_str(&format!("\n    rank {} recorded no operation", d.rank)),
        }
    }
    s
}

/// No rank parted from the others: where every dump ends, or the first operation still
/// pending.
fn no_divergence(ds: &[&Dump]) -> String {
    let pending: Vec<String> = ds
        .iter()
        .filter_map(|d| {
            d.entries
                .iter()
                .find(|e| e.state == "pending")
                .map(|e| format!("rank {} at {} ({})", d.rank, e.seq, e.call()))
        })
        .collect();
    if pending.is_empty() {
        let last = ds
            .iter()
            .filter_map(|d| d.entries.last())
            .max_by_key(|e| e.seq)
            .map_or("none".to_string(), |e| {
                format!("sequence number {} ({})", e.seq, e.fate())
            });
        format!(
            "  no divergence among the dumps: every one of them ends at the same operation, {last}; a rank with no dump is where the job stopped"
        )
    } else {
        format!(
            "  the ranks called the same operations; the first still pending: {}",
            pending.join(", ")
        )
    }
}

/// The most ranks or ranges a line lists before it says how many more there are.
const LISTED: usize = 32;

fn list(rs: impl Iterator<Item = usize>) -> String {
    let rs: Vec<usize> = rs.collect();
    let mut s = rs
        .iter()
        .take(LISTED)
        .map(|r| r.to_string())
        .collect::<Vec<_>>()
        .join(", ");
    if rs.len() > LISTED {
        s.push_str(&format!(" and {} more", rs.len() - LISTED));
    }
    s
}

/// Inclusive ranges of ranks, `a-b` where longer than one, at most [`LISTED`] of them.
fn ranges(rs: &[(usize, usize)]) -> String {
    let total: usize = rs.iter().map(|(a, b)| b - a + 1).sum();
    let mut s = rs
        .iter()
        .take(LISTED)
        .map(|&(a, b)| {
            if a == b {
                a.to_string()
            } else {
                format!("{a}-{b}")
            }
        })
        .collect::<Vec<_>>()
        .join(", ");
    if rs.len() > LISTED {
        s.push_str(&format!(" and {} more ranges", rs.len() - LISTED));
    }
    format!("{s} ({total} rank(s))")
}

/// `cargo xtask trace DIR`.
pub(crate) fn trace(dir: &Path) -> Result<()> {
    let dumps = read_dir(dir)?;
    if dumps.is_empty() {
        bail!(
            "no flight-recorder dump in {} (set UNICOMM_FLIGHT_DIR for the job)",
            dir.display()
        );
    }
    for p in analyze(&dumps) {
        println!("{p}");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dump(rank: usize, calls: &[(&str, usize)], state: &str) -> Dump {
        let entries = calls
            .iter()
            .enumerate()
            .map(|(i, (kind, count))| Entry {
                seq: i as u64,
                kind: kind.to_string(),
                count: *count,
                dtype: "float32".into(),
                op: None,
                rank_arg: None,
                path: "library".into(),
                state: state.into(),
                graph: None,
                replay: None,
            })
            .collect::<Vec<_>>();
        Dump {
            format: "unicomm-flight-1".into(),
            comm: "world".into(),
            rank,
            world: 3,
            reason: "deadline".into(),
            next_seq: entries.len() as u64,
            entries,
        }
    }

    #[test]
    fn names_the_first_sequence_number_a_rank_never_reached_and_what_it_did_last() {
        let ds = [
            dump(
                0,
                &[("all_reduce", 4), ("all_reduce", 4), ("barrier", 0)],
                "enqueued",
            ),
            dump(1, &[("all_reduce", 4)], "passed"),
            dump(2, &[("all_reduce", 4), ("all_reduce", 4)], "enqueued"),
        ];
        let a = analyze(&ds).join("\n");
        assert!(a.contains("first divergence at sequence number 1"), "{a}");
        assert!(a.contains("rank(s) 0, 2 reached it"), "{a}");
        assert!(a.contains("rank(s) 1 never did"), "{a}");
        assert!(
            a.contains(
                "rank 1's last operation: sequence number 0, all_reduce of 4 float32, passed"
            ),
            "{a}"
        );
    }

    #[test]
    fn names_ranks_that_called_different_operations_and_missing_dumps() {
        let ds = [
            dump(0, &[("all_reduce", 4), ("all_reduce", 8)], "enqueued"),
            dump(1, &[("all_reduce", 4), ("all_reduce", 16)], "enqueued"),
        ];
        let a = analyze(&ds).join("\n");
        assert!(a.contains("sequence number 1: the ranks called different operations: rank 0 all_reduce of 8 float32, rank 1 all_reduce of 16 float32"), "{a}");
        assert!(a.contains("no dump from rank(s) 2"), "{a}");
    }

    #[test]
    fn a_lost_rank_is_named_and_the_survivors_last_operation_given() {
        let ds = [
            dump(0, &[("all_reduce", 4), ("all_reduce", 4)], "enqueued"),
            dump(1, &[("all_reduce", 4), ("all_reduce", 4)], "enqueued"),
        ];
        let a = analyze(&ds).join("\n");
        assert!(a.contains("no dump from rank(s) 2"), "{a}");
        assert!(
            a.contains("ends at the same operation, sequence number 1 (all_reduce of 4 float32"),
            "{a}"
        );
    }

    #[test]
    fn a_file_larger_than_a_dump_is_refused_by_its_size_before_any_read() {
        let dir = std::env::temp_dir().join(format!("unicomm-trace-big-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("flight-0.txt");
        std::fs::File::create(&path)
            .unwrap()
            .set_len(1 << 30)
            .unwrap();
        let e = read_bounded(&path).unwrap_err().to_string();
        // Only the file's size says 1024: a read stops at the bound.
        assert!(e.contains("1024 MiB"), "{e}");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn reads_the_librarys_own_dump_format() {
        let text = r#"{"format":"unicomm-flight-1","comm":"world","rank":0,"world":2,"reason":"r","dumped_us":1,"next_seq":1,"entries":[{"seq":0,"kind":"broadcast","count":3,"dtype":"int32","op":null,"rank_arg":1,"path":"mock","stream":9,"enqueued_us":5,"state":"enqueued"}]}"#;
        let d: Dump = serde_json::from_str(text).unwrap();
        assert_eq!(d.entries[0].call(), "broadcast of 3 int32 with rank 1");
    }

    #[test]
    fn a_replayed_collective_is_named_by_its_graph_and_replay() {
        let text = r#"{"format":"unicomm-flight-1","comm":"world","rank":0,"world":2,"reason":"r","dumped_us":1,"next_seq":1,"entries":[{"seq":0,"kind":"all_reduce","count":4,"dtype":"float32","op":"sum","rank_arg":null,"path":"library","stream":0,"enqueued_us":5,"state":"pending","graph":3,"replay":41}]}"#;
        let d: Dump = serde_json::from_str(text).unwrap();
        assert_eq!(
            d.entries[0].fate(),
            "all_reduce of 4 float32 (sum), pending, by replay 41 of graph 3 (library)"
        );
    }

    fn scratch(name: &str) -> std::path::PathBuf {
        let d = std::env::temp_dir().join(format!("unicomm-trace-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    /// What a shared flight directory may hold under a dump's name: a FIFO (opening it for
    /// reading blocked for good), a link to /dev/zero (read until memory ran out). Refused at
    /// once, naming the file.
    #[test]
    fn a_fifo_or_a_link_named_like_a_dump_is_refused_at_once() {
        let d = scratch("fifo");
        let fifo = d.join("unicomm-flight.world.rank0.json");
        let made = std::process::Command::new("mkfifo").arg(&fifo).status();
        assert!(made.is_ok_and(|s| s.success()));
        let t = std::time::Instant::now();
        let e = read_dir(&d).unwrap_err().to_string();
        assert!(e.contains("not a regular file"), "{e}");
        std::fs::remove_file(&fifo).unwrap();
        std::os::unix::fs::symlink("/dev/zero", &fifo).unwrap();
        let e = read_dir(&d).unwrap_err().to_string();
        assert!(e.contains("not a regular file"), "{e}");
        assert!(t.elapsed() < std::time::Duration::from_secs(2));
        let _ = std::fs::remove_dir_all(&d);
    }

    /// A header naming a world of 2^62 ranks is refused (the analysis allocated by it).
    #[test]
    fn a_header_with_an_absurd_world_is_refused() {
        let d = scratch("world");
        let text = r#"{"format":"unicomm-flight-1","comm":"world","rank":0,"world":4611686018427387904,"reason":"r","next_seq":0,"entries":[]}"#;
        std::fs::write(d.join("unicomm-flight.world.rank0.json"), text).unwrap();
        let e = read_dir(&d).unwrap_err().to_string();
        assert!(e.contains("not a dump of this library"), "{e}");
        let _ = std::fs::remove_dir_all(&d);
    }

    /// No dump holding the next number (the rings of a malformed set), and a `next_seq` of
    /// 2^62: no panic, no loop over the gap.
    #[test]
    fn gaps_and_absurd_sequence_numbers_neither_panic_nor_loop() {
        let mut a = dump(0, &[("all_reduce", 4)], "enqueued");
        let mut b = dump(1, &[("all_reduce", 4)], "enqueued");
        a.next_seq = 1 << 62;
        b.entries[0].seq = 5;
        b.next_seq = 6;
        let t = std::time::Instant::now();
        let out = analyze(&[a, b]).join("\n");
        assert!(t.elapsed() < std::time::Duration::from_secs(1), "{out}");
    }

    /// The analysis is linear: three ranks of 80,000 entries each (42 s when each number
    /// was looked up by a scan).
    #[test]
    fn large_rings_are_analyzed_in_linear_time() {
        let calls: Vec<(&str, usize)> = (0..80_000).map(|_| ("all_reduce", 4)).collect();
        let mut ds: Vec<Dump> = (0..3).map(|r| dump(r, &calls, "enqueued")).collect();
        ds[2].entries.pop();
        ds[2].next_seq -= 1;
        let t = std::time::Instant::now();
        let a = analyze(&ds).join("\n");
        assert!(
            a.contains("first divergence at sequence number 79999"),
            "{a}"
        );
        assert!(
            t.elapsed() < std::time::Duration::from_secs(5),
            "{:?}",
            t.elapsed()
        );
    }

    /// Dumps whose header claims a world of 2^24 ranks give a few short lines, not a line
    /// listing every rank without a dump (1.2 GB printed before).
    #[test]
    fn a_dump_claiming_a_huge_world_is_summarised_in_short_lines() {
        let mut ds: Vec<Dump> = (0..8)
            .map(|r| dump(r * 3, &[("all_reduce", 4)], "pending"))
            .collect();
        for d in &mut ds {
            d.world = MAX_WORLD;
        }
        let text = analyze(&ds).join("\n");
        assert!(text.len() < 8 << 10, "{} bytes", text.len());
        assert!(text.contains("1-2, 4-5"), "{text}");
        assert!(
            text.contains(&format!("22-{} ({} rank(s))", MAX_WORLD - 1, MAX_WORLD - 8)),
            "{text}"
        );
    }
}
