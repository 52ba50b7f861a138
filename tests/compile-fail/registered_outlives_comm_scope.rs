// A registration cannot escape the scope of its communicator.
fn register_and_leak() -> unicomm::Result<unicomm::Registered<'static, f32>> {
    let comms = unicomm::local_comms_n(unicomm::Vendor::Mock, Some(1))?;
    let comm = &comms[0];
    Ok(comm.register(comm.alloc::<f32>(16)?)?)
}
fn main() {
    let _ = register_and_leak();
}
