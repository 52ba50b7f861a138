//! The benchmark on the mock, as CI runs it: every collective, every mode the mock has, in
//! and out of place, data checked, JSON and SVG written. A smoke test: no timing assertion.

use std::process::Command;

#[test]
fn the_benchmark_runs_on_the_mock_and_writes_json_and_svg() {
    let run = bench(
        "smoke",
        &[
            "--ranks", "3", "-b", "8", "-e", "64K", "-f", "8", "-w", "1", "-n", "2",
        ],
        true,
    );
    let (stdout, stderr, doc) = (&run.stdout, &run.stderr, &run.doc);
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
    for m in ["raw", "raw-registered", "raw-window"] {
        assert!(stderr.contains(&format!("mode {m}: skipped")), "{stderr}");
    }
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
    // nccl-tests' devices list: one entry per rank, in rank order.
    let devices = doc["devices"].as_array().expect("devices");
    assert_eq!(devices.len(), 3);
    for (r, d) in devices.iter().enumerate() {
        assert_eq!(d["rank"], r, "{d}");
        // One process drives the three ranks here.
        assert_eq!(d["pid"], devices[0]["pid"], "{d}");
        assert!(d["pid"].as_u64().is_some_and(|p| p > 0), "{d}");
        assert!(
            d["hostname"].is_string() && d["device_info"].is_string(),
            "{d}"
        );
    }
    assert!(stdout.contains("#  Rank  2 Pid"), "{stdout}");
    let plot = run.svg.as_deref().unwrap_or("");
    assert!(
        plot.starts_with("<svg") && plot.contains("bus bandwidth"),
        "not an SVG plot"
    );
}

/// What a run of unicomm-bench left: its output, its JSON and (with `--plot`) its SVG.
struct Run {
    stdout: String,
    stderr: String,
    doc: serde_json::Value,
    svg: Option<String>,
}

/// Runs unicomm-bench on the mock with `args`, `-J` and, if `plot`, `--plot`; it must
/// succeed.
/// A command line's arguments, written as one line.
fn words(line: &str) -> Vec<&str> {
    line.split_whitespace().collect()
}

