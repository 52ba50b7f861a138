//! The one error type of unicomm.

use std::time::Duration;

/// What went wrong. Every backend returns this type; nothing a caller or the environment
/// can cause panics.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The collective library (NCCL, RCCL) returned an error. `code` is the
    /// `ncclResult_t`, `message` what `ncclGetErrorString` says, and `last_error` what
    /// `ncclGetLastError` said right after the failing call (often the useful part).
    #[error(
        "{library} call {call} failed with {name} ({code}): {message}{}",
        detail(last_error)
    )]
    Library {
        /// "NCCL" or "RCCL".
        library: &'static str,
        /// The C function that failed.
        call: &'static str,
        /// The `ncclResult_t` value.
        code: i32,
        /// The enumerator's name (`ncclInvalidArgument`, ...).
        name: &'static str,
        /// `ncclGetErrorString(code)`.
        message: String,
        /// `ncclGetLastError(comm)`, empty when the library said nothing more.
        last_error: String,
    },
    /// The device runtime (CUDA driver, HIP runtime) returned an error.
    #[error("{runtime} call {call} failed with {name} ({code}): {message}")]
    Device {
        /// "CUDA" or "HIP".
        runtime: &'static str,
        /// The C function that failed.
        call: &'static str,
        /// The runtime's error code.
        code: i32,
        /// The error's name as the runtime spells it.
        name: String,
        /// The runtime's description of the error.
        message: String,
    },
    /// A vendor library could not be loaded from any of the places searched.
    #[error("{library} not found; tried: {}", tried.join(", "))]
    LibraryNotFound {
        /// Which library ("NCCL", "RCCL", "CUDA driver", "HIP runtime").
        library: &'static str,
        /// Every path or soname tried, in order, each with the loader's reason.
        tried: Vec<String>,
    },
    /// A loaded library lacks a symbol that unicomm requires.
    #[error("{library} at {path} has no symbol {symbol}")]
    MissingSymbol {
        /// Which library.
        library: &'static str,
        /// Where it was loaded from.
        path: String,
        /// The missing symbol.
        symbol: &'static str,
    },
    /// The loaded library or device cannot do what was asked.
    #[error("{what} is unsupported: needs {needs}, found {found}")]
    Unsupported {
        /// The feature asked for.
        what: String,
        /// The first version (or capability) that provides it.
        needs: String,
        /// What was found instead.
        found: String,
    },
    /// An argument was wrong; `argument` names it.
    #[error("invalid argument `{argument}`: {reason}")]
    InvalidArgument {
        /// The argument's name.
        argument: &'static str,
        /// Why it was rejected.
        reason: String,
    },
    /// No device of the vendor is visible.
    #[error("no {vendor} device: {detail}")]
    NoDevice {
        /// The vendor ("CUDA", "ROCm").
        vendor: &'static str,
        /// What was seen (the runtime's answer).
        detail: String,
    },
    /// A blocking wait passed its deadline.
    #[error("timed out after {after:?} waiting for {what}")]
    Timeout {
        /// What was awaited.
        what: String,
        /// The deadline that passed.
        after: Duration,
    },
    /// The communicator was aborted (by a call to `abort` or by a failed peer).
    #[error("communicator aborted: {reason}")]
    Aborted {
        /// Why.
        reason: String,
        /// The ranks known to be lost (their process exited, their connection failed), in
        /// the numbering of the communicator the processes joined: what a survivor passes to
        /// `shrink`. Empty when none is known (an abort asked for, a library's error: NCCL
        /// does not say which peer failed). [`Error::lost_ranks`] reads it.
        lost: Vec<usize>,
    },
    /// Building the communicator across processes failed (rendezvous, environment).
    #[error("bootstrap failed: {reason}")]
    Bootstrap {
        /// Why.
        reason: String,
    },
    /// Ranks disagreed about a collective (op, count, type, root, registration).
    #[error("ranks disagree on {what}: {detail}")]
    Mismatch {
        /// The field that differs.
        what: &'static str,
        /// Per-rank values.
        detail: String,
    },
}

fn detail(last: &str) -> String {
    if last.is_empty() {
        String::new()
    } else {
        format!(" (last error: {last})")
    }
}

impl Error {
    // These are `#[cold]`: an error is the rare way out of a collective's checks, so the
    // compiler lays the code that builds one out of the hot path (fewer instruction-cache
    // lines per call, which on a GPU host are cold after every library call).

    /// Shorthand for [`Error::InvalidArgument`].
    #[cold]
    pub fn invalid(argument: &'static str, reason: impl Into<String>) -> Self {
        Error::InvalidArgument {
            argument,
            reason: reason.into(),
        }
    }

    /// Shorthand for [`Error::Unsupported`].
    #[cold]
    pub fn unsupported(
        what: impl Into<String>,
        needs: impl Into<String>,
        found: impl Into<String>,
    ) -> Self {
        Error::Unsupported {
            what: what.into(),
            needs: needs.into(),
            found: found.into(),
        }
    }

    /// Shorthand for [`Error::Aborted`] with no rank known to be lost.
    #[cold]
    pub fn aborted(reason: impl Into<String>) -> Self {
        Error::Aborted {
            reason: reason.into(),
            lost: Vec::new(),
        }
    }

    /// [`Error::Aborted`] because the ranks `lost` are gone.
    #[cold]
    pub fn lost(lost: Vec<usize>, reason: impl Into<String>) -> Self {
        Error::Aborted {
            reason: reason.into(),
            lost,
        }
    }

    /// The ranks an [`Error::Aborted`] knows to be lost (empty for any other error, or when
    /// none is known): what survivors exclude when they `shrink`.
    pub fn lost_ranks(&self) -> &[usize] {
        match self {
            Error::Aborted { lost, .. } => lost,
            _ => &[],
        }
    }
}

/// `Result` with unicomm's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;
