//! NCCL's device API on the GPU: a device communicator in the loaded library's runtime
//! layout (its size the library's `devCommRuntimeVersionSize`, its header NCCL's magic and
//! version), and unicomm's one-shot all-reduce written against the device API
//! (backend-nccl/kernels/device_api.cu, built against NCCL 2.32.3's headers) exact over
//! f32, bf16 and f16 by sum, max and min, eagerly and over 1,000 graph replays. A library
//! before the device API's release is `Unsupported` naming it, never a silent pass. One
//! communicator per GPU here; two processes on one GPU run the same suite through
//! `rank_conformance` (NCCL's multi-rank mode).
#![cfg(feature = "nccl")]

use unicomm_core::{bf16, f16, DeviceCommRequirements, Error, Result, Version};
use unicomm_gpu_tests::{self as t, GPU};
use unicomm_nccl::device_kernel_requirements;

/// The release the kernel's headers are (nccl-api's `DEVICE_KERNEL_HEADERS`).
const KERNEL_HEADERS: Version = Version::new(2, 32, 3);
/// The device API's runtime-version mode.
const RUNTIME_LAYOUT: Version = Version::new(2, 31, 2);

fn refused_naming<T: std::fmt::Debug>(r: Result<T>, release: Version) {
    match r {
        Err(Error::Unsupported { needs, .. }) => {
            assert!(needs.contains(&release.to_string()), "{needs}")
        }
        other => panic!("expected Unsupported naming {release}: {other:?}"),
    }
}

#[test]
fn a_device_communicator_in_the_runtime_layout_is_the_library_s() -> Result<()> {
    let cs = GPU.comms(1)?;
    let c = &cs[0];
    let v = c.capabilities().version;
    let r = c.device_comm(&DeviceCommRequirements::runtime(4));
    if v < RUNTIME_LAYOUT {
        refused_naming(r, RUNTIME_LAYOUT);
        return Ok(());
    }
    let dc = r?;
    let b = dc.kernel_arg();
    println!(
        "device communicator: {} bytes, layout {}",
        b.len(),
        dc.layout_version()
    );
    assert!(b.len() >= 64, "{} bytes", b.len());
    assert_eq!(
        b[..4],
        0xcafe_beef_u32.to_ne_bytes(),
        "NCCL's magic heads it"
    );
    let code = v.major * 10000 + v.minor * 100 + v.patch;
    assert_eq!(b[4..8], code.to_ne_bytes(), "the runtime version's layout");
    assert_eq!(dc.world_team().ranks, 1);
    assert_eq!(dc.lsa_team().ranks, 1);
    Ok(())
}

#[test]
fn the_device_api_kernel_is_exact_eagerly_and_over_a_thousand_replays() -> Result<()> {
    let cs = GPU.comms(t::world()?)?;
    let v = cs[0].capabilities().version;
    let reqs = device_kernel_requirements(4);
    if v < KERNEL_HEADERS {
        // NCCL refuses device code built against a release newer than itself.
        refused_naming(cs[0].device_comm(&reqs), KERNEL_HEADERS);
        return Ok(());
    }
    let seen = unicomm_conformance::device_api_all_reduce::<f32, _>(&cs, 4099, 1000, &reqs)?;
    assert!(
        seen.iter().all(|&s| s),
        "the device API refused on NCCL {v}: {seen:?}"
    );
    let seen = unicomm_conformance::device_api_all_reduce::<bf16, _>(&cs, 1024, 100, &reqs)?;
    assert!(seen.iter().all(|&s| s), "{seen:?}");
    let seen = unicomm_conformance::device_api_all_reduce::<f16, _>(&cs, 7, 100, &reqs)?;
    assert!(seen.iter().all(|&s| s), "{seen:?}");
    Ok(())
}
