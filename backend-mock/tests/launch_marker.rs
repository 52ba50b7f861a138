//! A call's launch marker on the mock (NCCL 2.32's `launchCompletionEvent`): reached when
//! the collective begins, before it ends (its peer not there yet); another stream that
//! waits on it starts then; a fresh marker lets waits pass; inside a group or a capture it
//! is refused, as on NCCL.

use std::time::{Duration, Instant};

use unicomm_core::graph::Graph;
use unicomm_core::{CallOptions, Comm, DeviceStream, Error, LaunchMarker, ReduceOp};
use unicomm_mock::{local_comms_with, MockComm, MockConfig};

fn comms(world: usize) -> Vec<Comm<MockComm>> {
    let config = MockConfig::standing_for("nccl-2.32.3").unwrap();
    local_comms_with(world, config.within(Duration::from_secs(5))).unwrap()
}

fn marked(m: &LaunchMarker) -> CallOptions {
    CallOptions {
        launch_marker: Some(m.clone()),
        ..CallOptions::default()
    }
}

/// Rank 0's stream is busy 150 ms, then its all-reduce waits for rank 1, 400 ms late: the
/// marker is reached at the launch (after the busy work, before the end), and a second
/// stream waiting on it runs its work then.
#[test]
fn the_marker_is_reached_when_the_collective_begins_not_when_it_ends() {
    let cs = comms(2);
    std::thread::scope(|s| {
        s.spawn(|| {
            let c = &cs[1];
            let st = c.create_stream().unwrap();
            let mut b = c.upload(&[2.0f32; 4], &st).unwrap();
            std::thread::sleep(Duration::from_millis(400));
            c.all_reduce_in_place(&mut b, ReduceOp::Sum, &st).unwrap();
            st.synchronize().unwrap();
        });
        let c = &cs[0];
        let st = c.create_stream().unwrap();
        let compute = c.create_stream().unwrap();
        let m = LaunchMarker::new(&st).unwrap();
        let mut b = c.upload(&[1.0f32; 4], &st).unwrap();
        st.synchronize().unwrap();
        let t0 = Instant::now();
        // The stream is busy for 150 ms first: the launch comes after that.
        st.launch_host_fn(Box::new(|| std::thread::sleep(Duration::from_millis(150))))
            .unwrap();
        c.with_options(&marked(&m), || {
            c.all_reduce_in_place(&mut b, ReduceOp::Sum, &st)
        })
        .unwrap();
        compute.wait(m.marker()).unwrap();
        let started = std::sync::Arc::new(std::sync::OnceLock::new());
        let set = started.clone();
        compute
            .launch_host_fn(Box::new(move || {
                let _ = set.set(Instant::now());
            }))
            .unwrap();
        compute.synchronize().unwrap();
        let at = started.get().unwrap().duration_since(t0);
        assert_eq!(m.marker().inner().reached(), Some(true));
        assert!(
            !st.query().unwrap(),
            "the all-reduce ended before its peer came"
        );
        assert!(
            at >= Duration::from_millis(150) && at < Duration::from_millis(350),
            "the waiting stream ran at {at:?}, the launch was at 150 ms and the end after 400"
        );
        st.synchronize().unwrap();
        assert_eq!(b.copy_to_host(&st).unwrap(), vec![3.0; 4]);
    });
}

/// A launch marker no collective recorded lets waits pass (a CUDA event never recorded).
#[test]
fn a_fresh_marker_lets_waits_pass() {
    let cs = comms(1);
    let st = cs[0].create_stream().unwrap();
    let m = LaunchMarker::new(&st).unwrap();
    assert_eq!(m.marker().inner().reached(), Some(true));
    st.wait(m.marker()).unwrap();
    st.synchronize().unwrap();
    assert_eq!(m, m.clone());
    assert_ne!(m, LaunchMarker::new(&st).unwrap());
}

#[test]
fn inside_a_group_or_a_capture_it_is_refused() {
    let cs = comms(1);
    let c = &cs[0];
    let st = c.create_stream().unwrap();
    let m = LaunchMarker::new(&st).unwrap();
    let buf = c.upload(&[1.0f32; 4], &st).unwrap();
    let refused = |r: unicomm_core::Result<()>| match r {
        Err(Error::InvalidArgument { reason, .. }) => {
            assert!(reason.contains("launch marker"), "{reason}")
        }
        other => panic!("{other:?}"),
    };
    let mut b = c.upload(&[1.0f32; 4], &st).unwrap();
    refused(c.with_options(&marked(&m), || {
        c.group(|| c.all_reduce_in_place(&mut b, ReduceOp::Sum, &st))
    }));
    refused(
        Graph::capture(&st, |g| {
            c.with_options(&marked(&m), || {
                g.all_reduce_in_place(c, &buf, ReduceOp::Sum)
            })
        })
        .map(drop),
    );
    // Outside both, the same call takes it.
    c.with_options(&marked(&m), || {
        c.all_reduce_in_place(&mut b, ReduceOp::Sum, &st)
    })
    .unwrap();
    st.synchronize().unwrap();
}
