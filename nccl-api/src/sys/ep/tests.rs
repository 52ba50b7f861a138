use std::mem::{offset_of, size_of};
use std::time::Duration;

use super::calls::EpSpec;
use super::*;
use unicomm_core::{DataType, Version};

/// Each structure's size is the header's frozen boundary (`NCCL_EP_*_V{1,2}_SIZE` of
/// nccl_ep.h, API version 2): a library reads the fields the size covers, so a size off by
/// a word would shift every field after it.
#[test]
fn the_structures_have_the_sizes_nccl_ep_h_freezes() {
    assert_eq!(size_of::<Tensor>(), 48);
    assert_eq!(size_of::<GroupConfig>(), 112);
    assert_eq!(size_of::<LayoutInfo>(), 48);
    assert_eq!(size_of::<Inputs>(), 32);
    assert_eq!(size_of::<DispatchOutputs>(), 40);
    assert_eq!(size_of::<CombineOutputs>(), 24);
    assert_eq!(size_of::<HandleConfig>(), 16);
}

/// The fields a misplaced padding would move: the group's V1 boundary ends at
/// `timeout_ns` (96 bytes), its allocator after `max_num_sms`, the tensor's data pointer
/// after four words.
#[test]
fn the_fields_sit_where_nccl_ep_h_puts_them() {
    assert_eq!(offset_of!(GroupConfig, rdma_buffer_size), 32);
    assert_eq!(offset_of!(GroupConfig, alloc), 56);
    assert_eq!(offset_of!(GroupConfig, enable_mask), 80);
    assert_eq!(offset_of!(GroupConfig, timeout_ns) + 8, 96);
    assert_eq!(offset_of!(GroupConfig, num_topk), 104);
    assert_eq!(offset_of!(Tensor, data), 16);
    assert_eq!(offset_of!(Tensor, sizes), 40);
    assert_eq!(offset_of!(LayoutInfo, recv_total_counter) + 8, 40);
}

/// `ncclEpGetVersion`'s code is `MAJOR*10000+MINOR*100+PATCH`; 0.1.0 and later 0.x
/// releases are taken, a 1.x (another ABI) and anything before 0.1.0 refused naming both.
#[test]
fn only_the_bound_releases_of_nccl_ep_are_taken() {
    assert_eq!(version_of_code(200), Version::new(0, 2, 0));
    assert_eq!(version_of_code(10203), Version::new(1, 2, 3));
    assert!(check_version(Version::new(0, 1, 0)).is_ok());
    assert!(check_version(Version::new(0, 2, 0)).is_ok());
    for v in [Version::new(0, 0, 9), Version::new(1, 0, 0)] {
        let e = check_version(v).unwrap_err().to_string();
        assert!(
            e.contains("NCCL EP 0.1.0") && e.contains(&v.to_string()),
            "{e}"
        );
    }
}

/// The group's configuration: the magic, size and API version first, the low-latency
/// algorithm, a token's bytes from the element type, the device wait from the
/// communicator's deadline; a capacity past the library's 32-bit word is refused.
#[test]
fn a_group_config_carries_the_capacities_or_refuses_them() {
    let spec = EpSpec {
        experts: 256,
        world: 8,
        max_tokens: 128,
        hidden: 7168,
        top_k: 8,
        dtype: DataType::Bf16,
        timeout: Duration::from_secs(3),
    };
    let c = spec.config().unwrap();
    assert_eq!((c.size, c.magic, c.version), (112, MAGIC, API_VERSION));
    assert_eq!(c.algorithm, ALGO_LOW_LATENCY);
    assert_eq!(c.max_token_bytes, 7168 * 2);
    assert_eq!(
        (c.num_experts, c.max_dispatch_tokens_per_rank, c.num_topk),
        (256, 128, 8)
    );
    assert_eq!(c.timeout_ns, 3_000_000_000);
    assert_eq!(spec.local(), 32);
    let big = EpSpec {
        max_tokens: 1 << 33,
        ..spec
    };
    let e = big.config().unwrap_err().to_string();
    assert!(e.contains("max_tokens"), "{e}");
}

/// The JIT's folder, then the wheel's, for the driver's CUDA major: `cu13` from 13, `cu12`
/// below or unknown; the variable names the library first.
#[test]
fn the_wheels_folder_follows_the_drivers_cuda_major() {
    let s = search(Some(13));
    assert_eq!(s.env_var, EP_LIBRARY_VAR);
    assert!(s.names.contains(&"libnccl_ep.so"));
    let dir = std::env::temp_dir().join(format!("unicomm-ep-{}", std::process::id()));
    for cu in ["cu12", "cu13"] {
        std::fs::create_dir_all(
            dir.join("lib/python3.11/site-packages/nccl/ep/lib")
                .join(cu),
        )
        .unwrap();
    }
    std::env::set_var("VIRTUAL_ENV", &dir);
    std::env::set_var("NCCL_EP_HOME", "/opt/ep");
    let (s13, s12, none) = (search(Some(13)), search(Some(12)), search(None));
    std::env::remove_var("VIRTUAL_ENV");
    std::env::remove_var("NCCL_EP_HOME");
    assert_eq!(s13.dirs[0], std::path::Path::new("/opt/ep/lib/cu13"));
    let _ = std::fs::remove_dir_all(&dir);
    assert!(
        s13.dirs.iter().any(|d| d.ends_with("nccl/ep/lib/cu13")),
        "{:?}",
        s13.dirs
    );
    assert!(
        s12.dirs.iter().any(|d| d.ends_with("nccl/ep/lib/cu12")),
        "{:?}",
        s12.dirs
    );
    assert!(
        none.dirs.iter().all(|d| !d.ends_with("cu13")),
        "{:?}",
        none.dirs
    );
}

/// The JIT's headers are found beside a wheel's library (`nccl/ep/include/nccl_ep`), and
/// nowhere for a library elsewhere.
#[test]
fn the_jit_home_is_the_wheels_folder_of_the_library() {
    let dir = std::env::temp_dir().join(format!("unicomm-ep-home-{}", std::process::id()));
    std::fs::create_dir_all(dir.join("ep/include/nccl_ep")).unwrap();
    std::fs::create_dir_all(dir.join("ep/lib/cu13")).unwrap();
    let lib = dir.join("ep/lib/cu13/libnccl_ep.so");
    let home = jit_home(lib.to_str().unwrap());
    let elsewhere = jit_home("/usr/lib/libnccl_ep.so");
    let _ = std::fs::remove_dir_all(&dir);
    assert_eq!(home, Some(dir.join("ep")));
    assert_eq!(elsewhere, None);
}
