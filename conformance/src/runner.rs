//! Running one case: each rank's buffers (plain, registered or in a window), the
//! collective in one of the [`Mode`]s, the output check, and the release.

use unicomm_core::{Buffer, Collective, Comm, DeviceStream, Element, Result};

use super::reference::{root, send_data, sentinel, shape, verify, Expected, Sample};
use super::{Case, Coll, Failure, Mode, Place, Reg};

/// The buffers of one rank, registered as the case asks.
pub(crate) enum Held<'c, T: Element, C: Collective> {
    Plain(Buffer<T, C>),
    Reg(unicomm_core::Registered<'c, T, C>),
    Win(unicomm_core::Window<'c, T, C>),
    Auto(unicomm_core::AutoRegistered<'c, T, C>),
}

impl<'c, T: Element, C: Collective> Held<'c, T, C> {
    fn slice(&mut self) -> &mut dyn HeldSlice<T, C> {
        match self {
            Held::Plain(b) => b,
            Held::Reg(b) => b,
            Held::Win(b) => b,
            Held::Auto(b) => b,
        }
    }
    /// The buffer, registered or not (a registration is found by its address).
    pub(crate) fn buffer(&self) -> &Buffer<T, C> {
        match self {
            Held::Plain(b) => b,
            Held::Reg(b) => b,
            Held::Win(b) => b,
            Held::Auto(b) => b,
        }
    }
    pub(crate) fn release(self, comm: &'c Comm<C>) -> Result<()> {
        match self {
            Held::Plain(_) => Ok(()),
            Held::Reg(r) => comm.deregister(r).map(drop),
            Held::Win(w) => comm.deregister_window(w).map(drop),
            Held::Auto(a) => comm.deregister_auto(a).map(drop),
        }
    }
}

/// Object-safe access to any held buffer.
trait HeldSlice<T: Element, C: Collective> {
    fn view(&self) -> unicomm_core::View<'_, T, C>;
    fn view_mut(&mut self) -> unicomm_core::ViewMut<'_, T, C>;
}
impl<T: Element, C: Collective, B: unicomm_core::DeviceSliceMut<T, C>> HeldSlice<T, C> for B {
    fn view(&self) -> unicomm_core::View<'_, T, C> {
        unicomm_core::DeviceSlice::view(self)
    }
    fn view_mut(&mut self) -> unicomm_core::ViewMut<'_, T, C> {
        unicomm_core::DeviceSliceMut::view_mut(self)
    }
}

pub(crate) fn hold<'c, T: Element, C: Collective>(
    comm: &'c Comm<C>,
    buf: Buffer<T, C>,
    reg: Reg,
) -> Result<Held<'c, T, C>> {
    Ok(match reg {
        Reg::None => Held::Plain(buf),
        Reg::Buffer => Held::Reg(comm.register(buf)?),
        Reg::Window => Held::Win(comm.register_window(buf)?),
        Reg::Auto => Held::Auto(comm.register_auto(buf)?),
    })
}

/// Per-rank state of a case.
struct Rank<'c, T: Element, C: Collective> {
    comm: &'c Comm<C>,
    stream: C::Stream,
    send: Option<Held<'c, T, C>>,
    recv: Held<'c, T, C>,
}

fn setup<'c, T: Sample, C: Collective>(
    comm: &'c Comm<C>,
    case: &Case,
    exp: &Expected<T>,
) -> Result<Rank<'c, T, C>> {
    let s = shape(case);
    let r = comm.rank();
    let stream = comm.create_stream()?;
    let (send, recv) = match case.place {
        Place::Out => {
            let mut send = comm.alloc::<T>(s.send_len)?;
            send.copy_from_host(&send_data::<T>(case, exp, r), &stream)?;
            let mut recv = comm.alloc::<T>(s.recv_len)?;
            recv.copy_from_host(&vec![sentinel::<T>(); s.recv_len], &stream)?;
            (Some(send), recv)
        }
        Place::In => {
            let len = s.send_len.max(s.recv_len);
            let mut buf = comm.alloc::<T>(len)?;
            buf.copy_from_host(&send_data::<T>(case, exp, r), &stream)?;
            (None, buf)
        }
    };
    // Copies must land before registration in case the backend registers eagerly.
    stream.synchronize()?;
    let send = send.map(|b| hold(comm, b, case.reg)).transpose()?;
    let recv = hold(comm, recv, case.reg)?;
    Ok(Rank {
        comm,
        stream,
        send,
        recv,
    })
}

