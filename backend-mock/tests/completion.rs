//! Completion handles on the mock: an engine's async code awaits a collective without
//! blocking its executor, runs in CI without a GPU.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use unicomm_core::completion;
use unicomm_core::{DeviceStream, Error, ReduceOp};
use unicomm_mock::{MockComm, MockConfig};

type Completion<'a> = completion::Completion<'a, MockComm>;

/// A completion handle is a future woken by its work: on tokio's current-thread runtime a
/// ticking task keeps ticking while rank 0's all-reduce waits for rank 1, which arrives
/// 200 ms late (a future that blocked the thread would stop the ticks).
#[test]
fn an_awaited_collective_leaves_the_executor_free_for_other_tasks() {
    let comms = unicomm_mock::local_comms(2).unwrap();
    let (c0, c1) = (&comms[0], &comms[1]);
    std::thread::scope(|s| {
        s.spawn(|| {
            std::thread::sleep(Duration::from_millis(200));
            let st = c1.create_stream().unwrap();
            let mut x = c1.upload(&[2.0f32; 8], &st).unwrap();
            c1.all_reduce_in_place(&mut x, ReduceOp::Sum, &st).unwrap();
            st.synchronize().unwrap();
        });
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .unwrap();
        rt.block_on(async {
            let st = c0.create_stream().unwrap();
            let x = c0.upload(&[1.0f32; 8], &st).unwrap();
            let ticks = Arc::new(AtomicU32::new(0));
            let t = ticks.clone();
            let ticker = tokio::spawn(async move {
                loop {
                    tokio::time::sleep(Duration::from_millis(5)).await;
                    t.fetch_add(1, Ordering::Relaxed);
                }
            });
            let h =
                Completion::start(&st, |s| s.all_reduce_in_place(c0, &x, ReduceOp::Sum)).unwrap();
            assert!(!h.is_done(), "rank 1 arrives 200 ms later");
            h.await.unwrap();
            ticker.abort();
            let n = ticks.load(Ordering::Relaxed);
            assert!(
                n >= 10,
                "the executor ticked {n} times while the collective waited"
            );
            assert_eq!(x.copy_to_host(&st).unwrap(), vec![3.0; 8]);
        });
    });
}

/// A handle whose peer never comes ends at the communicators' deadline with `Timeout`,
/// woken by the process's deadline watcher (nothing else wakes it), never a hang.
#[test]
fn an_awaited_collective_whose_peer_never_comes_ends_at_the_deadline() {
    let config = MockConfig {
        timeout: Duration::from_millis(300),
        ..MockConfig::default()
    };
    let comms = unicomm_mock::local_comms_with(2, config).unwrap();
    let c0 = &comms[0];
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap();
    let st = c0.create_stream().unwrap();
    let x = c0.upload(&[1.0f32; 8], &st).unwrap();
    let t = Instant::now();
    let r = rt.block_on(async {
        Completion::start(&st, |s| s.all_reduce_in_place(c0, &x, ReduceOp::Sum))
            .unwrap()
            .await
    });
    assert!(matches!(r, Err(Error::Timeout { .. })), "{r:?}");
    assert!(t.elapsed() < Duration::from_secs(5), "{:?}", t.elapsed());
}

/// `wait` blocks until done; `is_done` answers without blocking; the handle's marker
/// orders another stream after the work; a dropped handle waits for its work first.
#[test]
fn a_handle_is_waited_polled_and_orders_another_stream() {
    let comms = unicomm_mock::local_comms(2).unwrap();
    unicomm_core::each_rank(&comms, |c| {
        let (st, other) = (c.create_stream()?, c.create_stream()?);
        let x = c.upload(&[1.0f32; 8], &st)?;
        let mut y = c.alloc::<f32>(8)?;
        let h = Completion::start(&st, |s| s.all_reduce_in_place(c, &x, ReduceOp::Sum))?;
        other.wait(h.marker())?;
        c.copy(&x, &mut y, &other)?;
        h.wait()?;
        assert_eq!(y.copy_to_host(&other)?, vec![2.0; 8]);
        let dropped = Completion::start(&st, |s| s.all_reduce_in_place(c, &x, ReduceOp::Sum))?;
        drop(dropped);
        let h = Completion::start(&st, |s| s.all_reduce_in_place(c, &x, ReduceOp::Sum))?;
        while !h.is_done() {
            std::thread::yield_now();
        }
        assert_eq!(x.copy_to_host(&st)?, vec![8.0; 8]);
        Ok::<_, Error>(())
    })
    .unwrap();
}

