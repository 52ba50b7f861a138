//! Per-call options ([`CallOptions`]): NCCL 2.32's per-collective configuration
//! (`ncclCollConfig_t`, the `nccl*Config` entry points) for every collective through one
//! scope, [`Comm::with_options`](crate::Comm::with_options), rather than a second method per
//! collective. The scope is this thread's and this communicator's; collectives called in it
//! carry the options to the backend ([`crate::Op::options`]), which passes them to the
//! library or refuses them (`Unsupported` naming the release, `InvalidArgument` for a
//! call NCCL has no per-call options for).

use std::cell::RefCell;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

use crate::config::{check_ctas, CtaPolicy};
use crate::{DeviceStream, Error, Marker, Result};

/// One of NCCL's algorithms, as `NCCL_ALGO` and `ncclCollConfig_t::algSelection` name them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Algorithm {
    /// `Ring`.
    Ring,
    /// `Tree`.
    Tree,
    /// `CollnetDirect` (in-network reduction, direct).
    CollnetDirect,
    /// `CollnetChain` (in-network reduction, chained).
    CollnetChain,
    /// `NVLS` (NVLink SHARP: multicast memory).
    Nvls,
    /// `NVLSTree` (NVLink SHARP within nodes, a tree across).
    NvlsTree,
    /// `PAT` (parallel aggregated trees: all-gather and reduce-scatter, one GPU per node).
    Pat,
}

impl Algorithm {
    /// NCCL's name of it.
    pub fn name(self) -> &'static str {
        match self {
            Algorithm::Ring => "Ring",
            Algorithm::Tree => "Tree",
            Algorithm::CollnetDirect => "CollnetDirect",
            Algorithm::CollnetChain => "CollnetChain",
            Algorithm::Nvls => "NVLS",
            Algorithm::NvlsTree => "NVLSTree",
            Algorithm::Pat => "PAT",
        }
    }
}

/// Which algorithms a call may use (`algSelection`, the syntax of `NCCL_ALGO`).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Algorithms {
    /// Only these (`"Ring,Tree"`).
    Only(Vec<Algorithm>),
    /// Any but these (`"^NVLS"`).
    Except(Vec<Algorithm>),
}

impl Algorithms {
    /// NCCL's selection string.
    pub fn selection(&self) -> String {
        let (prefix, list) = match self {
            Algorithms::Only(l) => ("", l),
            Algorithms::Except(l) => ("^", l),
        };
        let names: Vec<&str> = list.iter().map(|a| a.name()).collect();
        format!("{prefix}{}", names.join(","))
    }
}

/// Options of one collective call, each `None` for the communicator's or NCCL's own choice
/// (`ncclCollConfig_t`, NCCL >= 2.32). Every rank must give the same options to the same
/// call (NCCL checks them only locally).
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct CallOptions {
    /// `minCTAs`: at least this many CTAs (channels), 1..=32.
    pub min_ctas: Option<u32>,
    /// `maxCTAs`: at most this many, 1..=32 and at most the communicator's own cap.
    pub max_ctas: Option<u32>,
    /// `nvlsCTAs`: the cap of NVLink SHARP's channels, positive.
    pub nvls_ctas: Option<u32>,
    /// `cgaClusterSize` (Hopper and newer), 0..=8: the same for every call of a group.
    pub cga_cluster_size: Option<u32>,
    /// `algSelection`: which algorithms the call may use.
    pub algorithms: Option<Algorithms>,
    /// `forceAlgSelection` (NCCL's default: `true`): a selection the call cannot satisfy is
    /// an error; `false` lets NCCL fall back to its own choice.
    pub force_algorithms: Option<bool>,
    /// `CTAPolicy`: overrides the communicator's ([`crate::CommConfig::cta_policy`]).
    pub cta_policy: Option<CtaPolicy>,
    /// `userProfilerTag`: delivered verbatim to NCCL's profiler plugins with the call's
    /// events; values with the top bit set are NCCL's (refused).
    pub profiler_tag: Option<u64>,
    /// `launchCompletionEvent`: recorded by each call when its kernel has begun on every
    /// block, so that a compute stream that waits on it ([`DeviceStream::wait`]) starts
    /// only once the collective holds its SMs, not when it ends (how engines keep a
    /// communication kernel from being starved by the compute they overlap). Not inside a
    /// group (NCCL launches a group's kernels together at its end) nor a graph's capture
    /// (CUDA takes the event on a launch, not a graph node): refused there.
    pub launch_marker: Option<LaunchMarker>,
}

/// A marker a collective records when it has begun on the device (the
/// [`CallOptions::launch_marker`]): shared, so the options and the stream that waits on it
/// hold the same one. Equal only to its own clones.
#[derive(Clone)]
pub struct LaunchMarker(Arc<Marker>);

impl LaunchMarker {
    /// A new one, of `stream`'s backend and device ([`DeviceStream::launch_marker`]).
    pub fn new<S: DeviceStream>(stream: &S) -> Result<Self> {
        Ok(LaunchMarker(Arc::new(stream.launch_marker()?)))
    }

    /// The marker, for [`DeviceStream::wait`] or `reached`.
    pub fn marker(&self) -> &Marker {
        &self.0
    }

