//! Process groups, the variable-size collectives, fp8, scaled sums and the communicator
//! configuration on the fake NCCL-ABI library: every version gate, every fallback and the
//! calls each fallback makes (the fake counts its calls).

use crate::common;

use std::path::Path;
use std::sync::Arc;

use crate::common::{calls, comm, fake, flavors, Host, COMPUTE};
use unicomm_core::{
    packed_displs, Comm, CommConfig, Counts, CtaPolicy, DeviceStream, Error, ReduceOp, F8E4M3,
};
use unicomm_nccl_api::{Api, ApiComm};

type C = Comm<ApiComm<Host>>;

/// The fake's call counters are per process: the tests here run one at a time, so that one
/// test's calls never land between another's counts.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

fn last_type(path: &Path) -> i32 {
    // SAFETY: the fake, already loaded by the test; the function takes no arguments.
    unsafe {
        let lib = libloading::Library::new(path).unwrap();
        let f: libloading::Symbol<unsafe extern "C" fn() -> i32> =
            lib.get(b"unicommFakeLastType\0").unwrap();
        f()
    }
}

fn last_config(path: &Path) -> (String, i32) {
    // SAFETY: as above; the fake writes at most `cap` bytes into the buffer.
    unsafe {
        let lib = libloading::Library::new(path).unwrap();
        let f: libloading::Symbol<unsafe extern "C" fn(*mut std::ffi::c_char, usize) -> i32> =
            lib.get(b"unicommFakeLastConfig\0").unwrap();
        let mut buf = [0 as std::ffi::c_char; 64];
        let max = f(buf.as_mut_ptr(), buf.len());
        let name = std::ffi::CStr::from_ptr(buf.as_ptr())
            .to_string_lossy()
            .into_owned();
        (name, max)
    }
}

/// An all-reduce on `c` gives back its input (a world of one): the child works.
fn works(c: &C) {
    let st = c.create_stream().unwrap();
    let mut b = c.alloc::<f32>(8).unwrap();
    b.copy_from_host(&[3.0; 8], &st).unwrap();
    c.all_reduce_in_place(&mut b, ReduceOp::Sum, &st).unwrap();
    assert_eq!(b.copy_to_host(&st).unwrap(), vec![3.0; 8]);
}

struct Foreign;
impl unicomm_core::MarkerTime for Foreign {
    fn ms_until(&self, _: &dyn unicomm_core::MarkerTime) -> unicomm_core::Result<f64> {
        Ok(0.0)
    }
    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}

