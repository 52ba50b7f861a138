// A registered buffer cannot be freed while registered: `register` takes it.
fn main() -> unicomm::Result<()> {
    let comms = unicomm::local_comms_n(unicomm::Vendor::Mock, Some(1))?;
    let comm = &comms[0];
    let buf = comm.alloc::<f32>(16)?;
    let reg = comm.register(buf)?;
    drop(buf);
    drop(reg);
    Ok(())
}
