//! The mock's process fabric on the wire: the unique id that carries the hub's port and
//! secret, the frames and their fields, the request codes.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::Arc;
use std::time::Duration;

use unicomm_core::registry::RegKind;
use unicomm_core::{DataType, Error, ReduceOp, Result, Scalar};

use crate::fabric::{Desc, Load, Msg, Signature};
use crate::shm::Remote;

/// The first bytes of a mock unique id (NCCL's are random: no collision in practice).
pub(crate) const ID_MAGIC: &[u8; 8] = b"UCMOCK01";
/// The largest frame either side accepts.
pub(crate) const MAX_FRAME: usize = 16 << 20;
/// How long a reply may take beyond the deadline the hub enforces itself.
pub(crate) const SLACK: Duration = Duration::from_secs(10);

/// What rank 0 hands the others through the rendezvous: the hub's port and secret.
pub(crate) struct HubId {
    pub port: u16,
    pub secret: [u8; 32],
}

impl HubId {
    pub(crate) fn to_bytes(&self) -> [u8; 128] {
        let mut b = [0u8; 128];
        b[..8].copy_from_slice(ID_MAGIC);
        b[8..10].copy_from_slice(&self.port.to_le_bytes());
        b[10..42].copy_from_slice(&self.secret);
        b
    }
    pub(crate) fn parse(b: &[u8; 128]) -> Result<Self> {
        if &b[..8] != ID_MAGIC {
            return Err(Error::Bootstrap {
                reason: "the unique id is not a mock hub's (rank 0 runs another backend?)".into(),
            });
        }
        let mut secret = [0u8; 32];
        secret.copy_from_slice(&b[10..42]);
        Ok(HubId {
            port: u16::from_le_bytes([b[8], b[9]]),
            secret,
        })
    }
}

// ---------------------------------------------------------------------------------------
// Wire format: a frame is a u32 length and a payload written by `W`, read by `R`.

#[derive(Default)]
pub(crate) struct W(pub(crate) Vec<u8>);

