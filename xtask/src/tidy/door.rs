//! The one door: every stream-ordered operation reaches a backend through
//! `Collective::enqueue` (a `Work`), where the backend routes it and records it once in
//! its flight recorder. A second trait method that took work on a stream would go around
//! the recorder and the graph's count (the symmetric kernels, the one-sided calls and the
//! device-API kernel once did: an eager symmetric all-reduce left the ring empty), and a
//! recording outside the backends' doors would record some work twice.

use super::workspace::Crate;

/// The trait methods that take `&Self::Stream` though they enqueue no work: the door itself,
/// and a graph's launch telling the backend which stream now runs its work.
pub(crate) const STREAM_METHODS: &[&str] = &["enqueue", "graph_launched"];

/// The files whose `enqueue` is a backend's door, the only ones that record a piece of work
/// (`.enqueued(`).
pub(crate) const DOOR_FILES: &[&str] = &[
    "backend-mock/src/collective.rs",
    "nccl-api/src/comm/collective.rs",
];

/// Each method declared in the braced block after `header` with the text of its signature
/// (from `fn` to its body or `;`).
fn signatures(src: &str, header: &str) -> Vec<(String, String)> {
    let Some(at) = src.find(header) else {
        return Vec::new();
    };
    let Some(open) = src[at..].find('{').map(|i| at + i) else {
        return Vec::new();
    };
    let body = &src[open..];
    let (mut depth, mut out) = (0usize, Vec::new());
    let mut current: Option<String> = None;
    for (i, ch) in body.char_indices() {
        let at_word = i == 0 || body[..i].ends_with(|c: char| c.is_whitespace());
        if depth == 1 && current.is_none() && at_word && body[i..].starts_with("fn ") {
            current = Some(String::new());
        }
        if let Some(sig) = current.as_mut() {
            if depth == 1 && (ch == '{' || ch == ';') {
                let name: String = sig[3..]
                    .chars()
                    .take_while(|c| c.is_alphanumeric() || *c == '_')
                    .collect();
                out.push((name, std::mem::take(sig)));
                current = None;
            } else {
                sig.push(ch);
            }
        }
        match ch {
            '{' => depth += 1,
            '}' if depth == 1 => break,
            '}' => depth -= 1,
            _ => {}
        }
    }
    out
}

/// The methods of the trait `header` in `src` (code without comments and strings) that take the backend's stream and are not
/// [`STREAM_METHODS`]: doors beside the one door.
pub(crate) fn second_doors(src: &str, header: &str) -> Vec<String> {
    signatures(src, header)
        .into_iter()
        .filter(|(name, sig)| {
            let params = sig.split("->").next().unwrap_or(sig);
            params.contains("Self::Stream") && !STREAM_METHODS.contains(&name.as_str())
        })
        .map(|(name, _)| {
            format!("Collective::{name} takes work on a stream beside Collective::enqueue: make it a kind of Work")
        })
        .collect()
}

/// Flight records (`.enqueued(`) made outside the backends' doors ([`DOOR_FILES`]).
pub(crate) fn records_outside_doors(crates: &[&Crate], doors: &[&str]) -> Vec<String> {
    let mut out = Vec::new();
    for c in crates {
        for (path, src) in c.files.values() {
            let p = path.to_string_lossy().replace('\\', "/");
            if doors.contains(&p.as_str()) || p.starts_with("comm-core/src/flight") {
                continue;
            }
            if src.code.contains(".enqueued(") {
                out.push(format!(
                    "{p}: records work in a flight recorder outside a backend's door"
                ));
            }
        }
    }
    out
}
