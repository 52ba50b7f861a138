// The buffer inside a registration cannot be swapped out (and then freed) through `&mut`:
// a registration derefs to `&Buffer` only.
fn main() -> unicomm::Result<()> {
    let comms = unicomm::local_comms_n(unicomm::Vendor::Mock, Some(1))?;
    let comm = &comms[0];
    let mut reg = comm.register(comm.alloc::<f32>(16)?)?;
    let other = comm.alloc::<f32>(16)?;
    let old = std::mem::replace(&mut *reg, other);
    drop(old);
    Ok(())
}