impl W {
    pub(crate) fn u8(&mut self, v: u8) -> &mut Self {
        self.0.push(v);
        self
    }
    pub(crate) fn u64(&mut self, v: u64) -> &mut Self {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    pub(crate) fn str(&mut self, s: &str) -> &mut Self {
        self.u64(s.len() as u64);
        self.0.extend_from_slice(s.as_bytes());
        self
    }
    pub(crate) fn opt<T>(&mut self, v: Option<T>, f: impl FnOnce(&mut Self, T)) -> &mut Self {
        match v {
            None => self.u8(0),
            Some(x) => {
                self.u8(1);
                f(self, x);
                self
            }
        }
    }
    pub(crate) fn remote(&mut self, r: Remote) {
        self.u64(r.pid as u64)
            .u64(r.fd as u64)
            .u64(r.id)
            .u64(r.offset as u64);
    }
    pub(crate) fn desc(&mut self, d: &Desc) {
        let s = &d.sig;
        self.str(s.kind).u64(s.count as u64);
        self.opt(s.dtype, |w, t| {
            w.u8(t as u8);
        });
        self.opt(s.op, |w, o| match o {
            ReduceOp::PreMulSum(x) => {
                w.u8(PRE_MUL_SUM).u8(x.dtype() as u8);
                w.0.extend_from_slice(x.bytes());
            }
            o => {
                // Its place in `ReduceOp::ALL` (the wire's own numbering).
                let k = ReduceOp::ALL.iter().position(|x| *x == o).unwrap_or(0);
                w.u8(k as u8);
            }
        });
        self.opt(s.root, |w, r| {
            w.u64(r as u64);
        });
        self.opt(s.send_reg, |w, k| {
            w.u8(reg_code(k));
        });
        self.opt(s.recv_reg, |w, k| {
            w.u8(reg_code(k));
        });
        self.u64(d.send as u64).u64(d.recv as u64);
        self.opt(d.send_at, W::remote);
        self.opt(d.recv_at, W::remote);
    }
    pub(crate) fn msg(&mut self, m: &Msg) {
        self.u64(m.id)
            .u64(m.addr as u64)
            .u64(m.count as u64)
            .u8(m.dtype as u8);
        self.opt(m.at, W::remote);
        self.opt(m.load.as_ref(), |w, l| {
            w.opt(l.window, |w, (ord, off)| {
                w.u64(ord).u64(off as u64);
            });
            w.u64(l.bytes.len() as u64);
            w.0.extend_from_slice(&l.bytes);
            w.u8(u8::from(l.signal) | u8::from(l.graph) << 1);
        });
    }
    pub(crate) fn error(&mut self, e: &Error) {
        match e {
            Error::Timeout { what, after } => {
                self.u8(0).str(what).u64(after.as_millis() as u64);
            }
            Error::Mismatch { what, detail } => {
                self.u8(2).str(what).str(detail);
            }
            Error::Aborted { reason, lost } => {
                self.u8(1).str(reason).u64(lost.len() as u64);
                for &r in lost {
                    self.u64(r as u64);
                }
            }
            other => {
                self.u8(1).str(&other.to_string()).u64(0);
            }
        }
    }
    pub(crate) fn result(&mut self, r: &Result<()>) {
        match r {
            Ok(()) => {
                self.u8(0);
            }
            Err(e) => {
                self.u8(1);
                self.error(e);
            }
        }
    }
}

pub(crate) fn reg_code(k: RegKind) -> u8 {
    match k {
        RegKind::Buffer => 0,
        RegKind::Window => 1,
        RegKind::Auto => 2,
    }
}

/// The collective names a signature can carry (`Kind::name` and the window operations).
pub(crate) const KINDS: &[&str] = &[
    "AllReduce",
    "Broadcast",
    "Reduce",
    "AllGather",
    "ReduceScatter",
    "AlltoAll",
    "Send",
    "Recv",
    "Barrier",
    "Gather",
    "Scatter",
    "WindowRegister",
    "WindowDeregister",
    "CommSplit",
    "CommSplitHub",
    "SymmetricAlloc",
];

/// The wire code of a pre-multiplied sum (after the built-in reductions' `ncclRedOp_t`s).
const PRE_MUL_SUM: u8 = 5;

/// The fields a `Mismatch` can name (`exec::agree` and send/recv).
pub(crate) const MISMATCH: &[&str] = &[
    "send/recv",
    "operation",
    "count",
    "data type",
    "reduction",
    "root",
    "registration of the send buffer",
    "registration of the receive buffer",
    // A symmetric call's signature (unicomm_core::symmetric::Signature).
    "algorithm",
    "dtype",
    "op",
    "norm",
    "hidden",
    "eps",
    "round",
    "the number of symmetric calls",
    "bytes",
];

pub(crate) struct R<'a>(pub(crate) &'a [u8]);

pub(crate) fn bad(what: &str) -> Error {
    Error::aborted(format!(
        "the mock's exchange received a malformed message ({what})"
    ))
}

