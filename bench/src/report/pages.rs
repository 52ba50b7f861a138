//! The tables the manual keeps of runs, generated from the runs' JSON (docs/perf/) and
//! checked equal to it: a page marks each one with a line `<!-- KIND: ARGS -->` before it and
//! `<!-- /KIND -->` after, KIND `floors` (ARGS: the JSON's path, the `--floor` table) or
//! `times` (ARGS: the path, a collective, modes and sizes: the times table below). A marker
//! counts only at the start of a line (prose may name the markers).

use anyhow::{bail, Context};

/// `unicomm-bench report --times COLL MODES SIZES RUN.json`'s table: per size (out of place),
/// each mode's time in microseconds, with its bus bandwidth in GB/s in brackets from 1 MiB.
/// SIZES is a list of sizes (`8,512K,2M`), or a word of a preset's labels (`h8192`: a row
/// per label holding it, in the run's order). Bus bandwidth shows from 1 MiB where the run
/// has one.
pub fn times_table(doc: &serde_json::Value, spec: &str) -> anyhow::Result<String> {
    let mut words = spec.split_whitespace();
    let (Some(coll), Some(modes), Some(sizes), None) =
        (words.next(), words.next(), words.next(), words.next())
    else {
        bail!("a times table is named by COLL MODES SIZES (got {spec:?})");
    };
    let modes: Vec<&str> = modes.split(',').collect();
    let rows = doc["results"]
        .as_array()
        .context("no `results` in the JSON")?;
    let first = if sizes.starts_with(|c: char| c.is_ascii_digit()) {
        "size"
    } else {
        "shape"
    };
    let mut out = format!("| {first} | {} |\n| ---: |", modes.join(" | "));
    out.push_str(&" ---: |".repeat(modes.len()));
    out.push('\n');
    for (title, pick) in picks(rows, sizes)? {
        out.push_str(&format!("| {title} |"));
        for mode in &modes {
            let r = rows
                .iter()
                .find(|r| {
                    r["collective"] == coll
                        && r["mode"] == *mode
                        && r["inPlace"] == false
                        && pick.holds(r)
                })
                .with_context(|| format!("no {coll} {mode} at {title} in the JSON"))?;
            let bytes = r["size"].as_u64().context("no `size`")?;
            let t = r["time"].as_f64().context("no `time`")?;
            let bus = r["busBw"].as_f64().context("no `busBw`")?;
            // Bus bandwidth from 1 MiB, where there is one (a world of one has none).
            if bytes >= 1 << 20 && bus > 0.0 {
                out.push_str(&format!(" {t:.1} ({bus:.1}) |"));
            } else {
                out.push_str(&format!(" {t:.2} |"));
            }
        }
        out.push('\n');
    }
    Ok(out)
}

/// Which results a row of a times table shows.
enum Pick {
    Size(u64),
    Label(String),
}

impl Pick {
    fn holds(&self, r: &serde_json::Value) -> bool {
        match self {
            Pick::Size(b) => {
                r["size"].as_u64() == Some(*b) && r["label"].as_str().is_none_or(str::is_empty)
            }
            Pick::Label(l) => r["label"] == l.as_str(),
        }
    }
}

/// The rows SIZES names (see [`times_table`]), each with its title.
fn picks(rows: &[serde_json::Value], sizes: &str) -> anyhow::Result<Vec<(String, Pick)>> {
    if sizes.starts_with(|c: char| c.is_ascii_digit()) {
        return sizes
            .split(',')
            .map(|s| Ok((pretty(parse_size(s)?), Pick::Size(parse_size(s)?))))
            .collect();
    }
    let mut labels: Vec<String> = Vec::new();
    for r in rows {
        let l = r["label"].as_str().unwrap_or("");
        if l.split_whitespace().any(|w| w == sizes) && !labels.iter().any(|x| x == l) {
            labels.push(l.to_string());
        }
    }
    if labels.is_empty() {
        bail!("no label of the JSON holds {sizes:?}");
    }
    Ok(labels
        .into_iter()
        .map(|l| (l.clone(), Pick::Label(l)))
        .collect())
}

