//! What the loaded library reports and the registration rules: capabilities, registration
//! and its errors, symmetric windows, collective registration refused inside a group, and
//! a failing call's code, name and message.
#![cfg(any(feature = "nccl", feature = "rccl"))]

unicomm_gpu_tests::on_gpu! {
    capabilities_of_the_loaded_library => capabilities;
    registration_rules_hold => registration_rules;
    symmetric_windows_register_and_reduce => windows;
    registration_inside_a_group_is_refused => registration_in_group_refused;
    errors_carry_code_name_and_message => errors_carry_code;
}
