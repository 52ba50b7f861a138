//! Collective registrations inside `Comm::group` are refused on NCCL/RCCL (NCCL would defer
//! them to the group's end and write their out-parameter after the call returned); before
//! and after the group they work. The mock accepts them (docs/reliability.md).

use crate::common::{comm, fake, flavors};
use unicomm_core::Error;

isolated! {
    #[test]
    fn window_and_automatic_registration_inside_a_group_are_refused() {
        let path = fake("nccl228");
        let c = comm(flavors(false, false), &path);
        let in_group = c
            .group(|| {
                let w = c
                    .register_window(c.alloc::<f32>(64)?)
                    .map_err(|e| e.error)?;
                c.deregister_window(w).map(|_| ())
            })
            .expect_err("refused inside a group");
        assert!(
            matches!(&in_group, Error::InvalidArgument { .. }),
            "{in_group}"
        );
        assert!(
            in_group.to_string().contains("inside Comm::group"),
            "{in_group}"
        );
        let auto = c
            .group(|| {
                c.register_auto(c.alloc::<f32>(64)?)
                    .map(|_| ())
                    .map_err(|e| e.error)
            })
            .expect_err("refused inside a group");
        assert!(matches!(auto, Error::InvalidArgument { .. }), "{auto}");
        // Outside the group both work, and the group itself still works.
        let w = c.register_window(c.alloc::<f32>(64).unwrap()).unwrap();
        c.deregister_window(w).unwrap();
        let a = c.register_auto(c.alloc::<f32>(64).unwrap()).unwrap();
        c.deregister_auto(a).unwrap();
        c.group(|| Ok(())).unwrap();
    }
}
