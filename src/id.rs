//! One unique id for every vendor ([`UniqueId`]) and [`init_rank`]: the bootstrap an engine
//! already has (a file, a socket, its own store) carries the id's bytes; `from_env` is one
//! way among others to share it.

use unicomm_core::{CommConfig, Error, Place, Result};

use crate::{dispatch, resolve, Comm, Vendor};

/// A world's identity, made once (on the rank that will be rank 0) and given to every rank:
/// the vendor, then the library's 128 bytes (NCCL's and RCCL's `ncclUniqueId`; the mock's
/// hub address on 127.0.0.1 and a fresh secret its ranks prove). Plain bytes: send them
/// however the program already sends things. Like NCCL's, the id is a capability to join:
/// send it only to the job's ranks.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct UniqueId {
    vendor: Vendor,
    bytes: [u8; 128],
}

impl std::fmt::Debug for UniqueId {
    /// The vendor only: the bytes let anyone who holds them join.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "UniqueId({}, ..)", self.vendor)
    }
}

/// The vendor's code in the first byte of [`UniqueId::to_bytes`].
const CODES: [(u8, Vendor); 3] = [(1, Vendor::Cuda), (2, Vendor::Rocm), (3, Vendor::Mock)];

impl UniqueId {
    /// How many bytes [`UniqueId::to_bytes`] gives.
    pub const LEN: usize = 129;

    /// A new id for `vendor` (`Auto` resolved as [`resolve`] does): `ncclGetUniqueId` on
    /// NCCL and RCCL. On the mock this process starts listening for the world's ranks and
    /// must be the one where rank 0 joins (as NCCL's id maker serves its bootstrap).
    pub fn new(vendor: Vendor) -> Result<Self> {
        let (vendor, _) = resolve(vendor)?;
        let bytes = dispatch::unique_id_vendor(vendor)?;
        Ok(UniqueId { vendor, bytes })
    }

    /// The vendor whose world this is.
    pub fn vendor(&self) -> Vendor {
        self.vendor
    }

    /// The id as [`UniqueId::LEN`] bytes.
    pub fn to_bytes(&self) -> [u8; Self::LEN] {
        let mut b = [0u8; Self::LEN];
        b[0] = CODES
            .iter()
            .find(|(_, v)| *v == self.vendor)
            .map_or(0, |(c, _)| *c);
        b[1..].copy_from_slice(&self.bytes);
        b
    }

    /// Rank 0's new id for `vendor`, handed to every rank of `env` through its rendezvous
    /// ([`unicomm_bootstrap::exchange_unique_id`]: rank 0's port, or a file every rank
    /// sees, e.g. an engine's own from [`unicomm_bootstrap::LaunchEnv::shared_file`]),
    /// authenticated under the job's secret and bounded by `timeout`. Every rank passes the
    /// same vendor (`Auto` is resolved on each rank: set `UNICOMM_VENDOR` where ranks could
    /// resolve it differently).
    pub fn exchange(
        env: &unicomm_bootstrap::LaunchEnv,
        vendor: Vendor,
        timeout: std::time::Duration,
    ) -> Result<Self> {
        let (vendor, _) = resolve(vendor)?;
        let bytes = unicomm_bootstrap::exchange_unique_id(
            env,
            || dispatch::unique_id_vendor(vendor),
            timeout,
        )?;
        Ok(UniqueId { vendor, bytes })
    }

    /// Rank 0's id for growing `comm`'s world ([`unicomm_core::Comm::grow_id`]), to send
    /// to the new ranks ([`init_grown`]); rank 0 passes [`UniqueId::bytes`] to
    /// `comm.grow(world, Some(..))`, the world's other ranks pass `None`.
    pub fn for_grow(comm: &Comm) -> Result<Self> {
        let bytes = comm.grow_id()?;
        Ok(UniqueId {
            vendor: comm.backend().vendor(),
            bytes,
        })
    }

    /// The library's 128 bytes (what [`unicomm_core::Comm::grow`] takes).
    pub fn bytes(&self) -> &[u8; 128] {
        &self.bytes
    }

