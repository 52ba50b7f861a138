//! What identifies a run: machine, library, arguments, the variables that change NCCL.

use unicomm::{Capabilities, Vendor};

use crate::Args;

/// What identifies a run: machine, library, arguments.
pub struct Header {
    /// The command line.
    pub args: Vec<String>,
    /// The vendor and why.
    pub vendor: String,
    /// The library's capabilities (version, path).
    pub caps: Capabilities,
    /// Ranks.
    pub world: usize,
    /// Element type and reduction.
    pub dtype: String,
    /// The reduction.
    pub op: String,
    /// Warm-up and timed iterations.
    pub iters: (usize, usize),
    /// The variables that change NCCL's behaviour.
    pub env: Vec<(String, String)>,
    /// The measurement order, in words.
    pub order: String,
    /// CUDA graph launches per turn (`-G`); 0: direct calls.
    pub graphs: usize,
    /// Every rank's device.
    pub devices: Vec<crate::run::DeviceRow>,
}

impl Header {
    /// The header of this run.
    pub fn new(
        a: &Args,
        dtype: unicomm::DataType,
        vendor: Vendor,
        why: &str,
        caps: &Capabilities,
        world: usize,
        devices: Vec<crate::run::DeviceRow>,
    ) -> Self {
        let mut env: Vec<(String, String)> = std::env::vars()
            .filter(|(k, _)| {
                ["NCCL_", "RCCL_", "UNICOMM_", "CUDA_VISIBLE", "HIP_VISIBLE"]
                    .iter()
                    .any(|p| k.starts_with(p))
            })
            .collect();
        env.sort();
        Header {
            args: std::env::args().collect(),
            vendor: format!("{vendor} ({why})"),
            caps: caps.clone(),
            world,
            dtype: dtype.to_string(),
            op: a.op.to_string(),
            iters: (a.warmup, a.iters),
            env,
            order: match a.order {
                crate::Order::Size => format!(
                    "modes take turns at each size, in {} rounds",
                    a.rounds.max(1)
                ),
                crate::Order::Mode => "one mode at every size, then the next".into(),
            },
            graphs: a.graphs,
            devices,
        }
    }

    /// The `#` lines above the table.
    pub fn print(&self) {
        println!(
            "# unicomm-bench {}: {}",
            env!("CARGO_PKG_VERSION"),
            self.args.join(" ")
        );
        println!("# vendor: {}", self.vendor);
        println!(
            "# {} ranks, {} {} at {}",
            self.world, self.caps.backend, self.caps.version, self.caps.library_path
        );
        println!(
            "# {} {}; warm-up {} iterations, timed {} (device events, back to back); {}",
            self.dtype, self.op, self.iters.0, self.iters.1, self.order
        );
        if self.graphs > 0 {
            println!(
                "# graphs: each turn's iterations captured once per rank (unicomm::Graph; CUDA's own capture for the raw modes and --single-thread), the graph launched {} times (time per call = launches' time / calls replayed)",
                self.graphs
            );
        }
        for d in &self.devices {
            println!(
                "#  Rank {:2} Pid {:6} on {:>10} device {:>2} [{}] {}",
                d.rank,
                d.pid,
                d.hostname,
                d.device.map_or("-".into(), |i| i.to_string()),
                d.device_hex.as_deref().unwrap_or("-"),
                d.device_info
            );
        }
        for (k, v) in &self.env {
            println!("# {k}={v}");
        }
    }
}
