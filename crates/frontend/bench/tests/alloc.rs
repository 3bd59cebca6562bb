//! The per-I/O path does not allocate: a job that does several times more
//! I/O makes (about) the same number of allocations. Its own test binary,
//! because the counting allocator sees every thread of the process.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use nvraid_bench::{run_job, JobSpec, RwMode};
use nvraid_io::queue::Target;
use nvraid_testing::MemTarget;

struct Counting;

static ALLOCATIONS: AtomicU64 = AtomicU64::new(0);

// SAFETY: forwards to the system allocator unchanged; only counts calls.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: same contract as the caller's.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: same contract as the caller's.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: same contract as the caller's.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

/// Allocations made by one run of `rw` lasting `runtime`, and its I/O count.
fn allocations_for(rw: RwMode, runtime: Duration) -> (u64, u64) {
    let target: Arc<dyn Target> = Arc::new(MemTarget::null(64 << 20));
    let mut job = JobSpec::new(rw);
    job.iodepth = 8;
    job.numjobs = 2;
    job.runtime = runtime;
    job.ramp = Duration::from_millis(20);
    let before = ALLOCATIONS.load(Ordering::Relaxed);
    let result = run_job(&job, &[target], None).unwrap();
    let after = ALLOCATIONS.load(Ordering::Relaxed);
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
