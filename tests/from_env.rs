//! `unicomm::from_env` without a GPU: no launcher variables is a `Bootstrap` error naming
//! what was expected; the mock refuses one rank per process as `Unsupported`.

#[test]
fn from_env_errors_are_typed() {
    for k in [
        "RANK",
        "WORLD_SIZE",
        "OMPI_COMM_WORLD_RANK",
        "OMPI_COMM_WORLD_SIZE",
        "SLURM_PROCID",
        "SLURM_NTASKS",
    ] {
        std::env::remove_var(k);
    }
    match unicomm::from_env(unicomm::Vendor::Mock) {
        Err(unicomm::Error::Bootstrap { reason }) => assert!(reason.contains("RANK"), "{reason}"),
        other => panic!("expected Bootstrap, got {:?}", other.map(|_| ())),
    }
    std::env::set_var("RANK", "0");
    std::env::set_var("WORLD_SIZE", "2");
    std::env::set_var("LOCAL_RANK", "0");
    std::env::set_var("MASTER_ADDR", "127.0.0.1");
    std::env::set_var("MASTER_PORT", "29599");
    match unicomm::from_env(unicomm::Vendor::Mock) {
        Err(unicomm::Error::Unsupported { what, .. }) => assert!(what.contains("mock"), "{what}"),
        other => panic!("expected Unsupported, got {:?}", other.map(|_| ())),
    }
}
