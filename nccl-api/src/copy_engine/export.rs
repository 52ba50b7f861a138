//! Device memory swapped between the processes of one host (one rank per process): the
//! allocation exported (a cuMem / hipMem POSIX descriptor), the descriptors swapped over
//! Unix sockets (`ipc.rs`), the peers' allocations mapped into this process.

use std::os::fd::AsFd;
use std::time::Instant;

use unicomm_core::{Error, Result};

use super::ipc;
use super::local::PeerPart;
use super::pending::Pending;
use super::region::Region;
use crate::base::Base;
use crate::sys::runtime::Runtime;

pub(crate) use super::local::Swapped;

/// A host-side barrier: a one-element all-reduce on a stream of its own, waited for with
/// the communicator's deadline.
fn host_barrier<R: Runtime>(base: &Base<R>) -> Result<()> {
    let st = base.lc.create_stream()?;
    base.barrier_on(st.lend())?;
    st.synchronize()
}

/// Exchange number `seq` of `job`: export this rank's allocation holding
/// `addr..addr+bytes` (unless `offer` is false), swap it with the peers' (a barrier first,
/// so every rank's listener is bound), map theirs, and agree. Every rank's (device, address
/// here, bytes) and the mappings made, or `None` where some rank could not (nothing stays
/// mapped then).
pub(crate) fn swap<R: Runtime>(
    base: &Base<R>,
    pending: &Pending<R>,
    job: ipc::Job,
    seq: u64,
    region: Region,
    offer: bool,
) -> Result<Option<Swapped>> {
    let Region { addr, bytes } = region;
    let lc = &base.lc;
    let listener = ipc::Listener::bind(job, seq, lc.rank)?;
    let exported = match offer {
        true => export_range(base, region),
        false => Err(Error::invalid("export", "this rank offers nothing")),
    };
    host_barrier(base)?;
    let deadline = Instant::now() + lc.timeout();
    let mine = exported.as_ref().ok().map(|x| {
        (
            ipc::Offer {
                size: x.size as u64,
                offset: (addr - x.base) as u64, // checked by `export_range`
                bytes: bytes as u64,
            },
            x.fd.as_fd(),
        )
    });
    let mut maps: Vec<Mapping> = Vec::new();
    let out = ipc::exchange(&listener, lc.world, mine, deadline, |p, o, fd| {
        maps.push(map_offer(base, p, o, fd)?);
        Ok(())
    });
    let mapped =
        |maps: &[Mapping]| -> Vec<(usize, usize)> { maps.iter().map(|m| (m.va, m.size)).collect() };
    let agreed = match out {
        Ok(a) => a,
        Err(e) => {
            pending.unmap_after(mapped(&maps));
            return Err(e);
        }
    };
    if !agreed {
        // Some rank cannot take the path for this memory: none does.
        if let (true, Err(e)) = (offer, &exported) {
            tracing::warn!(
                "unicomm: rank {}: memory not shared for the copy-engine path: {e}",
                lc.rank
            );
        }
        pending.unmap_after(mapped(&maps));
        return Ok(None);
    }
    let part = |addr, bytes| PeerPart {
        dev: lc.dev,
        addr,
        bytes,
    };
    let mut peers = vec![part(addr, bytes); lc.world];
    for m in &maps {
        peers[m.rank] = part(m.va + m.offset, m.bytes);
    }
    Ok(Some((peers, mapped(&maps))))
}

/// A peer's allocation mapped into this process for an exchange.
struct Mapping {
    rank: usize,
    /// Where it is mapped here, and its size.
    va: usize,
    size: usize,
    /// The peer's range in it.
    offset: usize,
    bytes: usize,
}

/// This rank's allocation holding `addr..addr+bytes`, exported. The range must lie inside
/// it (the driver says so; a runtime that said otherwise offers nothing rather than a
/// wrong range).
fn export_range<R: Runtime>(
    base: &Base<R>,
    Region { addr, bytes }: Region,
) -> Result<crate::sys::runtime::Exported> {
    let lc = &base.lc;
    let x = lc.rt.export_memory(lc.dev, addr)?;
    let inside = addr
        .checked_sub(x.base)
        .and_then(|off| off.checked_add(bytes))
        .is_some_and(|end| end <= x.size);
    if !inside {
        return Err(Error::invalid(
            "export",
            format!(
                "the range {addr:#x}+{bytes} is not inside the exported allocation {:#x}+{}",
                x.base, x.size
            ),
        ));
    }
    Ok(x)
}

/// Rank `p`'s offer mapped here, its range checked inside its allocation first.
fn map_offer<R: Runtime>(
    base: &Base<R>,
    p: usize,
    o: &ipc::Offer,
    fd: std::os::fd::BorrowedFd<'_>,
) -> Result<Mapping> {
    let (size, offset, b) = (o.size as usize, o.offset as usize, o.bytes as usize);
    if offset.checked_add(b).is_none_or(|end| end > size) {
        return Err(Error::invalid(
            "copy-engine exchange",
            format!("rank {p}'s memory ({offset}+{b}) lies outside its allocation ({size})"),
        ));
    }
    let va = base.lc.rt.import_memory(base.lc.dev, fd, size)?;
    Ok(Mapping {
        rank: p,
        va,
        size,
        offset,
        bytes: b,
    })
}