impl R<'_> {
    pub(crate) fn take(&mut self, n: usize) -> Result<&[u8]> {
        if self.0.len() < n {
            return Err(bad("truncated"));
        }
        let (a, b) = self.0.split_at(n);
        self.0 = b;
        Ok(a)
    }
    pub(crate) fn u8(&mut self) -> Result<u8> {
        Ok(self.take(1)?[0])
    }
    pub(crate) fn u64(&mut self) -> Result<u64> {
        let b = self.take(8)?;
        let mut a = [0u8; 8];
        a.copy_from_slice(b);
        Ok(u64::from_le_bytes(a))
    }
    pub(crate) fn usize(&mut self) -> Result<usize> {
        usize::try_from(self.u64()?).map_err(|_| bad("size"))
    }
    pub(crate) fn str(&mut self) -> Result<String> {
        let n = self.usize()?;
        String::from_utf8(self.take(n)?.to_vec()).map_err(|_| bad("text"))
    }
    pub(crate) fn opt<T>(&mut self, f: impl FnOnce(&mut Self) -> Result<T>) -> Result<Option<T>> {
        match self.u8()? {
            0 => Ok(None),
            1 => f(self).map(Some),
            _ => Err(bad("option")),
        }
    }
    pub(crate) fn dtype(&mut self) -> Result<DataType> {
        let c = self.u8()?;
        DataType::ALL
            .into_iter()
            .find(|t| *t as u8 == c)
            .ok_or_else(|| bad("data type"))
    }
    pub(crate) fn reg(&mut self) -> Result<RegKind> {
        match self.u8()? {
            0 => Ok(RegKind::Buffer),
            1 => Ok(RegKind::Window),
            2 => Ok(RegKind::Auto),
            _ => Err(bad("registration")),
        }
    }
    pub(crate) fn remote(&mut self) -> Result<Remote> {
        Ok(Remote {
            pid: u32::try_from(self.u64()?).map_err(|_| bad("pid"))?,
            fd: i32::try_from(self.u64()? as i64).map_err(|_| bad("fd"))?,
            id: self.u64()?,
            offset: self.usize()?,
        })
    }
    pub(crate) fn desc(&mut self) -> Result<Desc> {
        let kind = self.str()?;
        let kind = KINDS
            .iter()
            .copied()
            .find(|k| *k == kind)
            .ok_or_else(|| bad("operation"))?;
        let sig = Signature {
            kind,
            count: self.usize()?,
            dtype: self.opt(R::dtype)?,
            op: self.opt(|r| {
                let c = r.u8()?;
                if c == PRE_MUL_SUM {
                    let t = r.dtype()?;
                    let b = r.take(t.size())?;
                    return Scalar::from_bytes(t, b)
                        .map(ReduceOp::PreMulSum)
                        .ok_or_else(|| bad("scalar"));
                }
                ReduceOp::ALL
                    .get(usize::from(c))
                    .copied()
                    .ok_or_else(|| bad("reduction"))
            })?,
            root: self.opt(R::usize)?,
            send_reg: self.opt(R::reg)?,
            recv_reg: self.opt(R::reg)?,
        };
        Ok(Desc {
            sig,
            send: self.usize()?,
            recv: self.usize()?,
            send_at: self.opt(R::remote)?,
            recv_at: self.opt(R::remote)?,
        })
    }
    pub(crate) fn msg(&mut self) -> Result<Msg> {
        Ok(Msg {
            id: self.u64()?,
            addr: self.usize()?,
            count: self.usize()?,
            dtype: self.dtype()?,
            at: self.opt(R::remote)?,
            load: self.opt(|r| {
                let window = r.opt(|r| Ok((r.u64()?, r.usize()?)))?;
                let n = r.usize()?;
                let bytes: Arc<[u8]> = r.take(n)?.into();
                let flags = r.u8()?;
                Ok(Load {
                    window,
                    bytes,
                    signal: flags & 1 != 0,
                    graph: flags & 2 != 0,
                })
            })?,
        })
    }
    pub(crate) fn error(&mut self) -> Result<Error> {
        Ok(match self.u8()? {
            0 => Error::Timeout {
                what: self.str()?,
                after: Duration::from_millis(self.u64()?),
            },
            2 => {
                let what = self.str()?;
                Error::Mismatch {
                    what: MISMATCH
                        .iter()
                        .copied()
                        .find(|m| *m == what)
                        .unwrap_or("operation"),
                    detail: self.str()?,
                }
            }
            _ => {
                let reason = self.str()?;
                let n = self.usize()?;
                // Each rank is 8 bytes of the message: a count past what is left is malformed.
                if n > self.0.len() / 8 {
                    return Err(bad("lost ranks"));
                }
                let lost = (0..n).map(|_| self.usize()).collect::<Result<_>>()?;
                Error::lost(lost, reason)
            }
        })
    }
    pub(crate) fn result(&mut self) -> Result<Result<()>> {
        Ok(match self.u8()? {
            0 => Ok(()),
            _ => Err(self.error()?),
        })
    }
}

pub(crate) fn send_frame(s: &mut TcpStream, payload: &[u8]) -> std::io::Result<()> {
    let mut b = Vec::with_capacity(4 + payload.len());
    b.extend_from_slice(&(payload.len() as u32).to_le_bytes());
    b.extend_from_slice(payload);
    s.write_all(&b)
}

pub(crate) fn recv_frame(s: &mut TcpStream) -> std::io::Result<Vec<u8>> {
    let mut n = [0u8; 4];
    s.read_exact(&mut n)?;
    let n = u32::from_le_bytes(n) as usize;
    if n > MAX_FRAME {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            "frame too large",
        ));
    }
    let mut b = vec![0u8; n];
    s.read_exact(&mut b)?;
    Ok(b)
}

