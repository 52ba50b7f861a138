//! The benchmark on the mock, as CI runs it: every collective, every mode the mock has, in
//! and out of place, data checked, JSON and SVG written. A smoke test: no timing assertion.

use std::process::Command;

#[test]
fn the_benchmark_runs_on_the_mock_and_writes_json_and_svg() {
    let dir = std::env::temp_dir().join(format!("unicomm-bench-smoke-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (json, svg) = (dir.join("out.json"), dir.join("out.svg"));
    let out = Command::new(env!("CARGO_BIN_EXE_unicomm-bench"))
        .args([
            "--vendor", "mock", "--ranks", "3", "-b", "8", "-e", "64K", "-f", "8", "-w", "1", "-n",
            "2",
        ])
        .arg("-J")
        .arg(&json)
        .arg("--plot")
        .arg(&svg)
        .output()
        .expect("run unicomm-bench");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    for coll in [
        "all_reduce",
        "all_to_all",
        "all_gather",
        "reduce_scatter",
        "broadcast",
    ] {
        assert!(
            stdout.contains(&format!("# {coll}")),
            "{coll} missing:\n{stdout}"
        );
    }
    // The modes the mock cannot run are named, not silently dropped.
    assert!(stderr.contains("mode raw: skipped"), "{stderr}");
    let doc: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let rows = doc["results"].as_array().expect("results");
    // 5 collectives x sizes x 3 modes x placements, less all_to_all in place.
    assert!(rows.len() > 50, "{} rows", rows.len());
    for r in rows {
        assert_eq!(r["wrong"], 0, "{r}");
        assert!(r["time"].as_f64().unwrap() > 0.0, "{r}");
        // The host's enqueue time is measured (on the mock the host does the work).
        assert!(r["hostTime"].as_f64().unwrap() > 0.0, "{r}");
        assert!(r["hostBound"].is_boolean(), "{r}");
        for k in [
            "algBw", "busBw", "size", "count", "inPlace", "mode", "iterTime",
        ] {
            assert!(!r[k].is_null(), "{k} missing in {r}");
        }
    }
    assert_eq!(doc["nranks"], 3);
    let plot = std::fs::read_to_string(&svg).unwrap();
    assert!(
        plot.starts_with("<svg") && plot.contains("bus bandwidth"),
        "not an SVG plot"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// Runs unicomm-bench on the mock with `args` and `-J`; the JSON it wrote.
fn bench_json(tag: &str, args: &[&str]) -> serde_json::Value {
    let dir = std::env::temp_dir().join(format!("unicomm-bench-{tag}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let json = dir.join("out.json");
    let out = Command::new(env!("CARGO_BIN_EXE_unicomm-bench"))
        .args(["--vendor", "mock"])
        .args(args)
        .arg("-J")
        .arg(&json)
        .output()
        .expect("run unicomm-bench");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    let doc = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    doc
}

/// The (collective, mode, size, in place) cells of a run, each checked with 0 wrong.
fn cells(doc: &serde_json::Value) -> Vec<String> {
    let rows = doc["results"].as_array().expect("results");
    let mut v: Vec<String> = rows
        .iter()
        .map(|r| {
            assert_eq!(r["wrong"], 0, "{r}");
            format!(
                "{} {} {} {}",
                r["collective"], r["mode"], r["size"], r["inPlace"]
            )
        })
        .collect();
    v.sort();
    v
}

/// `--single-thread`: one thread drives every rank inside a group per iteration; the data
/// is checked on every rank, in every mode the mock has.
#[test]
fn one_thread_drives_every_rank() {
    let doc = bench_json(
        "single",
        &[
            "--ranks",
            "3",
            "--single-thread",
            "--modes",
            "plain,registered,window,auto",
            "-b",
            "8",
            "-e",
            "64K",
            "-f",
            "8",
            "-w",
            "1",
            "-n",
            "2",
        ],
    );
    let rows = cells(&doc);
    assert!(rows.len() > 50, "{} rows", rows.len());
}

/// The modes taking turns at each size (the default) and one mode after another measure
/// the same cells, each with its data checked.
#[test]
fn both_orders_measure_the_same_cells() {
    let args = |order: &'static str| {
        [
            "--ranks",
            "2",
            "--order",
            order,
            "--rounds",
            "3",
            "--modes",
            "plain,window,auto",
            "-b",
            "8",
            "-e",
            "4K",
            "-f",
            "8",
            "-w",
            "1",
            "-n",
            "7",
        ]
    };
    let size_doc = bench_json("order-size", &args("size"));
    let by_size = cells(&size_doc);
    let by_mode = cells(&bench_json("order-mode", &args("mode")));
    // Every cell timed its 7 iterations, in rounds of 3, 2 and 2.
    for r in size_doc["results"].as_array().unwrap() {
        assert_eq!(r["iterations"], 7, "{r}");
    }
    // 5 collectives x 4 sizes x 3 modes x 2 placements, less all_to_all in place.
    assert_eq!(by_size.len(), 4 * 4 * 3 * 2 + 4 * 3, "{by_size:?}");
    assert_eq!(by_size, by_mode);
}

/// `-G` (CUDA graphs) is refused up front on a backend without them, naming the option.
#[test]
fn graphs_are_refused_on_the_mock() {
    let out = Command::new(env!("CARGO_BIN_EXE_unicomm-bench"))
        .args(["--vendor", "mock", "-G", "3", "-b", "8", "-e", "8"])
        .output()
        .expect("run unicomm-bench");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        stderr.contains("-G (CUDA graphs) needs the CUDA backend"),
        "{stderr}"
    );
}
