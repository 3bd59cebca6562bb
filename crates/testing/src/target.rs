//! [`MemTarget`] and its queue.

use std::fmt;
use std::io;
use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use nvraid_io::queue::{Completion, OpKind, Queue, Target};

use crate::faults::{BadRange, Faults, Outcome};

/// What a [`MemTarget`] has done, over all its queues.
#[derive(Debug, Default)]
pub struct Counters {
    /// Reads completed in full.
    pub reads: AtomicU64,
    /// Writes completed in full.
    pub writes: AtomicU64,
    /// Flushes completed.
    pub flushes: AtomicU64,
    /// Discards completed in full.
    pub discards: AtomicU64,
    /// Requests submitted (all kinds, failed ones included).
    pub submitted: AtomicU64,
    /// Queues opened.
    pub queues_opened: AtomicU64,
}

/// The two images of a memory target.
struct Images {
    current: RwLock<Vec<u8>>,
    durable: Mutex<Vec<u8>>,
}

impl Images {
    fn new(size_bytes: u64) -> Images {
        Images {
            current: RwLock::new(vec![0; size_bytes as usize]),
            durable: Mutex::new(vec![0; size_bytes as usize]),
        }
    }

    /// Stores `data` (zeros if `None`) at `range`; `durable` also on the
    /// durable image. Lock order everywhere: current, then durable.
    fn store(&self, range: Range<usize>, data: Option<&[u8]>, durable: bool) {
        let put = |image: &mut [u8]| match data {
            Some(data) => image.copy_from_slice(data),
            None => image.fill(0),
        };
        let mut current = self.current.write().expect("lock");
        put(&mut current[range.clone()]);
        if durable {
            put(&mut self.durable.lock().expect("lock")[range]);
        }
    }

    fn flush(&self) {
        let current = self.current.read().expect("lock");
        self.durable.lock().expect("lock").copy_from_slice(&current);
    }
}

struct Shared {
    /// `None` for a null target.
    images: Option<Images>,
    faults: RwLock<Faults>,
    counters: Counters,
}

/// An in-memory or null [`Target`] with injected faults.
///
/// Clones share the bytes, the counters and the fault plan; the name,
/// sector size and read-only flag are set by the builder methods before
/// the target is shared. Fault builders ([`MemTarget::latency`],
/// [`MemTarget::fail_from_io`], ...) and setters ([`MemTarget::set_faults`],
/// [`MemTarget::fail_between`]) change the shared plan, so they also act on
/// queues already open.
#[derive(Clone)]
pub struct MemTarget {
    name: String,
    size_bytes: u64,
    sector_bytes: u32,
    writable: bool,
    shared: Arc<Shared>,
}

impl fmt::Debug for MemTarget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MemTarget")
            .field("name", &self.name)
            .field("size_bytes", &self.size_bytes)
            .field("sector_bytes", &self.sector_bytes)
            .field("writable", &self.writable)
            .field("faults", &*self.shared.faults.read().expect("lock"))
            .finish()
    }
}

impl MemTarget {
    fn build(name: String, size_bytes: u64, images: Option<Images>) -> MemTarget {
        MemTarget {
            name,
            size_bytes,
            sector_bytes: 512,
            writable: true,
            shared: Arc::new(Shared {
                images,
                faults: RwLock::default(),
                counters: Counters::default(),
            }),
        }
    }

    /// A target that keeps its bytes in memory (zero-filled), 512-byte
    /// sectors, writable.
    pub fn mem(size_bytes: u64) -> MemTarget {
        let name = format!("memory target ({size_bytes} bytes)");
        MemTarget::build(name, size_bytes, Some(Images::new(size_bytes)))
    }

    /// A target that moves no data: reads leave buffers as they were.
    pub fn null(size_bytes: u64) -> MemTarget {
        MemTarget::build(
            format!("null target ({size_bytes} bytes)"),
            size_bytes,
            None,
        )
    }

    /// A shared writable memory target with `sector_bytes` sectors.
    pub fn new(size_bytes: u64, sector_bytes: u32) -> Arc<MemTarget> {
        MemTarget::with_mode(size_bytes, sector_bytes, true)
    }

