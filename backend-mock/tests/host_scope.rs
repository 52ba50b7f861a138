//! Host slices lent to the mock's collectives for a scope: an engine's CPU tensors used
//! where they are (no copy for ranks in this process), and never touched after the scope.

use std::time::{Duration, Instant};

use unicomm_core::{DeviceSlice, DeviceStream, Error, ReduceOp};
use unicomm_mock::MockConfig;

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
                let out_addr = output.as_ptr() as usize;
                let st = c.create_stream().unwrap();
                unicomm_mock::host_scope(c.backend(), |s| {
                    let send = s.lend(&input)?;
                    let mut recv = s.lend_mut(&mut output)?;
                    assert_eq!(send.view().device_ptr(), input.as_ptr() as usize);
                    assert_eq!(recv.view().device_ptr(), out_addr);
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

/// One rank whose waits have a 200 ms deadline, and a stream of it stalled for 450 ms by a
/// host function (work enqueued after it outlasts a scope's deadline).
fn one_rank_stalled() -> (
    Vec<unicomm_core::Comm<unicomm_mock::MockComm>>,
    unicomm_mock::MockStream,
) {
    let config = MockConfig {
        timeout: Duration::from_millis(200),
        ..Default::default()
    };
    let comms = unicomm_mock::local_comms_with(1, config).unwrap();
    let st = comms[0].create_stream().unwrap();
    st.launch_host_fn(Box::new(|| std::thread::sleep(Duration::from_millis(450))))
        .unwrap();
    (comms, st)
}

/// The stream's work after the scope's end failed, naming the ended scope.
fn refused_as_after_the_scope(late: unicomm_core::Result<()>) {
    assert!(
        matches!(&late, Err(Error::InvalidArgument { reason, .. }) if reason.contains("scope that has ended")),
        "{late:?}"
    );
}

/// Work still queued at the scope's deadline (behind a host function that outlasts it) is
/// refused the slice: the scope ends with `Timeout`, the slice keeps what it held, and the
/// collective, when it runs, fails with `InvalidArgument` naming the ended scope.
#[test]
fn work_queued_past_the_scopes_deadline_never_writes_the_slice() {
    let started = Instant::now();
    let (comms, st) = one_rank_stalled();
    let c = &comms[0];
    let input = vec![7f32; 64];
    let mut output = vec![-1f32; 64];
    let r = unicomm_mock::host_scope(c.backend(), |s| {
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
    refused_as_after_the_scope(st.synchronize());
    assert!(output.iter().all(|&x| x == -1.0));
}

/// A panic inside the scope still takes the slices back before it unwinds into the frame
/// that owns them: the queued write is refused, the panic reaches the caller.
#[test]
fn a_panic_inside_the_scope_takes_the_slices_back_first() {
    let (comms, st) = one_rank_stalled();
    let c = &comms[0];
    let mut output = vec![-1f32; 16];
    let src = c.upload(&[3f32; 16], &st).unwrap();
    let panicked = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let _: unicomm_core::Result<()> = unicomm_mock::host_scope(c.backend(), |s| {
            let mut dst = s.lend_mut(&mut output)?;
            c.copy(&src, &mut dst, &st)?;
            panic!("the engine's own code failed inside the scope");
        });
    }));
    assert!(panicked.is_err());
    assert!(output.iter().all(|&x| x == -1.0));
    refused_as_after_the_scope(st.synchronize());
    assert!(output.iter().all(|&x| x == -1.0));
}

/// Work on lent slices that fails (its peer aborts, or never joins and the work's deadline
/// falls at the scope's own) ends the scope with the work's error every time, never `Ok`
/// with the lent output unwritten: the failure is kept with the slice, not inferred from
/// whether the work still holds it at the scope's deadline.
#[test]
fn a_scope_whose_work_failed_reports_the_failure_whenever_it_ends() {
    let config = MockConfig {
        timeout: Duration::from_millis(200),
        ..Default::default()
    };
    for run in 0..10 {
        let comms = unicomm_mock::local_comms_with(2, config.clone()).unwrap();
        let (c, peer) = (&comms[0], &comms[1]);
        let st = c.create_stream().unwrap();
        let input = vec![7f32; 64];
        let mut output = vec![-1f32; 64];
        let aborts = run % 2 == 0;
        let r = std::thread::scope(|s| {
            if aborts {
                s.spawn(|| {
                    std::thread::sleep(Duration::from_millis(20));
                    let _ = peer.abort();
                });
            }
            unicomm_mock::host_scope(c.backend(), |s| {
                let send = s.lend(&input)?;
                let mut recv = s.lend_mut(&mut output)?;
                c.all_reduce(&send, &mut recv, ReduceOp::Sum, &st)
            })
        });
        assert!(r.is_err(), "run {run} (peer aborts: {aborts}): {r:?}");
        assert!(output.iter().all(|&x| x == -1.0));
        let _ = (c.abort(), peer.abort());
    }
}

/// A view forgotten with `mem::forget` holds its memory for ever, but no view can outlive
/// its scope otherwise: the scope ends once the work is done, not at its deadline with
/// `Timeout` (as it did, waiting for the forgotten view to let go).
#[test]
fn a_forgotten_view_does_not_hold_its_scope_until_the_deadline() {
    let config = MockConfig {
        timeout: Duration::from_secs(20),
        ..MockConfig::default()
    };
    let comms = unicomm_mock::local_comms_with(1, config).unwrap();
    let c = &comms[0];
    let (input, mut output) = (vec![2.5f32; 64], vec![0f32; 64]);
    let st = c.create_stream().unwrap();
    let t = Instant::now();
    unicomm_mock::host_scope(c.backend(), |s| {
        let send = s.lend(&input)?;
        let mut recv = s.lend_mut(&mut output)?;
        c.all_reduce(&send, &mut recv, ReduceOp::Sum, &st)?;
        st.synchronize()?;
        std::mem::forget(send);
        Ok(())
    })
    .unwrap();
    assert!(t.elapsed() < Duration::from_secs(5), "{:?}", t.elapsed());
    assert_eq!(output, input);
}
