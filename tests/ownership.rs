//! The ownership rules of registered memory at run time: a registered buffer is still a
//! collective's output. The programs that must not compile are the `compile_fail` examples
//! of the facade's `rules` module (doctests, each with its error code).

/// A registered buffer can be an output, out of place and in place.
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
