//! The facade's `Comm` reaches every call of its backend: a call `AnyComm` does not forward
//! answers the contract's default, `Unsupported`, on every vendor (found on an H100: NCCL
//! 2.32.3's properties and sleep mode were refused through `unicomm::Comm` while the
//! backend's own `Comm` had them). On the mock standing for NCCL 2.32.3, which has both.

use unicomm::{each_rank, Vendor};

#[test]
fn the_facade_forwards_properties_and_the_sleep_mode() {
    // The mock standing for a NCCL that has both (read at the world's creation; the only
    // test of this binary).
    std::env::set_var("UNICOMM_MOCK_TARGET", "nccl-2.32.3");
    let comms = unicomm::local_comms_n(Vendor::Mock, Some(2)).unwrap();
    let seen = each_rank(comms, |c| -> unicomm::Result<(usize, usize, bool, bool)> {
        let p = c.properties()?;
        c.suspend()?;
        let suspended = c.mem_stats()?.suspended;
        c.resume()?;
        Ok((p.rank, p.world, suspended, c.mem_stats()?.suspended))
    })
    .unwrap();
    assert_eq!(seen, vec![(0, 2, true, false), (1, 2, true, false)]);
}
