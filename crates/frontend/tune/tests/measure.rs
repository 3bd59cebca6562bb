//! A whole run of the library on in-memory members: the chunks are
//! visited up, then down; every stage reaches the observer; each value is
//! the best of the rounds; the recommendation is the rule's on the values
//! the outcome reports; the text and the JSON carry them.

use nvraid_bench::cli::Engine;
use nvraid_bench::RunContext;
use nvraid_tune::{recommend, Observer, Plan, Position, Request, Stage};
use std::time::Duration;

/// Records what the run told it.
#[derive(Default)]
struct Log {
    created: Vec<(u32, u64)>,
    filled: Vec<u64>,
    steps: u32,
    measured: Duration,
    chunks: u32,
}

impl Observer for Log {
    fn stage(&mut self, at: &Position, stage: Stage<'_>) {
        match stage {
            Stage::Creating => self.created.push((at.round, at.chunk_bytes)),
            Stage::Filling { bytes } => self.filled.push(bytes),
            Stage::Measuring(_) => panic!("not asked for"),
        }
    }
    fn step_done(&mut self, measured: Duration) {
        self.steps += 1;
        self.measured += measured;
    }
    fn chunk_done(&mut self) {
        self.chunks += 1;
    }
}

#[test]
fn a_run_on_memory_members() {
    const K: u64 = 1024;
    let plan = Plan::new(Request {
        members: vec!["mem:16M".into(); 3],
        level: "5".into(),
        workload: "rw=randread,bs=4k,iodepth=4".into(),
        chunks: Some("64k,16k".into()),
        noise_pct: 10.0,
        rounds: 2,
        runtime: Duration::from_millis(20),
        ramp: Duration::ZERO,
        size_bytes: 4 << 20,
        destructive: false,
        engine: Engine::Auto,
        direct: false,
    })
    .unwrap();
    let mut log = Log::default();
    let outcome = plan.measure(&mut log).unwrap();

    assert_eq!(
        log.created,
        [(1, 16 * K), (1, 64 * K), (2, 64 * K), (2, 16 * K)]
    );
    // mem: members are new each time: every array is filled, the first
    // with a stripe of the largest chunk (3 x 64K) to spare.
    assert_eq!(log.filled, [(4 << 20) + 192 * K, 4 << 20, 4 << 20, 4 << 20]);
    assert_eq!((log.steps, log.chunks), (4, 4));
    assert_eq!(log.measured, plan.measuring_time());

    let chunks: Vec<u64> = outcome.runs.iter().map(|r| r.chunk_bytes).collect();
    assert_eq!(chunks, [16 * K, 64 * K]);
    let keys: Vec<String> = outcome.metrics.iter().map(|m| m.key.clone()).collect();
    assert_eq!(keys, ["RND4K Q4T1 read"]);
    for (run, row) in outcome.runs.iter().zip(&outcome.values) {
        assert_eq!(run.report.steps.len(), 1);
        assert_eq!(run.report.steps[0].runs, 2, "best of 2 rounds");
        let result = run.report.steps[0].result.as_ref().unwrap();
        assert_eq!(row, &[result.total_iops()]);
        assert!(row[0] > 0.0, "{row:?}");
        assert_eq!(
            run.report.context.subject,
            format!(
                "raid5, 3 members, chunk {} KiB: mem:16M, mem:16M, mem:16M",
                run.chunk_bytes / K
            )
        );
    }
    assert_eq!(
        outcome.recommendation,
        recommend(&chunks, &keys, &outcome.values, 10.0)
    );

    let mut text = Vec::new();
    nvraid_tune::report::write_text(&mut text, &plan, &outcome).unwrap();
    let text = String::from_utf8(text).unwrap();
    assert!(
        text.starts_with(
            "nvraid tune: raid5, 3 members: mem:16M, mem:16M, mem:16M; workload \
             rw=randread,bs=4k,iodepth=4,numjobs=1; 4 MiB of each array, best of 2 runs of \
             20ms per step, no ramp\n"
        ),
        "{text}"
    );
    assert!(
        text.contains(&format!("\nReason: {}\n", outcome.recommendation.reason)),
        "{text}"
    );

    let doc = nvraid_tune::report::to_json(&RunContext::here(plan.subject()), &plan, &outcome);
    assert_eq!(doc["schema"], "nvraid-tune/1");
    assert_eq!(doc["level"], "raid5");
    assert_eq!(doc["chunks"][1]["chunk_bytes"], 64 * K);
    assert_eq!(
        doc["chunks"][1]["values"]["RND4K Q4T1 read"],
        outcome.values[1][0]
    );
    assert_eq!(
        doc["recommendation"]["chunk_bytes"],
        outcome.recommendation.chunk_bytes
    );
}
