//! An in-memory [`Target`] for tests, with a durability model.
//!
//! Fault model: the target keeps two images, *current* (what reads see) and
//! *durable* (what would survive a crash). A completed write changes
//! *current*; a FUA write also changes *durable* for its range; a flush
//! copies *current* to *durable* (target-wide: it covers writes completed
//! on any queue). [`MemTarget::crash`] drops everything not durable. Reads
//! and writes can be made to fail with EIO on a chosen range.

use std::io;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};

use nvraid_io::queue::{Completion, OpKind, Queue, Target};

/// The test double. Cheap to clone (the state is shared).
#[derive(Clone, Debug)]
pub struct MemTarget {
    state: Arc<MemState>,
}

#[derive(Debug)]
struct MemState {
    current: RwLock<Vec<u8>>,
    durable: Mutex<Vec<u8>>,
    sector_bytes: u32,
    writable: bool,
    fail_range: Mutex<Option<(u64, u64)>>,
    flushes: AtomicU64,
    queues_opened: AtomicU64,
}

impl MemTarget {
    pub fn new(size_bytes: u64, sector_bytes: u32) -> Arc<MemTarget> {
        MemTarget::with_mode(size_bytes, sector_bytes, true)
    }

    pub fn with_mode(size_bytes: u64, sector_bytes: u32, writable: bool) -> Arc<MemTarget> {
        assert_eq!(size_bytes % u64::from(sector_bytes), 0);
        let state = MemState {
            current: RwLock::new(vec![0; size_bytes as usize]),
            durable: Mutex::new(vec![0; size_bytes as usize]),
            sector_bytes,
            writable,
            fail_range: Mutex::new(None),
            flushes: AtomicU64::new(0),
            queues_opened: AtomicU64::new(0),
        };
        Arc::new(MemTarget {
            state: Arc::new(state),
        })
    }

    /// Number of flushes that reached the target.
    pub fn flush_count(&self) -> u64 {
        self.state.flushes.load(Ordering::SeqCst)
    }

    /// Number of queues opened.
    pub fn queues_opened(&self) -> u64 {
        self.state.queues_opened.load(Ordering::SeqCst)
    }

    /// Fill the image with bytes (current and durable).
    pub fn fill(&self, data: &[u8]) {
        self.state.current.write().expect("lock")[..data.len()].copy_from_slice(data);
        self.state.durable.lock().expect("lock")[..data.len()].copy_from_slice(data);
    }

    /// A copy of what reads see.
    pub fn contents(&self) -> Vec<u8> {
        self.state.current.read().expect("lock").clone()
    }

    /// A copy of what survives a crash.
    pub fn durable_contents(&self) -> Vec<u8> {
        self.state.durable.lock().expect("lock").clone()
    }

    /// Forget everything that was not made durable.
    pub fn crash(&self) {
        let durable = self.state.durable.lock().expect("lock").clone();
        *self.state.current.write().expect("lock") = durable;
    }

    /// Make I/O touching `[start, end)` fail with EIO (None: no failures).
    pub fn fail_between(&self, range: Option<(u64, u64)>) {
        *self.state.fail_range.lock().expect("lock") = range;
    }
}

impl MemState {
    fn fails(&self, offset: u64, len: u32) -> bool {
        let range = *self.fail_range.lock().expect("lock");
        range.is_some_and(|(start, end)| offset < end && offset + u64::from(len) > start)
    }

    fn size_bytes(&self) -> u64 {
        self.current.read().expect("lock").len() as u64
    }

    fn execute(&self, op: OpKind, offset: u64, buffer: &mut [u8], fua: bool) -> Result<u32, i32> {
        let len = buffer.len() as u32;
        if op != OpKind::Flush && self.fails(offset, len) {
            return Err(libc::EIO);
        }
        let range = offset as usize..offset as usize + buffer.len();
        match op {
            OpKind::Read => buffer.copy_from_slice(&self.current.read().expect("lock")[range]),
            OpKind::Write => self.write(range, buffer, fua)?,
            OpKind::Discard => self.write(range.clone(), &vec![0; range.len()], fua)?,
            OpKind::Flush => {
                let current = self.current.read().expect("lock");
                self.durable.lock().expect("lock").copy_from_slice(&current);
                self.flushes.fetch_add(1, Ordering::SeqCst);
            }
        }
        Ok(len)
    }

    fn write(&self, range: std::ops::Range<usize>, data: &[u8], fua: bool) -> Result<(), i32> {
        if !self.writable {
            return Err(libc::EROFS);
        }
        let mut current = self.current.write().expect("lock");
        current[range.clone()].copy_from_slice(data);
        if fua {
            self.durable.lock().expect("lock")[range].copy_from_slice(data);
        }
        Ok(())
    }
}

impl Target for MemTarget {
    fn size_bytes(&self) -> u64 {
        self.state.size_bytes()
    }

    fn sector_bytes(&self) -> u32 {
        self.state.sector_bytes
    }

    fn writable(&self) -> bool {
        self.state.writable
    }

    fn describe(&self) -> String {
        format!("memory target ({} bytes)", self.size_bytes())
    }

    fn open_queue(&self, depth: u32, max_io_bytes: u32) -> io::Result<Box<dyn Queue>> {
        self.state.queues_opened.fetch_add(1, Ordering::SeqCst);
        Ok(Box::new(MemQueue {
            state: Arc::clone(&self.state),
            buffers: (0..depth).map(|_| vec![0; max_io_bytes as usize]).collect(),
            submitted: Vec::new(),
            max_io_bytes,
        }))
    }
}

/// A queue on a [`MemTarget`]: requests run at reap time.
struct MemQueue {
    state: Arc<MemState>,
    buffers: Vec<Vec<u8>>,
    submitted: Vec<(u32, OpKind, u64, u32, bool)>,
    max_io_bytes: u32,
}

impl Queue for MemQueue {
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
        fua: bool,
    ) -> io::Result<()> {
        let sector = u64::from(self.state.sector_bytes);
        assert!(
            len <= self.max_io_bytes,
            "request longer than the slot buffer"
        );
        assert_eq!(offset % sector, 0, "unaligned offset");
        assert_eq!(u64::from(len) % sector, 0, "unaligned length");
        assert!(
            offset + u64::from(len) <= self.state.size_bytes(),
            "past the end"
        );
        self.submitted.push((slot, op, offset, len, fua));
        Ok(())
    }

    fn reap(
        &mut self,
        _min_complete: u32,
        on_complete: &mut dyn FnMut(Completion),
    ) -> io::Result<u32> {
        let batch = std::mem::take(&mut self.submitted);
        for &(slot, op, offset, len, fua) in &batch {
            let buffer = &mut self.buffers[slot as usize][..len as usize];
            let result = self.state.execute(op, offset, buffer, fua);
            on_complete(Completion { slot, result });
        }
        Ok(batch.len() as u32)
    }
}
