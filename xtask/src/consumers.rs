//! `consumers`: `cargo check` of a program that depends on unicomm's NCCL backend beside its
//! own cudarc, in each way engines build cudarc (cargo unifies its features per binary, so a
//! feature unicomm forced would be forced on them; cudarc's build script refuses some
//! combinations). The program is `consumers/cudarc`, its own workspace, built in
//! `<target>/consumers`.

use anyhow::Result;

use crate::cargo::{cargo, root, step, target_dir};

/// The configurations checked: the program's cudarc features, and who builds cudarc so.
const CONFIGURATIONS: &[(&str, &str)] = &[
    (
        "dynamic-linking,cuda-version-from-build-system",
        "candle, mistral.rs, candle-vllm",
    ),
    ("dynamic-linking,cuda-12080", "a pinned CUDA, linked"),
    ("dynamic-loading,cuda-13000", "cudarc's loading, pinned"),
    ("fallback-dynamic-loading", "cubecl, no version of its own"),
];
// candle-core's CPU build beside unicomm's NCCL backend is unicomm-candle itself, which
// the workspace's clippy and tests build with its `mock` and `nccl` features.

/// Checks each configuration; the first failure names it.
pub(crate) fn consumers() -> Result<()> {
    let dir = root().join("consumers/cudarc");
    let target = target_dir("consumers");
    for (features, who) in CONFIGURATIONS {
        let mut c = cargo();
        c.current_dir(&dir)
            .args(["check", "--quiet", "--features", features])
            .arg("--target-dir")
            .arg(&target);
        step(
            &format!("a program beside unicomm with cudarc {features} ({who})"),
            c,
        )?;
    }
    eprintln!("consumers: {} configurations check", CONFIGURATIONS.len());
    Ok(())
}
