//! The run-time choice of backend, generated from one table ([`backends!`] at the bottom):
//! the enums over the compiled-in backends, their `From` impls, the backend trait
//! implemented by matching (the `burn-dispatch` pattern), and for each vendor its entry
//! points or a "not compiled in" error. Adding a backend is one line of the table plus its
//! [`Backend`] impl. Written by hand, not with enum_dispatch: it cannot see a trait of
//! another crate nor handle associated types (docs/dev/decisions.md).

use std::time::Duration;

use unicomm_bootstrap::LaunchEnv;
use unicomm_core::{
    Capabilities, Collective, CommConfig, DeviceStream, Error, Place, RawHandle, Result, Work,
};

use crate::Vendor;

/// What the facade needs from each backend crate.
pub(crate) trait Backend {
    /// One line naming the devices and library, or why they are unusable.
    fn probe() -> Result<String>;
    /// `n` ranks in this process (`None`: every device, or the mock's default).
    fn local(n: Option<usize>, config: &CommConfig) -> Result<Vec<AnyComm>>;
    /// One rank of a world launched one rank per process.
    fn from_env(env: &LaunchEnv, timeout: Duration, config: &CommConfig) -> Result<AnyComm>;
    /// A new world's id (the library's 128 bytes).
    fn unique_id() -> Result<[u8; 128]>;
    /// Rank `rank` of `world` on device `dev`, joining the world of `id`.
    fn init_rank(id: &[u8; 128], at: Place, config: &CommConfig) -> Result<AnyComm>;
    /// New rank `rank` of a world grown to `world` with `id` (its rank 0's grow id).
    fn init_grown(id: &[u8; 128], at: Place, config: &CommConfig) -> Result<AnyComm>;
}

