//! `unicomm::from_env` without a GPU: no launcher variables is a `Bootstrap` error naming
//! what was looked for; on the mock a world of one process joins and runs; a missing peer
//! ends the rendezvous at its deadline, naming the rank.

use std::time::{Duration, Instant};

#[test]
fn from_env_on_the_mock() {
    for k in [
        "RANK",
        "WORLD_SIZE",
        "OMPI_COMM_WORLD_RANK",
        "OMPI_COMM_WORLD_SIZE",
        "SLURM_PROCID",
        "SLURM_NTASKS",
        "PMI_RANK",
        "PMIX_RANK",
        "MV2_COMM_WORLD_RANK",
    ] {
        std::env::remove_var(k);
    }
    match unicomm::from_env(unicomm::Vendor::Mock) {
        Err(unicomm::Error::Bootstrap { reason }) => {
            for v in [
                "RANK",
                "OMPI_COMM_WORLD_RANK",
                "PMI_RANK",
                "PMIX_RANK",
                "SLURM_PROCID",
            ] {
                assert!(reason.contains(v), "{reason}");
            }
        }
        other => panic!("expected Bootstrap, got {:?}", other.map(|_| ())),
    }
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    std::env::set_var("RANK", "0");
    std::env::set_var("WORLD_SIZE", "1");
    std::env::set_var("LOCAL_RANK", "0");
    std::env::set_var("MASTER_ADDR", "127.0.0.1");
    std::env::set_var("MASTER_PORT", port.to_string());
    std::env::set_var("UNICOMM_RENDEZVOUS_TOKEN", "from-env-test");
    let comm = unicomm::from_env(unicomm::Vendor::Mock).expect("a world of one process");
    let st = comm.create_stream().unwrap();
    let mut b = comm.alloc::<f32>(8).unwrap();
    b.copy_from_host(&[2.0; 8], &st).unwrap();
    comm.all_reduce_in_place(&mut b, unicomm::ReduceOp::Sum, &st)
        .unwrap();
    assert_eq!(b.copy_to_host(&st).unwrap(), vec![2.0; 8]);
    comm.finalize().unwrap();

    // Rank 0 of two, rank 1 never comes: the rendezvous's deadline ends it.
    std::env::set_var("WORLD_SIZE", "2");
    std::env::set_var("UNICOMM_BOOTSTRAP_TIMEOUT_S", "1");
    let t = Instant::now();
    match unicomm::from_env(unicomm::Vendor::Mock) {
        Err(e) => assert!(e.to_string().contains('1'), "{e}"),
        Ok(_) => panic!("joined a world whose rank 1 never started"),
    }
    assert!(t.elapsed() < Duration::from_secs(5), "{:?}", t.elapsed());
}
