//! What a newcomer reached for and found: an MoE dispatch and combine in one call each,
//! uploading host data in one call, reading a buffer back into memory of their own.

use unicomm_core::{each_rank, Error};

// Rank r sends p + r + 1 elements to peer p (values naming r, p and the index): the counts
// each rank receives and the packed data are what the senders meant, and the combine
// (the same call with the received counts) brings every element home.
#[test]
fn an_moe_dispatch_and_combine_take_one_call_each() {
    let comms = unicomm_mock::local_comms(3).unwrap();
    each_rank(&comms, |c| {
        let (r, w) = (c.rank(), c.world_size());
        let st = c.create_stream()?;
        let counts: Vec<usize> = (0..w).map(|p| p + r + 1).collect();
        let data: Vec<f32> = (0..w)
            .flat_map(|p| (0..counts[p]).map(move |i| (100 * r + 10 * p + i) as f32))
            .collect();
        let send = c.upload(&data, &st)?;
        let (got, from) = c.all_to_all_v_packed(&send, &counts, &st)?;
        assert_eq!(from, (0..w).map(|p| r + p + 1).collect::<Vec<_>>());
        let want: Vec<f32> = (0..w)
            .flat_map(|p| (0..from[p]).map(move |i| (100 * p + 10 * r + i) as f32))
            .collect();
        assert_eq!(got.copy_to_host(&st)?, want);
        let (back, sent) = c.all_to_all_v_packed(&got, &from, &st)?;
        assert_eq!(sent, counts);
        assert_eq!(back.copy_to_host(&st)?, data);
        Ok::<_, Error>(())
    })
    .unwrap();
    let c = &comms[0];
    assert!(matches!(
        c.all_to_all_v_packed(
            &c.alloc::<f32>(1).unwrap(),
            &[1],
            &c.create_stream().unwrap()
        ),
        Err(Error::InvalidArgument { .. })
    ));
}

#[test]
fn a_buffer_is_uploaded_in_one_call_and_read_back_into_the_callers_memory() {
    let c = &unicomm_mock::local_comms(1).unwrap()[0];
    let st = c.create_stream().unwrap();
    let b = c.upload(&[1.5f32, 2.5, 3.5], &st).unwrap();
    let mut out = [0f32; 3];
    b.copy_to_host_into(&mut out, &st).unwrap();
    assert_eq!(out, [1.5, 2.5, 3.5]);
    let mut short = [0f32; 2];
    assert!(matches!(
        b.copy_to_host_into(&mut short, &st),
        Err(Error::InvalidArgument { .. })
    ));
}

// A scaled sum whose scalar is typed as the elements: 0.5 x (1 + 2 + 3) on three ranks.
#[test]
fn a_scaled_sum_takes_a_scalar_of_the_elements_type() {
    let comms = unicomm_mock::local_comms(3).unwrap();
    let out = each_rank(&comms, |c| {
        let st = c.create_stream()?;
        let send = c.upload(&[(c.rank() + 1) as f32; 4], &st)?;
        let mut recv = c.alloc::<f32>(4)?;
        c.all_reduce_scaled(&send, &mut recv, 0.5f32, &st)?;
        recv.copy_to_host(&st)
    })
    .unwrap();
    assert!(out.iter().all(|v| v == &vec![3.0f32; 4]), "{out:?}");
}

/// A device-to-device copy in stream order: after the work before it, before the work
/// after it, the host not waiting; a part of a buffer into another, and within one buffer
/// (the ranges overlapping).
#[test]
fn a_device_copy_runs_in_stream_order() {
    let comms = unicomm_mock::local_comms(2).unwrap();
    each_rank(&comms, |c| {
        let st = c.create_stream()?;
        let a = c.upload(&[1.0f32, 2.0, 3.0, 4.0], &st)?;
        let mut b = c.alloc::<f32>(4)?;
        b.copy_from_host(&[0.0; 4], &st)?;
        c.copy(&a.slice(1..3)?, &mut b.slice_mut(..2)?, &st)?;
        // The collective after the copy sees the copied elements (2 ranks: doubled).
        c.all_reduce_in_place(&mut b, unicomm_core::ReduceOp::Sum, &st)?;
        assert_eq!(b.copy_to_host(&st)?, vec![4.0, 6.0, 0.0, 0.0]);
        let mut a = a;
        c.copy(&a.slice(..3)?, &mut b.slice_mut(1..)?, &st)?;
        assert_eq!(b.copy_to_host(&st)?, vec![4.0, 1.0, 2.0, 3.0]);
        c.copy(&b, &mut a, &st)?;
        assert_eq!(a.copy_to_host(&st)?, vec![4.0, 1.0, 2.0, 3.0]);
        let e = c.copy(&b.slice(..2)?, &mut a, &st).unwrap_err();
        assert!(
            e.to_string().contains("holds 4 elements, the source 2"),
            "{e}"
        );
        Ok::<_, Error>(())
    })
    .unwrap();
}

/// A host function (an engine's own step) runs in stream order: after the collective
/// before it, before the work after it; `synchronize` waits for it; a panic in it is the
/// stream's error, not a crash of the worker.
#[test]
fn a_host_function_runs_in_stream_order() {
    use std::sync::{Arc, Mutex};
    use unicomm_core::DeviceStream;
    let comms = unicomm_mock::local_comms(2).unwrap();
    each_rank(&comms, |c| {
        let st = c.create_stream()?;
        let log = Arc::new(Mutex::new(Vec::new()));
        let mut b = c.upload(&[1.0f32; 4], &st)?;
        let l = log.clone();
        st.launch_host_fn(Box::new(move || {
            std::thread::sleep(std::time::Duration::from_millis(50));
            l.lock().unwrap().push("before");
        }))?;
        c.all_reduce_in_place(&mut b, unicomm_core::ReduceOp::Sum, &st)?;
        let l = log.clone();
        st.launch_host_fn(Box::new(move || l.lock().unwrap().push("after")))?;
        st.synchronize()?;
        assert_eq!(*log.lock().unwrap(), ["before", "after"]);
        assert_eq!(b.copy_to_host(&st)?, vec![2.0; 4]);
        st.launch_host_fn(Box::new(|| panic!("an engine's step failed")))?;
        let e = st.synchronize().unwrap_err();
        assert!(e.to_string().contains("panicked"), "{e}");
        Ok::<_, Error>(())
    })
    .unwrap();
}
