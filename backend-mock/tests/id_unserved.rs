//! A rank of the process that made an id, whose rank 0 never joins there: told why at its
//! deadline. Its own binary: another test's 300 ids would give this one's up meanwhile.
#![cfg(target_os = "linux")]

use std::time::Duration;

use unicomm_core::Error;
use unicomm_mock::{init_rank, unique_id, MockConfig};

// The id's maker serves the world only once its rank 0 joins there: a rank of the maker
// whose rank 0 joined elsewhere (refused there) waits for a rank 0 that never comes, and is
// told so at the deadline, not that the hub is unreachable or busy with strangers.
#[test]
fn a_rank_of_the_maker_whose_rank_zero_never_joins_is_told_why() {
    let id = unique_id().unwrap();
    let short = MockConfig {
        timeout: Duration::from_millis(600),
        ..MockConfig::default()
    };
    match init_rank(&id, 1, 2, short) {
        Err(Error::Timeout { what, .. }) => {
            assert!(
                what.contains("rank 0 to join") && what.contains("made in this process"),
                "{what}"
            )
        }
        other => panic!("{:?}", other.map(|_| ())),
    }
}
