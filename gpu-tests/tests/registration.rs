//! What the loaded library reports and the registration rules: capabilities, registration
//! and its errors, symmetric windows, collective registration refused inside a group, and
//! a failing call's code, name and message.
#![cfg(any(feature = "nccl", feature = "rccl"))]

use unicomm_core::Result;
use unicomm_gpu_tests as t;
use unicomm_gpu_tests::GPU;

#[test]
fn capabilities_of_the_loaded_library() -> Result<()> {
    t::capabilities(&GPU)
}
#[test]
fn registration_rules_hold() -> Result<()> {
    t::registration_rules(&GPU)
}
#[test]
fn symmetric_windows_register_and_reduce() -> Result<()> {
    t::windows(&GPU)
}
#[test]
fn registration_inside_a_group_is_refused() -> Result<()> {
    t::registration_in_group_refused(&GPU)
}
#[test]
fn errors_carry_code_name_and_message() -> Result<()> {
    t::errors_carry_code(&GPU)
}