    /// `made` (on rank 0) handed to every rank of `env` through its rendezvous, as
    /// [`UniqueId::exchange`] hands a new one: for an id rank 0 made otherwise, such as a
    /// grow id ([`UniqueId::for_grow`]) sent to the ranks that join the grown world. The
    /// other ranks pass `None` and the same vendor.
    pub fn share(
        env: &unicomm_bootstrap::LaunchEnv,
        made: Option<&UniqueId>,
        vendor: Vendor,
        timeout: std::time::Duration,
    ) -> Result<Self> {
        let (vendor, _) = resolve(made.map_or(vendor, |m| m.vendor))?;
        let bytes = unicomm_bootstrap::exchange_unique_id(
            env,
            || {
                made.map(|m| m.bytes)
                    .ok_or_else(|| Error::invalid("made", "rank 0 shares the id it made"))
            },
            timeout,
        )?;
        Ok(UniqueId { vendor, bytes })
    }

    /// An id received from the rank that made it: `InvalidArgument` for bytes that are not
    /// one (a wrong length or vendor code).
    pub fn from_bytes(b: &[u8]) -> Result<Self> {
        let (&code, rest) = b
            .split_first()
            .filter(|_| b.len() == Self::LEN)
            .ok_or_else(|| {
                Error::invalid(
                    "id",
                    format!("{} bytes; a unique id has {}", b.len(), Self::LEN),
                )
            })?;
        let vendor = CODES
            .iter()
            .find(|(c, _)| *c == code)
            .map(|(_, v)| *v)
            .ok_or_else(|| Error::invalid("id", format!("vendor code {code} is not one")))?;
        let mut bytes = [0u8; 128];
        bytes.copy_from_slice(rest);
        Ok(UniqueId { vendor, bytes })
    }
}

/// Joins the world of `id` as `rank` of `world` on device `device` (NCCL's
/// `ncclCommInitRankConfig` with `config`, collective: every rank calls it, each once; the
/// mock has no devices and ignores `device`). One rank per thread or per process.
///
/// ```
/// // Two ranks as threads; an engine sends `id.to_bytes()` to its other processes instead.
/// let id = unicomm::UniqueId::new(unicomm::Vendor::Mock)?;
/// let bytes = id.to_bytes();
/// let ranks = std::thread::scope(|s| {
///     let joins: Vec<_> = (0..2)
///         .map(|r| s.spawn(move || -> unicomm::Result<usize> {
///             let id = unicomm::UniqueId::from_bytes(&bytes)?;
///             let comm = unicomm::init_rank(&id, r, 2, 0, &Default::default())?;
///             let rank = comm.rank();
///             comm.finalize()?;
///             Ok(rank)
///         }))
///         .collect();
///     joins.into_iter().map(|j| j.join().unwrap()).collect::<unicomm::Result<Vec<_>>>()
/// })?;
/// assert_eq!(ranks, [0, 1]);
/// # Ok::<(), unicomm::Error>(())
/// ```
pub fn init_rank(
    id: &UniqueId,
    rank: usize,
    world: usize,
    device: usize,
    config: &CommConfig,
) -> Result<Comm> {
    let at = Place::new(rank, world, device);
    dispatch::init_rank_vendor(id.vendor, &id.bytes, at, config).map(Comm::from_backend)
}

/// Joins a world grown with `id` ([`UniqueId::for_grow`] on its rank 0) as new rank `rank`
/// of `world` on device `device`, while every rank of the world calls
/// [`unicomm_core::Comm::grow`] (`ncclCommGrow`, NCCL >= 2.29.2; the mock as the NCCL it
/// stands for). New ranks follow the world's: `rank` in `old world..world`.
pub fn init_grown(
    id: &UniqueId,
    rank: usize,
    world: usize,
    device: usize,
    config: &CommConfig,
) -> Result<Comm> {
    let at = Place::new(rank, world, device);
    dispatch::init_grown_vendor(id.vendor, &id.bytes, at, config).map(Comm::from_backend)
}

#[cfg(all(test, feature = "mock", target_os = "linux"))]
mod tests {
    use super::*;

    // The bytes travel through the engine's own channel: they must come back whole, and
    // anything else must be refused, not joined.
    #[test]
    fn an_id_survives_its_bytes_and_other_bytes_are_refused() {
        let id = UniqueId::new(Vendor::Mock).unwrap();
        let b = id.to_bytes();
        assert_eq!(UniqueId::from_bytes(&b).unwrap(), id);
        assert_eq!(UniqueId::from_bytes(&b).unwrap().vendor(), Vendor::Mock);
        assert!(UniqueId::from_bytes(&b[..128]).is_err());
        let mut other = b;
        other[0] = 9;
        assert!(UniqueId::from_bytes(&other).is_err());
        assert_eq!(format!("{id:?}"), "UniqueId(mock, ..)", "no secret in logs");
    }
}