    /// What a backend answers for a launch marker inside a group or a graph's capture
    /// (every backend in the same words).
    #[cold]
    pub fn refused_here() -> Error {
        Error::invalid(
            "options",
            "a launch marker inside a group or a graph's capture: NCCL launches a group's kernels together at its end, and CUDA takes a launch completion event on a launch, not a graph's node (mark a call outside them)",
        )
    }
}

impl std::fmt::Debug for LaunchMarker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "LaunchMarker({:p})", Arc::as_ptr(&self.0))
    }
}

// A marker's state is the device's (an event): an unwind leaves nothing half-changed in it,
// so options holding one stay usable across `catch_unwind` as they were before it existed.
impl std::panic::UnwindSafe for LaunchMarker {}
impl std::panic::RefUnwindSafe for LaunchMarker {}

impl PartialEq for LaunchMarker {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}
impl Eq for LaunchMarker {}

impl std::hash::Hash for LaunchMarker {
    fn hash<H: std::hash::Hasher>(&self, h: &mut H) {
        Arc::as_ptr(&self.0).hash(h)
    }
}

impl CallOptions {
    /// Refuses what NCCL documents as out of range (`InvalidArgument` naming the field).
    pub fn check_values(&self) -> Result<()> {
        check_ctas(
            self.min_ctas,
            self.max_ctas,
            self.nvls_ctas,
            self.cga_cluster_size,
        )?;
        if let Some(Algorithms::Only(l) | Algorithms::Except(l)) = &self.algorithms {
            if l.is_empty() {
                return Err(Error::invalid(
                    "algorithms",
                    "an empty list (leave it None for NCCL's choice)",
                ));
            }
        }
        if self.profiler_tag.is_some_and(|t| t >> 63 != 0) {
            return Err(Error::invalid(
                "profiler_tag",
                "values with the most significant bit set are reserved by NCCL",
            ));
        }
        Ok(())
    }
}

thread_local! {
    /// This thread's scopes, innermost last: (communicator id, options).
    static SCOPES: RefCell<Vec<(u64, Arc<CallOptions>)>> = const { RefCell::new(Vec::new()) };
}

/// The options of this thread's innermost scope for communicator `comm` (read only while
/// the communicator counts an open scope: a call reads no thread-local otherwise).
pub(crate) fn current(comm: u64) -> Option<Arc<CallOptions>> {
    SCOPES.with(|s| {
        s.borrow()
            .iter()
            .rev()
            .find(|(c, _)| *c == comm)
            .map(|(_, o)| o.clone())
    })
}

/// A scope open on this thread until dropped (also by an unwind), counted by its
/// communicator's `open` while it lives.
pub(crate) struct Scope<'c>(&'c AtomicU32);

impl<'c> Scope<'c> {
    pub(crate) fn open(comm: u64, open: &'c AtomicU32, options: &CallOptions) -> Result<Self> {
        options.check_values()?;
        SCOPES.with(|s| s.borrow_mut().push((comm, Arc::new(options.clone()))));
        open.fetch_add(1, Ordering::Relaxed);
        Ok(Scope(open))
    }
}

impl Drop for Scope<'_> {
    fn drop(&mut self) {
        SCOPES.with(|s| s.borrow_mut().pop());
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_selection_string_is_ncclalgos_syntax() {
        let only = Algorithms::Only(vec![Algorithm::Ring, Algorithm::Tree]);
        assert_eq!(only.selection(), "Ring,Tree");
        let except = Algorithms::Except(vec![Algorithm::Nvls, Algorithm::NvlsTree]);
        assert_eq!(except.selection(), "^NVLS,NVLSTree");
    }

    /// NCCL reserves profiler tags with the top bit set; ncclCollConfig_t's CTA fields have
    /// ncclConfig_t's ranges.
    #[test]
    fn values_nccl_reserves_or_refuses_are_refused() {
        for bad in [
            CallOptions {
                profiler_tag: Some(1 << 63),
                ..CallOptions::default()
            },
            CallOptions {
                min_ctas: Some(4),
                max_ctas: Some(2),
                ..CallOptions::default()
            },
            CallOptions {
                max_ctas: Some(33),
                ..CallOptions::default()
            },
            CallOptions {
                cga_cluster_size: Some(9),
                ..CallOptions::default()
            },
            CallOptions {
                algorithms: Some(Algorithms::Only(vec![])),
                ..CallOptions::default()
            },
        ] {
            assert!(
                matches!(bad.check_values(), Err(Error::InvalidArgument { .. })),
                "{bad:?}"
            );
        }
        CallOptions {
            max_ctas: Some(32),
            profiler_tag: Some((1 << 63) - 1),
            ..CallOptions::default()
        }
        .check_values()
        .unwrap();
    }

    #[test]
    fn a_scope_is_this_threads_and_this_communicators_and_ends_with_an_unwind() {
        let o = CallOptions {
            max_ctas: Some(2),
            ..CallOptions::default()
        };
        assert!(current(7).is_none());
        let open = AtomicU32::new(0);
        let r = std::panic::catch_unwind(|| {
            let _s = Scope::open(7, &open, &o).unwrap();
            assert_eq!(open.load(Ordering::Relaxed), 1);
            assert_eq!(current(7).as_deref(), Some(&o));
            assert!(current(8).is_none());
            std::thread::scope(|t| {
                t.spawn(|| assert!(current(7).is_none()));
            });
            panic!("unwound");
        });
        assert!(r.is_err());
        assert!(current(7).is_none());
        assert_eq!(open.load(Ordering::Relaxed), 0);
    }
}