    /// A shared memory target, read-only unless `writable`.
    pub fn with_mode(size_bytes: u64, sector_bytes: u32, writable: bool) -> Arc<MemTarget> {
        assert_eq!(size_bytes % u64::from(sector_bytes), 0);
        let target = MemTarget::mem(size_bytes).sector_bytes(sector_bytes);
        Arc::new(if writable { target } else { target.read_only() })
    }

    // ---------------------------------------------------------- builders

    /// Sets the sector size (default 512).
    pub fn sector_bytes(mut self, sector_bytes: u32) -> MemTarget {
        self.sector_bytes = sector_bytes;
        self
    }

    /// Makes the target read-only: writes and discards fail with EROFS.
    pub fn read_only(mut self) -> MemTarget {
        self.writable = false;
        self
    }

    /// Renames the target (for reports).
    pub fn named(mut self, name: &str) -> MemTarget {
        self.name = name.to_string();
        self
    }

    /// Replaces the fault plan.
    pub fn with_faults(self, faults: Faults) -> MemTarget {
        self.set_faults(faults);
        self
    }

    /// Delays every completion by `latency`.
    pub fn latency(self, latency: Duration) -> MemTarget {
        self.update_faults(|f| f.latency = latency);
        self
    }

    /// Makes `open_queue` fail.
    pub fn fail_open(self) -> MemTarget {
        self.update_faults(|f| f.fail_open = true);
        self
    }

    /// Fails the `nth` request (counting from 0 over all queues) and every
    /// later one with `errno`.
    pub fn fail_from_io(self, nth: u64, errno: i32) -> MemTarget {
        self.update_faults(|f| f.fail_from_op = Some((nth, errno)));
        self
    }

    /// Reports a short transfer (half the length) from the `nth` request on.
    pub fn short_from_io(self, nth: u64) -> MemTarget {
        self.update_faults(|f| f.short_from_op = Some(nth));
        self
    }

    /// The device vanishes after `ops` requests: later ones fail with
    /// ENODEV, and so does opening a queue.
    pub fn vanish_after(self, ops: u64) -> MemTarget {
        self.update_faults(|f| f.vanish_after = Some(ops));
        self
    }

    // ------------------------------------------------- faults at run time

    /// A copy of the fault plan.
    pub fn faults(&self) -> Faults {
        self.shared.faults.read().expect("lock").clone()
    }

    /// Replaces the fault plan (open queues included).
    pub fn set_faults(&self, faults: Faults) {
        *self.shared.faults.write().expect("lock") = faults;
    }

    /// Changes the fault plan in place.
    pub fn update_faults(&self, change: impl FnOnce(&mut Faults)) {
        change(&mut self.shared.faults.write().expect("lock"));
    }

    /// Makes reads, writes and discards touching `[start, end)` fail with
    /// EIO, replacing any other bad ranges (`None`: no bad ranges).
    pub fn fail_between(&self, range: Option<(u64, u64)>) {
        let ranges = range.map(|(start, end)| BadRange::eio(start, end));
        self.update_faults(|f| f.bad_ranges = ranges.into_iter().collect());
    }

    // ------------------------------------------------------------ state

    /// What the target has done.
    pub fn counters(&self) -> &Counters {
        &self.shared.counters
    }

    /// Number of flushes completed.
    pub fn flush_count(&self) -> u64 {
        self.shared.counters.flushes.load(Ordering::SeqCst)
    }

    /// Number of queues opened.
    pub fn queues_opened(&self) -> u64 {
        self.shared.counters.queues_opened.load(Ordering::SeqCst)
    }

    fn images(&self) -> &Images {
        let images = self.shared.images.as_ref();
        images.expect("a null target keeps no bytes")
    }

    /// Fills the start of both images with `data`.
    pub fn fill(&self, data: &[u8]) {
        self.images().store(0..data.len(), Some(data), true);
    }

    /// A copy of what reads see. Panics on a null target.
    pub fn contents(&self) -> Vec<u8> {
        self.images().current.read().expect("lock").clone()
    }

    /// A copy of what survives a crash. Panics on a null target.
    pub fn durable_contents(&self) -> Vec<u8> {
        self.images().durable.lock().expect("lock").clone()
    }

    /// Forgets everything that was not made durable (power loss).
    pub fn crash(&self) {
        let images = self.images();
        let mut current = images.current.write().expect("lock");
        current.copy_from_slice(&images.durable.lock().expect("lock"));
    }
}

impl Target for MemTarget {
    fn size_bytes(&self) -> u64 {
        self.size_bytes
    }

    fn sector_bytes(&self) -> u32 {
        self.sector_bytes
    }

    fn writable(&self) -> bool {
        self.writable
    }

    fn describe(&self) -> String {
        self.name.clone()
    }

    fn open_queue(&self, depth: u32, max_io_bytes: u32) -> io::Result<Box<dyn Queue>> {
        {
            let faults = self.shared.faults.read().expect("lock");
            if faults.fail_open {
                return Err(io::Error::other("simulated open failure"));
            }
            let submitted = self.shared.counters.submitted.load(Ordering::SeqCst);
            if faults.vanished(submitted) {
                return Err(io::Error::from_raw_os_error(libc::ENODEV));
            }
        }
        self.shared
            .counters
            .queues_opened
            .fetch_add(1, Ordering::SeqCst);
        Ok(Box::new(MemQueue {
            target: self.clone(),
            buffers: (0..depth).map(|_| vec![0; max_io_bytes as usize]).collect(),
            pending: Vec::with_capacity(depth as usize),
            max_io_bytes,
        }))
    }
}

struct Pending {
    slot: u32,
    due: Instant,
    result: Result<u32, i32>,
}

/// A queue on a [`MemTarget`]: requests are carried out at `submit` and
/// reported at the first `reap` after their due time.
struct MemQueue {
    target: MemTarget,
    buffers: Vec<Vec<u8>>,
    /// In submission order (the latency can change, so not always in due
    /// order).
    pending: Vec<Pending>,
    max_io_bytes: u32,
}

impl MemQueue {
    /// Does request `op` now; its latency and result.
    fn carry_out(
        &mut self,
        slot: u32,
        op: OpKind,
        offset: u64,
        len: u32,
        fua: bool,
    ) -> (Duration, Result<u32, i32>) {
        let shared = &self.target.shared;
        let nth = shared.counters.submitted.fetch_add(1, Ordering::SeqCst);
        let (outcome, latency) = {
            let faults = shared.faults.read().expect("lock");
            (faults.outcome(nth, op, offset, len), faults.latency)
        };
        let changes = matches!(op, OpKind::Write | OpKind::Discard);
        if changes && !self.target.writable {
            return (latency, Err(libc::EROFS));
        }
        let (moved, result) = match outcome {
            Outcome::Complete => (len, Ok(len)),
            Outcome::Short(moved) => (moved, Ok(moved)),
            Outcome::Torn(moved) => (moved, Err(libc::EIO)),
            Outcome::Fail(errno) => return (latency, Err(errno)),
        };
        if let Some(images) = &shared.images {
            let range = offset as usize..(offset + u64::from(moved)) as usize;
            let durable = fua || matches!(outcome, Outcome::Torn(_));
            match op {
                OpKind::Read => {
                    let buffer = &mut self.buffers[slot as usize][..moved as usize];
                    buffer.copy_from_slice(&images.current.read().expect("lock")[range]);
                }
                OpKind::Write => {
                    let buffer = &self.buffers[slot as usize][..moved as usize];
                    images.store(range, Some(buffer), durable);
                }
                OpKind::Discard => images.store(range, None, durable),
                OpKind::Flush => images.flush(),
            }
        }
        if result == Ok(len) {
            let counters = &shared.counters;
            let counter = match op {
                OpKind::Read => &counters.reads,
                OpKind::Write => &counters.writes,
                OpKind::Flush => &counters.flushes,
                OpKind::Discard => &counters.discards,
            };
            counter.fetch_add(1, Ordering::SeqCst);
        }
        (latency, result)
    }
}

impl Queue for MemQueue {
    fn depth(&self) -> u32 {
        self.buffers.len() as u32
    }