fn bench(tag: &str, args: &[&str], plot: bool) -> Run {
    let dir = std::env::temp_dir().join(format!("unicomm-bench-{tag}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (json, svg) = (dir.join("out.json"), dir.join("out.svg"));
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_unicomm-bench"));
    cmd.args(["--vendor", "mock"])
        .args(args)
        .arg("-J")
        .arg(&json);
    if plot {
        cmd.arg("--plot").arg(&svg);
    }
    let out = cmd.output().expect("run unicomm-bench");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "{stdout}\n{stderr}");
    let doc = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let svg = plot.then(|| std::fs::read_to_string(&svg).unwrap());
    let _ = std::fs::remove_dir_all(&dir);
    Run {
        stdout,
        stderr,
        doc,
        svg,
    }
}

/// The JSON of a run of unicomm-bench on the mock with `args`.
fn bench_json(tag: &str, args: &[&str]) -> serde_json::Value {
    bench(tag, args, false).doc
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
        &words("--ranks 3 --single-thread --modes plain,registered,window,auto -b 8 -e 64K -f 8 -w 1 -n 2"),
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

/// `-G` over several ranks on one thread captures them all in one CUDA graph: refused up
/// front on the mock, naming the option and the way that works (a thread per rank).
#[test]
fn graphs_of_several_ranks_on_one_thread_are_refused_on_the_mock() {
    let out = Command::new(env!("CARGO_BIN_EXE_unicomm-bench"))
        .args(words(
            "--vendor mock --ranks 2 --single-thread -G 3 -b 8 -e 8",
        ))
        .output()
        .expect("run unicomm-bench");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        stderr.contains("-G with --single-thread over several ranks")
            && stderr.contains("drop --single-thread"),
        "{stderr}"
    );
}

/// `report` names the path auto took per row by the library's own policy code: with a tune
/// file that sends all_reduce up to 100 bytes to windows and above to registration, the 8 B
/// row says window and the 1 KiB row registered, and a cell where auto is over 1.03x the
/// best fixed mode is listed as a miss.
#[test]
fn the_report_names_auto_s_path_by_the_policy_and_lists_its_misses() {
    let dir = std::env::temp_dir().join(format!("unicomm-report-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let row = |size: u64, mode: &str, time: f64| {
        serde_json::json!({"collective": "all_reduce", "size": size, "mode": mode,
            "inPlace": false, "time": time, "iterTime": {"p50": time}})
    };
    let doc = serde_json::json!({"library": {"backend": "nccl", "version": "2.28.9"},
        "nranks": 2, "results": [
            row(8, "window", 6.0), row(8, "registered", 8.0), row(8, "auto", 6.1),
            row(1024, "window", 9.0), row(1024, "registered", 8.0), row(1024, "auto", 9.0)]});
    let json = dir.join("sweep.json");
    std::fs::write(&json, doc.to_string()).unwrap();
    let tune = dir.join("tune.txt");
    std::fs::write(&tune, "all_reduce 100 window\nall_reduce max registered\n").unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_unicomm-bench"))
        .arg("report")
        .arg(&json)
        .arg("--tune")
        .arg(&tune)
        .output()
        .unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let line = |size: &str| {
        text.lines()
            .find(|l| l.starts_with(&format!("| {size} |")))
            .unwrap_or_else(|| panic!("no row for {size}: {text}"))
            .to_string()
    };
    assert!(line("8").contains("| window | window |"), "{text}");
    assert!(
        line("1024").contains("| registered | registered |"),
        "{text}"
    );
    assert!(
        text.contains("auto over 1.03x the best fixed mode (mean): 1 cells"),
        "{text}"
    );
    assert!(text.contains("- all_reduce 1024 B: 1.125"), "{text}");
}

/// gather, scatter and all_to_all_v (skewed per-peer counts) are measured and checked, out
/// of place, in every mode the mock has that takes them.
#[test]
fn gather_scatter_and_all_to_all_v_are_measured_and_checked() {
    let doc = bench_json(
        "vcolls",
        &words("--ranks 3 --coll gather,scatter,all_to_all_v -b 96 -e 96K -f 32 -w 1 -n 2 --modes plain,registered,window"),
    );
    let c = cells(&doc);
    for coll in ["gather", "scatter", "all_to_all_v"] {
        for mode in ["plain", "registered", "window"] {
            assert!(
                c.iter()
                    .any(|x| x.starts_with(&format!("\"{coll}\" \"{mode}\""))),
                "{coll} {mode} missing: {c:?}"
            );
        }
    }
    // Out of place only: no in-place rows.
    assert!(c.iter().all(|x| x.ends_with("false")), "{c:?}");
}

/// The MoE preset: a top-k routing's per-peer token counts, hidden 7168, in fp8; checked.
#[test]
fn the_moe_preset_dispatches_routed_tokens_in_fp8() {
    let doc = bench_json(
        "moe",
        &[
            "--ranks", "4", "--preset", "moe", "-d", "f8e4m3", "-w", "1", "-n", "1", "--modes",
            "plain", "--place", "out",
        ],
    );
    let rows = doc["results"].as_array().expect("results");
    assert_eq!(rows.len(), 1, "{rows:?}");
    assert_eq!(rows[0]["collective"], "all_to_all_v");
    assert_eq!(rows[0]["wrong"], 0);
}

/// The decode preset: a decode step's bf16 all-reduces, hidden 4096 and 8192 at batch 1 to
/// 64 (8 KiB to 1 MiB per call), every one checked.
#[test]
fn the_decode_preset_times_a_decode_steps_all_reduces() {
    let doc = bench_json(
        "decode",
        &[
            "--ranks", "2", "--preset", "decode", "-w", "1", "-n", "1", "-c", "1", "--modes",
            "plain", "--place", "out",
        ],
    );
    let rows = doc["results"].as_array().expect("results");
    assert_eq!(rows.len(), 14, "{rows:?}");
    let bytes: Vec<u64> = rows
        .iter()
        .map(|r| r["size"].as_u64().unwrap_or(0))
        .collect();
    assert_eq!(bytes[0], 4096 * 2);
    assert_eq!(bytes[13], 64 * 8192 * 2);
    for r in rows {
        assert_eq!(r["collective"], "all_reduce");
        assert!(
            r["label"]
                .as_str()
                .is_some_and(|l| l.starts_with("decode h")),
            "{r}"
        );
        assert_eq!(r["wrong"], 0);
    }
}

/// `-G` on the mock: each thread's rank captures its turn through `unicomm::Graph` and
/// replays it; every collective in and out of place, in every mode the mock has, with the
/// data checked after one replay of a captured call into a cleared output.
#[test]
fn graph_mode_captures_and_replays_on_the_mock() {
    let doc = bench_json(
        "graphs",
        &words("--ranks 3 -b 64 -e 4K -f 8 -w 1 -n 2 -G 2 --modes plain,registered,window,auto"),
    );
    let all = cells(&doc);
    for coll in [
        "all_reduce",
        "all_to_all",
        "all_gather",
        "reduce_scatter",
        "broadcast",
    ] {
        for mode in ["plain", "registered", "window", "auto"] {
            assert!(
                all.iter()
                    .any(|c| c.starts_with(&format!("\"{coll}\" \"{mode}\""))),
                "{coll} {mode} missing: {all:?}"
            );
        }
    }
    assert!(
        all.iter().any(|c| c.ends_with("true")),
        "no in-place cell: {all:?}"
    );
}

/// unicomm's symmetric kernels as modes of their own: every algorithm's all_reduce at each
/// size, eager and in unicomm's graphs, its data checked (bf16, sum), the other collectives
/// and in-place forms left to the other modes.
#[test]
fn the_symmetric_modes_run_checked_all_reduces_eager_and_in_graphs() {
    for graphs in [None, Some("2")] {
        let mut args = words(
            "--ranks 3 --modes one-shot,two-shot,lamport -d bf16 -b 8 -e 4K -f 8 -w 1 -n 2 -c 1",
        );
        if let Some(g) = graphs {
            args.extend(["-G", g]);
        }
        let doc = bench_json("symmetric", &args);
        let rows = cells(&doc);
        for algorithm in ["one-shot", "two-shot", "lamport"] {
            let n = rows
                .iter()
                .filter(|r| r.contains(&format!("\"{algorithm}\"")))
                .count();
            assert!(n >= 4, "{algorithm}: {n} cells of {rows:?}");
        }
        assert!(
            rows.iter()
                .all(|r| r.starts_with("\"all_reduce\"") && r.ends_with("false")),
            "{rows:?}"
        );
    }
}

/// The fused modes on the decode preset's shapes: the all-reduce + residual add + RMSNorm
/// (and its FP8 output) at every shape, eager and in graphs; the residual checked (one
/// call from a cleared residual leaves the all-reduce there), sweeps without a row length
/// left out.
#[test]
fn the_fused_modes_time_the_decode_shapes_with_the_residual_checked() {
    for graphs in [None, Some("1")] {
        let mut args = words("--ranks 2 --preset decode -w 1 -n 1 -c 1 --modes fused,fused-fp8");
        if let Some(g) = graphs {
            args.extend(["-G", g]);
        }
        let doc = bench_json("fused", &args);
        let rows = doc["results"].as_array().expect("results");
        for mode in ["fused", "fused-fp8"] {
            let mine: Vec<_> = rows.iter().filter(|r| r["mode"] == mode).collect();
            assert_eq!(mine.len(), 14, "{mode}: {rows:?}");
            for r in mine {
                assert_eq!(r["wrong"], 0, "{r}");
                assert_eq!(r["inPlace"], false, "{r}");
            }
        }
    }
    let sweep = bench_json(
        "fused-sweep",
        &words("--ranks 2 -b 8 -e 64 -w 1 -n 1 --modes plain,fused"),
    );
    let rows = sweep["results"].as_array().expect("results");
    assert!(rows.iter().all(|r| r["mode"] == "plain"), "{rows:?}");
}

/// `moe-ep`: dispatch and combine of a MoE layer's routing on the mock, eager and in a
/// graph, every rank's combine equal to its fixed-order reference.
#[test]
fn the_moe_ep_command_times_dispatch_and_combine_checked() {
    let out = Command::new(env!("CARGO_BIN_EXE_unicomm-bench"))
        .args(words("moe-ep --vendor mock --ranks 4 --tokens 16 --hidden 24 --experts 16 --top-k 4 -n 3 -w 1 -G 2"))
        .output()
        .expect("run unicomm-bench moe-ep");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let rows: Vec<&str> = stdout.lines().filter(|l| !l.starts_with('#')).collect();
    assert_eq!(rows.len(), 4, "{stdout}");
    for r in rows {
        let f: Vec<&str> = r.split_whitespace().collect();
        assert_eq!(f.len(), 4, "{r}");
        assert_eq!(f[3], "0", "{r}");
        assert!(
            f[1].parse::<f64>().is_ok() && f[2].parse::<f64>().is_ok(),
            "{r}"
        );
    }
}

/// The high-throughput mode (`--max-recv`): every rank's figures, its combine exact.
#[test]
fn the_moe_ep_command_times_the_high_throughput_mode_checked() {
    let out = Command::new(env!("CARGO_BIN_EXE_unicomm-bench"))
        .args(words(
            "moe-ep --vendor mock --ranks 3 --tokens 8 --hidden 16",
        ))
        .args(words("--experts 6 --top-k 2 -n 2 -w 1 -G 1 --max-recv 24"))
        .output()
        .expect("run unicomm-bench moe-ep");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("HighThroughput"), "{stdout}");
    let rows: Vec<&str> = stdout.lines().filter(|l| !l.starts_with('#')).collect();
    assert_eq!(rows.len(), 3, "{stdout}");
    assert!(
        rows.iter()
            .all(|r| r.split_whitespace().nth(3) == Some("0")),
        "{stdout}"
    );
}

/// `--engine library` on a backend without an expert library fails naming why on every
/// rank, never a row of figures.
#[test]
fn the_moe_ep_command_fails_where_the_library_engine_does_not_run() {
    let out = Command::new(env!("CARGO_BIN_EXE_unicomm-bench"))
        .args([
            "moe-ep", "--vendor", "mock", "--ranks", "2", "--tokens", "4",
        ])
        .args([
            "--hidden",
            "8",
            "--experts",
            "4",
            "--top-k",
            "2",
            "--engine",
            "library",
        ])
        .output()
        .expect("run unicomm-bench moe-ep");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(!out.status.success(), "{stdout}");
    assert_eq!(stdout.matches("not run here").count(), 2, "{stdout}");
    assert!(stdout.contains("NCCL EP"), "{stdout}");
}
