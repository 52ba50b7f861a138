//! The conformance suite on the vendor's GPUs (the mock passes the same suite in CI); the
//! world sizes larger than the machine's GPU count are skipped by name, and say so.
#![cfg(any(feature = "nccl", feature = "rccl"))]

use unicomm_gpu_tests::GPU;

unicomm_conformance::conformance_suite!(GPU);
