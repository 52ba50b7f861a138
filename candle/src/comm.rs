//! [`Communicator`]: one rank's unicomm communicator as candle's ops use it.

use std::sync::Arc;
use std::time::Duration;

use candle_core::Result;
use parking_lot::{Mutex, MutexGuard};

/// How long a call waits for another thread's call on the same rank when the
/// communicator has no deadline of its own (unicomm's default deadline).
const DEFAULT_WAIT: Duration = Duration::from_secs(60);

/// One rank's communicator for candle: `Send + Sync` (from unicomm's own types, no
/// `unsafe impl`), shared by the ops as an `Arc`. Its calls are serialised: a collective is
/// one enqueue on NCCL but several steps on the CPU path (copy in, collective, copy out),
/// and two threads of one rank must not interleave them. The order of collectives across
/// ranks stays the caller's to keep, as with every communicator.
pub struct Communicator {
    comm: unicomm::Comm,
    streams: Mutex<Streams>,
}

/// The streams the ops enqueue on: one made for the CPU path, and on CUDA candle's own.
#[derive(Default)]
pub(crate) struct Streams {
    host: Option<unicomm::Stream>,
    #[cfg(feature = "cuda")]
    pub(crate) cuda: Option<(usize, unicomm::Stream)>,
}

impl Streams {
    /// The CPU path's stream, made on first use.
    pub(crate) fn host(&mut self, comm: &unicomm::Comm) -> Result<&unicomm::Stream> {
        let s = match self.host.take() {
            Some(s) => s,
            None => comm.create_stream().map_err(|e| wrap("create_stream", e))?,
        };
        Ok(self.host.insert(s))
    }
}

impl std::fmt::Debug for Communicator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "Communicator(rank {} of {})",
            self.comm.rank(),
            self.comm.world_size()
        )
    }
}

impl Communicator {
    /// The rank's communicator, for candle's ops.
    pub fn new(comm: unicomm::Comm) -> Arc<Self> {
        Arc::new(Communicator {
            comm,
            streams: Mutex::new(Streams::default()),
        })
    }

    /// The unicomm communicator (for what the ops do not cover: split, abort, ...).
    pub fn comm(&self) -> &unicomm::Comm {
        &self.comm
    }

    /// This rank's place in the communicator.
    pub fn rank(&self) -> usize {
        self.comm.rank()
    }

    /// The number of ranks.
    pub fn world_size(&self) -> usize {
        self.comm.world_size()
    }

    /// The streams, once no other thread of this rank is inside a call (at most the
    /// communicator's deadline: then `Timeout`).
    pub(crate) fn locked(&self, what: &'static str) -> Result<MutexGuard<'_, Streams>> {
        self.lock_within(&self.streams, what, "another thread's call on this rank")
    }

    /// `m`, once no other thread holds it: uncontended (one thread per rank, the common
    /// case) one atomic and no deadline read; else at most the communicator's deadline, then
    /// `Timeout` naming `what` and `holder`.
    pub(crate) fn lock_within<'m, T>(
        &self,
        m: &'m Mutex<T>,
        what: &'static str,
        holder: &str,
    ) -> Result<MutexGuard<'m, T>> {
        match m.try_lock() {
            Some(g) => Ok(g),
            None => self.lock_slowly(m, what, holder),
        }
    }

    #[cold]
    #[inline(never)]
    fn lock_slowly<'m, T>(
        &self,
        m: &'m Mutex<T>,
        what: &'static str,
        holder: &str,
    ) -> Result<MutexGuard<'m, T>> {
        let wait = self.comm.timeout().unwrap_or(DEFAULT_WAIT);
        m.try_lock_for(wait).ok_or_else(|| {
            wrap(
                what,
                unicomm::Error::Timeout {
                    what: format!("{what}: {holder}"),
                    after: wait,
                },
            )
        })
    }
}

/// unicomm's error inside candle's, kept whole: [`unicomm_error`] finds it again.
pub(crate) fn wrap(what: &str, e: unicomm::Error) -> candle_core::Error {
    let context = format!("unicomm-candle {what}: {e}");
    candle_core::Error::WrappedContext {
        wrapped: Box::new(e),
        context,
    }
    .bt()
}

/// The unicomm error inside a candle error, if it came from unicomm (through any context
/// or backtrace candle added): what a caller matches on (`Aborted`, `Timeout`, ...).
pub fn unicomm_error(e: &candle_core::Error) -> Option<&unicomm::Error> {
    use candle_core::Error as E;
    match e {
        E::WrappedContext { wrapped, .. } => wrapped.downcast_ref::<unicomm::Error>(),
        E::Context { inner, .. } | E::WithPath { inner, .. } | E::WithBacktrace { inner, .. } => {
            unicomm_error(inner)
        }
        _ => None,
    }
}
