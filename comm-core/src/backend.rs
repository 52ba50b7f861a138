//! The backend contract: what every backend (mock, NCCL, RCCL) implements.
//!
//! This layer is untyped (bytes, [`DataType`]) and trusts nothing: the typed, safe API in
//! [`crate::comm`] validates arguments first, but a backend still checks what would be
//! unsound for it to get wrong (bounds of host memory on the mock, unknown handles).

use crate::{DataType, ReduceOp, Result};

/// A library version, as `ncclGetVersion` reports it (`major*10000 + minor*100 + patch`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Version {
    /// Major version.
    pub major: u32,
    /// Minor version.
    pub minor: u32,
    /// Patch version.
    pub patch: u32,
}

impl Version {
    /// A version from its parts.
    pub const fn new(major: u32, minor: u32, patch: u32) -> Self {
        Version {
            major,
            minor,
            patch,
        }
    }

    /// Decodes `ncclGetVersion`'s integer (`NCCL_VERSION_CODE`): `major*10000+minor*100+patch`
    /// from 2.9 on, `major*1000+minor*100+patch` before.
    pub const fn from_nccl_code(code: i32) -> Self {
        let code = if code < 0 { 0 } else { code as u32 };
        if code >= 20900 {
            Version::new(code / 10000, (code % 10000) / 100, code % 100)
        } else {
            Version::new(code / 1000, (code % 1000) / 100, code % 100)
        }
    }
}

impl std::fmt::Display for Version {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}.{}.{}", self.major, self.minor, self.patch)
    }
}

/// What the loaded library and device can do. Returned by `Comm::capabilities`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Capabilities {
    /// The backend: "mock", "nccl" or "rccl".
    pub backend: &'static str,
    /// Where the collective library was loaded from ("built-in" for the mock).
    pub library_path: String,
    /// The collective library's version (the NCCL API version for RCCL).
    pub version: Version,
    /// Ordinary user-buffer registration (`ncclCommRegister`, NCCL >= 2.19).
    pub registration: bool,
    /// Symmetric windows (`ncclCommWindowRegister`, NCCL >= 2.27).
    pub windows: bool,
    /// A native all-to-all call (`ncclAlltoAll` / RCCL's `ncclAllToAll`); without it
    /// all-to-all is grouped send/recv.
    pub native_all_to_all: bool,
    /// Collectives may be captured into CUDA/HIP graphs. NCCL connects peers at the first
    /// collective and cannot do so during capture: run one collective on the communicator
    /// before capturing.
    pub graph_capture: bool,
    /// Allocation through the library (`ncclMemAlloc`, cuMem-backed).
    pub mem_alloc: bool,
}

/// A stream: an ordered queue of device work.
pub trait DeviceStream: Send + Sync {
    /// Blocks until all work enqueued so far has finished, and returns the first
    /// asynchronous error it raised.
    fn synchronize(&self) -> Result<()>;
}

/// One device allocation, owned; freed on drop.
pub trait DeviceMemory: Send + Sync {
    /// The stream type copies are enqueued on.
    type Stream: DeviceStream;

    /// Size in bytes.
    fn byte_len(&self) -> usize;

    /// The device address of the first byte (a host address on the mock).
    fn address(&self) -> usize;

    /// Enqueues a copy of `src` to `self[offset..offset + src.len()]`. `src` may be reused
    /// as soon as this returns (the bytes are staged, as CUDA does for pageable memory).
    fn write(&self, offset: usize, src: &[u8], stream: &Self::Stream) -> Result<()>;

    /// Copies `self[offset..offset + dst.len()]` into `dst` after all work enqueued on
    /// `stream` so far; returns once `dst` holds the bytes.
    fn read(&self, offset: usize, dst: &mut [u8], stream: &Self::Stream) -> Result<()>;
}

/// A byte range of one allocation, as a collective sees it.
#[derive(Debug)]
pub struct Slice<'a, M> {
    /// The allocation.
    pub mem: &'a M,
    /// Offset of the first byte.
    pub offset: usize,
    /// Length in bytes.
    pub bytes: usize,
}

impl<M> Clone for Slice<'_, M> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<M> Copy for Slice<'_, M> {}

