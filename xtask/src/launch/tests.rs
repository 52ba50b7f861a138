//! The launcher's behaviour, on `sh` scripts as ranks.
use super::*;

fn sh(script: &str) -> Vec<String> {
    vec!["-c".into(), script.into()]
}

fn job(n: usize, timeout: Duration, share_gpu: bool, expect_lost: &[usize]) -> Job<'_> {
    Job {
        n,
        timeout,
        share_gpu,
        expect_lost,
        env: &[],
    }
}

#[test]
fn a_rank_expected_to_be_lost_does_not_stop_the_others() {
    // Rank 1 kills itself; the others finish their work after it and succeed.
    let t = Instant::now();
    run(
        Path::new("sh"),
        &sh(r#"if [ "$RANK" = 1 ]; then kill -KILL $$; fi; sleep 1; exit 0"#),
        &job(3, Duration::from_secs(60), false, &[1]),
    )
    .unwrap();
    assert!(t.elapsed() >= Duration::from_secs(1));
    // Another rank's failure still stops the job.
    let e = run(
        Path::new("sh"),
        &sh(r#"if [ "$RANK" = 2 ]; then exit 5; fi; sleep 60"#),
        &job(3, Duration::from_secs(60), false, &[1]),
    )
    .unwrap_err();
    assert_eq!(e.downcast_ref::<Failed>().map(|f| f.code), Some(5));
}

#[test]
fn every_rank_gets_its_variables_and_success_is_success() {
    let script = r#"[ "$WORLD_SIZE" = 3 ] && [ "$LOCAL_RANK" = "$RANK" ] && [ -n "$MASTER_PORT" ] && [ -n "$UNICOMM_RENDEZVOUS_TOKEN" ]"#;
    run(
        Path::new("sh"),
        &sh(script),
        &job(3, Duration::from_secs(30), false, &[]),
    )
    .unwrap();
}

#[test]
fn shared_gpu_ranks_are_on_gpu_0_each_with_a_host_id_of_its_own() {
    // Each rank writes its host id to a file named by its rank; the ids must differ.
    let dir = std::env::temp_dir().join(format!("xtask-share-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let script = format!(
        r#"[ "$LOCAL_RANK" = 0 ] && [ "$WORLD_SIZE" = 3 ] && [ -n "$NCCL_HOSTID" ] && printf %s "$NCCL_HOSTID" > {}/$RANK"#,
        dir.display()
    );
    run(
        Path::new("sh"),
        &sh(&script),
        &job(3, Duration::from_secs(30), true, &[]),
    )
    .unwrap();
    let ids: std::collections::BTreeSet<String> = (0..3)
        .map(|r| std::fs::read_to_string(dir.join(r.to_string())).unwrap())
        .collect();
    let _ = std::fs::remove_dir_all(&dir);
    assert_eq!(ids.len(), 3, "{ids:?}");
}

#[test]
fn the_first_failure_stops_the_others_and_gives_its_code() {
    let t = Instant::now();
    let e = run(
        Path::new("sh"),
        &sh(r#"if [ "$RANK" = 1 ]; then sleep 0.2; exit 3; fi; sleep 60"#),
        &job(3, Duration::from_secs(120), false, &[]),
    )
    .unwrap_err();
    let f = e.downcast_ref::<Failed>().expect("a rank's failure");
    assert_eq!((f.rank, f.code), (1, 3));
    // The sleeping ranks were stopped (SIGTERM), not waited for.
    assert!(t.elapsed() < Duration::from_secs(20), "{:?}", t.elapsed());
}

#[test]
fn ranks_past_the_deadline_are_stopped() {
    let e = run(
        Path::new("sh"),
        &sh("sleep 60"),
        &job(2, Duration::from_secs(1), false, &[]),
    )
    .unwrap_err();
    assert_eq!(e.downcast_ref::<Failed>().map(|f| f.code), Some(124));
}

#[test]
fn a_line_that_is_not_utf8_or_has_no_end_does_not_break_the_rank() {
    // Once the launcher stopped reading at such a line, the rank died of SIGPIPE (141) at
    // its next write.
    run(
        Path::new("sh"),
        &sh(r#"printf '\377\376 not utf-8\n'; sleep 0.2; echo after; head -c 3000000 /dev/zero | tr '\0' a; echo; echo end"#),
        &job(2, Duration::from_secs(60), false, &[]),
    )
    .unwrap();
}

/// Whether process `pid` still runs (a zombie that no init reaped does not).
fn alive(pid: &str) -> bool {
    std::fs::read_to_string(format!("/proc/{}/stat", pid.trim()))
        .ok()
        .and_then(|st| st.rsplit_once(") ").map(|(_, rest)| rest.starts_with('Z')))
        .is_some_and(|zombie| !zombie)
}

#[test]
fn what_a_rank_started_stops_with_it_and_the_deadline_holds() {
    let dir = std::env::temp_dir().join(format!("xtask-children-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    // Every rank leaves a child behind; rank 1 then fails, the others would sleep on.
    let script = format!(
        r#"sleep 300 & echo $! > {}/$RANK; if [ "$RANK" = 1 ]; then sleep 0.3; exit 3; fi; sleep 60"#,
        dir.display()
    );
    let t = Instant::now();
    let e = run(
        Path::new("sh"),
        &sh(&script),
        &job(3, Duration::from_secs(60), false, &[]),
    )
    .unwrap_err();
    assert_eq!(e.downcast_ref::<Failed>().map(|f| f.code), Some(3));
    assert!(t.elapsed() < Duration::from_secs(4), "{:?}", t.elapsed());
    for r in 0..3 {
        let pid = std::fs::read_to_string(dir.join(r.to_string())).unwrap();
        assert!(!alive(&pid), "rank {r}'s child {pid} still runs");
    }
    // A grandchild holding the pipes once added 2 s past a 1 s deadline.
    let t = Instant::now();
    let e = run(
        Path::new("sh"),
        &sh("sleep 60 & sleep 60"),
        &job(2, Duration::from_secs(1), false, &[]),
    )
    .unwrap_err();
    assert_eq!(e.downcast_ref::<Failed>().map(|f| f.code), Some(124));
    assert!(
        t.elapsed() < Duration::from_millis(2500),
        "{:?}",
        t.elapsed()
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_signal_to_the_launcher_stops_every_rank_and_what_they_started() {
    let dir = std::env::temp_dir().join(format!("xtask-signal-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let script = format!(
        r#"sleep 300 & echo $! > {}/$RANK; sleep 300"#,
        dir.display()
    );
    let stop = Stop(Arc::new(AtomicI32::new(0)));
    let flag = stop.0.clone();
    let t = Instant::now();
    let e = std::thread::scope(|s| {
        s.spawn(move || {
            std::thread::sleep(Duration::from_millis(400));
            flag.store(libc::SIGTERM, Ordering::SeqCst);
        });
        run_until(
            Path::new("sh"),
            &sh(&script),
            &job(2, Duration::from_secs(120), false, &[]),
            &stop,
        )
        .unwrap_err()
    });
    assert_eq!(
        e.downcast_ref::<Failed>().map(|f| f.code),
        Some(128 + libc::SIGTERM)
    );
    assert!(t.elapsed() < Duration::from_secs(4), "{:?}", t.elapsed());
    for r in 0..2 {
        let pid = std::fs::read_to_string(dir.join(r.to_string())).unwrap();
        assert!(!alive(&pid), "rank {r}'s child {pid} still runs");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// `--timeout-s 18446744073709551615`: a deadline too far to represent is no deadline, not
/// a panic (an `Instant` overflow at the end of the run).
#[test]
fn a_deadline_too_far_to_represent_runs_the_job_to_its_end() {
    run(
        Path::new("sh"),
        &sh("exit 0"),
        &job(2, Duration::from_secs(u64::MAX), false, &[]),
    )
    .unwrap();
}
