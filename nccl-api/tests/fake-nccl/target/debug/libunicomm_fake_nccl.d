/work/main/nccl-api/tests/fake-nccl/target/debug/libunicomm_fake_nccl.so: /work/main/nccl-api/tests/fake-nccl/src/coll_config.rs /work/main/nccl-api/tests/fake-nccl/src/lib.rs
