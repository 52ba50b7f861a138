//! Across ranks: each rank's device for the header, and the ranks' figures combined
//! through the communicator (one rank per process).

use anyhow::Context;
use unicomm::ReduceOp;

use super::drive::*;

/// One rank's device as the header and the JSON report it (nccl-tests' `devices` entries).
#[derive(Debug, Clone, PartialEq)]
pub struct DeviceRow {
    /// The rank.
    pub rank: usize,
    /// Its process.
    pub pid: u32,
    /// Its host.
    pub hostname: String,
    /// The device index in that process (`None`: not a GPU).
    pub device: Option<usize>,
    /// The PCI bus id.
    pub device_hex: Option<String>,
    /// The device's name.
    pub device_info: String,
}

/// Bytes per rank of a device row sent to rank 0 (one rank per process).
pub(crate) const ROW_BYTES: usize = 512;

impl DeviceRow {
    pub(crate) fn mine(c: &unicomm::Comm) -> Self {
        let d = c.device_info().unwrap_or_else(|e| unicomm::DeviceInfo {
            index: None,
            name: format!("unknown ({e})"),
            pci_bus_id: None,
        });
        DeviceRow {
            rank: c.rank(),
            pid: std::process::id(),
            hostname: hostname(),
            device: d.index,
            device_hex: d.pci_bus_id,
            device_info: d.name,
        }
    }

    /// Tab-separated fields, cut to fit [`ROW_BYTES`] (the name last, cut at a character).
    pub(crate) fn encode(&self) -> Vec<u8> {
        let opt = |o: &Option<String>| o.clone().unwrap_or_else(|| "-".into());
        let mut s = format!(
            "{}\t{}\t{}\t{}\t{}",
            self.pid,
            self.hostname.replace(['\t', '\0'], " "),
            self.device.map_or("-".into(), |d| d.to_string()),
            opt(&self.device_hex),
            self.device_info.replace(['\t', '\0'], " ")
        );
        while s.len() >= ROW_BYTES {
            s.pop();
        }
        let mut b = s.into_bytes();
        b.resize(ROW_BYTES, 0);
        b
    }

    pub(crate) fn decode(rank: usize, b: &[u8]) -> Self {
        let end = b.iter().position(|&x| x == 0).unwrap_or(b.len());
        let s = String::from_utf8_lossy(&b[..end]).into_owned();
        let mut f = s.splitn(5, '\t');
        let mut next = || f.next().unwrap_or("").to_string();
        let (pid, hostname, device, hex, name) = (next(), next(), next(), next(), next());
        DeviceRow {
            rank,
            pid: pid.parse().unwrap_or(0),
            hostname,
            device: device.parse().ok(),
            device_hex: (hex != "-").then_some(hex),
            device_info: name,
        }
    }
}

/// This host's name (Linux: the kernel's; else `HOSTNAME`), or `unknown`.
pub(crate) fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .or_else(|| std::env::var("HOSTNAME").ok())
        .map(|h| h.trim().to_string())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "unknown".into())
}

/// Every rank's device, in rank order: read here for the ranks of this process; with one
/// rank per process gathered through the communicator (collective).
pub fn devices(comms: &[unicomm::Comm]) -> anyhow::Result<Vec<DeviceRow>> {
    let Some(c) = comms.first() else {
        return Ok(Vec::new());
    };
    let w = c.world_size();
    if comms.len() == w {
        return Ok(comms.iter().map(DeviceRow::mine).collect());
    }
    let st = c.create_stream()?;
    let mut send = c.alloc::<u8>(ROW_BYTES)?;
    send.copy_from_host(&DeviceRow::mine(c).encode(), &st)?;
    let mut all = c.alloc::<u8>(ROW_BYTES * w)?;
    c.all_gather(&send, &mut all, &st)?;
    let bytes = all.copy_to_host(&st)?;
    Ok(bytes
        .chunks(ROW_BYTES)
        .enumerate()
        .map(|(r, b)| DeviceRow::decode(r, b))
        .collect())
}

/// One rank per process: every rank's figures made the world's, through the communicator
/// (an all-reduce of the times with max, of the wrong counts with sum), so every process
/// holds what one process driving all ranks would: per cell the slowest rank's time, the
/// slowest rank's time per iteration, the wrong elements of all ranks.
pub(crate) fn combine(c: &unicomm::Comm, mine: Vec<ModeOut>) -> anyhow::Result<Vec<ModeOut>> {
    let mut times = Vec::new();
    let mut wrongs = Vec::new();
    for (out, extra) in &mine {
        times.push(extra.map_or(f64::MIN, |e| e as f64));
        for cell in out.iter().flatten() {
            times.push(cell.total_us);
            times.push(cell.host_us);
            times.extend_from_slice(&cell.iter_us);
            wrongs.push(cell.wrong.map_or(0.0, |w| w as f64));
        }
    }
    let times = reduce_host(c, &times, ReduceOp::Max)?;
    let wrongs = reduce_host(c, &wrongs, ReduceOp::Sum)?;
    let (mut t, mut w) = (times.into_iter(), wrongs.into_iter());
    let next = |it: &mut std::vec::IntoIter<f64>| {
        it.next()
            .context("combining the ranks' figures: ranks disagree on the sweep")
    };
    let mut all = Vec::new();
    for (out, _) in mine {
        let extra = next(&mut t)?;
        let extra = (extra > f64::MIN).then_some(extra as i64);
        let mut cells = Vec::new();
        for cell in out {
            cells.push(match cell {
                None => None,
                Some(cell) => {
                    let total_us = next(&mut t)?;
                    let host_us = next(&mut t)?;
                    let iter_us = cell
                        .iter_us
                        .iter()
                        .map(|_| next(&mut t))
                        .collect::<anyhow::Result<Vec<f64>>>()?;
                    let wsum = next(&mut w)?;
                    Some(Cell {
                        count: cell.count,
                        total_us,
                        iter_us,
                        host_us,
                        wrong: cell.wrong.map(|_| wsum as u64),
                    })
                }
            });
        }
        all.push((cells, extra));
    }
    Ok(all)
}
