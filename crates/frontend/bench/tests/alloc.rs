//! The per-I/O path does not allocate: a job that does several times more
//! I/O makes (about) the same number of allocations. Its own test binary,
//! because the counting allocator sees every thread of the process.

use std::sync::Arc;
use std::time::Duration;

use nvraid_bench::{run_job, JobSpec, RwMode};
use nvraid_io::queue::Target;
use nvraid_testing::alloc::allocations;
use nvraid_testing::{CountingAllocator, MemTarget};

#[global_allocator]
static GLOBAL: CountingAllocator = CountingAllocator;

/// Allocations made by one run of `rw` lasting `runtime`, and its I/O count.
fn allocations_for(rw: RwMode, runtime: Duration) -> (u64, u64) {
    let target: Arc<dyn Target> = Arc::new(MemTarget::null(64 << 20));
    let mut job = JobSpec::new(rw);
    job.iodepth = 8;
    job.numjobs = 2;
    job.runtime = runtime;
    job.ramp = Duration::from_millis(20);
    let before = allocations();
    let result = run_job(&job, &[target], None).unwrap();
    let after = allocations();
    (after - before, result.read.ios + result.write.ios)
}

#[test]
fn allocations_do_not_grow_with_io_count() {
    for rw in [RwMode::Randread, RwMode::Randrw, RwMode::Write] {
        let (short_allocs, short_ios) = allocations_for(rw, Duration::from_millis(50));
        let (long_allocs, long_ios) = allocations_for(rw, Duration::from_millis(250));
        assert!(
            long_ios > short_ios + 1000,
            "{rw}: {short_ios} vs {long_ios} I/Os"
        );
        assert!(
            long_allocs.abs_diff(short_allocs) <= 16,
            "{rw}: {short_allocs} allocations for {short_ios} I/Os, {long_allocs} for {long_ios}"
        );
    }
}
