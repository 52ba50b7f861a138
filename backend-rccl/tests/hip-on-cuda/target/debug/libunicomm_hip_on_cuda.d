/work/main/backend-rccl/tests/hip-on-cuda/target/debug/libunicomm_hip_on_cuda.so: /work/main/backend-rccl/tests/hip-on-cuda/src/lib.rs
