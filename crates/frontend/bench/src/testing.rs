//! Test-double targets: in memory, null, slow, read-only, and failing on
//! command.
//!
//! Fault model: a [`SimTarget`] can (1) refuse to open queues, (2) fail every
//! I/O from the N-th on with a chosen errno, (3) return a short transfer from
//! the N-th I/O on, (4) delay every completion by a fixed latency, (5) refuse
//! writes (read-only). Requests are carried out at `submit` (memory copy or
//! nothing) and reported at the first `reap` after their due time. What the
//! benchmark must still guarantee under these faults: every failed I/O is
//! counted and the job fails with a message naming the first one; nothing is
//! reported as measured that did not complete in full.

use std::io;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use nvraid_io::queue::{Completion, OpKind, Queue, Target};

/// Counts of requests a [`SimTarget`] completed successfully.
#[derive(Debug, Default)]
pub struct SimCounters {
    /// Reads completed in full.
    pub reads: AtomicU64,
    /// Writes completed in full.
    pub writes: AtomicU64,
    /// Requests submitted (all kinds, failed ones included).
    pub submitted: AtomicU64,
}

/// A configurable in-memory or null target.
#[derive(Clone, Debug)]
pub struct SimTarget {
    name: String,
    size_bytes: u64,
    sector_bytes: u32,
    writable: bool,
    latency: Duration,
    fail_open: bool,
    fail_from_io: Option<(u64, i32)>,
    short_from_io: Option<u64>,
    store: Option<Arc<Mutex<Vec<u8>>>>,
    counters: Arc<SimCounters>,
}

impl SimTarget {
    fn with_store(name: String, size_bytes: u64, store: Option<Arc<Mutex<Vec<u8>>>>) -> SimTarget {
        SimTarget {
            name,
            size_bytes,
            sector_bytes: 512,
            writable: true,
            latency: Duration::ZERO,
            fail_open: false,
            fail_from_io: None,
            short_from_io: None,
            store,
            counters: Arc::default(),
        }
    }

    /// A target that keeps its bytes in memory (zero-filled).
    pub fn mem(size_bytes: usize) -> SimTarget {
        let store = Arc::new(Mutex::new(vec![0u8; size_bytes]));
        SimTarget::with_store(
            format!("sim-mem:{size_bytes}"),
            size_bytes as u64,
            Some(store),
        )
    }

    /// A target that moves no data: reads leave buffers as they were.
    pub fn null(size_bytes: u64) -> SimTarget {
        SimTarget::with_store(format!("sim-null:{size_bytes}"), size_bytes, None)
    }

    /// Sets the sector size (default 512).
    pub fn sector_bytes(mut self, sector_bytes: u32) -> SimTarget {
        self.sector_bytes = sector_bytes;
        self
    }

    /// Makes the target read-only.
    pub fn read_only(mut self) -> SimTarget {
        self.writable = false;
        self
    }

    /// Delays every completion by `latency`.
    pub fn latency(mut self, latency: Duration) -> SimTarget {
        self.latency = latency;
        self
    }

    /// Makes `open_queue` fail.
    pub fn fail_open(mut self) -> SimTarget {
        self.fail_open = true;
        self
    }

    /// Fails the `nth` request (counting from 0 over all queues) and every
    /// later one with `errno`.
    pub fn fail_from_io(mut self, nth: u64, errno: i32) -> SimTarget {
        self.fail_from_io = Some((nth, errno));
        self
    }

    /// Reports a short transfer (half the length) from the `nth` request on.
    pub fn short_from_io(mut self, nth: u64) -> SimTarget {
        self.short_from_io = Some(nth);
        self
    }

    /// Renames the target (for reports).
    pub fn named(mut self, name: &str) -> SimTarget {
        self.name = name.to_string();
        self
    }

    /// What the target completed.
    pub fn counters(&self) -> &SimCounters {
        &self.counters
    }

    /// A copy of the stored bytes (`None` for a null target).
    pub fn contents(&self) -> Option<Vec<u8>> {
        self.store
            .as_ref()
            .map(|store| store.lock().unwrap().clone())
    }

