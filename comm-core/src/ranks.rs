//! One thread per rank: NCCL's one-thread-per-GPU mode, as the user-buffer examples run it.

/// Runs `f` once per communicator, each on a thread of its own, and returns the results in
/// rank order once every thread has ended: every rank's value, or the error of the lowest
/// rank that failed (a program that ignores one rank's error would exit 0 with a wrong
/// result). A rank that panics re-raises its panic on the caller's thread.
///
/// ```
/// // Communicators in practice (`unicomm::local_comms`); any values here.
/// let doubled = unicomm_core::each_rank([0, 1, 2], |r| Ok::<_, String>(r * 2));
/// assert_eq!(doubled, Ok(vec![0, 2, 4]));
/// let failed = unicomm_core::each_rank([0, 1, 2], |r| {
///     if r == 0 { Ok(r) } else { Err(format!("rank {r} failed")) }
/// });
/// assert_eq!(failed, Err("rank 1 failed".to_string()));
/// ```
pub fn each_rank<C, T, E>(
    comms: impl IntoIterator<Item = C>,
    f: impl Fn(C) -> Result<T, E> + Sync,
) -> Result<Vec<T>, E>
where
    C: Send,
    T: Send,
    E: Send,
{
    let f = &f;
    let results: Vec<Result<T, E>> = std::thread::scope(|s| {
        let handles: Vec<_> = comms.into_iter().map(|c| s.spawn(move || f(c))).collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap_or_else(|p| std::panic::resume_unwind(p)))
            .collect()
    });
    results.into_iter().collect()
}

/// One rank's place: its number, its world's size and its device, the three a rank is
/// created with, named (never a positional tuple whose order a reader must know).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Place {
    /// This rank, `0..world`.
    pub rank: usize,
    /// The number of ranks.
    pub world: usize,
    /// The device it runs on (CUDA's or HIP's ordinal; the mock ignores it).
    pub device: usize,
}

impl Place {
    /// Rank `rank` of `world` on `device`.
    pub const fn new(rank: usize, world: usize, device: usize) -> Self {
        Place {
            rank,
            world,
            device,
        }
    }
}