/// Requests a rank sends the hub (the [`Exchange`] methods).
pub(crate) mod op {
    pub const GATHER: u8 = 1;
    pub const PHASE: u8 = 2;
    pub const ENTER: u8 = 3;
    pub const EXIT: u8 = 4;
    pub const LEAVE: u8 = 5;
    pub const POST: u8 = 6;
    pub const TAKE: u8 = 7;
    pub const COMPLETE: u8 = 8;
    pub const WAIT_SENT: u8 = 9;
    pub const POISON: u8 = 10;
    pub const BYE: u8 = 11;
    pub const DEPART: u8 = 12;
}

/// The two kinds of connection: one for a rank's life, others for its requests.
pub(crate) const LIFE: u8 = 1;
pub(crate) const CALLS: u8 = 2;

/// Why the hub refused a hello that proved the job's secret (a stranger's is dropped
/// unanswered): the answer's first byte is 1, then the reason and the hub's world size.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Refusal {
    /// The rank was told another world size than rank 0.
    World,
    /// The rank is outside rank 0's world.
    Rank,
    /// The rank was claimed by another process already.
    Twice,
}

impl Refusal {
    pub(crate) fn answer(self, world: usize) -> Vec<u8> {
        let mut w = W::default();
        w.u8(1).u8(self as u8).u64(world as u64);
        w.0
    }

    /// The error a refused rank returns, naming both sides.
    pub(crate) fn error(answer: &[u8], rank: usize, world: usize) -> Error {
        let mut r = R(answer);
        let (reason, theirs) = match (r.u8(), r.u8(), r.usize()) {
            (Ok(1), Ok(reason), Ok(theirs)) => (reason, theirs),
            _ => return bad("hub hello"),
        };
        let why = match reason {
            0 => format!("this rank was told a world of {world} ranks and rank 0 one of {theirs}: every rank must be given the same world size"),
            1 => format!("rank {rank} is outside rank 0's world of {theirs} ranks (rank < world)"),
            2 => format!("rank {rank} of {theirs} was claimed by another process already: each rank joins once"),
            _ => return bad("hub hello"),
        };
        Error::invalid("rank", why)
    }
}

pub(crate) fn secret_ok(a: &[u8], b: &[u8; 32]) -> bool {
    a.len() == 32 && a.iter().zip(b).fold(0u8, |d, (x, y)| d | (x ^ y)) == 0
}

/// A frame of at most `max` bytes, all of it before `deadline` (each read's timeout is what
/// is left): what a connection not yet authenticated may send, so a stranger can make the
/// hub hold neither more memory nor a thread for longer than that.
pub(crate) fn recv_frame_within(
    s: &mut TcpStream,
    max: usize,
    deadline: std::time::Instant,
) -> std::io::Result<Vec<u8>> {
    let mut read = |buf: &mut [u8]| -> std::io::Result<()> {
        let mut got = 0;
        while got < buf.len() {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            if left.is_zero() {
                return Err(std::io::ErrorKind::TimedOut.into());
            }
            s.set_read_timeout(Some(left))?;
            match s.read(&mut buf[got..]) {
                Ok(0) => return Err(std::io::ErrorKind::UnexpectedEof.into()),
                Ok(k) => got += k,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    };
    let mut n = [0u8; 4];
    read(&mut n)?;
    let n = u32::from_le_bytes(n) as usize;
    if n > max {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            "frame too large",
        ));
    }
    let mut b = vec![0u8; n];
    read(&mut b)?;
    Ok(b)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A lost rank crosses processes as data: the survivors' error names it as the hub's
    /// did, so they can exclude it when they shrink.
    #[test]
    fn an_abort_keeps_its_lost_ranks_across_processes() {
        let sent = Error::lost(vec![3, 0], "two ranks' processes exited");
        let mut w = W::default();
        w.error(&sent);
        let got = R(&w.0).error().unwrap();
        assert_eq!(got.lost_ranks(), &[3, 0]);
        assert_eq!(got.to_string(), sent.to_string());
        // A count the message cannot hold is malformed, not an allocation of its size.
        let mut w = W::default();
        w.u8(1).str("x").u64(u64::MAX / 16);
        assert!(R(&w.0)
            .error()
            .unwrap_err()
            .to_string()
            .contains("malformed"));
    }
}
