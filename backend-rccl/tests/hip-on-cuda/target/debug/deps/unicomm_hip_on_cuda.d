/work/main/backend-rccl/tests/hip-on-cuda/target/debug/deps/unicomm_hip_on_cuda.d: src/lib.rs

/work/main/backend-rccl/tests/hip-on-cuda/target/debug/deps/libunicomm_hip_on_cuda.so: src/lib.rs

src/lib.rs:
