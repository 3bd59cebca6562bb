//! The runner: worker threads that keep every queue full and measure.
//!
//! For a job with `numjobs` workers on `T` targets, each worker opens one
//! [`Queue`] per target with `iodepth` slots and keeps `iodepth` I/Os in
//! flight *in total*, handing each new I/O to the next target in turn
//! (round-robin per I/O, fio's default `file_service_type=roundrobin`).
//! With one target this is exactly fio's single-file job.
//!
//! How it measures (the same way fio does):
//! - completion latency (fio's `clat`) runs from the `submit` call to the
//!   reap that returned the completion; one clock read per reap batch, as
//!   fio does;
//! - the ramp runs the workload but counts nothing; measuring covers the
//!   completions reaped in `[ramp end, ramp end + runtime)`, and rates are
//!   divided by `runtime`; I/Os still in flight at the end are drained and not
//!   counted (fio's `time_based=1`);
//! - random offsets are drawn uniformly, with replacement, from the
//!   bs-aligned blocks of the region (fio's `norandommap=1`);
//! - sequential workers each walk their own slice of the region
//!   (`size/numjobs`, fio's `offset_increment`), wrapping at its end.
//!
//! Nothing on the per-I/O path allocates: slot state, free-slot stacks and
//! histograms are sized when the worker starts.

use std::io;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use nvraid_io::queue::{Completion, OpKind, Queue, Target};

use crate::cpu::ThreadCpu;
use crate::hist::LatencyHistogram;
use crate::rng::SplitMix64;
use crate::spec::JobSpec;
use crate::Error;

/// What a progress callback is told, about twice a second.
#[derive(Clone, Debug, PartialEq)]
pub struct Progress<'a> {
    /// The job running.
    pub job_name: &'a str,
    /// Time since the workers started (ramp included).
    pub elapsed: Duration,
    /// Ramp plus runtime.
    pub total: Duration,
    /// Whether the ramp is still running.
    pub ramping: bool,
    /// I/Os completed so far (ramp included).
    pub ios: u64,
    /// Bytes moved so far (ramp included).
    pub bytes: u64,
}

/// Statistics for one direction (reads or writes).
#[derive(Clone, Debug, Default)]
pub struct DirStats {
    /// I/Os completed in the measured window.
    pub ios: u64,
    /// Bytes moved in the measured window.
    pub bytes: u64,
    /// Completion latencies of those I/Os.
    pub clat: LatencyHistogram,
}

impl DirStats {
    fn merge(&mut self, other: &DirStats) {
        self.ios += other.ios;
        self.bytes += other.bytes;
        self.clat.merge(&other.clat);
    }

    /// I/Os per second over `runtime_ns`.
    pub fn iops(&self, runtime_ns: u64) -> f64 {
        per_second(self.ios, runtime_ns)
    }

    /// Bytes per second over `runtime_ns`.
    pub fn bw_bytes(&self, runtime_ns: u64) -> f64 {
        per_second(self.bytes, runtime_ns)
    }
}

fn per_second(count: u64, runtime_ns: u64) -> f64 {
    if runtime_ns == 0 {
        return 0.0;
    }
    count as f64 * 1e9 / runtime_ns as f64
}

/// The first failed I/O of a worker, and how many failed.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct IoErrors {
    /// Failed I/Os (errors and short transfers), ramp and drain included.
    pub count: u64,
    /// Description of the first one.
    pub first: Option<String>,
}

/// What one worker thread measured.
#[derive(Clone, Debug, Default)]
pub struct WorkerResult {
    /// Reads.
    pub read: DirStats,
    /// Writes.
    pub write: DirStats,
    /// CPU time of the thread during the measured window.
    pub cpu: ThreadCpu,
    /// Failed I/Os.
    pub errors: IoErrors,
}

/// What a job measured: per worker and merged.
#[derive(Clone, Debug)]
pub struct JobResult {
    /// The job as run.
    pub spec: JobSpec,
    /// Names of the targets, in round-robin order.
    pub targets: Vec<String>,
    /// The measured window (the job's runtime) in nanoseconds.
    pub runtime_ns: u64,
    /// Each worker's numbers.
    pub workers: Vec<WorkerResult>,
    /// All workers' reads.
    pub read: DirStats,
    /// All workers' writes.
    pub write: DirStats,
    /// All workers' CPU time.
    pub cpu: ThreadCpu,
}

impl JobResult {
    fn from_workers(spec: &JobSpec, targets: Vec<String>, workers: Vec<WorkerResult>) -> Self {
        let mut result = JobResult {
            spec: spec.clone(),
            targets,
            runtime_ns: spec.runtime.as_nanos() as u64,
            workers,
            read: DirStats::default(),
            write: DirStats::default(),
            cpu: ThreadCpu::default(),
        };
        for worker in &result.workers {
            result.read.merge(&worker.read);
            result.write.merge(&worker.write);
            result.cpu.user_ns += worker.cpu.user_ns;
            result.cpu.sys_ns += worker.cpu.sys_ns;
        }
        result
    }

    /// Reads plus writes per second.
    pub fn total_iops(&self) -> f64 {
        per_second(self.read.ios + self.write.ios, self.runtime_ns)
    }

    /// Reads plus writes, bytes per second.
    pub fn total_bw_bytes(&self) -> f64 {
        per_second(self.read.bytes + self.write.bytes, self.runtime_ns)
    }

    /// Completion latency of reads and writes together.
    pub fn total_clat(&self) -> LatencyHistogram {
        let mut clat = self.read.clat.clone();
        clat.merge(&self.write.clat);
        clat
    }
}

/// Runs `job` on `targets` (after [`JobSpec::validate`]) and returns what it
/// measured, or [`Error::IoFailed`] if any I/O failed. `progress` is called
/// from this thread while the workers run.
pub fn run_job(
    job: &JobSpec,
    targets: &[Arc<dyn Target>],
    progress: Option<&mut dyn FnMut(&Progress)>,
) -> Result<JobResult, Error> {
    job.validate(targets)?;
    let shared = Shared::new(job.numjobs);
    let results = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..job.numjobs)
            .map(|index| {
                let shared = &shared;
                std::thread::Builder::new()
                    .name(format!("bench-{index}"))
                    .spawn_scoped(scope, move || run_worker(job, targets, index, shared))
                    .expect("spawning a benchmark worker thread")
            })
            .collect();
        shared.barrier.wait();
        if let Some(progress) = progress {
            watch(job, &shared, progress);
        }
        let results: Vec<_> = handles
            .into_iter()
            .map(|handle| handle.join().expect("benchmark worker panicked"))
            .collect();
        results
    });
    collect(job, targets, results)
}

fn collect(
    job: &JobSpec,
    targets: &[Arc<dyn Target>],
    results: Vec<Result<WorkerResult, Error>>,
) -> Result<JobResult, Error> {
    let mut workers = Vec::with_capacity(results.len());
    for result in results {
        workers.push(result?);
    }
    let failed: u64 = workers.iter().map(|worker| worker.errors.count).sum();
    if failed > 0 {
        let first = workers
            .iter()
            .find_map(|worker| worker.errors.first.clone())
            .unwrap_or_default();
        return Err(Error::IoFailed {
            job: job.name.clone(),
            count: failed,
            first,
        });
    }
    let names = targets.iter().map(|target| target.describe()).collect();
    Ok(JobResult::from_workers(job, names, workers))
}

/// State the workers share with the watching thread. Each worker writes only
/// its own padded counters, so progress costs no cache-line contention.
struct Shared {
    barrier: Barrier,
    abort: AtomicBool,
    finished: AtomicUsize,
    counters: Vec<WorkerCounters>,
}

#[repr(align(64))]
#[derive(Default)]
struct WorkerCounters {
    ios: AtomicU64,
    bytes: AtomicU64,
}

impl Shared {
    fn new(numjobs: u32) -> Shared {
        Shared {
            barrier: Barrier::new(numjobs as usize + 1),
            abort: AtomicBool::new(false),
            finished: AtomicUsize::new(0),
            counters: (0..numjobs).map(|_| WorkerCounters::default()).collect(),
        }
    }
}

