//! The ownership rules of registered memory, proven by programs that must not compile.
#[test]
fn registration_rules_are_enforced_by_the_compiler() {
    let t = trybuild::TestCases::new();
    t.compile_fail("tests/compile-fail/*.rs");
}

/// And the shape that must compile: a registered buffer is still a collective's output.
#[test]
fn a_registered_buffer_can_be_an_output() -> unicomm::Result<()> {
    let comms = unicomm::local_comms_n(unicomm::Vendor::Mock, Some(1))?;
    let comm = &comms[0];
    let st = comm.create_stream()?;
    let send = comm.register(comm.alloc::<f32>(4)?)?;
    let mut recv = comm.register(comm.alloc::<f32>(4)?)?;
    comm.all_reduce(&send, &mut recv, unicomm::ReduceOp::Sum, &st)?;
    comm.all_reduce_in_place(&mut recv, unicomm::ReduceOp::Sum, &st)?;
    st.synchronize()?;
    comm.deregister(send)?;
    comm.deregister(recv)?;
    Ok(())
}