macro_rules! backends {
    ($( $variant:ident, $feature:literal, $vendor:ident, $krate:ident,
        $comm:ident, $stream:ident, $memory:ident, $doc:literal; )*) => {
        /// A communicator of any compiled-in backend.
        #[derive(Debug)]
        #[non_exhaustive]
        #[allow(
            clippy::large_enum_variant,
            reason = "one per rank: a box would cost an indirection on every call, not memory"
        )]
        pub enum AnyComm {
            $( #[doc = $doc] #[cfg(feature = $feature)] $variant($krate::$comm), )*
        }

        /// A stream of any compiled-in backend.
        #[derive(Debug)]
        #[non_exhaustive]
        pub enum AnyStream {
            $( #[doc = $doc] #[cfg(feature = $feature)] $variant($krate::$stream), )*
        }

        /// A captured graph of any compiled-in backend ([`unicomm_core::graph::Graph`]).
        #[derive(Debug)]
        #[non_exhaustive]
        pub enum AnyGraph {
            $( #[doc = $doc] #[cfg(feature = $feature)] $variant(<$krate::$stream as DeviceStream>::Graph), )*
        }

        /// Device memory of any compiled-in backend.
        #[derive(Debug)]
        #[non_exhaustive]
        pub enum AnyMemory {
            $( #[doc = $doc] #[cfg(feature = $feature)] $variant($krate::$memory), )*
        }

        $(
            #[cfg(feature = $feature)]
            impl From<$krate::$comm> for AnyComm {
                fn from(x: $krate::$comm) -> Self { AnyComm::$variant(x) }
            }
            #[cfg(feature = $feature)]
            impl From<$krate::$stream> for AnyStream {
                fn from(x: $krate::$stream) -> Self { AnyStream::$variant(x) }
            }
            #[cfg(feature = $feature)]
            impl From<$krate::$memory> for AnyMemory {
                fn from(x: $krate::$memory) -> Self { AnyMemory::$variant(x) }
            }
        )*

        /// Runs `$body` with `$x` bound to the inner value, whatever the backend.
        macro_rules! each {
            ($e:expr, $ty:ident, $x:ident => $body:expr) => {
                match $e {
                    $( #[cfg(feature = $feature)] $ty::$variant($x) => $body, )*
                }
            };
        }

        /// Runs `$body` with the inner values of two enums of the same backend; a pair of
        /// different backends is an `InvalidArgument` error naming `$arg`.
        macro_rules! pair {
            ($a:expr, $ta:ident, $b:expr, $tb:ident, $arg:expr, ($x:ident, $y:ident) => $body:expr) => {
                match ($a, $b) {
                    $( #[cfg(feature = $feature)] ($ta::$variant($x), $tb::$variant($y)) => $body, )*
                    #[cfg_attr(one_backend, expect(unreachable_patterns, reason = "one backend compiled in: every pair matches an arm above"))]
                    _ => Err(Error::invalid($arg, "belongs to another backend")),
                }
            };
        }

        /// `$call` on the backend of `$on` and `$queue` with `$operation`'s memory mapped to that
        /// backend's (`map_mem`): memory or a stream of another backend is `InvalidArgument`.
        macro_rules! mapped {
            ($on:expr, $queue:expr, $operation:expr, $call:ident) => {
                match ($on, $queue) {
                    $(
                        #[cfg(feature = $feature)]
                        (AnyComm::$variant(c), AnyStream::$variant(s)) => $operation.map_mem(
                            |m| match m {
                                AnyMemory::$variant(m) => Some(m),
#[cfg_attr(one_backend, expect(unreachable_patterns, reason = "one backend compiled in: every pair matches an arm above"))]
                                _ => None,
                            },
                            |w| c.$call(w, s),
                        ),
                    )*
                    #[cfg_attr(one_backend, expect(unreachable_patterns, reason = "one backend compiled in: every pair matches an arm above"))]
                    _ => Err(Error::invalid("stream", "belongs to another backend")),
                }
            };
        }

        macro_rules! triple {
            ($a:expr, $ta:ident, $b:expr, $tb:ident, $c:expr, $tc:ident, ($x:ident, $y:ident, $z:ident) => $body:expr) => {
                match ($a, $b, $c) {
                    $( #[cfg(feature = $feature)] ($ta::$variant($x), $tb::$variant($y), $tc::$variant($z)) => $body, )*
                    #[cfg_attr(one_backend, expect(unreachable_patterns, reason = "one backend compiled in: every triple matches an arm above"))]
                    _ => Err(Error::invalid("src", "memory and stream of different backends")),
                }
            };
        }

        impl AnyStream {
            fn end_capture_any(&self) -> Result<AnyGraph> {
                match self {
                    $( #[cfg(feature = $feature)] AnyStream::$variant(s) => s.end_capture().map(AnyGraph::$variant), )*
                }
            }
        }

        impl AnyComm {
            /// The vendor whose communicator this is.
            pub(crate) fn vendor(&self) -> Vendor {
                match self {
                    $( #[cfg(feature = $feature)] AnyComm::$variant(_) => Vendor::$vendor, )*
                }
            }

            #[inline]
            fn enqueue_any(&self, work: Work<'_, AnyMemory>, stream: &AnyStream) -> Result<()> {
                mapped!(self, stream, work, enqueue)
            }

            fn alloc_symmetric_any(
                &self,
                bytes: usize,
                lamport: Option<unicomm_core::DataType>,
            ) -> Result<unicomm_core::symmetric::SymmetricParts<AnyMemory>> {
                match self {
                    $(
                        #[cfg(feature = $feature)]
                        AnyComm::$variant(c) => c.alloc_symmetric(bytes, lamport).map(|p| {
                            unicomm_core::symmetric::SymmetricParts {
                                mem: AnyMemory::$variant(p.mem),
                                handle: p.handle,
                                peers: p.peers,
                                pads: p.pads,
                                bytes: p.bytes,
                            }
                        }),
                    )*
                }
            }
        }

        /// Runs `$body` with `$b` the [`Backend`] of `$vendor`, or gives `Unsupported`
        /// naming the feature when it is not compiled in. `Auto` must be resolved first.
        macro_rules! on_vendor {
            ($v:expr, $b:ident => $body:expr) => {
                match $v {
                    $(
                        #[cfg(feature = $feature)]
                        Vendor::$vendor => {
                            type $b = $krate::Facade;
                            $body
                        }
                        #[cfg(not(feature = $feature))]
                        Vendor::$vendor => Err(not_compiled($feature)),
                    )*
                    Vendor::Auto => Err(unresolved()),
                }
            };
        }
    };
}

#[cfg_attr(
    all(feature = "mock", feature = "nccl", feature = "rccl"),
    expect(
        dead_code,
        reason = "the stubs are unused when every backend is compiled in"
    )
)]
fn not_compiled(feature: &str) -> Error {
    Error::unsupported(
        format!("the `{feature}` backend"),
        format!("unicomm built with feature `{feature}`"),
        "a build without it",
    )
}

fn unresolved() -> Error {
    Error::invalid("vendor", "auto must be resolved to a vendor first")
}

// Each backend's adapter is named `Facade` inside a module named like its crate, so the
// table can name it from the crate column.
#[cfg(feature = "mock")]
mod unicomm_mock {
    pub(crate) use ::unicomm_mock::{MockComm, MockMemory, MockStream};
    pub(crate) struct Facade;
}
#[cfg(feature = "nccl")]
mod unicomm_nccl {
    pub(crate) use ::unicomm_nccl::{NcclComm, NcclMemory, NcclStream};
    pub(crate) struct Facade;
}
#[cfg(feature = "rccl")]
mod unicomm_rccl {
    pub(crate) use ::unicomm_rccl::{RcclComm, RcclMemory, RcclStream};
    pub(crate) struct Facade;
}

// The one table: variant, cargo feature, `Vendor`, crate, its communicator, stream and
// memory types, and the doc line.
backends! {
    Mock, "mock", Mock, unicomm_mock, MockComm, MockStream, MockMemory, "The CPU mock.";
    Nccl, "nccl", Cuda, unicomm_nccl, NcclComm, NcclStream, NcclMemory, "NCCL on CUDA.";
    Rccl, "rccl", Rocm, unicomm_rccl, RcclComm, RcclStream, RcclMemory, "RCCL on HIP.";
}

/// One line naming `vendor`'s devices and library, or why they are unusable.
pub(crate) fn probe_vendor(vendor: Vendor) -> Result<String> {
    on_vendor!(vendor, B => B::probe())
}

/// `n` ranks of `vendor` in this process.
pub(crate) fn local_vendor(
    vendor: Vendor,
    n: Option<usize>,
    config: &CommConfig,
) -> Result<Vec<AnyComm>> {
    on_vendor!(vendor, B => B::local(n, config))
}

/// A new world id of `vendor`.
pub(crate) fn unique_id_vendor(vendor: Vendor) -> Result<[u8; 128]> {
    on_vendor!(vendor, B => B::unique_id())
}

/// Rank `at.0` of `at.1` on device `at.2`, joining `vendor`'s world of `id`.
pub(crate) fn init_rank_vendor(
    vendor: Vendor,
    id: &[u8; 128],
    at: Place,
    config: &CommConfig,
) -> Result<AnyComm> {
    on_vendor!(vendor, B => B::init_rank(id, at, config))
}

/// New rank `at.0` of a world of `vendor` grown to `at.1` ranks with `id`.
pub(crate) fn init_grown_vendor(
    vendor: Vendor,
    id: &[u8; 128],
    at: Place,
    config: &CommConfig,
) -> Result<AnyComm> {
    on_vendor!(vendor, B => B::init_grown(id, at, config))
}

/// One rank of `vendor` in a world launched one rank per process.
pub(crate) fn from_env_vendor(
    vendor: Vendor,
    env: &LaunchEnv,
    timeout: Duration,
    config: &CommConfig,
) -> Result<AnyComm> {
    on_vendor!(vendor, B => B::from_env(env, timeout, config))
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
    fn create_stream_with(&self, priority: unicomm_core::StreamPriority) -> Result<AnyStream> {
        each!(self, AnyComm, c => c.create_stream_with(priority).map(AnyStream::from))
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
    #[inline]
    fn enqueue(&self, work: Work<'_, AnyMemory>, stream: &AnyStream) -> Result<()> {
        self.enqueue_any(work, stream)
    }
    fn group_start(&self) -> Result<()> {
        each!(self, AnyComm, c => c.group_start())
    }
    fn group_end(&self) -> Result<()> {
        each!(self, AnyComm, c => c.group_end())
    }
    fn set_copy_engine(&self, on: bool) -> Result<()> {
        each!(self, AnyComm, c => c.set_copy_engine(on))
    }
    // Every provided method a backend may override is forwarded, or the facade would run
    // the trait's default instead of the backend's own.
    fn register_auto(&self, mem: &AnyMemory, offset: usize, bytes: usize) -> Result<RawHandle> {
        pair!(self, AnyComm, mem, AnyMemory, "buffer", (c, m) => c.register_auto(m, offset, bytes))
    }
    fn deregister_auto(&self, handle: RawHandle) -> Result<()> {
        each!(self, AnyComm, c => c.deregister_auto(handle))
    }
    fn device_memory(&self) -> Result<(usize, usize)> {
        each!(self, AnyComm, c => c.device_memory())
    }
    fn device_info(&self) -> Result<unicomm_core::DeviceInfo> {
        each!(self, AnyComm, c => c.device_info())
    }
    fn poll_async_error(&self) -> Result<()> {
        each!(self, AnyComm, c => c.poll_async_error())
    }
    fn set_timeout(&self, timeout: std::time::Duration) -> Result<()> {
        each!(self, AnyComm, c => c.set_timeout(timeout))
    }
    fn timeout(&self) -> Option<std::time::Duration> {
        each!(self, AnyComm, c => c.timeout())
    }
    fn split(&self, color: Option<u32>, key: i32, config: &CommConfig) -> Result<Option<Self>> {
        each!(self, AnyComm, c => Ok(c.split(color, key, config)?.map(AnyComm::from)))
    }
    fn shrink(
        &self,
        exclude: &[usize],
        mode: unicomm_core::ShrinkMode,
        config: &CommConfig,
    ) -> Result<Self> {
        each!(self, AnyComm, c => Ok(AnyComm::from(c.shrink(exclude, mode, config)?)))
    }
    fn revoke(&self) -> Result<()> {
        each!(self, AnyComm, c => c.revoke())
    }
    fn alloc_symmetric(
        &self,
        bytes: usize,
        lamport: Option<unicomm_core::DataType>,
    ) -> Result<unicomm_core::symmetric::SymmetricParts<AnyMemory>> {
        self.alloc_symmetric_any(bytes, lamport)
    }
    fn window_peer_address(&self, handle: RawHandle, peer: usize) -> Result<Option<usize>> {
        each!(self, AnyComm, c => c.window_peer_address(handle, peer))
    }
    fn create_device_comm(
        &self,
        reqs: &unicomm_core::DeviceCommRequirements,
    ) -> Result<unicomm_core::device_api::DeviceCommParts> {
        each!(self, AnyComm, c => c.create_device_comm(reqs))
    }
    fn destroy_device_comm(&self, handle: RawHandle) -> Result<()> {
        each!(self, AnyComm, c => c.destroy_device_comm(handle))
    }
    fn free_symmetric(&self, handle: RawHandle) -> Result<()> {
        each!(self, AnyComm, c => c.free_symmetric(handle))
    }
    fn open_expert_engine(
        &self,
        group: &unicomm_core::symmetric::ExpertGroupParts,
    ) -> Result<RawHandle> {
        each!(self, AnyComm, c => c.open_expert_engine(group))
    }
    fn close_expert_engine(&self, handle: RawHandle) -> Result<()> {
        each!(self, AnyComm, c => c.close_expert_engine(handle))
    }
    fn properties(&self) -> Result<unicomm_core::Properties> {
        each!(self, AnyComm, c => c.properties())
    }
    fn suspend(&self) -> Result<()> {
        each!(self, AnyComm, c => c.suspend())
    }
    fn resume(&self) -> Result<()> {
        each!(self, AnyComm, c => c.resume())
    }
    fn mem_stats(&self) -> Result<unicomm_core::MemStats> {
        each!(self, AnyComm, c => c.mem_stats())
    }
    fn grow_id(&self) -> Result<[u8; 128]> {
        each!(self, AnyComm, c => c.grow_id())
    }
    fn grow(&self, world: usize, id: Option<&[u8; 128]>, config: &CommConfig) -> Result<Self> {
        each!(self, AnyComm, c => Ok(AnyComm::from(c.grow(world, id, config)?)))
    }
    fn flight(&self) -> Option<&std::sync::Arc<unicomm_core::flight::FlightRecorder>> {
        each!(self, AnyComm, c => c.flight())
    }
    fn graph_launched(&self, stream: &AnyStream) {
        // A stream of another backend cannot carry this communicator's graph: the launch
        // itself refuses it.
        let _ = pair!(self, AnyComm, stream, AnyStream, "stream", (c, s) => {
            c.graph_launched(s);
            Ok(())
        });
    }
    fn graphs_held(&self) {
        each!(self, AnyComm, c => c.graphs_held())
    }
    fn graphs_released(&self) {
        each!(self, AnyComm, c => c.graphs_released())
    }
    fn finalize(&mut self) -> Result<()> {
        each!(self, AnyComm, c => c.finalize())
    }
    fn abort(&self) -> Result<()> {
        each!(self, AnyComm, c => c.abort())
    }
}

// The streams' and graphs' side of the dispatch, after the macros it uses.
mod memory;
mod streams;
// Each backend crate's entry points behind the `Backend` trait.
mod vendors;