fn watch(job: &JobSpec, shared: &Shared, progress: &mut dyn FnMut(&Progress)) {
    let start = Instant::now();
    let total = job.ramp + job.runtime;
    while shared.finished.load(Ordering::Acquire) < shared.counters.len() {
        std::thread::sleep(Duration::from_millis(100));
        let elapsed = start.elapsed();
        let (ios, bytes) = shared.counters.iter().fold((0, 0), |(ios, bytes), c| {
            let ios_worker = c.ios.load(Ordering::Relaxed);
            (ios + ios_worker, bytes + c.bytes.load(Ordering::Relaxed))
        });
        progress(&Progress {
            job_name: &job.name,
            elapsed,
            total,
            ramping: elapsed < job.ramp,
            ios,
            bytes,
        });
    }
}

fn run_worker(
    job: &JobSpec,
    targets: &[Arc<dyn Target>],
    index: u32,
    shared: &Shared,
) -> Result<WorkerResult, Error> {
    let lanes = open_lanes(job, targets, index);
    shared.barrier.wait();
    let result = lanes.and_then(|lanes| Worker::new(job, index, lanes, shared).run());
    shared.finished.fetch_add(1, Ordering::Release);
    if result.as_ref().map_or(true, |r| r.errors.count > 0) {
        shared.abort.store(true, Ordering::Relaxed);
    }
    result
}

fn open_lanes(job: &JobSpec, targets: &[Arc<dyn Target>], index: u32) -> Result<Vec<Lane>, Error> {
    let mut rng = SplitMix64::new(worker_seed(job, index) ^ 0xb0f);
    targets
        .iter()
        .map(|target| Lane::open(job, target.as_ref(), index, &mut rng))
        .collect()
}

fn worker_seed(job: &JobSpec, index: u32) -> u64 {
    let name_hash = job.name.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3)
    });
    name_hash ^ (u64::from(index) << 32)
}

/// One in-flight request's bookkeeping.
#[derive(Clone, Copy)]
struct SlotState {
    submitted_at: Instant,
    offset: u64,
    is_write: bool,
}

/// One worker's queue on one target, and where it is in that target.
struct Lane {
    name: String,
    queue: Box<dyn Queue>,
    free_slots: Vec<u32>,
    slots: Vec<SlotState>,
    region_start_bytes: u64,
    region_blocks: u64,
    seq_first_block: u64,
    seq_blocks: u64,
    seq_next: u64,
}

impl Lane {
    fn open(
        job: &JobSpec,
        target: &dyn Target,
        index: u32,
        rng: &mut SplitMix64,
    ) -> Result<Lane, Error> {
        let name = target.describe();
        let mut queue = target
            .open_queue(job.iodepth, job.bs_bytes)
            .map_err(|source| Error::OpenQueue {
                target: name.clone(),
                source,
            })?;
        if job.job_writes() {
            for slot in 0..job.iodepth {
                rng.fill(&mut queue.buffer_mut(slot)[..job.bs_bytes as usize]);
            }
        }
        let (start, end) = job.region_bytes(target.size_bytes());
        let region_blocks = (end - start) / u64::from(job.bs_bytes);
        assert!(region_blocks > 0, "validate() guarantees one block");
        let seq_blocks = (region_blocks / u64::from(job.numjobs)).max(1);
        let seq_first_block = (u64::from(index) * seq_blocks) % region_blocks;
        Ok(Lane {
            name,
            queue,
            free_slots: (0..job.iodepth).rev().collect(),
            slots: vec![
                SlotState {
                    submitted_at: Instant::now(),
                    offset: 0,
                    is_write: false
                };
                job.iodepth as usize
            ],
            region_start_bytes: start,
            region_blocks,
            seq_first_block,
            seq_blocks: seq_blocks.min(region_blocks - seq_first_block),
            seq_next: 0,
        })
    }

    /// The next block's byte offset.
    #[inline]
    fn next_offset(&mut self, random: bool, bs_bytes: u32, rng: &mut SplitMix64) -> u64 {
        let block = if random {
            rng.below(self.region_blocks)
        } else {
            let block = self.seq_first_block + self.seq_next;
            self.seq_next = (self.seq_next + 1) % self.seq_blocks;
            block
        };
        self.region_start_bytes + block * u64::from(bs_bytes)
    }

    fn in_flight(&self) -> usize {
        self.slots.len() - self.free_slots.len()
    }
}

/// Counts kept while the worker runs.
struct Tally {
    read: DirStats,
    write: DirStats,
    errors: IoErrors,
    ios_all: u64,
    bytes_all: u64,
}

struct Worker<'a> {
    job: &'a JobSpec,
    lanes: Vec<Lane>,
    shared: &'a Shared,
    counters: &'a WorkerCounters,
    rng: SplitMix64,
    read_pct: u64,
    next_lane: usize,
    in_flight: u32,
    tally: Tally,
}

impl<'a> Worker<'a> {
    fn new(job: &'a JobSpec, index: u32, lanes: Vec<Lane>, shared: &'a Shared) -> Worker<'a> {
        Worker {
            job,
            lanes,
            shared,
            counters: &shared.counters[index as usize],
            rng: SplitMix64::new(worker_seed(job, index)),
            read_pct: u64::from(job.rw.read_pct(job.rwmixread_pct)),
            next_lane: 0,
            in_flight: 0,
            tally: Tally {
                read: DirStats::default(),
                write: DirStats::default(),
                errors: IoErrors::default(),
                ios_all: 0,
                bytes_all: 0,
            },
        }
    }

    fn run(mut self) -> Result<WorkerResult, Error> {
        let start = Instant::now();
        let measure_from = start + self.job.ramp;
        let measure_until = measure_from + self.job.runtime;
        let mut cpu_start = (self.job.ramp.is_zero()).then(ThreadCpu::now);
        loop {
            let now = Instant::now();
            if now >= measure_until || self.stopping() {
                break;
            }
            if cpu_start.is_none() && now >= measure_from {
                cpu_start = Some(ThreadCpu::now());
            }
            self.fill_queues();
            self.reap(true, measure_from, measure_until)?;
            self.publish();
        }
        let cpu = ThreadCpu::now().since(cpu_start.unwrap_or_else(ThreadCpu::now));
        self.drain()?;
        let Tally {
            read,
            write,
            errors,
            ..
        } = self.tally;
        Ok(WorkerResult {
            read,
            write,
            cpu,
            errors,
        })
    }

    fn stopping(&self) -> bool {
        self.tally.errors.count > 0 || self.shared.abort.load(Ordering::Relaxed)
    }

    fn publish(&self) {
        self.counters
            .ios
            .store(self.tally.ios_all, Ordering::Relaxed);
        self.counters
            .bytes
            .store(self.tally.bytes_all, Ordering::Relaxed);
    }

    /// Submits until `iodepth` I/Os are in flight, round-robin over lanes.
    fn fill_queues(&mut self) {
        let bs_bytes = self.job.bs_bytes;
        let random = self.job.rw.is_random();
        while self.in_flight < self.job.iodepth {
            let lane_index = self.next_lane;
            self.next_lane = (self.next_lane + 1) % self.lanes.len();
            let is_write = self.rng.below(100) >= self.read_pct;
            let lane = &mut self.lanes[lane_index];
            let Some(slot) = lane.free_slots.pop() else {
                continue;
            };
            let offset = lane.next_offset(random, bs_bytes, &mut self.rng);
            if is_write {
                stamp(lane.queue.buffer_mut(slot), offset);
            }
            let op = if is_write {
                OpKind::Write
            } else {
                OpKind::Read
            };
            let submitted_at = Instant::now();
            lane.slots[slot as usize] = SlotState {
                submitted_at,
                offset,
                is_write,
            };
            if let Err(error) = lane.queue.submit(slot, op, offset, bs_bytes, false) {
                lane.free_slots.push(slot);
                let what = describe_io(is_write, bs_bytes, offset, &lane.name);
                note_error(&mut self.tally.errors, || {
                    format!("{what}: submit failed: {error}")
                });
                return;
            }
            self.in_flight += 1;
            // A queue that completes I/O inside submit (psync) gives no
            // concurrency: reap each I/O before the next, so its latency is
            // its own and not that of the I/Os submitted after it (fio runs
            // its sync engines at an effective depth of 1 for the same reason).
            if lane.queue.completes_inline() {
                return;
            }
        }
    }

    /// Reaps completions; with `wait`, blocks until at least one arrives.
    fn reap(
        &mut self,
        wait: bool,
        measure_from: Instant,
        measure_until: Instant,
    ) -> Result<(), Error> {
        let window = (measure_from, measure_until);
        if self.lanes.len() == 1 {
            let min_complete = u32::from(wait && self.in_flight > 0);
            self.reap_lane(0, min_complete, Some(window))?;
            return Ok(());
        }
        let mut reaped = 0;
        for lane_index in 0..self.lanes.len() {
            reaped += self.reap_lane(lane_index, 0, Some(window))?;
        }
        if reaped == 0 && wait && self.in_flight > 0 {
            let busiest = (0..self.lanes.len())
                .max_by_key(|&index| self.lanes[index].in_flight())
                .unwrap_or(0);
            self.reap_lane(busiest, 1, Some(window))?;
        }
        Ok(())
    }

    /// Waits for every in-flight I/O, counting only errors.
    fn drain(&mut self) -> Result<(), Error> {
        while self.in_flight > 0 {
            for lane_index in 0..self.lanes.len() {
                if self.lanes[lane_index].in_flight() > 0 {
                    self.reap_lane(lane_index, 1, None)?;
                }
            }
        }
        Ok(())
    }

    /// Reaps one lane. Completions reaped inside `window` are measured;
    /// with `None` (draining) none are.
    fn reap_lane(
        &mut self,
        lane_index: usize,
        min_complete: u32,
        window: Option<(Instant, Instant)>,
    ) -> Result<u32, Error> {
        let bs_bytes = self.job.bs_bytes;
        let lane = &mut self.lanes[lane_index];
        let Lane {
            queue,
            free_slots,
            slots,
            name,
            ..
        } = lane;
        let tally = &mut self.tally;
        let mut reaped_at: Option<Instant> = None;
        let mut on_complete = |completion: Completion| {
            let now = *reaped_at.get_or_insert_with(Instant::now);
            let state = slots[completion.slot as usize];
            free_slots.push(completion.slot);
            let measured = window.is_some_and(|(from, until)| now >= from && now < until);
            account(
                tally,
                &state,
                completion.result,
                bs_bytes,
                now,
                measured,
                name,
            );
        };
        let reaped = queue
            .reap(min_complete, &mut on_complete)
            .map_err(|source| Error::Reap {
                target: name.clone(),
                source,
            })?;
        self.in_flight -= reaped;
        Ok(reaped)
    }
}

/// Writes the block's own offset into its first 8 bytes, so every written
/// block differs and a read-back can tell where it was meant to land.
#[inline]
fn stamp(buffer: &mut [u8], offset: u64) {
    buffer[..8].copy_from_slice(&offset.to_le_bytes());
}

fn account(
    tally: &mut Tally,
    state: &SlotState,
    result: Result<u32, i32>,
    bs_bytes: u32,
    now: Instant,
    measured: bool,
    lane_name: &str,
) {
    match result {
        Ok(moved) if moved == bs_bytes => {
            tally.ios_all += 1;
            tally.bytes_all += u64::from(bs_bytes);
            if measured {
                let latency_ns =
                    now.saturating_duration_since(state.submitted_at).as_nanos() as u64;
                let dir = if state.is_write {
                    &mut tally.write
                } else {
                    &mut tally.read
                };
                dir.ios += 1;
                dir.bytes += u64::from(bs_bytes);
                dir.clat.record(latency_ns);
            }
        }
        Ok(moved) => note_error(&mut tally.errors, || {
            let what = describe_io(state.is_write, bs_bytes, state.offset, lane_name);
            format!("{what}: short transfer of {moved} bytes")
        }),
        Err(errno) => note_error(&mut tally.errors, || {
            let what = describe_io(state.is_write, bs_bytes, state.offset, lane_name);
            format!("{what}: {}", io::Error::from_raw_os_error(errno))
        }),
    }
}

/// Counts an error; builds its description (allocating) only for the first.
fn note_error(errors: &mut IoErrors, describe: impl FnOnce() -> String) {
    errors.count += 1;
    if errors.first.is_none() {
        errors.first = Some(describe());
    }
}

fn describe_io(is_write: bool, bs_bytes: u32, offset: u64, target: &str) -> String {
    let op = if is_write { "write" } else { "read" };
    format!("{op} of {bs_bytes} bytes at offset {offset} on {target}")
}
