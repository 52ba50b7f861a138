//! The flight recorder names a dispatch a rank is stuck in: ranks 0 and 1 wait in an expert
//! dispatch that rank 2 never makes; their rings show it pending, and their dumps at the
//! deadline name it. Alone in its binary: it sets the recorder's variables.

use std::time::Duration;

use unicomm_core::{each_rank, DeviceStream, ExpertConfig, ExpertTokens};
use unicomm_mock::{local_comms_with, MockConfig};

#[test]
fn a_rank_stuck_in_a_dispatch_is_named_by_the_flight_recorder() {
    let dir = std::env::temp_dir().join(format!("unicomm-mock-flight-ep-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::env::set_var("UNICOMM_FLIGHT_DIR", &dir);
    std::env::set_var("UNICOMM_FLIGHT_COMPLETION", "1");
    let config = MockConfig {
        timeout: Duration::from_millis(300),
        ..MockConfig::default()
    };
    let comms = local_comms_with(3, config).unwrap();
    let cfg = ExpertConfig {
        experts: 3,
        max_tokens: 2,
        hidden: 4,
        top_k: 1,
    };
    let records = each_rank(comms, |c| -> unicomm_core::Result<String> {
        let st = c.create_stream()?;
        let g = c.expert_group::<f32>(cfg)?;
        let (tokens, ids) = (c.upload(&[1.0f32; 8], &st)?, c.upload(&[0i32, 1], &st)?);
        let (mut out, mut counts) = (c.alloc::<f32>(g.received_len())?, c.alloc::<i32>(1)?);
        if c.rank() == 2 {
            // Rank 2 never dispatches.
            std::thread::sleep(Duration::from_millis(600));
            return Ok(c.flight_record("on demand").unwrap_or_default());
        }
        let o = ExpertTokens {
            tokens: &mut out,
            counts: &mut counts,
        };
        g.dispatch(&tokens, &ids, o, &st)?;
        std::thread::sleep(Duration::from_millis(100));
        let rec = c.flight_record("while stuck").unwrap_or_default();
        assert!(st.synchronize().is_err());
        Ok(rec)
    })
    .unwrap();
    for rec in &records[..2] {
        let last = rec.rsplit("\"seq\":").next().unwrap_or("");
        assert!(
            last.contains("expert_dispatch") && last.contains("\"state\":\"pending\""),
            "{rec}"
        );
    }
    assert!(!records[2].contains("expert_dispatch"), "{}", records[2]);
    let dump = std::fs::read_to_string(dir.join("unicomm-flight.world.rank0.json")).unwrap();
    assert!(
        dump.contains("expert_dispatch") && dump.contains("timed out"),
        "{dump}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