isolated! {
    /// NCCL >= 2.18: `split` is `ncclCommSplit`; no color gives no child (NCCL_SPLIT_NOCOLOR).
    #[test]
    fn split_is_ncclcommsplit_from_2_18() {
        let _one = serial();
        let path = fake("nccl228");
        let c = comm(flavors(false, false), &path);
        assert!(c.capabilities().native_split);
        let before = calls(&path, "ncclCommSplit");
        let child = c.split(Some(3), 0).unwrap().expect("a child");
        assert_eq!(calls(&path, "ncclCommSplit"), before + 1);
        assert_eq!((child.rank(), child.world_size()), (0, 1));
        works(&child);
        assert!(
            calls(&path, "ncclAllReduce:split") >= 1,
            "the child's call reached the child"
        );
        let nocolor = calls(&path, "ncclCommSplit:nocolor");
        assert!(c.split(None, 0).unwrap().is_none());
        assert_eq!(calls(&path, "ncclCommSplit:nocolor"), nocolor + 1);
        // A child of a child, and the parent still works after the child is gone.
        let grandchild = child.split(Some(0), 0).unwrap().expect("a grandchild");
        child.finalize().unwrap();
        works(&grandchild);
        grandchild.finalize().unwrap();
        works(&c);
    }

    /// A non-blocking child of a blocking parent (`blocking: false` in the child's config):
    /// ncclCommSplit answers ncclInProgress for it, which is not an error; the child is settled
    /// (polled until it leaves ncclInProgress) before `split` returns it.
    #[test]
    fn a_non_blocking_child_of_a_blocking_parent_is_settled_not_refused() {
        let _one = serial();
        let path = fake("nccl228");
        let c = comm(flavors(false, false), &path);
        let polls = calls(&path, "ncclCommGetAsyncError");
        let config = CommConfig {
            blocking: Some(false),
            ..CommConfig::default()
        };
        let child = c.split_with(Some(0), 0, &config).unwrap().expect("a child");
        assert!(calls(&path, "ncclCommGetAsyncError") - polls >= 4);
        works(&child);
        child.finalize().unwrap();
        works(&c);
    }

    /// NCCL 2.17 (no ncclCommSplit): the members make the child from a fresh unique id that
    /// the parent carries to them: one all-reduce for every rank's (color, key), one per group
    /// for its id, then ncclCommInitRank.
    #[test]
    fn without_ncclcommsplit_the_child_comes_from_a_fresh_unique_id() {
        let _one = serial();
        let path = fake("nccl217");
        let c = comm(flavors(false, false), &path);
        assert!(!c.capabilities().native_split);
        let (ids, inits, reduces) = (
            calls(&path, "ncclGetUniqueId"),
            calls(&path, "ncclCommInitRank"),
            calls(&path, "ncclAllReduce"),
        );
        let child = c.split(Some(5), 0).unwrap().expect("a child");
        assert_eq!(calls(&path, "ncclCommSplit"), 0);
        assert_eq!(calls(&path, "ncclGetUniqueId"), ids + 1);
        assert_eq!(calls(&path, "ncclCommInitRank"), inits + 1);
        assert_eq!(calls(&path, "ncclAllReduce"), reduces + 2);
        works(&child);
        assert!(c.split(None, 0).unwrap().is_none());
        child.finalize().unwrap();
    }

    /// ncclGather/ncclScatter from 2.28.3; before, grouped send/recv to and from the root.
    #[test]
    fn gather_and_scatter_are_native_from_2_28_3_and_grouped_send_recv_before() {
        let _one = serial();
        for (flavor, native) in [("nccl228", true), ("default", false)] {
            let path = fake(flavor);
            let c = comm(flavors(false, false), &path);
            assert_eq!(c.capabilities().native_gather_scatter, native);
            let st = c.create_stream().unwrap();
            let mut src = c.alloc::<i32>(4).unwrap();
            src.copy_from_host(&[1, 2, 3, 4], &st).unwrap();
            let mut dst = c.alloc::<i32>(4).unwrap();
            let (g, sends) = (calls(&path, "ncclGather"), calls(&path, "ncclSend"));
            c.gather(&src, &mut dst, 0, &st).unwrap();
            assert_eq!(dst.copy_to_host(&st).unwrap(), vec![1, 2, 3, 4]);
            let mut back = c.alloc::<i32>(4).unwrap();
            c.scatter(&dst, &mut back, 0, &st).unwrap();
            assert_eq!(back.copy_to_host(&st).unwrap(), vec![1, 2, 3, 4]);
            if native {
                assert_eq!(calls(&path, "ncclGather"), g + 1, "{flavor}");
                assert_eq!(calls(&path, "ncclScatter"), 1, "{flavor}");
            } else {
                assert_eq!(calls(&path, "ncclSend"), sends + 2, "{flavor}");
            }
        }
    }

    /// RCCL's ncclAllToAllv is used where present; NCCL has none: one send and one receive
    /// per peer with elements, the empty ones left out.
    #[test]
    fn all_to_all_v_is_rccls_call_or_grouped_send_recv() {
        let _one = serial();
        for (flavor, rccl) in [("rccl-old", true), ("nccl228", false)] {
            let path = fake(flavor);
            let c = comm(flavors(false, rccl), &path);
            assert_eq!(c.capabilities().native_all_to_all_v, rccl);
            let st = c.create_stream().unwrap();
            let mut send = c.alloc::<f32>(5).unwrap();
            send.copy_from_host(&[9.0, 1.0, 2.0, 3.0, 9.0], &st)
                .unwrap();
            let mut recv = c.alloc::<f32>(4).unwrap();
            recv.copy_from_host(&[0.0; 4], &st).unwrap();
            let s = Counts {
                counts: &[3],
                displs: &[1],
            };
            let r = Counts {
                counts: &[3],
                displs: &[1],
            };
            let (v, sends) = (calls(&path, "ncclAllToAllv"), calls(&path, "ncclSend"));
            c.all_to_all_v(&send, s, &mut recv, r, &st).unwrap();
            assert_eq!(recv.copy_to_host(&st).unwrap(), vec![0.0, 1.0, 2.0, 3.0]);
            if rccl {
                assert_eq!(calls(&path, "ncclAllToAllv"), v + 1);
            } else {
                assert_eq!(calls(&path, "ncclSend"), sends + 1);
            }
            // Zero counts reach the library as no call at all.
            let sends = calls(&path, "ncclSend");
            let zero = Counts {
                counts: &[0],
                displs: &[0],
            };
            c.all_to_all_v(&send, zero, &mut recv, zero, &st).unwrap();
            if !rccl {
                assert_eq!(calls(&path, "ncclSend"), sends);
            }
        }
    }

    /// all_gather_v and reduce_scatter_v: a group of broadcasts, of reduces (neither library
    /// has them).
    #[test]
    fn all_gather_v_and_reduce_scatter_v_are_groups_of_broadcasts_and_reduces() {
        let _one = serial();
        let path = fake("default");
        let c = comm(flavors(false, false), &path);
        let st = c.create_stream().unwrap();
        let mut send = c.alloc::<i64>(3).unwrap();
        send.copy_from_host(&[4, 5, 6], &st).unwrap();
        let mut recv = c.alloc::<i64>(3).unwrap();
        let counts = [3usize];
        let displs = packed_displs(&counts).unwrap();
        let layout = Counts {
            counts: &counts,
            displs: &displs,
        };
        let (b, r) = (calls(&path, "ncclBroadcast"), calls(&path, "ncclReduce"));
        c.all_gather_v(&send, &mut recv, layout, &st).unwrap();
        assert_eq!(recv.copy_to_host(&st).unwrap(), vec![4, 5, 6]);
        assert_eq!(calls(&path, "ncclBroadcast"), b + 1);
        c.reduce_scatter_v(&send, layout, &mut recv, ReduceOp::Sum, &st)
            .unwrap();
        assert_eq!(recv.copy_to_host(&st).unwrap(), vec![4, 5, 6]);
        assert_eq!(calls(&path, "ncclReduce"), r + 1);
    }

    /// Reductions of the 8-bit floats need NCCL 2.24.3 (`Unsupported` naming it before);
    /// moving them works on every version, as bytes (ncclUint8: the 2.18 fake has no type 10).
    #[test]
    fn fp8_moves_on_every_version_and_reduces_from_2_24_3() {
        let _one = serial();
        let path = fake("default");
        let c = comm(flavors(false, false), &path);
        assert!(!c.capabilities().fp8_reduce);
        let st = c.create_stream().unwrap();
        let x: Vec<F8E4M3> = (0..6).map(|i| F8E4M3::from_f32(i as f32)).collect();
        let mut a = c.alloc::<F8E4M3>(6).unwrap();
        a.copy_from_host(&x, &st).unwrap();
        let mut b = c.alloc::<F8E4M3>(6).unwrap();
        c.all_gather(&a, &mut b, &st).unwrap();
        assert_eq!(b.copy_to_host(&st).unwrap(), x);
        assert_eq!(last_type(&path), 1, "moved as ncclUint8");
        let e = c.all_reduce(&a, &mut b, ReduceOp::Sum, &st).unwrap_err();
        assert!(
            matches!(&e, Error::Unsupported { needs, .. } if needs.contains("2.24.3")),
            "{e}"
        );
        // NCCL 2.28: the reduction reaches the library with ncclFloat8e4m3.
        let path = fake("nccl228");
        let c = comm(flavors(false, false), &path);
        assert!(c.capabilities().fp8_reduce);
        let st = c.create_stream().unwrap();
        let mut a = c.alloc::<F8E4M3>(6).unwrap();
        a.copy_from_host(&x, &st).unwrap();
        let mut b = c.alloc::<F8E4M3>(6).unwrap();
        c.all_reduce(&a, &mut b, ReduceOp::Sum, &st).unwrap();
        assert_eq!(last_type(&path), 10);
        assert_eq!(b.copy_to_host(&st).unwrap(), x);
    }

    /// NCCL reduces fp8 on sm90 and newer only: on an Ampere GPU (sm80) NCCL 2.28 refuses it, in
    /// the words of the target rules the mock shares (`Target`), before the library is called.
    #[test]
    fn fp8_reductions_are_refused_below_sm90_naming_the_device() {
        let _one = serial();
        let path = fake("nccl228");
        COMPUTE.store(80, std::sync::atomic::Ordering::SeqCst);
        let c = comm(flavors(false, false), &path);
        COMPUTE.store(0, std::sync::atomic::Ordering::SeqCst);
        assert!(!c.capabilities().fp8_reduce);
        let st = c.create_stream().unwrap();
        let a = c.alloc::<F8E4M3>(4).unwrap();
        let mut b = c.alloc::<F8E4M3>(4).unwrap();
        let before = calls(&path, "ncclAllReduce");
        let e = c.all_reduce(&a, &mut b, ReduceOp::Sum, &st).unwrap_err();
        let want = unicomm_nccl_api::Target::nccl(c.capabilities().version, Some((8, 0)))
            .fp8_reduce()
            .unwrap_err();
        match (&e, &want) {
            (
                Error::Unsupported { what, needs, found },
                Error::Unsupported {
                    what: w, needs: n, ..
                },
            ) => {
                assert_eq!((what, needs), (w, n));
                assert!(
                    found.contains("sm80") && found.contains(&path.display().to_string()),
                    "{found}"
                );
            }
            _ => panic!("{e}"),
        }
        assert_eq!(
            calls(&path, "ncclAllReduce"),
            before,
            "refused before the library"
        );
        c.broadcast(&a, &mut b, 0, &st).unwrap();
    }

    /// RCCL's fp8 on MI300 is the FNUZ encoding: unicomm refuses its reductions rather than
    /// reinterpret the OCP values; moves work.
    #[test]
    fn rccl_refuses_fp8_reductions_naming_the_encoding() {
        let _one = serial();
        let path = fake("rccl-old");
        let c = comm(flavors(false, true), &path);
        let st = c.create_stream().unwrap();
        let mut a = c.alloc::<F8E4M3>(4).unwrap();
        let e = c
            .all_reduce_in_place(&mut a, ReduceOp::Max, &st)
            .unwrap_err()
            .to_string();
        assert!(e.contains("FNUZ"), "{e}");
        let mut b = c.alloc::<F8E4M3>(4).unwrap();
        c.broadcast(&a, &mut b, 0, &st).unwrap();
    }

    /// A pre-multiplied sum is an operator created on the communicator for the call and
    /// destroyed after it (ncclRedOpCreatePreMulSum with a host scalar, ncclRedOpDestroy).
    #[test]
    fn a_scaled_sum_creates_and_destroys_its_operator() {
        let _one = serial();
        let path = fake("nccl228");
        let c = comm(flavors(false, false), &path);
        let st = c.create_stream().unwrap();
        let mut a = c.alloc::<f32>(4).unwrap();
        a.copy_from_host(&[1.0, 2.0, 3.0, 4.0], &st).unwrap();
        let mut b = c.alloc::<f32>(4).unwrap();
        let (made, gone) = (
            calls(&path, "ncclRedOpCreatePreMulSum"),
            calls(&path, "ncclRedOpDestroy"),
        );
        c.all_reduce(&a, &mut b, ReduceOp::pre_mul_sum(0.5f32), &st)
            .unwrap();
        assert_eq!(b.copy_to_host(&st).unwrap(), vec![0.5, 1.0, 1.5, 2.0]);
        assert_eq!(calls(&path, "ncclRedOpCreatePreMulSum"), made + 1);
        assert_eq!(calls(&path, "ncclRedOpDestroy"), gone + 1);
    }

    /// A configuration field newer than the library is `Unsupported`, naming it and its
    /// release, before anything is created; one the library knows reaches it.
    #[test]
    fn config_fields_are_gated_by_version_and_reach_the_library() {
        let _one = serial();
        let path = fake("default");
        let api = Arc::new(Api::open(flavors(false, false), &path).unwrap());
        let name = CommConfig {
            comm_name: Some("tp".into()),
            ..CommConfig::default()
        };
        let inits = calls(&path, "ncclCommInitRank");
        let e = ApiComm::init_local_with(api.clone(), Arc::new(Host), &[0], &name).unwrap_err();
        assert!(
            e.to_string().contains("commName") && e.to_string().contains("2.27"),
            "{e}"
        );
        assert_eq!(
            calls(&path, "ncclCommInitRank"),
            inits,
            "nothing was created"
        );
        // A split with a too-new field fails the same way, before ncclCommSplit.
        let c = comm(flavors(false, false), &path);
        let splits = calls(&path, "ncclCommSplit");
        let e = c.split_with(Some(0), 0, &name).unwrap_err();
        assert!(matches!(e, Error::Unsupported { .. }), "{e}");
        assert_eq!(calls(&path, "ncclCommSplit"), splits);

        let path = fake("nccl228");
        let api = Arc::new(Api::open(flavors(false, false), &path).unwrap());
        let config = CommConfig {
            comm_name: Some("tensor-parallel".into()),
            max_ctas: Some(8),
            cta_policy: Some(CtaPolicy::Efficiency),
            ..CommConfig::default()
        };
        let before = calls(&path, "ncclCommInitRankConfig");
        let c = ApiComm::init_local_with(api, Arc::new(Host), &[0], &config).unwrap();
        assert_eq!(calls(&path, "ncclCommInitRankConfig"), before + 1);
        assert_eq!(last_config(&path), ("tensor-parallel".to_string(), 8));
        let c = Comm::from_backend(c.into_iter().next().unwrap());
        let child = c
            .split_with(
                Some(1),
                0,
                &CommConfig {
                    comm_name: Some("dp".into()),
                    ..CommConfig::default()
                },
            )
            .unwrap()
            .expect("a child");
        assert_eq!(last_config(&path).0, "dp");
        works(&child);
    }

    /// A stream waits for a marker of another stream (cudaStreamWaitEvent): the call reaches
    /// the runtime.
    #[test]
    fn a_stream_waits_for_another_streams_marker() {
        let _one = serial();
        let path = fake("nccl228");
        let c = comm(flavors(false, false), &path);
        let (a, b) = (c.create_stream().unwrap(), c.create_stream().unwrap());
        let m = a.record().unwrap();
        let before = common::EVENT_WAITS.load(std::sync::atomic::Ordering::SeqCst);
        b.wait(&m).unwrap();
        assert_eq!(
            common::EVENT_WAITS.load(std::sync::atomic::Ordering::SeqCst),
            before + 1
        );
        // A marker of another backend is refused.
        let mock = unicomm_core::Marker::new(Foreign);
        assert!(matches!(b.wait(&mock), Err(Error::InvalidArgument { .. })));
    }

    /// A child reaches its peers' memory where its parent does: its all-to-all into a window
    /// of its own takes the copy-engine path (the library's all-to-all never runs).
    #[test]
    fn a_child_takes_the_copy_engine_path_where_its_parent_can() {
        let _one = serial();
        let path = fake("nccl228");
        let c = comm(flavors(false, false), &path);
        let child = c.split(Some(0), 0).unwrap().expect("a child");
        assert!(child.capabilities().copy_engine);
        child.set_copy_engine(true).unwrap();
        let st = child.create_stream().unwrap();
        let mut send = child.alloc::<u32>(64).unwrap();
        send.copy_from_host(&(0..64).collect::<Vec<u32>>(), &st)
            .unwrap();
        let mut recv = child
            .register_window(child.alloc::<u32>(64).unwrap())
            .unwrap();
        let moves = common::library_moves(&path);
        child.all_to_all(&send, &mut recv, &st).unwrap();
        assert_eq!(
            recv.copy_to_host(&st).unwrap(),
            (0..64).collect::<Vec<u32>>()
        );
        assert_eq!(
            common::library_moves(&path),
            moves,
            "the library's all-to-all ran"
        );
        assert_eq!(child.backend().copy_engine_calls(), 1);
        child.deregister_window(recv).unwrap();
        child.finalize().unwrap();
    }
}
