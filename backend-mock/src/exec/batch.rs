//! A stream's batch of the mock's work (one operation, or a group's): faults injected, the
//! buffers locked, sends posted first, then collectives and receives, then the sends
//! awaited.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use unicomm_core::{Error, Result};

use super::{run_coll, run_recv, RankCtx, Span, Task, Work};
use crate::fabric::Msg;
use crate::lock::Guard;
use crate::FaultKind;

pub(super) static NEXT_MSG: AtomicU64 = AtomicU64::new(1);

/// Runs a batch (one operation, or a whole group for one stream): sends are posted first,
/// then collectives and receives run in order, then the sends are awaited, so that grouped
/// send/recv pairs between the same ranks never deadlock (NCCL's guarantee for groups).
/// Runs a batch (one operation, or a group's); a failure that explains a stuck or
/// divergent job (a deadline, a disagreement, an abort) dumps the flight recorder.
pub(crate) fn run_batch(tasks: Vec<Task>) -> Result<()> {
    let r = run_tasks(&tasks);
    if let Err(e) = &r {
        // A host slice lent to this work reports the failure at its scope's end.
        for s in tasks.iter().flat_map(|t| t.work.spans()) {
            s.alloc.failed(e);
        }
        if let Some(t) = tasks.first() {
            t.ctx.flight.dump_if_explains(e);
        }
    }
    r
}

fn run_tasks(tasks: &[Task]) -> Result<()> {
    let Some(ctx) = tasks.first().map(|t| t.ctx.clone()) else {
        return Ok(());
    };
    for t in tasks {
        inject(&t.ctx, t.index)?;
    }
    if let Some(e) = ctx.fabric.poisoned() {
        return Err(e);
    }
    let _guards = lock_all(tasks, ctx.timeout)?;

    let mut posted = Vec::new();
    let mut result = Ok(());
    for t in tasks {
        if let Work::Send {
            span,
            count,
            dtype,
            peer,
        } = &t.work
        {
            let msg = Msg {
                // Unique across the ranks of a world, in one process or several.
                id: (t.ctx.rank as u64) << 44 | NEXT_MSG.fetch_add(1, Ordering::Relaxed),
                addr: span.addr(),
                count: *count,
                dtype: *dtype,
                at: span.alloc.remote(span.offset),
                load: None,
            };
            let id = msg.id;
            if let Err(e) = ctx.fabric.post(t.ctx.rank, *peer, msg) {
                result = Err(e);
                break;
            }
            posted.push((id, *peer));
        }
    }
    if result.is_ok() {
        for t in tasks {
            let r = match &t.work {
                Work::Coll {
                    seq,
                    sig,
                    spec,
                    send,
                    recv,
                } => run_coll(&t.ctx, *seq, sig, *spec, send.as_ref(), recv.as_ref()),
                Work::Recv {
                    span,
                    count,
                    dtype,
                    peer,
                } => run_recv(&t.ctx, span, *count, *dtype, *peer),
                Work::Send { .. } => Ok(()),
                Work::Signal { put, peer, graph } => {
                    super::signal(&t.ctx, put.as_ref(), *peer, *graph)
                }
                Work::Wait {
                    waits,
                    windows,
                    graph,
                } => super::signals::wait(&t.ctx, waits, windows, *graph),
            };
            if let Err(e) = r {
                result = Err(e);
                break;
            }
        }
    }
    // Always await posted sends: a receiver may be reading our buffers.
    for (id, peer) in posted {
        let r = ctx.fabric.wait_sent(id, peer, ctx.deadline(), ctx.timeout);
        if result.is_ok() {
            result = r;
        }
    }
    result
}

fn inject(ctx: &RankCtx, index: u64) -> Result<()> {
    if let Some(f) = ctx.faults.iter().find(|f| f.op == index) {
        match f.kind {
            FaultKind::Fail => {
                return Err(Error::Device {
                    runtime: "mock",
                    call: "injected fault",
                    code: 999,
                    name: "InjectedFault".into(),
                    message: format!("rank {} failed operation #{index} on purpose", ctx.rank),
                })
            }
            FaultKind::Hang => {
                // Never arrives; wakes only when a peer's timeout poisons the fabric (or,
                // bounded, after ten deadlines) so the worker thread can still exit.
                let until = Instant::now() + ctx.timeout * 10;
                while Instant::now() < until {
                    if let Some(e) = ctx.fabric.poisoned() {
                        return Err(e);
                    }
                    std::thread::sleep(Duration::from_millis(5));
                }
                return Err(Error::aborted(format!(
                    "rank {} hung on purpose at operation #{index}",
                    ctx.rank
                )));
            }
        }
    }
    Ok(())
}

/// Locks every allocation the batch touches, in address order, each once, exclusively if
/// any of its uses writes.
fn lock_all(tasks: &[Task], timeout: Duration) -> Result<Vec<Guard<'_>>> {
    let mut spans: Vec<&Span> = Vec::new();
    for t in tasks {
        match &t.work {
            Work::Coll { send, recv, .. } => spans.extend(send.iter().chain(recv.iter())),
            Work::Send { span, .. } | Work::Recv { span, .. } => spans.push(span),
            Work::Signal { put, .. } => spans.extend(put.as_ref().map(|p| &p.0)),
            // The windows a wait writes are locked per message, as the bytes arrive.
            Work::Wait { .. } => {}
        }
    }
    // By address, then by allocation: distinct empty allocations share one (dangling)
    // address, and must not interleave, or one would be locked twice and wait for itself.
    spans.sort_by_key(|s| (s.alloc.addr(), Arc::as_ptr(&s.alloc) as usize));
    let mut guards = Vec::new();
    let mut i = 0;
    while i < spans.len() {
        let alloc = &spans[i].alloc;
        let mut write = false;
        while i < spans.len() && Arc::ptr_eq(&spans[i].alloc, alloc) {
            write |= spans[i].write;
            i += 1;
        }
        guards.push(if write {
            alloc.write_lock(timeout)?
        } else {
            alloc.read_lock(timeout)?
        });
    }
    Ok(guards)
}
