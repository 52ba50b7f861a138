//! What a run prints and writes: the nccl-tests-style table, the JSON, the SVG plot.

mod floor;
mod header;
mod json;
mod pages;
mod plot;
mod summary;
mod table;
mod tune;

pub use floor::{floor_table, floors};
pub use header::Header;
pub use json::{json, json_with_memory};
pub use pages::times_table;
pub use plot::{plot, replot};
pub use summary::summary;
pub use table::{memory, table};
pub use tune::tune;

use std::path::PathBuf;

/// `unicomm-bench report SWEEP.json`: a sweep's JSON read back as tables.
#[derive(clap::Parser, Debug)]
#[command(name = "unicomm-bench report")]
struct ReportArgs {
    /// The sweep's JSON (`-J`).
    json: PathBuf,
    /// The tune file the run's auto read (default: nccl-tune.txt or rccl-tune.txt beside
    /// the JSON, where the bundle writes it).
    #[arg(long)]
    tune: Option<PathBuf>,
    /// The in-place rows instead of the out-of-place ones.
    #[arg(long)]
    in_place: bool,
    /// The floors' table of a `--floor` run (markdown, as docs/performance.md keeps it).
    #[arg(long)]
    floors: bool,
    /// A table of times, "COLL MODES SIZES" (`"all_reduce plain,window 8,2M"`), in
    /// markdown as docs/performance.md keeps it (out of place; bus bandwidth from 1 MiB).
    #[arg(long, value_name = "COLL MODES SIZES")]
    times: Option<String>,
}

/// `unicomm-bench report ARGS`.
pub fn report(args: impl IntoIterator<Item = String>) -> anyhow::Result<()> {
    use clap::Parser;
    let r = ReportArgs::parse_from(args);
    if r.floors || r.times.is_some() {
        let doc: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&r.json)?)?;
        match &r.times {
            Some(spec) => print!("{}", times_table(&doc, spec)?),
            None => print!("{}", floor_table(&doc)?),
        }
        return Ok(());
    }
    summary(&r.json, r.tune.as_deref(), r.in_place)
}

#[cfg(test)]
mod tests {
    use super::table::*;
    use super::*;
    use crate::run::Measure;
    use crate::Mode;
    use crate::{Coll, Work};

    fn m(bytes: usize, mode: Mode, iters: &[f64]) -> Measure {
        Measure {
            work: Work {
                coll: Coll::AllReduce,
                bytes,
                dtype: unicomm::DataType::F32,
                label: "",
                moe: None,
                hidden: None,
            },
            mode,
            in_place: false,
            count: bytes / 4,
            time_us: iters.iter().sum::<f64>() / iters.len() as f64,
            iter_us: iters.to_vec(),
            host_us: 0.0,
            wrong: Some(0),
        }
    }

    #[test]
    fn host_bound_when_enqueueing_takes_nearly_the_device_time() {
        let mut r = m(8, Mode::Window, &[10.0, 10.0]);
        assert!(!host_bound(&r));
        r.host_us = 8.9;
        assert!(!host_bound(&r));
        r.host_us = 9.0;
        assert!(host_bound(&r));
        r.host_us = 14.0;
        assert!(host_bound(&r));
        r.time_us = 0.0;
        assert!(!host_bound(&r), "no time measured: not called host-bound");
    }

    /// The tuner ranks paths by the median iteration (one slow iteration does not decide)
    /// and keeps the previous size's path within 3% of the fastest.
    #[test]
    fn tune_uses_the_median_and_keeps_a_path_within_the_tolerance() {
        let h = Header {
            args: vec!["unicomm-bench".into()],
            vendor: "test".into(),
            caps: unicomm::local_comms_n(unicomm::Vendor::Mock, Some(1))
                .expect("a mock communicator")[0]
                .capabilities(),
            world: 2,
            dtype: "float".into(),
            op: "sum".into(),
            iters: (1, 4),
            env: Vec::new(),
            order: String::new(),
            graphs: 0,
            devices: Vec::new(),
        };
        let results = vec![
            // 8 B: the window's mean (29.5) loses to registered (8.0), its median (6) wins.
            m(8, Mode::Window, &[6.0, 6.0, 6.0, 100.0]),
            m(8, Mode::Registered, &[8.0, 8.0, 8.0, 8.0]),
            // 32 B: registered is 2% faster: the window stays.
            m(32, Mode::Window, &[6.12, 6.12, 6.12, 6.12]),
            m(32, Mode::Registered, &[6.0, 6.0, 6.0, 6.0]),
            // 128 B: registered is 20% faster: it takes over.
            m(128, Mode::Window, &[7.2, 7.2, 7.2, 7.2]),
            m(128, Mode::Registered, &[6.0, 6.0, 6.0, 6.0]),
        ];
        let path =
            std::env::temp_dir().join(format!("unicomm-tune-test-{}.txt", std::process::id()));
        tune(&path, &h, &results).unwrap();
        let text = std::fs::read_to_string(&path).unwrap();
        let _ = std::fs::remove_file(&path);
        let rules: Vec<&str> = text.lines().filter(|l| !l.starts_with('#')).collect();
        assert_eq!(
            rules,
            ["all_reduce 32 window", "all_reduce max registered"],
            "{text}"
        );
        // The digest line is the library's digest of the rules as it reads the file.
        let digest = unicomm_nccl_api::Policy::parse(&text, "t")
            .unwrap()
            .digest();
        assert!(text.contains(&format!("# digest {digest:016x} ")), "{text}");
    }
}