    fn buffer_mut(&mut self, slot: u32) -> &mut [u8] {
        &mut self.buffers[slot as usize]
    }

    fn buffer(&self, slot: u32) -> &[u8] {
        &self.buffers[slot as usize]
    }

    fn leak_buffers(&mut self) {
        std::mem::forget(std::mem::take(&mut self.buffers));
    }

    fn submit(
        &mut self,
        slot: u32,
        op: OpKind,
        offset: u64,
        len: u32,
        fua: bool,
    ) -> io::Result<()> {
        let target = &self.target;
        if op != OpKind::Flush {
            let sector = target.sector_bytes;
            assert!(
                offset.is_multiple_of(u64::from(sector)),
                "unaligned offset {offset}"
            );
            assert!(len.is_multiple_of(sector), "unaligned length {len}");
            assert!(len <= self.max_io_bytes, "request longer than the slot");
            assert!(offset + u64::from(len) <= target.size_bytes, "past the end");
        }
        assert!(slot < self.depth(), "slot {slot} out of range");
        assert!(
            self.pending.len() < self.buffers.len(),
            "more requests than slots"
        );
        assert!(
            self.pending.iter().all(|p| p.slot != slot),
            "slot {slot} reused in flight"
        );
        let submitted = Instant::now();
        let (latency, result) = self.carry_out(slot, op, offset, len, fua);
        let due = submitted + latency;
        self.pending.push(Pending { slot, due, result });
        Ok(())
    }

