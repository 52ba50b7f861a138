/work/main/backend-rccl/tests/hip-on-cuda/target/debug/deps/unicomm_hip_on_cuda-80bf6c805def2ea3.d: src/lib.rs

/work/main/backend-rccl/tests/hip-on-cuda/target/debug/deps/libunicomm_hip_on_cuda-80bf6c805def2ea3.rmeta: src/lib.rs

src/lib.rs:
