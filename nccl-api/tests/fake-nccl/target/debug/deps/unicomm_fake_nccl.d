/work/main/nccl-api/tests/fake-nccl/target/debug/deps/unicomm_fake_nccl.d: src/lib.rs src/coll_config.rs

/work/main/nccl-api/tests/fake-nccl/target/debug/deps/libunicomm_fake_nccl.so: src/lib.rs src/coll_config.rs

src/lib.rs:
src/coll_config.rs:
