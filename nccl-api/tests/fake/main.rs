//! The tests against the fake NCCL (`tests/fake-nccl`), one module each, in one binary:
//! each test runs in a process of its own (`rusty_fork_test!`), since the fake's call
//! counters and hooks, and the variables a test sets, are the process's; one link of the
//! crate serves them all.

/// Tests each run in a child process of this binary (rusty-fork), ended at 300 s.
macro_rules! isolated {
    ($($tests:tt)*) => {
        rusty_fork::rusty_fork_test! {
            #![rusty_fork(timeout_ms = 300_000)]
            $($tests)*
        }
    };
}

#[path = "../common/mod.rs"]
mod common;

mod abi;
mod abort;
mod abort_after_graphs;
mod abort_under_graphs;
mod auto;
mod auto_agree;
mod auto_windowless;
mod blocking_deadline;
mod call_checks;
mod call_options;
mod check_collectives;
mod check_layout;
mod copy_engine;
mod copy_engine_abort;
mod copy_engine_ipc;
mod copy_engine_ranks;
mod copy_engine_v;
mod deadline;
mod device_comm;
mod device_comm_end;
mod expert_library;
mod group_registration;
mod groups;
mod grow;
mod lent_home;
mod lock_deadline;
mod lock_drop;
mod one_sided;
mod peer_pointer;
mod registry_cost;
mod releases;
mod scalable;
mod shrink;
mod sleep;
mod symmetric;
mod symmetric_local;
mod window_end;
