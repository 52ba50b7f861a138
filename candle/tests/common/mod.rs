//! What the tests share: a mock world's ranks as threads.

use std::sync::Arc;

use unicomm::Vendor;
use unicomm_candle::Communicator;

/// `f` on every rank of a mock world of `n` threads.
pub fn ranks<T: Send>(
    n: usize,
    f: impl Fn(Arc<Communicator>) -> candle_core::Result<T> + Sync,
) -> Vec<T> {
    let comms = unicomm::local_comms_n(Vendor::Mock, Some(n)).unwrap();
    unicomm::each_rank(comms, |c| f(Communicator::new(c))).unwrap()
}
