//! One rank per process: who am I (from the launcher's variables) and the 128-byte unique id
//! every rank needs, exchanged over a small TCP rendezvous on `MASTER_ADDR:MASTER_PORT`.
//! Across machines NCCL/RCCL themselves carry the traffic; this only hands out the id.

#![deny(unsafe_code)]

mod auth;
mod file;
mod launcher;
mod rejoin;
mod secret;
mod serve;
mod tcp;

pub use auth::{Hello, HELLO_LEN};
pub use launcher::{LaunchEnv, Launcher, LAUNCHERS, MAX_WORLD};
pub use rejoin::Rejoin;
pub use tcp::exchange_unique_id;
#[cfg(test)]
use {auth::*, serve::*, tcp::*};

#[cfg(test)]
mod tests;
#[cfg(test)]
mod tests_keys;
#[cfg(test)]
mod tests_scale;
