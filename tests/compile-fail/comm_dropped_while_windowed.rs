// Nor dropped while a window borrows it.
fn main() -> unicomm::Result<()> {
    let mut comms = unicomm::local_comms_n(unicomm::Vendor::Mock, Some(1))?;
    let comm = comms.pop().unwrap();
    let win = comm.register_window(comm.alloc::<f32>(16)?)?;
    drop(comm);
    drop(win);
    Ok(())
}