impl<M: DeviceMemory> Slice<'_, M> {
    /// The device address of the first byte.
    pub fn address(&self) -> usize {
        self.mem.address() + self.offset
    }

    /// Whether the range lies inside its allocation.
    pub fn in_bounds(&self) -> bool {
        self.offset
            .checked_add(self.bytes)
            .is_some_and(|end| end <= self.mem.byte_len())
    }

    /// Checks that the range lies inside its allocation and holds `elems` elements of
    /// `dtype`; the error names `arg`. Every backend checks this before touching memory.
    pub fn holds(&self, elems: usize, dtype: DataType, arg: &'static str) -> Result<()> {
        let need = elems
            .checked_mul(dtype.size())
            .ok_or_else(|| crate::Error::invalid(arg, "count x element size overflows"))?;
        if !self.in_bounds() || self.bytes < need {
            return Err(crate::Error::invalid(
                arg,
                format!(
                    "{} bytes at offset {} of a {}-byte allocation cannot hold {elems} x {dtype}",
                    self.bytes,
                    self.offset,
                    self.mem.byte_len()
                ),
            ));
        }
        Ok(())
    }
}

/// One operation of the contract, with counts in elements as NCCL takes them.
///
/// In-place operations pass the same range as `send` and `recv` (all_gather and
/// reduce_scatter use NCCL's in-place layout: the rank's chunk of the larger buffer).
#[derive(Debug)]
pub enum Op<'a, M> {
    /// `ncclAllReduce`: `recv[i] = op(send_r[i] for every rank r)`, `count` elements.
    AllReduce {
        /// Input.
        send: Slice<'a, M>,
        /// Output.
        recv: Slice<'a, M>,
        /// Elements.
        count: usize,
        /// Element type.
        dtype: DataType,
        /// Reduction.
        op: ReduceOp,
    },
    /// `ncclBroadcast`: root's `send` to every rank's `recv`.
    Broadcast {
        /// Input (read on `root` only).
        send: Slice<'a, M>,
        /// Output.
        recv: Slice<'a, M>,
        /// Elements.
        count: usize,
        /// Element type.
        dtype: DataType,
        /// The sending rank.
        root: usize,
    },
    /// `ncclReduce`: the reduction of every rank's `send` into root's `recv`.
    Reduce {
        /// Input.
        send: Slice<'a, M>,
        /// Output (written on `root` only).
        recv: Slice<'a, M>,
        /// Elements.
        count: usize,
        /// Element type.
        dtype: DataType,
        /// Reduction.
        op: ReduceOp,
        /// The receiving rank.
        root: usize,
    },
    /// `ncclAllGather`: `recv[r*count..][..count] = send_r`.
    AllGather {
        /// Input, `count` elements.
        send: Slice<'a, M>,
        /// Output, `count * world_size` elements.
        recv: Slice<'a, M>,
        /// Elements per rank.
        count: usize,
        /// Element type.
        dtype: DataType,
    },
    /// `ncclReduceScatter`: `recv = op(send_r[rank*count..][..count] for every rank r)`.
    ReduceScatter {
        /// Input, `count * world_size` elements.
        send: Slice<'a, M>,
        /// Output, `count` elements.
        recv: Slice<'a, M>,
        /// Elements per rank (NCCL's `recvcount`).
        count: usize,
        /// Element type.
        dtype: DataType,
        /// Reduction.
        op: ReduceOp,
    },
    /// `ncclAlltoAll`: `recv[p*count..][..count] = send_p[rank*count..][..count]`.
    AllToAll {
        /// Input, `count * world_size` elements.
        send: Slice<'a, M>,
        /// Output, `count * world_size` elements.
        recv: Slice<'a, M>,
        /// Elements per peer.
        count: usize,
        /// Element type.
        dtype: DataType,
    },
    /// `ncclSend` to `peer`.
    Send {
        /// Input.
        buf: Slice<'a, M>,
        /// Elements.
        count: usize,
        /// Element type.
        dtype: DataType,
        /// Receiving rank.
        peer: usize,
    },
    /// `ncclRecv` from `peer`.
    Recv {
        /// Output.
        buf: Slice<'a, M>,
        /// Elements.
        count: usize,
        /// Element type.
        dtype: DataType,
        /// Sending rank.
        peer: usize,
    },
    /// Every rank waits for every other (stream-ordered; NCCL has no barrier, the GPU
    /// backends all-reduce one element).
    Barrier,
}

