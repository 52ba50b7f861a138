//! The run-time choice of backend: enums over the compiled-in backends, each implementing
//! the backend trait by matching (the `burn-dispatch` pattern). Written by hand:
//! enum_dispatch cannot see a trait of another crate nor handle associated types
//! (docs/decisions.md).

use comm_core::{
    Capabilities, Collective, DeviceMemory, DeviceStream, Error, Op, RawHandle, Result,
};

/// A communicator of any compiled-in backend.
#[derive(Debug)]
#[non_exhaustive]
pub enum AnyComm {
    /// The CPU mock.
    #[cfg(feature = "mock")]
    Mock(backend_mock::MockComm),
    /// NCCL on CUDA.
    #[cfg(feature = "nccl")]
    Nccl(backend_nccl::NcclComm),
    /// RCCL on HIP.
    #[cfg(feature = "rccl")]
    Rccl(backend_rccl::RcclComm),
}

/// A stream of any compiled-in backend.
#[derive(Debug)]
#[non_exhaustive]
pub enum AnyStream {
    /// The CPU mock.
    #[cfg(feature = "mock")]
    Mock(backend_mock::MockStream),
    /// A CUDA stream.
    #[cfg(feature = "nccl")]
    Nccl(backend_nccl::NcclStream),
    /// A HIP stream.
    #[cfg(feature = "rccl")]
    Rccl(backend_rccl::RcclStream),
}

/// Device memory of any compiled-in backend.
#[derive(Debug)]
#[non_exhaustive]
pub enum AnyMemory {
    /// Host memory of the mock.
    #[cfg(feature = "mock")]
    Mock(backend_mock::MockMemory),
    /// CUDA device memory.
    #[cfg(feature = "nccl")]
    Nccl(backend_nccl::NcclMemory),
    /// HIP device memory.
    #[cfg(feature = "rccl")]
    Rccl(backend_rccl::RcclMemory),
}

/// Runs `$body` with `$x` bound to the inner value, whatever the backend.
macro_rules! each {
    ($e:expr, $ty:ident, $x:ident => $body:expr) => {
        match $e {
            #[cfg(feature = "mock")]
            $ty::Mock($x) => $body,
            #[cfg(feature = "nccl")]
            $ty::Nccl($x) => $body,
            #[cfg(feature = "rccl")]
            $ty::Rccl($x) => $body,
        }
    };
}

/// Runs `$body` with the inner values of a communicator and a stream (or memory) of the same
/// backend; a pair of different backends is an `InvalidArgument` error.
macro_rules! pair {
    ($a:expr, $ta:ident, $b:expr, $tb:ident, $arg:expr, ($x:ident, $y:ident) => $body:expr) => {
        match ($a, $b) {
            #[cfg(feature = "mock")]
            ($ta::Mock($x), $tb::Mock($y)) => $body,
            #[cfg(feature = "nccl")]
            ($ta::Nccl($x), $tb::Nccl($y)) => $body,
            #[cfg(feature = "rccl")]
            ($ta::Rccl($x), $tb::Rccl($y)) => $body,
            #[allow(unreachable_patterns)]
            _ => Err(Error::invalid($arg, "belongs to another backend")),
        }
    };
}

impl DeviceStream for AnyStream {
    fn synchronize(&self) -> Result<()> {
        each!(self, AnyStream, s => s.synchronize())
    }
}

impl AnyStream {
    /// Blocks until the work enqueued so far has finished; returns its first error.
    pub fn synchronize(&self) -> Result<()> {
        DeviceStream::synchronize(self)
    }
}

impl DeviceMemory for AnyMemory {
    type Stream = AnyStream;
    fn byte_len(&self) -> usize {
        each!(self, AnyMemory, m => m.byte_len())
    }
    fn address(&self) -> usize {
        each!(self, AnyMemory, m => m.address())
    }
    fn write(&self, offset: usize, src: &[u8], stream: &AnyStream) -> Result<()> {
        pair!(self, AnyMemory, stream, AnyStream, "stream", (m, s) => m.write(offset, src, s))
    }
    fn read(&self, offset: usize, dst: &mut [u8], stream: &AnyStream) -> Result<()> {
        pair!(self, AnyMemory, stream, AnyStream, "stream", (m, s) => m.read(offset, dst, s))
    }
}

impl Collective for AnyComm {
    type Stream = AnyStream;
    type Memory = AnyMemory;

