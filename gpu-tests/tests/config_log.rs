//! Each field set through `CommConfig` reaches NCCL, read from NCCL's own log: after its
//! version check (`parseCommConfig` resets the fields newer than the version the config
//! claims), NCCL logs `Comm config <field> set to <value>` (`NCCL_DEBUG=INFO`, subsystem
//! `ENV`) for each field that is not its "undefined" value. A field dropped on the way (a
//! wrong offset, a version too old for it) has no line, and this test names it.
//!
//! One test in its own binary: NCCL reads its log variables once, at its first call, so they
//! are set before anything of NCCL runs in this process.
#![cfg(feature = "nccl")]

use unicomm_core::{Comm, CommConfig, CtaPolicy, Place, ReduceOp, Result, Version};

/// NCCL's words for each field set below, and the value it must print.
fn expected(cfg: &CommConfig) -> Vec<(&'static str, String)> {
    let flag = |b: Option<bool>| b.map(|b| (b as i32).to_string());
    let num = |n: Option<u32>| n.map(|n| n.to_string());
    let policy = cfg.cta_policy.map(|p| match p {
        CtaPolicy::Default => "0".to_string(),
        CtaPolicy::Efficiency => "1".to_string(),
        CtaPolicy::Zero => "2".to_string(),
    });
    [
        ("Blocking", flag(cfg.blocking)),
        ("CGA cluster size", num(cfg.cga_cluster_size)),
        ("Min CTAs", num(cfg.min_ctas)),
        ("Max CTAs", num(cfg.max_ctas)),
        ("Net name", cfg.net_name.clone()),
        ("Split share", flag(cfg.split_share)),
        ("Traffic class", num(cfg.traffic_class)),
        ("Comm name", cfg.comm_name.clone()),
        ("Collnet enable", flag(cfg.collnet_enable)),
        ("CTA policy flags", policy),
        ("nvlsCTAs", num(cfg.nvls_ctas)),
        (
            "graphUsageMode",
            cfg.graph_usage_mode.map(|m| m.to_string()),
        ),
        (
            "graphStreamOrdering",
            cfg.graph_stream_ordering.map(|m| m.to_string()),
        ),
    ]
    .into_iter()
    .filter_map(|(k, v)| v.map(|v| (k, v)))
    .collect()
}

/// Every field the loaded NCCL has, each away from NCCL's default so its line shows it came
/// from us: the 2.29 and 2.30.5 fields only where the library has them (older ones refuse them
/// as `Unsupported`, tested on the fake NCCLs).
fn config_for(v: Version) -> CommConfig {
    CommConfig {
        blocking: Some(false),
        cga_cluster_size: Some(2),
        min_ctas: Some(2),
        max_ctas: Some(4),
        net_name: Some("Socket".into()),
        split_share: Some(true),
        traffic_class: Some(5),
        comm_name: Some("unicomm-config-check".into()),
        collnet_enable: Some(false),
        cta_policy: Some(CtaPolicy::Efficiency),
        nvls_ctas: Some(3),
        graph_usage_mode: (v >= Version::new(2, 29, 0)).then_some(1),
        graph_stream_ordering: (v >= Version::new(2, 30, 5)).then_some(0),
    }
}

#[test]
fn every_config_field_set_reaches_nccl_as_its_log_shows() -> Result<()> {
    let dir = std::env::temp_dir().join(format!("unicomm-config-log-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("a log folder");
    let log = dir.join("nccl.log");
    // The one test of this binary, before NCCL is loaded: nothing else reads the
    // environment concurrently.
    std::env::set_var("NCCL_DEBUG", "INFO");
    std::env::set_var("NCCL_DEBUG_SUBSYS", "INIT,ENV");
    std::env::set_var("NCCL_DEBUG_FILE", &log);
    let version = unicomm_nccl::nccl()?.version;
    let cfg = config_for(version);
    let raw = unicomm_nccl::init_rank_with(unicomm_nccl::unique_id()?, Place::new(0, 1, 0), &cfg)?;
    let c = Comm::from_backend(raw);
    let st = c.create_stream()?;
    let mut b = c.alloc::<f32>(1024)?;
    b.copy_from_host(&vec![2.0f32; 1024], &st)?;
    c.all_reduce_in_place(&mut b, ReduceOp::Sum, &st)?;
    assert!(b.copy_to_host(&st)?.iter().all(|&x| x == 2.0));
    c.finalize()?;
    let text = std::fs::read_to_string(&log).expect("NCCL's log file");
    let mut missing = Vec::new();
    for (field, value) in expected(&cfg) {
        let line = format!("Comm config {field} set to {value}");
        match text.lines().find(|l| l.contains(&line)) {
            Some(l) => println!("NCCL {version}: {}", l.trim()),
            None => missing.push(line),
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
    assert!(
        missing.is_empty(),
        "NCCL {version} did not log {missing:?}: those fields did not reach it"
    );
    Ok(())
}
