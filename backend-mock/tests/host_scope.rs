//! Host slices lent to the mock's collectives for a scope: an engine's CPU tensors used
//! where they are (no copy for ranks in this process), and never touched after the scope.

use std::time::{Duration, Instant};

use unicomm_core::{DeviceSlice, DeviceStream, Error, ReduceOp};
use unicomm_mock::{MockComm, MockConfig};

/// Each of 3 ranks (threads) reduces its own host vectors: the views are the vectors
/// themselves (the same addresses: nothing copied), and the sum lands in each output.
#[test]
fn ranks_in_this_process_reduce_their_host_slices_where_they_are() {
    let comms = unicomm_mock::local_comms(3).unwrap();
    std::thread::scope(|t| {
        for c in &comms {
            t.spawn(move || {
                let input: Vec<f32> = (0..1000).map(|i| (i * (c.rank() + 1)) as f32).collect();
                let mut output = vec![0f32; 1000];
                let st = c.create_stream().unwrap();
                unicomm_mock::host_scope(c.backend(), |s| {
                    let send = s.lend(&input)?;
                    let mut recv = s.lend_mut(&mut output)?;
                    assert_eq!(send.view().device_ptr(), input.as_ptr() as usize);
                    assert_eq!(DeviceSlice::view(&recv).device_ptr(), recv_addr(&recv));
                    c.all_reduce(&send, &mut recv, ReduceOp::Sum, &st)?;
                    st.synchronize()
                })
                .unwrap();
                let want: Vec<f32> = (0..1000).map(|i| (i * 6) as f32).collect();
                assert_eq!(output, want);
            });
        }
    });
}

fn recv_addr<T: unicomm_core::Element>(v: &impl DeviceSlice<T, MockComm>) -> usize {
    v.view().device_ptr()
}

/// Work still queued at the scope's deadline (behind a host function that outlasts it) is
/// refused the slice: the scope ends with `Timeout`, the slice keeps what it held, and the
/// collective, when it runs, fails with `InvalidArgument` naming the ended scope.
#[test]
fn work_queued_past_the_scopes_deadline_never_writes_the_slice() {
    let config = MockConfig {
        timeout: Duration::from_millis(200),
        ..Default::default()
    };
    let comms = unicomm_mock::local_comms_with(1, config).unwrap();
    let c = &comms[0];
    let st = c.create_stream().unwrap();
    let input = vec![7f32; 64];
    let mut output = vec![-1f32; 64];
    let started = Instant::now();
    let r = unicomm_mock::host_scope(c.backend(), |s| {
        st.launch_host_fn(Box::new(|| std::thread::sleep(Duration::from_millis(450))))?;
        let send = s.lend(&input)?;
        let mut recv = s.lend_mut(&mut output)?;
        c.all_reduce(&send, &mut recv, ReduceOp::Sum, &st)
    });
    assert!(matches!(r, Err(Error::Timeout { .. })), "{r:?}");
    assert!(
        started.elapsed() < Duration::from_millis(420),
        "{:?}",
        started.elapsed()
    );
    assert!(
        output.iter().all(|&x| x == -1.0),
        "the slice was written after its scope"
    );
    let late = st.synchronize();
    assert!(
        matches!(&late, Err(Error::InvalidArgument { reason, .. }) if reason.contains("scope that has ended")),
        "{late:?}"
    );
    assert!(output.iter().all(|&x| x == -1.0));
}

/// A panic inside the scope still takes the slices back before it unwinds into the frame
/// that owns them: the queued write is refused, the panic reaches the caller.
#[test]
fn a_panic_inside_the_scope_takes_the_slices_back_first() {
    let config = MockConfig {
        timeout: Duration::from_millis(200),
        ..Default::default()
    };
    let comms = unicomm_mock::local_comms_with(1, config).unwrap();
    let c = &comms[0];
    let st = c.create_stream().unwrap();
    let mut output = vec![-1f32; 16];
    let src = c.upload(&[3f32; 16], &st).unwrap();
    let panicked = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let _: unicomm_core::Result<()> = unicomm_mock::host_scope(c.backend(), |s| {
            st.launch_host_fn(Box::new(|| std::thread::sleep(Duration::from_millis(450))))?;
            let mut dst = s.lend_mut(&mut output)?;
            c.copy(&src, &mut dst, &st)?;
            panic!("the engine's own code failed inside the scope");
        });
    }));
    assert!(panicked.is_err());
    assert!(output.iter().all(|&x| x == -1.0));
    let late = st.synchronize();
    assert!(
        matches!(&late, Err(Error::InvalidArgument { reason, .. }) if reason.contains("scope that has ended")),
        "{late:?}"
    );
    assert!(output.iter().all(|&x| x == -1.0));
}
