//! The facade's stream is its backend's: a method the contract provides with a default
//! (`launch_marker`) reaches the backend's own, never the default's `Unsupported`.

#[test]
fn a_launch_marker_is_the_backends_own() -> unicomm::Result<()> {
    let comms = unicomm::local_comms_n(unicomm::Vendor::Mock, Some(1))?;
    let st = comms[0].create_stream()?;
    let m = unicomm::LaunchMarker::new(&st)?;
    // A marker no call recorded lets waits pass, as the mock's own does.
    st.wait(m.marker())?;
    st.synchronize()
}