/// `8`, `512K`, `2M`, `1G` as bytes.
fn parse_size(s: &str) -> anyhow::Result<u64> {
    let (digits, shift) = match s.as_bytes().last() {
        Some(b'K') => (&s[..s.len() - 1], 10),
        Some(b'M') => (&s[..s.len() - 1], 20),
        Some(b'G') => (&s[..s.len() - 1], 30),
        _ => (s, 0),
    };
    let n: u64 = digits
        .parse()
        .with_context(|| format!("{s:?} is not a size"))?;
    Ok(n << shift)
}

/// Bytes as the manual writes them (`8 B`, `512 KiB`, `2 MiB`).
fn pretty(b: u64) -> String {
    match b {
        b if b >= 1 << 30 && b % (1 << 30) == 0 => format!("{} GiB", b >> 30),
        b if b >= 1 << 20 && b % (1 << 20) == 0 => format!("{} MiB", b >> 20),
        b if b >= 1 << 10 && b % (1 << 10) == 0 => format!("{} KiB", b >> 10),
        b => format!("{b} B"),
    }
}

/// The tables of kind `kind` in `text` that differ from what their JSON gives
/// (`table_of(ARGS)`), named; and how many there are.
#[cfg(test)]
pub(crate) fn stale_tables(
    text: &str,
    kind: &str,
    table_of: impl Fn(&str) -> anyhow::Result<String>,
) -> (usize, Vec<String>) {
    let (open, close) = (format!("\n<!-- {kind}: "), format!("<!-- /{kind} -->"));
    let mut stale = Vec::new();
    let mut n = 0;
    for part in text.split(open.as_str()).skip(1) {
        n += 1;
        let Some((args, rest)) = part.split_once(" -->") else {
            stale.push(format!("a {kind} marker without its end"));
            continue;
        };
        let kept = rest.split(close.as_str()).next().unwrap_or("").trim();
        match table_of(args) {
            Ok(t) if t.trim() == kept => {}
            Ok(_) => stale.push(format!(
                "the {kind} table of {args} is not what its JSON gives: run `unicomm-bench report --{kind} ...`"
            )),
            Err(e) => stale.push(format!("{args}: {e:#}")),
        }
    }
    (n, stale)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn root() -> std::path::PathBuf {
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
    }

    fn json(path: &str) -> anyhow::Result<serde_json::Value> {
        Ok(serde_json::from_str(&std::fs::read_to_string(
            root().join(path),
        )?)?)
    }

    /// docs/performance.md's tables of runs are generated from their JSON, not typed: each
    /// kind is there at least once, and each equals what its JSON gives.
    #[test]
    fn the_performance_page_s_tables_are_their_runs() {
        let text = std::fs::read_to_string(root().join("docs/performance.md")).unwrap();
        let (n, stale) = stale_tables(&text, "times", |args| {
            let (path, spec) = args.split_once(' ').context("PATH COLL MODES SIZES")?;
            times_table(&json(path)?, spec)
        });
        assert!(n >= 1 && stale.is_empty(), "{n} times tables: {stale:?}");
        let (_, stale) = stale_tables(&text, "floors", |p| super::super::floor_table(&json(p)?));
        assert!(stale.is_empty(), "{stale:?}");
    }

    /// A table edited by hand (or a JSON re-run without regenerating it) is named.
    #[test]
    fn a_times_table_that_differs_from_its_json_is_named() {
        let doc = serde_json::json!({"results": [
            {"collective": "all_reduce", "mode": "plain", "inPlace": false, "size": 8, "time": 8.5632, "busBw": 0.0},
            {"collective": "all_reduce", "mode": "plain", "inPlace": true, "size": 8, "time": 9.0, "busBw": 0.0},
            {"collective": "all_reduce", "mode": "plain", "inPlace": false, "size": 2097152, "time": 31.66, "busBw": 66.23},
        ]});
        let t = times_table(&doc, "all_reduce plain 8,2M").unwrap();
        assert!(
            t.contains("| 8 B | 8.56 |") && t.contains("| 2 MiB | 31.7 (66.2) |"),
            "{t}"
        );
        assert!(times_table(&doc, "all_reduce plain 512K").is_err());
        let page = format!("x\n<!-- times: r.json all_reduce plain 8,2M -->\n{t}<!-- /times -->\n");
        assert_eq!(stale_tables(&page, "times", |_| Ok(t.clone())), (1, vec![]));
        let edited = page.replace("8.56", "8.50");
        let (n, stale) = stale_tables(&edited, "times", |_| Ok(t.clone()));
        assert_eq!((n, stale.len()), (1, 1), "{stale:?}");
    }
}