    fn rank(&self) -> usize {
        each!(self, AnyComm, c => c.rank())
    }
    fn world_size(&self) -> usize {
        each!(self, AnyComm, c => c.world_size())
    }
    fn capabilities(&self) -> Capabilities {
        each!(self, AnyComm, c => c.capabilities())
    }
    fn create_stream(&self) -> Result<AnyStream> {
        each!(self, AnyComm, c => c.create_stream().map(AnyStream::from))
    }
    fn alloc(&self, bytes: usize) -> Result<AnyMemory> {
        each!(self, AnyComm, c => c.alloc(bytes).map(AnyMemory::from))
    }
    fn check_memory(&self, mem: &AnyMemory) -> Result<()> {
        pair!(self, AnyComm, mem, AnyMemory, "buffer", (c, m) => c.check_memory(m))
    }
    fn register(&self, mem: &AnyMemory, offset: usize, bytes: usize) -> Result<RawHandle> {
        pair!(self, AnyComm, mem, AnyMemory, "buffer", (c, m) => c.register(m, offset, bytes))
    }
    fn deregister(&self, handle: RawHandle) -> Result<()> {
        each!(self, AnyComm, c => c.deregister(handle))
    }
    fn register_window(&self, mem: &AnyMemory, offset: usize, bytes: usize) -> Result<RawHandle> {
        pair!(self, AnyComm, mem, AnyMemory, "buffer", (c, m) => c.register_window(m, offset, bytes))
    }
    fn deregister_window(&self, handle: RawHandle) -> Result<()> {
        each!(self, AnyComm, c => c.deregister_window(handle))
    }
    fn enqueue(&self, op: Op<'_, AnyMemory>, stream: &AnyStream) -> Result<()> {
        // Each arm maps the op's memory to its own backend's (memory of another backend is
        // an InvalidArgument error naming the argument).
        macro_rules! mem_of {
            ($v:ident) => {
                |m: &AnyMemory| match m {
                    AnyMemory::$v(m) => Some(m),
                    #[allow(unreachable_patterns)]
                    _ => None,
                }
            };
        }
        match (self, stream) {
            #[cfg(feature = "mock")]
            (AnyComm::Mock(c), AnyStream::Mock(s)) => c.enqueue(op.try_map_mem(mem_of!(Mock))?, s),
            #[cfg(feature = "nccl")]
            (AnyComm::Nccl(c), AnyStream::Nccl(s)) => c.enqueue(op.try_map_mem(mem_of!(Nccl))?, s),
            #[cfg(feature = "rccl")]
            (AnyComm::Rccl(c), AnyStream::Rccl(s)) => c.enqueue(op.try_map_mem(mem_of!(Rccl))?, s),
            #[allow(unreachable_patterns)]
            _ => Err(Error::invalid("stream", "belongs to another backend")),
        }
    }
    fn group_start(&self) -> Result<()> {
        each!(self, AnyComm, c => c.group_start())
    }
    fn group_end(&self) -> Result<()> {
        each!(self, AnyComm, c => c.group_end())
    }
    fn finalize(&mut self) -> Result<()> {
        each!(self, AnyComm, c => c.finalize())
    }
    fn abort(&mut self) -> Result<()> {
        each!(self, AnyComm, c => c.abort())
    }
}

macro_rules! from_variant {
    ($any:ident, $variant:ident, $feature:literal, $inner:ty) => {
        #[cfg(feature = $feature)]
        impl From<$inner> for $any {
            fn from(x: $inner) -> Self {
                $any::$variant(x)
            }
        }
    };
}
from_variant!(AnyComm, Mock, "mock", backend_mock::MockComm);
from_variant!(AnyStream, Mock, "mock", backend_mock::MockStream);
from_variant!(AnyMemory, Mock, "mock", backend_mock::MockMemory);
from_variant!(AnyComm, Nccl, "nccl", backend_nccl::NcclComm);
from_variant!(AnyStream, Nccl, "nccl", backend_nccl::NcclStream);
from_variant!(AnyMemory, Nccl, "nccl", backend_nccl::NcclMemory);
from_variant!(AnyComm, Rccl, "rccl", backend_rccl::RcclComm);
from_variant!(AnyStream, Rccl, "rccl", backend_rccl::RcclStream);
from_variant!(AnyMemory, Rccl, "rccl", backend_rccl::RcclMemory);
