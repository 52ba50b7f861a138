//! The flight recorder on the mock's threads: each rank's ring of its operations (numbered
//! alike on every rank), completion tracked by markers, and the dump every rank writes at
//! its first failure (a rank that skipped an all-reduce times the others out). Alone in its
//! binary: it sets the recorder's variables.

use std::time::Duration;

use unicomm_core::{each_rank, DeviceStream, ReduceOp};
use unicomm_mock::{local_comms_with, MockConfig};

#[test]
fn every_rank_dumps_its_ring_at_the_first_failure_with_completion_states() {
    let dir = std::env::temp_dir().join(format!("unicomm-mock-flight-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::env::set_var("UNICOMM_FLIGHT_DIR", &dir);
    std::env::set_var("UNICOMM_FLIGHT_COMPLETION", "1");
    let comms = local_comms_with(
        3,
        MockConfig {
            timeout: Duration::from_millis(300),
            ..MockConfig::default()
        },
    )
    .unwrap();
    let records = each_rank(comms, |c| -> unicomm_core::Result<String> {
        let st = c.create_stream()?;
        let mut b = c.alloc::<f32>(16)?;
        for _ in 0..2 {
            c.all_reduce_in_place(&mut b, ReduceOp::Sum, &st)?;
        }
        st.synchronize()?;
        if c.rank() == 2 {
            // Rank 2 skips the next one.
            std::thread::sleep(Duration::from_millis(600));
            return Ok(c.flight_record("on demand").unwrap_or_default());
        }
        c.all_reduce_in_place(&mut b, ReduceOp::Max, &st)?;
        // While it waits for rank 2: the stream has not passed it.
        std::thread::sleep(Duration::from_millis(100));
        let rec = c.flight_record("while stuck").unwrap_or_default();
        assert!(st.synchronize().is_err());
        Ok(rec)
    })
    .unwrap();
    for (r, rec) in records.iter().enumerate() {
        let n = if r == 2 { 2 } else { 3 };
        assert!(
            rec.contains(&format!("\"next_seq\":{n}")),
            "rank {r}: {rec}"
        );
        assert!(
            rec.contains("\"seq\":1,") && rec.contains("\"state\":\"passed\""),
            "rank {r}: {rec}"
        );
        if r != 2 {
            let stuck = rec.split("\"seq\":2,").nth(1).unwrap_or("");
            assert!(
                stuck.contains("\"op\":\"max\"") && stuck.contains("\"state\":\"pending\""),
                "rank {r}: {rec}"
            );
        }
    }
    // Ranks 0 and 1 failed (the deadline) and dumped; rank 2 never failed.
    for r in 0..3 {
        let p = dir.join(format!("unicomm-flight.world.rank{r}.json"));
        assert_eq!(p.exists(), r != 2, "{p:?}");
    }
    let dump = std::fs::read_to_string(dir.join("unicomm-flight.world.rank0.json")).unwrap();
    assert!(dump.contains("\"reason\":\"timed out"), "{dump}");
    let _ = std::fs::remove_dir_all(&dir);
}
