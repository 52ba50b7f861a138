// The communicator cannot be destroyed while a registration borrows it.
fn main() -> unicomm::Result<()> {
    let mut comms = unicomm::local_comms_n(unicomm::Vendor::Mock, Some(1))?;
    let comm = comms.pop().unwrap();
    let reg = comm.register(comm.alloc::<f32>(16)?)?;
    comm.finalize()?;
    drop(reg);
    Ok(())
}