fn launch<T: Sample, C: Collective>(rk: &mut Rank<'_, T, C>, case: &Case) -> Result<()> {
    let (c, st) = (rk.comm, &rk.stream);
    let w = case.world;
    let r = c.rank();
    let recv = rk.recv.slice();
    match (case.coll, rk.send.as_mut()) {
        (Coll::Barrier, _) => c.barrier(st),
        (Coll::SendRecv, Some(send)) => c.group(|| {
            c.send(&send.slice().view(), (r + 1) % w, st)?;
            c.recv(&mut recv.view_mut(), (r + w - 1) % w, st)
        }),
        (Coll::SendRecv, None) => Err(unicomm_core::Error::invalid(
            "case",
            "send/recv is out of place only",
        )),
        (coll, Some(send)) => {
            let sv = send.slice().view();
            let mut rv = recv.view_mut();
            match coll {
                Coll::AllReduce => c.all_reduce(&sv, &mut rv, case.op, st),
                Coll::Broadcast => c.broadcast(&sv, &mut rv, root(case), st),
                Coll::Reduce => c.reduce(&sv, &mut rv, case.op, root(case), st),
                Coll::AllGather => c.all_gather(&sv, &mut rv, st),
                Coll::ReduceScatter => c.reduce_scatter(&sv, &mut rv, case.op, st),
                Coll::AllToAll => c.all_to_all(&sv, &mut rv, st),
                Coll::SendRecv | Coll::Barrier => Ok(()),
            }
        }
        (coll, None) => {
            let mut b = recv.view_mut();
            match coll {
                Coll::AllReduce => c.all_reduce_in_place(&mut b, case.op, st),
                Coll::Broadcast => c.broadcast_in_place(&mut b, root(case), st),
                Coll::Reduce => c.reduce_in_place(&mut b, case.op, root(case), st),
                Coll::AllGather => c.all_gather_in_place(&mut b, st),
                Coll::ReduceScatter => c.reduce_scatter_in_place(&mut b, case.op, st),
                Coll::AllToAll => Err(unicomm_core::Error::invalid(
                    "case",
                    "all_to_all is out of place only",
                )),
                Coll::SendRecv | Coll::Barrier => Ok(()),
            }
        }
    }
}

fn check_output<T: Sample, C: Collective>(
    rk: &mut Rank<'_, T, C>,
    case: &Case,
    exp: &Expected<T>,
) -> std::result::Result<(), Failure> {
    rk.stream.synchronize()?;
    let out = rk.recv.slice().view().copy_to_host(&rk.stream)?;
    verify::<T>(case, exp, rk.comm.rank(), &out).map_err(Failure::msg)
}

fn release<T: Sample, C: Collective>(mut rk: Rank<'_, T, C>) -> std::result::Result<(), Failure> {
    if let Some(s) = rk.send.take() {
        s.release(rk.comm)?;
    }
    rk.recv.release(rk.comm)?;
    Ok(())
}

/// Runs `f` on one scoped thread per communicator and collects the results in rank order.
fn per_rank<'c, C: Collective, R: Send>(
    comms: &'c [Comm<C>],
    f: impl Fn(&'c Comm<C>) -> R + Sync,
) -> Vec<std::thread::Result<R>> {
    std::thread::scope(|s| {
        let hs: Vec<_> = comms.iter().map(|c| s.spawn(|| f(c))).collect();
        hs.into_iter().map(|h| h.join()).collect()
    })
}