    fn reap(
        &mut self,
        min_complete: u32,
        on_complete: &mut dyn FnMut(Completion),
    ) -> io::Result<u32> {
        let wanted = (min_complete as usize).min(self.pending.len());
        let mut reaped = 0;
        loop {
            let now = Instant::now();
            let mut index = 0;
            while index < self.pending.len() {
                if self.pending[index].due <= now {
                    let done = self.pending.remove(index);
                    on_complete(Completion {
                        slot: done.slot,
                        result: done.result,
                    });
                    reaped += 1;
                } else {
                    index += 1;
                }
            }
            if reaped >= wanted {
                return Ok(reaped as u32);
            }
            let next = self.pending.iter().map(|p| p.due).min();
            let next = next.expect("requests still pending");
            std::thread::sleep(next.saturating_duration_since(Instant::now()));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::TornWrite;

    const MIB: u64 = 1 << 20;

    /// Submits one request on slot 0 (writing `data` first) and waits for it.
    fn once(
        queue: &mut dyn Queue,
        op: OpKind,
        offset: u64,
        data: &[u8],
        fua: bool,
    ) -> Result<u32, i32> {
        queue.buffer_mut(0)[..data.len()].copy_from_slice(data);
        queue.submit(0, op, offset, data.len() as u32, fua).unwrap();
        let mut result = None;
        let reaped = queue.reap(1, &mut |c| result = Some(c.result)).unwrap();
        assert_eq!(reaped, 1);
        result.unwrap()
    }

    fn read(queue: &mut dyn Queue, offset: u64, len: usize) -> Result<Vec<u8>, i32> {
        queue.buffer_mut(0)[..len].fill(0xee);
        once(queue, OpKind::Read, offset, &vec![0xee; len], false)?;
        Ok(queue.buffer_mut(0)[..len].to_vec())
    }

    fn open(target: &MemTarget) -> Box<dyn Queue> {
        target.open_queue(4, 64 << 10).unwrap()
    }

    #[test]
    fn memory_target_reads_back_and_models_durability() {
        let target = MemTarget::new(MIB, 4096);
        assert_eq!(
            (target.size_bytes(), Target::sector_bytes(&*target)),
            (MIB, 4096)
        );
        let mut q = open(&target);
        let mut other = open(&target);
        assert_eq!(
            once(&mut *q, OpKind::Write, 4096, &[1; 4096], false),
            Ok(4096)
        );
        assert_eq!(read(&mut *other, 4096, 4096).unwrap(), vec![1; 4096]);
        assert_eq!(target.durable_contents()[4096], 0, "not flushed yet");
        assert_eq!(
            once(&mut *q, OpKind::Write, 8192, &[2; 4096], true),
            Ok(4096)
        );
        assert_eq!(target.durable_contents()[8192], 2, "FUA is durable");
        assert_eq!(once(&mut *q, OpKind::Write, 0, &[3; 4096], false), Ok(4096));
        target.crash();
        let after = target.contents();
        assert_eq!((after[0], after[4096], after[8192]), (0, 0, 2));

        assert_eq!(once(&mut *q, OpKind::Write, 0, &[4; 4096], false), Ok(4096));
        assert_eq!(once(&mut *other, OpKind::Flush, 0, &[], false), Ok(0));
        target.crash();
        assert_eq!(target.contents()[0], 4, "a flush on any queue covers it");
        assert_eq!(
            once(&mut *q, OpKind::Discard, 0, &[0; 4096], true),
            Ok(4096)
        );
        assert_eq!(target.durable_contents()[..4096], [0; 4096]);

        let c = target.counters();
        let load = |a: &AtomicU64| a.load(Ordering::SeqCst);
        assert_eq!(
            (
                load(&c.writes),
                load(&c.reads),
                load(&c.discards),
                load(&c.submitted)
            ),
            (4, 1, 1, 7)
        );
        assert_eq!((target.flush_count(), target.queues_opened()), (1, 2));
        target.fill(&[9; 512]);
        assert_eq!(target.durable_contents()[511], 9);
    }

    #[test]
    fn null_target_moves_nothing_and_counts() {
        let target = MemTarget::null(64 * MIB).named("n");
        assert_eq!(target.describe(), "n");
        let mut q = open(&target);
        assert_eq!(read(&mut *q, 0, 512).unwrap(), vec![0xee; 512]);
        assert_eq!(once(&mut *q, OpKind::Write, MIB, &[1; 512], false), Ok(512));
        assert_eq!(target.counters().reads.load(Ordering::SeqCst), 1);
        assert_eq!(target.counters().writes.load(Ordering::SeqCst), 1);
    }

    #[test]
    fn read_only_target_refuses_writes() {
        let target = MemTarget::with_mode(MIB, 512, false);
        assert!(!target.writable());
        let mut q = open(&target);
        assert_eq!(
            once(&mut *q, OpKind::Write, 0, &[1; 512], false),
            Err(libc::EROFS)
        );
        assert_eq!(
            once(&mut *q, OpKind::Discard, 0, &[0; 512], false),
            Err(libc::EROFS)
        );
        assert!(target.contents().iter().all(|&b| b == 0));
    }

    #[test]
    fn bad_ranges_fail_what_touches_them_until_cleared() {
        let target = MemTarget::new(MIB, 512);
        target.fill(&[7; 16384]);
        let mut q = open(&target);
        target.fail_between(Some((8192, 12288)));
        assert_eq!(read(&mut *q, 4096, 4608), Err(libc::EIO));
        assert_eq!(
            once(&mut *q, OpKind::Write, 12287 - 511, &[1; 512], false),
            Err(libc::EIO)
        );
        assert_eq!(target.contents()[11776], 7, "a failed write lands nothing");
        assert_eq!(read(&mut *q, 12288, 512).unwrap(), vec![7; 512]);
        target.fail_between(None);
        assert_eq!(read(&mut *q, 8192, 512).unwrap(), vec![7; 512]);

        // A latent read error: rewriting the range works, reading it fails.
        target.update_faults(|f| f.bad_ranges = vec![BadRange::reads(0, 512).errno(libc::EILSEQ)]);
        assert_eq!(once(&mut *q, OpKind::Write, 0, &[5; 512], false), Ok(512));
        assert_eq!(read(&mut *q, 0, 512), Err(libc::EILSEQ));
        assert_eq!(target.contents()[0], 5);
    }

    #[test]
    fn errors_from_the_nth_operation_on() {
        let target = MemTarget::mem(MIB).fail_from_io(3, libc::EIO);
        let mut q = open(&target);
        for _ in 0..3 {
            assert_eq!(read(&mut *q, 0, 512).map(|_| ()), Ok(()));
        }
        assert_eq!(once(&mut *q, OpKind::Flush, 0, &[], false), Err(libc::EIO));
        assert_eq!(
            once(&mut *q, OpKind::Write, 0, &[1; 512], false),
            Err(libc::EIO)
        );
        assert_eq!(target.contents()[0], 0);
        assert_eq!(target.flush_count(), 0);
    }

    #[test]
    fn short_transfers_move_half() {
        let target = MemTarget::mem(MIB).short_from_io(1);
        let mut q = open(&target);
        assert_eq!(once(&mut *q, OpKind::Write, 0, &[1; 1024], false), Ok(1024));
        assert_eq!(once(&mut *q, OpKind::Write, 0, &[2; 1024], false), Ok(512));
        let contents = target.contents();
        assert_eq!((contents[511], contents[512]), (2, 1));
        assert_eq!(target.counters().writes.load(Ordering::SeqCst), 1);
    }

    #[test]
    fn latency_delays_completions() {
        let latency = Duration::from_millis(30);
        let target = MemTarget::null(MIB).latency(latency);
        let mut q = open(&target);
        let started = Instant::now();
        q.submit(0, OpKind::Read, 0, 512, false).unwrap();
        q.submit(1, OpKind::Read, 512, 512, false).unwrap();
        assert_eq!(q.reap(0, &mut |_| {}).unwrap(), 0, "not due yet");
        assert_eq!(q.reap(2, &mut |_| {}).unwrap(), 2);
        assert!(started.elapsed() >= latency);
        target.set_faults(Faults::default());
        let started = Instant::now();
        assert_eq!(read(&mut *q, 0, 512).map(|_| ()), Ok(()));
        assert!(
            started.elapsed() < latency,
            "a plan change reaches open queues"
        );
    }

    #[test]
    fn a_vanished_device_fails_everything_and_cannot_be_opened() {
        let target = MemTarget::mem(MIB).vanish_after(2);
        let mut q = open(&target);
        assert_eq!(once(&mut *q, OpKind::Write, 0, &[1; 512], false), Ok(512));
        assert_eq!(read(&mut *q, 0, 512).unwrap(), vec![1; 512]);
        assert_eq!(read(&mut *q, 0, 512), Err(libc::ENODEV));
        assert_eq!(
            once(&mut *q, OpKind::Flush, 0, &[], false),
            Err(libc::ENODEV)
        );
        let err = target.open_queue(1, 4096).err().expect("open fails");
        assert_eq!(err.raw_os_error(), Some(libc::ENODEV));
        assert_eq!(target.queues_opened(), 1);
    }

    #[test]
    fn a_torn_write_keeps_its_prefix_through_a_crash() {
        let target = MemTarget::new(MIB, 512);
        target.fill(&[0xaa; 8192]);
        target.set_faults(Faults {
            torn_write: Some(TornWrite {
                start: 4096,
                end: 4097,
                keep_bytes: 1536,
            }),
            ..Faults::default()
        });
        let mut q = open(&target);
        assert_eq!(
            once(&mut *q, OpKind::Write, 0, &[0x55; 4096], false),
            Ok(4096)
        );
        assert_eq!(
            once(&mut *q, OpKind::Write, 4096, &[0x55; 4096], false),
            Err(libc::EIO)
        );
        target.crash();
        let after = target.contents();
        assert_eq!(
            after[0], 0xaa,
            "the whole write before it was never flushed"
        );
        assert!(after[4096..4096 + 1536].iter().all(|&b| b == 0x55));
        assert!(after[4096 + 1536..8192].iter().all(|&b| b == 0xaa));
        assert_eq!(target.counters().writes.load(Ordering::SeqCst), 1);
    }

    #[test]
    fn open_can_be_refused() {
        let target = MemTarget::null(MIB).fail_open();
        assert!(target.open_queue(1, 4096).is_err());
        assert_eq!(target.queues_opened(), 0);
    }

    #[test]
    #[should_panic(expected = "unaligned offset")]
    fn unaligned_requests_are_caller_bugs() {
        let target = MemTarget::null(MIB).sector_bytes(4096);
        let _ = open(&target).submit(0, OpKind::Read, 512, 4096, false);
    }
}