/// How a completion of one all-reduce ends on rank 0 of 2 when `scene` happens beside it:
/// the error and how long it took, waited (`wait`) or awaited (the future).
fn completion_in_scene(scene: &str, awaited: bool) -> (std::result::Result<(), Error>, Duration) {
    let config = MockConfig {
        timeout: Duration::from_secs(20),
        ..MockConfig::default()
    };
    let comms = unicomm_mock::local_comms_with(2, config).unwrap();
    let (c0, c1) = (&comms[0], &comms[1]);
    std::thread::scope(|s| {
        let scene = scene.to_string();
        s.spawn(move || {
            std::thread::sleep(Duration::from_millis(100));
            let st = c1.create_stream().unwrap();
            match scene.as_str() {
                // The peer's own abort: its in-flight collectives fail on every rank.
                "peer abort" => drop(c1.abort()),
                // The peer calls the same collective with another count.
                "mismatch" => {
                    let mut x = c1.upload(&[2.0f32; 4], &st).unwrap();
                    let _ = c1.all_reduce_in_place(&mut x, ReduceOp::Sum, &st);
                    let _ = st.synchronize();
                }
                // This rank's own communicator aborted from another thread.
                "own abort" => drop(c0.abort()),
                _ => unreachable!(),
            }
        });
        let st = c0.create_stream().unwrap();
        let x = c0.upload(&[1.0f32; 8], &st).unwrap();
        let t = Instant::now();
        let h = Completion::start(&st, |s| s.all_reduce_in_place(c0, &x, ReduceOp::Sum)).unwrap();
        let r = if awaited {
            tokio::runtime::Builder::new_current_thread()
                .enable_time()
                .build()
                .unwrap()
                .block_on(h)
        } else {
            h.wait()
        };
        let took = t.elapsed();
        // The peer's abort leaves it unusable; the other scenes leave rank 1 waiting
        // for nothing, so the world is aborted before it is dropped.
        let _ = c0.abort();
        let _ = c1.abort();
        (r, took)
    })
}

/// A completion whose collective failed ends at once with the failure's own error, as the
/// same scene ends an eager wait: `Aborted` for a peer's abort and for this rank's own
/// abort from another thread, `Mismatch` for a peer that called another count, never a
/// `Timeout` at the deadline (20 s here), whether waited or awaited.
#[test]
fn a_failed_completion_ends_at_once_with_the_failures_error() {
    for awaited in [false, true] {
        for (scene, want) in [
            ("peer abort", "aborted"),
            ("mismatch", "mismatch"),
            ("own abort", "aborted"),
        ] {
            let (r, took) = completion_in_scene(scene, awaited);
            let got = match &r {
                Err(Error::Aborted { .. }) => "aborted",
                Err(Error::Mismatch { .. }) => "mismatch",
                _ => "other",
            };
            assert_eq!(got, want, "{scene} (awaited {awaited}): {r:?}");
            assert!(
                took < Duration::from_secs(5),
                "{scene} (awaited {awaited}) took {took:?}"
            );
        }
    }
}

/// Cancelling a task that awaits a completion (`tokio::time::timeout`) costs the executor
/// nothing: the handle's drop returns at once while its all-reduce still waits for a peer
/// 500 ms late (the buffers are the mock's own allocations, which outlive their work); the
/// work finishes afterwards, exact, in stream order.
#[test]
fn cancelling_an_awaited_completion_does_not_block_the_executor() {
    let comms = unicomm_mock::local_comms(2).unwrap();
    let (c0, c1) = (&comms[0], &comms[1]);
    std::thread::scope(|s| {
        s.spawn(|| {
            std::thread::sleep(Duration::from_millis(500));
            let st = c1.create_stream().unwrap();
            let mut x = c1.upload(&[2.0f32; 8], &st).unwrap();
            c1.all_reduce_in_place(&mut x, ReduceOp::Sum, &st).unwrap();
            st.synchronize().unwrap();
        });
        let st = c0.create_stream().unwrap();
        let x = c0.upload(&[1.0f32; 8], &st).unwrap();
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .unwrap();
        let t = Instant::now();
        let r = rt.block_on(async {
            let h =
                Completion::start(&st, |s| s.all_reduce_in_place(c0, &x, ReduceOp::Sum)).unwrap();
            tokio::time::timeout(Duration::from_millis(20), h).await
        });
        let took = t.elapsed();
        assert!(r.is_err(), "the peer is 500 ms late: {r:?}");
        assert!(
            took < Duration::from_millis(250),
            "the cancelled handle's drop took {took:?}"
        );
        st.synchronize().unwrap();
        assert_eq!(x.copy_to_host(&st).unwrap(), vec![3.0; 8]);
    });
}
