//! What the ranks exchange and the exchange's interface: [`Desc`], [`Msg`], [`Exchange`], and
//! a blocking call's wait as a value ([`Wait`], [`Done`]).

use std::sync::Arc;
use std::time::{Duration, Instant};

use unicomm_core::registry::RegKind;
use unicomm_core::{DataType, Error, ReduceOp, Result};

/// What the ranks must agree on for one collective. Equality is agreement: a pre-multiplied
/// sum's scalar is each rank's own and not compared (the same rule as `exec::agree`, which
/// decides whether peers' memory is touched).
#[derive(Debug, Clone)]
pub(crate) struct Signature {
    pub kind: &'static str,
    pub count: usize,
    pub dtype: Option<DataType>,
    pub op: Option<ReduceOp>,
    pub root: Option<usize>,
    pub send_reg: Option<RegKind>,
    pub recv_reg: Option<RegKind>,
}

impl PartialEq for Signature {
    fn eq(&self, o: &Self) -> bool {
        self.kind == o.kind
            && self.count == o.count
            && self.dtype == o.dtype
            && self.op.map(ReduceOp::shape) == o.op.map(ReduceOp::shape)
            && self.root == o.root
            && self.send_reg == o.send_reg
            && self.recv_reg == o.recv_reg
    }
}
impl Eq for Signature {}

/// One rank's part of one collective.
#[derive(Debug, Clone)]
pub(crate) struct Desc {
    pub sig: Signature,
    /// Address of the first send byte (meaningful only for the ops that send).
    pub send: usize,
    /// Address of the first receive byte.
    pub recv: usize,
    /// Where a peer process finds the send and receive bytes (ranks in different
    /// processes; `None` in one process, where the addresses are shared).
    pub send_at: Option<crate::shm::Remote>,
    pub recv_at: Option<crate::shm::Remote>,
}

/// A posted send, waiting for its receiver; or a one-sided message (`load`), which no
/// receive matches and whose sender does not wait.
#[derive(Debug, Clone)]
pub(crate) struct Msg {
    pub id: u64,
    pub addr: usize,
    pub count: usize,
    pub dtype: DataType,
    /// Where a receiver in another process finds the bytes.
    pub at: Option<crate::shm::Remote>,
    /// A one-sided message's load (its own mailbox: sends and receives never meet it).
    pub load: Option<Load>,
}

/// What a one-sided message carries (the mock's `ncclPutSignal`, `ncclSignal`): a part of a
/// put's bytes for the receiver's part of a window, or nothing (a bare signal). The bytes
/// travel with the message, so the sender never waits for the receiver (one-sided), and
/// they land when the receiver's wait takes them.
#[derive(Debug, Clone)]
pub(crate) struct Load {
    /// The window's ordinal on its communicator (every rank registers windows in one
    /// order) and the byte offset in it; `None` for a bare signal.
    pub window: Option<(u64, usize)>,
    /// The bytes (a put is cut into parts of at most [`LOAD_PART`] bytes).
    pub bytes: Arc<[u8]>,
    /// Whether the message counts one signal (a put's last part, or a bare signal).
    pub signal: bool,
    /// Whether a graph's replay sent it: NCCL counts a graph's signals only in graphs'
    /// waits, and an eager call's only in eager waits.
    pub graph: bool,
}

/// The largest part of a put one message carries (well inside the hub's frame).
pub(crate) const LOAD_PART: usize = 4 << 20;

/// The exchange a mock rank needs from its peers.
pub(crate) trait Exchange: Send + Sync {
    /// Deposits `desc` for collective `seq` and returns every rank's, once all arrived.
    fn gather(&self, seq: u64, rank: usize, desc: Desc, deadline: Instant) -> Result<Vec<Desc>>;
    /// Barrier number `phase` of collective `seq`.
    fn phase(&self, seq: u64, rank: usize, phase: u32, deadline: Instant) -> Result<()>;
    /// Marks the start of an access to peers' memory in collective `seq`; fails when the
    /// fabric is poisoned (then no access may start).
    fn enter(&self, seq: u64) -> Result<()>;
    /// Marks the end of an access started by `enter`.
    fn exit(&self, seq: u64);
    /// This rank is done with collective `seq`. After an error, waits until no peer is still
    /// reading or writing memory under `seq`, until `deadline` (a copy does not block, but a
    /// peer's process can be stopped inside one); past it the fabric is poisoned.
    fn leave(&self, seq: u64, failed: bool, deadline: Instant);
    /// Posts a send from `src` to `dst`.
    fn post(&self, src: usize, dst: usize, msg: Msg) -> Result<()>;
    /// Takes the next send from `src` to `dst`.
    fn take(&self, src: usize, dst: usize, deadline: Instant, after: Duration) -> Result<Msg>;
    /// Takes the next one-sided message from `src` to `dst` (never completed: its sender
    /// does not wait).
    fn take_one_sided(&self, src: usize, dst: usize, deadline: Instant) -> Result<Msg>;
    /// Marks a taken send as copied (`None`) or refused (`Some(error)`, given to the sender).
    fn complete(&self, id: u64, refused: Option<Error>);
    /// Waits until send `id` was copied by its receiver.
    fn wait_sent(&self, id: u64, dst: usize, deadline: Instant, after: Duration) -> Result<()>;
    /// Fails every present and future wait with `e`.
    fn poison(&self, e: Error);
    /// The poison, if any.
    fn poisoned(&self) -> Option<Error>;
    /// `rank` finalized (or dropped) its communicator after joining `joined` collectives: a
    /// peer waiting on a collective it will never join fails at once naming it, a peer not
    /// waiting on one is not disturbed; where peers already wait on such a collective, the
    /// error is this rank's too. Across processes rank 0 (whose process serves the exchange)
    /// then waits, at most `timeout`, until the others did.
    fn depart(&self, rank: usize, joined: u64, timeout: Duration) -> Result<()>;
}

/// A started call waiting for its peers.
pub(crate) enum Wait {
    /// Every rank's [`Desc`] of collective `seq`.
    Gather {
        seq: u64,
        rank: usize,
        kind: &'static str,
    },
    /// Every rank past barrier `phase` of collective `seq`.
    Phase { seq: u64, rank: usize, phase: u32 },
    /// The next send from `src` to `dst` (or, `one_sided`, the next one-sided message).
    Take {
        src: usize,
        dst: usize,
        one_sided: bool,
    },
    /// Send `id` copied (or refused) by its receiver `dst`.
    Sent { id: u64, dst: usize },
    /// Send `id` failed with `e` and was withdrawn: until its receiver no longer copies it
    /// (a copy cannot block, so no deadline), then `e`.
    Unsend { id: u64, e: Error },
    /// A failed collective `seq` left once no peer accesses its memory (until the deadline).
    Leave { seq: u64 },
}

impl Wait {
    /// Whether the wait ends at its deadline (a withdrawal has none: a copy cannot block).
    pub(crate) fn has_deadline(&self) -> bool {
        !matches!(self, Wait::Unsend { .. })
    }
}

/// What an ended wait gives.
pub(crate) enum Done {
    /// Every rank's, shared by the ranks that waited for them.
    Descs(Arc<[Desc]>),
    Msg(Msg),
    Unit,
}
