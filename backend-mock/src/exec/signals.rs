//! A stream's wait for one-sided signals on the mock: the peers' messages taken until each
//! entry's signals arrived, the puts' bytes landing in this rank's windows.

use unicomm_core::{Error, Result, SignalWait};

use super::{land, RankCtx};
use crate::windows::Windows;

/// Takes every entry's signals in turn, writing the puts' bytes into this rank's part of
/// their windows (each under the window allocation's write lock), until the deadline.
/// A graph's wait (`graph`) takes only graphs' signals and an eager wait only eager ones
/// (NCCL keeps them in separate slots, where the other kind's wait would hang): taking the
/// other kind is refused naming the rule.
pub(crate) fn wait(
    ctx: &RankCtx,
    waits: &[SignalWait],
    windows: &Windows,
    graph: bool,
) -> Result<()> {
    let deadline = ctx.deadline();
    for w in waits {
        let mut got = 0;
        while got < w.count {
            let m = ctx.fabric.take_one_sided(w.peer, ctx.rank, deadline)?;
            let Some(load) = m.load else {
                return Err(Error::invalid(
                    "waits",
                    "a send reached the one-sided mailbox",
                ));
            };
            if load.graph != graph {
                return Err(crossed_signal(w.peer, graph));
            }
            if let Some((ord, offset)) = load.window {
                land(ctx, w.peer, windows, ord, offset, &load.bytes)?;
            }
            got += u32::from(load.signal);
        }
    }
    Ok(())
}

/// The refusal of a signal of the other kind (a graph's for an eager wait, or the reverse).
#[cold]
fn crossed_signal(peer: usize, graph: bool) -> Error {
    let (wait, sent) = match graph {
        true => ("a graph's wait", "an eager call"),
        false => ("an eager wait", "a graph's replay"),
    };
    Error::invalid(
        "waits",
        format!(
            "{wait} took a signal rank {peer} sent from {sent}: NCCL counts a graph's puts and signals only in graphs' waits and an eager call's only in eager waits (there this wait would hang until its deadline)"
        ),
    )
}
