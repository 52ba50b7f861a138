//! An engine's sleep mode and a communicator's properties, the same on every backend: where
//! the library has them (suspend from NCCL 2.29.7, properties from 2.29.2) a suspended
//! communicator refuses calls until it is resumed and the world then reduces exactly; where
//! it predates them, `Unsupported` naming the release.

use unicomm_core::{each_rank, Collective, Comm, DeviceStream, Error, ReduceOp, Result};

/// What each rank saw: whether the library has the sleep mode and the properties.
pub fn sleep_mode_and_properties<C: Collective>(comms: &[Comm<C>]) -> Result<Vec<(bool, bool)>> {
    each_rank(comms, |c| -> Result<(bool, bool)> {
        let (r, w) = (c.rank(), c.world_size());
        let props = match c.properties() {
            Ok(p) if (p.rank, p.world) == (r, w) => true,
            Ok(p) => return Err(wrong(format!("properties of rank {r} of {w}: {p:?}"))),
            Err(Error::Unsupported { needs, .. }) if needs.contains("2.29.2") => false,
            Err(e) => return Err(e),
        };
        let sleeps = match c.suspend() {
            Ok(()) => {
                if !c.mem_stats()?.suspended {
                    return Err(wrong("suspended, yet its statistics say not".into()));
                }
                match c.alloc::<f32>(4) {
                    Err(Error::InvalidArgument { reason, .. }) if reason.contains("suspended") => {}
                    other => {
                        let got = other.map(drop);
                        return Err(wrong(format!("a call while suspended: {got:?}")));
                    }
                }
                c.resume()?;
                if c.mem_stats()?.suspended {
                    return Err(wrong("resumed, yet its statistics say suspended".into()));
                }
                true
            }
            Err(Error::Unsupported { needs, .. }) if needs.contains("2.29.7") => false,
            Err(e) => return Err(e),
        };
        // The world reduces exactly after it was resumed.
        let st = c.create_stream()?;
        let mut b = c.upload(&[(r + 1) as i64; 8], &st)?;
        c.all_reduce_in_place(&mut b, ReduceOp::Sum, &st)?;
        st.synchronize()?;
        let want = (w * (w + 1) / 2) as i64;
        if b.copy_to_host(&st)?.iter().any(|&v| v != want) {
            return Err(wrong("the all-reduce after resume is not exact".into()));
        }
        Ok((sleeps, props))
    })
}

fn wrong(what: String) -> Error {
    Error::invalid("sleep mode", what)
}
