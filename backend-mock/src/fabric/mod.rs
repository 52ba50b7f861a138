//! The rank-to-rank exchange of the mock.
//!
//! Ranks agree on each collective through a numbered slot: each deposits a [`Desc`] (what it
//! was asked to do, and where its buffers are), waits for the others, then reads peers'
//! buffers directly ("pull") in phases separated by barriers. Every wait has a deadline;
//! the first rank to miss one poisons the fabric, and every rank waiting then or later gets
//! the same error instead of hanging.
//!
//! [`Exchange`] is the cut between ranks: [`LocalFabric`] for ranks that are threads of one
//! process, and `procs::ProcFabric` for ranks in different processes (the same
//! `LocalFabric` in rank 0's process, reached over loopback; buffers in shared memory).

mod local;
mod types;
mod wait;

pub(crate) use local::LocalFabric;
pub(crate) use types::{Desc, Done, Exchange, Load, Msg, Signature, Wait, LOAD_PART};