impl<'a, M> Op<'a, M> {
    /// The same operation over another memory type: `f` maps each slice's memory, or
    /// returns `None` when it belongs to another backend (an `InvalidArgument` error). Used by
    /// dispatching layers such as the `unicomm` facade.
    pub fn try_map_mem<N>(self, f: impl Fn(&'a M) -> Option<&'a N>) -> Result<Op<'a, N>> {
        let m = |s: Slice<'a, M>, arg: &'static str| -> Result<Slice<'a, N>> {
            Ok(Slice {
                mem: f(s.mem).ok_or_else(|| {
                    crate::Error::invalid(arg, "memory of another backend than the communicator's")
                })?,
                offset: s.offset,
                bytes: s.bytes,
            })
        };
        Ok(match self {
            Op::AllReduce {
                send,
                recv,
                count,
                dtype,
                op,
            } => Op::AllReduce {
                send: m(send, "send")?,
                recv: m(recv, "recv")?,
                count,
                dtype,
                op,
            },
            Op::Broadcast {
                send,
                recv,
                count,
                dtype,
                root,
            } => Op::Broadcast {
                send: m(send, "send")?,
                recv: m(recv, "recv")?,
                count,
                dtype,
                root,
            },
            Op::Reduce {
                send,
                recv,
                count,
                dtype,
                op,
                root,
            } => Op::Reduce {
                send: m(send, "send")?,
                recv: m(recv, "recv")?,
                count,
                dtype,
                op,
                root,
            },
            Op::AllGather {
                send,
                recv,
                count,
                dtype,
            } => Op::AllGather {
                send: m(send, "send")?,
                recv: m(recv, "recv")?,
                count,
                dtype,
            },
            Op::ReduceScatter {
                send,
                recv,
                count,
                dtype,
                op,
            } => Op::ReduceScatter {
                send: m(send, "send")?,
                recv: m(recv, "recv")?,
                count,
                dtype,
                op,
            },
            Op::AllToAll {
                send,
                recv,
                count,
                dtype,
            } => Op::AllToAll {
                send: m(send, "send")?,
                recv: m(recv, "recv")?,
                count,
                dtype,
            },
            Op::Send {
                buf,
                count,
                dtype,
                peer,
            } => Op::Send {
                buf: m(buf, "buf")?,
                count,
                dtype,
                peer,
            },
            Op::Recv {
                buf,
                count,
                dtype,
                peer,
            } => Op::Recv {
                buf: m(buf, "buf")?,
                count,
                dtype,
                peer,
            },
            Op::Barrier => Op::Barrier,
        })
    }

    /// Checks every range against what the operation reads or writes in it (counts per
    /// NCCL's definitions, `world` ranks), and that roots and peers are ranks. Every backend
    /// calls this before touching memory.
    pub fn check_bounds(&self, world: usize) -> Result<()>
    where
        M: DeviceMemory,
    {
        let total = |count: usize| {
            count
                .checked_mul(world)
                .ok_or_else(|| crate::Error::invalid("count", "count x world size overflows"))
        };
        let rank = |r: usize, arg: &'static str| {
            if r < world {
                Ok(())
            } else {
                Err(crate::Error::invalid(
                    arg,
                    format!("rank {r} is outside 0..{world}"),
                ))
            }
        };
        match self {
            Op::AllReduce {
                send,
                recv,
                count,
                dtype,
                ..
            } => {
                send.holds(*count, *dtype, "send")?;
                recv.holds(*count, *dtype, "recv")
            }
            Op::Broadcast {
                send,
                recv,
                count,
                dtype,
                root,
            }
            | Op::Reduce {
                send,
                recv,
                count,
                dtype,
                root,
                ..
            } => {
                rank(*root, "root")?;
                send.holds(*count, *dtype, "send")?;
                recv.holds(*count, *dtype, "recv")
            }
            Op::AllGather {
                send,
                recv,
                count,
                dtype,
            } => {
                send.holds(*count, *dtype, "send")?;
                recv.holds(total(*count)?, *dtype, "recv")
            }
            Op::ReduceScatter {
                send,
                recv,
                count,
                dtype,
                ..
            } => {
                send.holds(total(*count)?, *dtype, "send")?;
                recv.holds(*count, *dtype, "recv")
            }
            Op::AllToAll {
                send,
                recv,
                count,
                dtype,
            } => {
                send.holds(total(*count)?, *dtype, "send")?;
                recv.holds(total(*count)?, *dtype, "recv")
            }
            Op::Send {
                buf,
                count,
                dtype,
                peer,
            }
            | Op::Recv {
                buf,
                count,
                dtype,
                peer,
            } => {
                rank(*peer, "peer")?;
                buf.holds(*count, *dtype, "buf")
            }
            Op::Barrier => Ok(()),
        }
    }

    /// The operation's name, as NCCL spells it without the prefix.
    pub fn name(&self) -> &'static str {
        match self {
            Op::AllReduce { .. } => "AllReduce",
            Op::Broadcast { .. } => "Broadcast",
            Op::Reduce { .. } => "Reduce",
            Op::AllGather { .. } => "AllGather",
            Op::ReduceScatter { .. } => "ReduceScatter",
            Op::AllToAll { .. } => "AlltoAll",
            Op::Send { .. } => "Send",
            Op::Recv { .. } => "Recv",
            Op::Barrier => "Barrier",
        }
    }
}