pub(super) fn run_typed<T: Sample, C: Collective>(
    comms: &[Comm<C>],
    case: &Case,
    exp: &Expected<T>,
    mode: Mode,
) -> std::result::Result<(), Failure> {
    let outcome: Vec<std::result::Result<(), Failure>> = match mode {
        Mode::ThreadPerRank => per_rank(comms, |c| -> std::result::Result<(), Failure> {
            let mut rk = setup::<T, C>(c, case, exp)?;
            launch(&mut rk, case)?;
            check_output(&mut rk, case, exp)?;
            release(rk)
        })
        .into_iter()
        .map(|r| r.unwrap_or_else(|_| Err(Failure::msg("a rank thread panicked"))))
        .collect(),
        Mode::SingleThread => single_thread(comms, case, exp)?,
    };
    verdict(outcome)
}

/// Every rank's collective issued by this one thread inside one group (window
/// registration, being collective, set up and released one thread per rank): each rank's
/// outcome.
fn single_thread<T: Sample, C: Collective>(
    comms: &[Comm<C>],
    case: &Case,
    exp: &Expected<T>,
) -> std::result::Result<Vec<std::result::Result<(), Failure>>, Failure> {
    let mut ranks: Vec<Rank<'_, T, C>> = if case.reg.is_collective() {
        let mut v = Vec::new();
        for r in per_rank(comms, |c| setup::<T, C>(c, case, exp)) {
            v.push(r.map_err(|_| Failure::msg("a setup thread panicked"))??);
        }
        v
    } else {
        comms
            .iter()
            .map(|c| setup::<T, C>(c, case, exp))
            .collect::<Result<_>>()?
    };
    // A refused launch (an expected `Unsupported`) still releases every rank's collective
    // registrations below, one thread per rank: dropped here, in this one thread, the first
    // rank's deregistration would wait for the others' forever.
    let launched = comms[0].group(|| ranks.iter_mut().try_for_each(|rk| launch(rk, case)));
    let mut out: Vec<_> = match launched {
        Ok(()) => ranks
            .iter_mut()
            .map(|rk| check_output(rk, case, exp))
            .collect(),
        Err(e) => ranks
            .iter()
            .map(|_| Err(Failure::from(e.clone())))
            .collect(),
    };
    for (o, r) in out.iter_mut().zip(release_all(ranks, case)) {
        if o.is_ok() {
            *o = r;
        }
    }
    Ok(out)
}

/// Every rank's buffers released (window deregistration is collective: one thread per rank
/// then).
fn release_all<T: Sample, C: Collective>(
    ranks: Vec<Rank<'_, T, C>>,
    case: &Case,
) -> Vec<std::result::Result<(), Failure>> {
    if !case.reg.is_collective() {
        return ranks.into_iter().map(release).collect();
    }
    std::thread::scope(|s| {
        let hs: Vec<_> = ranks
            .into_iter()
            .map(|rk| s.spawn(move || release(rk)))
            .collect();
        hs.into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err(Failure::msg("a release thread panicked")))
            })
            .collect()
    })
}

/// The ranks' outcomes as one: `Ok`, or every failure named by rank, with the error kept
/// where every failing rank returned the same variant (so that a harness can match an
/// expected refusal, `Unsupported`, without a data error hiding).
fn verdict(outcome: Vec<std::result::Result<(), Failure>>) -> std::result::Result<(), Failure> {
    let failed: Vec<(usize, Failure)> = outcome
        .into_iter()
        .enumerate()
        .filter_map(|(r, o)| o.err().map(|e| (r, e)))
        .collect();
    if failed.is_empty() {
        return Ok(());
    }
    let text = failed
        .iter()
        .map(|(r, e)| format!("rank {r}: {e}"))
        .collect::<Vec<_>>()
        .join("; ");
    // The error is kept only when every failing rank returned the same variant, so that a
    // harness can match an expected refusal (`Unsupported`) without a data error hiding.
    let first = failed[0].1 .1.clone();
    let same = failed.iter().all(|(_, f)| match (&f.1, &first) {
        (Some(a), Some(b)) => std::mem::discriminant(&**a) == std::mem::discriminant(&**b),
        _ => false,
    });
    Err(Failure(text, if same { first } else { None }))
}