    /// The outcome of request number `nth` moving `len` bytes.
    fn outcome(&self, nth: u64, len: u32) -> Result<u32, i32> {
        match (self.fail_from_io, self.short_from_io) {
            (Some((from, errno)), _) if nth >= from => Err(errno),
            (_, Some(from)) if nth >= from => Ok(len / 2),
            _ => Ok(len),
        }
    }
}

impl Target for SimTarget {
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
        if self.fail_open {
            return Err(io::Error::other("simulated open failure"));
        }
        Ok(Box::new(SimQueue {
            target: self.clone(),
            buffers: (0..depth)
                .map(|_| vec![0u8; max_io_bytes as usize])
                .collect(),
            pending: Vec::with_capacity(depth as usize),
        }))
    }
}

struct Pending {
    slot: u32,
    due: Instant,
    result: Result<u32, i32>,
}

/// A queue on a [`SimTarget`].
struct SimQueue {
    /// The target's settings, sharing its store and counters.
    target: SimTarget,
    buffers: Vec<Vec<u8>>,
    pending: Vec<Pending>,
}

impl SimQueue {
    fn carry_out(&mut self, slot: u32, op: OpKind, offset: u64, len: u32) -> Result<u32, i32> {
        let target = &self.target;
        let nth = target.counters.submitted.fetch_add(1, Ordering::Relaxed);
        let result = target.outcome(nth, len);
        let Ok(moved) = result else {
            return result;
        };
        let range = offset as usize..(offset + u64::from(moved)) as usize;
        let buffer = &mut self.buffers[slot as usize][..moved as usize];
        if let Some(store) = &target.store {
            let mut store = store.lock().unwrap();
            match op {
                OpKind::Read => buffer.copy_from_slice(&store[range]),
                OpKind::Write => store[range].copy_from_slice(buffer),
                OpKind::Flush | OpKind::Discard => {}
            }
        }
        if moved == len {
            let counter = match op {
                OpKind::Write => &target.counters.writes,
                _ => &target.counters.reads,
            };
            counter.fetch_add(1, Ordering::Relaxed);
        }
        result
    }
}

impl Queue for SimQueue {
    fn depth(&self) -> u32 {
        self.buffers.len() as u32
    }

    fn buffer_mut(&mut self, slot: u32) -> &mut [u8] {
        &mut self.buffers[slot as usize]
    }

    fn submit(
        &mut self,
        slot: u32,
        op: OpKind,
        offset: u64,
        len: u32,
        _fua: bool,
    ) -> io::Result<()> {
        let target = &self.target;
        assert!(
            offset.is_multiple_of(u64::from(target.sector_bytes)),
            "unaligned offset {offset}"
        );
        assert!(
            len.is_multiple_of(target.sector_bytes),
            "unaligned length {len}"
        );
        assert!(offset + u64::from(len) <= target.size_bytes, "past the end");
        assert!(
            op != OpKind::Write || target.writable,
            "write to a read-only target"
        );
        assert!(
            self.pending.len() < self.buffers.len(),
            "more requests than slots"
        );
        assert!(
            self.pending.iter().all(|p| p.slot != slot),
            "slot {slot} reused in flight"
        );
        let due = Instant::now() + target.latency;
        let result = self.carry_out(slot, op, offset, len);
        self.pending.push(Pending { slot, due, result });
        Ok(())
    }

    fn reap(
        &mut self,
        min_complete: u32,
        on_complete: &mut dyn FnMut(Completion),
    ) -> io::Result<u32> {
        // Pending requests are kept in submission order and share one
        // latency, so they fall due in order.
        let wanted = (min_complete as usize).min(self.pending.len());
        if wanted > 0 {
            let wait_until = self.pending[wanted - 1].due;
            let now = Instant::now();
            if wait_until > now {
                std::thread::sleep(wait_until - now);
            }
        }
        let now = Instant::now();
        let mut reaped = 0;
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
        Ok(reaped)
    }
}