/// An opaque registration handle a backend hands out (`ncclCommRegister`'s `void*`, a
/// window pointer, or the mock's id).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct RawHandle(pub usize);

/// The communicator of one rank, as a backend implements it.
///
/// Users reach it through [`crate::Comm`], which adds types and ownership. Ordering: every
/// `enqueue` and every memory copy runs after the work enqueued before it on the same stream.
/// Errors of the work itself surface at the next `synchronize` of that stream (or at a
/// blocking read), as on real hardware.
pub trait Collective: Send + Sync + Sized + 'static {
    /// The backend's stream.
    type Stream: DeviceStream;
    /// The backend's device allocation.
    type Memory: DeviceMemory<Stream = Self::Stream>;

    /// This rank, `0..world_size`.
    fn rank(&self) -> usize;
    /// Number of ranks.
    fn world_size(&self) -> usize;
    /// What the loaded library can do.
    fn capabilities(&self) -> Capabilities;

    /// A new stream on this rank's device.
    fn create_stream(&self) -> Result<Self::Stream>;
    /// Allocates `bytes` on this rank's device (through `ncclMemAlloc` where available).
    fn alloc(&self, bytes: usize) -> Result<Self::Memory>;
    /// Whether `mem` may be used by this communicator (same device).
    fn check_memory(&self, mem: &Self::Memory) -> Result<()>;

    /// `ncclCommRegister` over `bytes` bytes at `mem[offset..]`.
    fn register(&self, mem: &Self::Memory, offset: usize, bytes: usize) -> Result<RawHandle>;
    /// `ncclCommDeregister`. An unknown handle (twice, or another communicator's) is an
    /// `InvalidArgument` error.
    fn deregister(&self, handle: RawHandle) -> Result<()>;
    /// `ncclCommWindowRegister` (collective: every rank calls it, in the same order).
    fn register_window(&self, mem: &Self::Memory, offset: usize, bytes: usize)
        -> Result<RawHandle>;
    /// `ncclCommWindowDeregister`.
    fn deregister_window(&self, handle: RawHandle) -> Result<()>;

    /// Enqueues one operation on `stream`.
    fn enqueue(&self, op: Op<'_, Self::Memory>, stream: &Self::Stream) -> Result<()>;
    /// `ncclGroupStart`: operations until the matching `group_end` are launched together.
    /// Groups are per thread and span communicators of the same backend.
    fn group_start(&self) -> Result<()>;
    /// `ncclGroupEnd`.
    fn group_end(&self) -> Result<()>;

    /// `ncclCommFinalize` + `ncclCommDestroy`: flushes pending work, then frees the
    /// communicator. After it, the communicator must not be used; dropping it is a no-op.
    fn finalize(&mut self) -> Result<()>;
    /// `ncclCommAbort`: frees the communicator without waiting for pending work.
    fn abort(&mut self) -> Result<()>;
}
