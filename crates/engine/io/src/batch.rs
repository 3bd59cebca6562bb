//! Batches: a handful of reads, writes or flushes of different member files
//! put in flight together on the calling thread's io_uring, each reported
//! as it finishes.
//!
//! This is how the array's background work (a reshape's step, a rebuild's
//! reads of the other members) moves whole rows of several members at
//! once without a thread per member. A [`Batch`] borrows its buffers and
//! files for as long as it lives; [`Batch::run`] does not return (and does
//! not unwind) while the kernel still owns one of them, so the borrow rules
//! keep the memory valid.
//!
//! Each thread keeps one ring, made at its first batch and reused. Where no
//! ring can be made (a kernel without io_uring, or one that forbids it),
//! the batch is done one operation after another with positioned system
//! calls, in the order the operations were added; [`Batch::run`] says which
//! path it took. Short transfers and EINTR/EAGAIN answers are retried for
//! the rest of the operation; a read that meets the end of the file fails
//! with `UnexpectedEof`, as `read_exact_at` does.

use io_uring::{opcode, types, IoUring};
use std::cell::RefCell;
use std::collections::VecDeque;
use std::io;
use std::marker::PhantomData;
use std::os::fd::{AsRawFd, BorrowedFd, RawFd};

/// Operations in flight at once on a thread's ring (the rest wait their
/// turn); also the ring's submission queue size.
const RING_ENTRIES: u32 = 64;

/// The most bytes one submission moves (the rest of a longer operation is
/// submitted as the first part completes).
const MAX_SUBMISSION_BYTES: usize = 1 << 30;

thread_local! {
    /// This thread's ring: `None` until the first batch, and while a batch
    /// holds it.
    static RING: RefCell<Option<IoUring>> = const { RefCell::new(None) };
    /// A ring could not be made on this thread: batches go one by one.
    static NO_RING: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
    /// Operations this thread has run on its ring.
    static RING_OPERATIONS: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

/// How many operations the calling thread has run on its ring so far
/// (tests check with it which path a batch took).
pub fn ring_operations() -> u64 {
    RING_OPERATIONS.with(|c| c.get())
}

/// What one operation of a batch does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Read,
    Write,
    /// fdatasync of the whole file.
    Flush,
}

#[derive(Debug)]
struct Op {
    kind: Kind,
    tag: usize,
    fd: RawFd,
    ptr: *mut u8,
    len: usize,
    offset: u64,
    /// Bytes moved so far.
    done: usize,
}

/// How a batch was run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Path {
    /// Every operation in flight together on the thread's io_uring.
    Ring,
    /// One after another with positioned system calls (no ring).
    OneByOne,
}

/// Operations to put in flight together. The buffers and files stay
/// borrowed until the batch is run (or dropped unrun).
#[derive(Debug, Default)]
pub struct Batch<'a> {
    ops: Vec<Op>,
    _borrows: PhantomData<&'a mut [u8]>,
}

impl<'a> Batch<'a> {
    pub fn new() -> Batch<'a> {
        Batch {
            ops: Vec::new(),
            _borrows: PhantomData,
        }
    }

    /// Operations added so far.
    pub fn len(&self) -> usize {
        self.ops.len()
    }

    pub fn is_empty(&self) -> bool {
        self.ops.is_empty()
    }

    fn push(
        &mut self,
        kind: Kind,
        tag: usize,
        fd: BorrowedFd<'a>,
        ptr: *mut u8,
        len: usize,
        offset: u64,
    ) {
        self.ops.push(Op {
            kind,
            tag,
            fd: fd.as_raw_fd(),
            ptr,
            len,
            offset,
            done: 0,
        });
    }

    /// Fill all of `buf` from `file` at `offset`; reported as `tag`.
    pub fn read(&mut self, tag: usize, file: BorrowedFd<'a>, buf: &'a mut [u8], offset: u64) {
        self.push(Kind::Read, tag, file, buf.as_mut_ptr(), buf.len(), offset);
    }

    /// Write all of `buf` to `file` at `offset`; reported as `tag`.
    pub fn write(&mut self, tag: usize, file: BorrowedFd<'a>, buf: &'a [u8], offset: u64) {
        // The kernel only reads through this pointer.
        self.push(
            Kind::Write,
            tag,
            file,
            buf.as_ptr().cast_mut(),
            buf.len(),
            offset,
        );
    }

    /// Make `file`'s completed writes durable (fdatasync); reported as `tag`.
    pub fn flush(&mut self, tag: usize, file: BorrowedFd<'a>) {
        self.push(Kind::Flush, tag, file, std::ptr::null_mut(), 0, 0);
    }

    /// Run every operation: all in flight at once on this thread's ring
    /// (at most [`RING_ENTRIES`] at a time), `meanwhile` called once after
    /// they were handed to the kernel (other work to overlap with them),
    /// then `done(tag, result)` for each as it finishes, in the order they
    /// finish. Without a ring: `meanwhile` first, then each operation in
    /// turn, `done` after each. Returns once every operation has finished,
    /// and the path taken ([`Path::Ring`] for an empty batch).
    pub fn run(
        self,
        meanwhile: &mut dyn FnMut(),
        done: &mut dyn FnMut(usize, io::Result<()>),
    ) -> Path {
        if self.ops.is_empty() {
            meanwhile();
            return Path::Ring;
        }
        let ring = if NO_RING.with(|n| n.get()) {
            None
        } else {
            RING.with(|r| r.borrow_mut().take())
                .or_else(|| match make_ring() {
                    Ok(ring) => Some(ring),
                    Err(_) => {
                        NO_RING.with(|n| n.set(true));
                        None
                    }
                })
        };
        let Some(mut ring) = ring else {
            meanwhile();
            for op in self.ops {
                let result = one_by_one(&op);
                done(op.tag, result);
            }
            return Path::OneByOne;
        };
        RING_OPERATIONS.with(|c| c.set(c.get() + self.ops.len() as u64));
        let mut flight = InFlight {
            ring: &mut ring,
            count: 0,
        };
        flight.run(self.ops, meanwhile, done);
        drop(flight);
        RING.with(|r| {
            let mut slot = r.borrow_mut();
            if slot.is_none() {
                *slot = Some(ring);
            }
        });
        Path::Ring
    }
}

/// A ring whose task work runs as soon as the thread is back from any
/// system call (and interrupts a sleep), not only when it next waits on
/// the ring. This matters for closing files: every operation goes to the
/// kernel's workers, and when a worker lets go of its operation after the
/// completion was reaped, the operation's file reference is dropped by
/// task work on this thread. With deferred task work
/// (`IORING_SETUP_DEFER_TASKRUN`) that waited for this thread's next batch,
/// which may never come: a member closed after a step stayed open, and its
/// exclusive claim held, until then (seen in CI as "claimed here" when the
/// same process opened the member again).
fn make_ring() -> io::Result<IoUring> {
    // The ring never leaves this thread (it is thread-local, and a batch
    // holds it only while it runs on this thread).
    let single_thread = IoUring::builder()
        .setup_cqsize(RING_ENTRIES * 2)
        .setup_single_issuer()
        .build(RING_ENTRIES);
    match single_thread {
        Ok(ring) => Ok(ring),
        Err(_) => IoUring::builder()
            .setup_cqsize(RING_ENTRIES * 2)
            .build(RING_ENTRIES),
    }
}

/// The ring with `count` operations in flight; dropping it waits for them
/// (so that a panic in a caller's callback cannot free memory the kernel
/// still writes to).
struct InFlight<'r> {
    ring: &'r mut IoUring,
    count: usize,
}

impl InFlight<'_> {
    fn run(
        &mut self,
        mut ops: Vec<Op>,
        meanwhile: &mut dyn FnMut(),
        done: &mut dyn FnMut(usize, io::Result<()>),
    ) {
        let mut waiting: VecDeque<usize> = (0..ops.len()).collect();
        let mut first = true;
        loop {
            while self.count < RING_ENTRIES as usize {
                let Some(i) = waiting.pop_front() else { break };
                let entry = entry(&ops[i]).user_data(i as u64);
                // SAFETY: the op's buffer and file are borrowed by the batch
                // for 'a, and this function does not return (nor does the
                // guard drop) until the kernel has completed the entry.
                let pushed = unsafe { self.ring.submission().push(&entry) };
                if pushed.is_err() {
                    waiting.push_front(i);
                    break;
                }
                self.count += 1;
            }
            if self.count == 0 {
                if first {
                    meanwhile();
                }
                return;
            }
            if first {
                self.enter(0);
                first = false;
                meanwhile();
            }
            self.enter(1);
            let finished: Vec<(usize, i32)> = self
                .ring
                .completion()
                .map(|c| (c.user_data() as usize, c.result()))
                .collect();
            self.count -= finished.len();
            for (i, res) in finished {
                let op = &mut ops[i];
                match outcome(op, res) {
                    Outcome::Again => waiting.push_back(i),
                    Outcome::Done(result) => done(op.tag, result),
                }
            }
        }
    }

    /// Submit what is queued and wait for `want` completions, retrying
    /// interrupted and busy waits.
    fn enter(&mut self, want: usize) {
        loop {
            match self.ring.submit_and_wait(want) {
                Ok(_) => return,
                Err(e)
                    if matches!(
                        e.raw_os_error(),
                        Some(libc::EINTR) | Some(libc::EAGAIN) | Some(libc::EBUSY)
                    ) =>
                {
                    if want == 0 {
                        return;
                    }
                    if !self.ring.completion().is_empty() {
                        return;
                    }
                }
                Err(e) => panic!(
                    "io_uring_enter failed with {} operations in flight: {e}",
                    self.count
                ),
            }
        }
    }
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        while self.count > 0 {
            self.enter(1);
            let n = self.ring.completion().count();
            self.count -= n;
        }
    }
}

/// Reads and writes are handed to the kernel's io_uring workers
/// (`IOSQE_ASYNC`) rather than tried in the submitting thread first: a
/// device that completes in the caller (zram, a file through the page
/// cache) would otherwise do the members one after another in this
/// thread, as blocking calls would. A batch's operations are large (whole
/// member rows), so the hand-over's cost is small beside the transfer;
/// flushes go to the workers anyway.
fn entry(op: &Op) -> io_uring::squeue::Entry {
    let fd = types::Fd(op.fd);
    let len = (op.len - op.done).min(MAX_SUBMISSION_BYTES) as u32;
    // `done` <= `len`: still inside the borrowed buffer.
    let ptr = op.ptr.wrapping_add(op.done);
    let at = op.offset + op.done as u64;
    let async_ = io_uring::squeue::Flags::ASYNC;
    match op.kind {
        Kind::Read => opcode::Read::new(fd, ptr, len)
            .offset(at)
            .build()
            .flags(async_),
        Kind::Write => opcode::Write::new(fd, ptr, len)
            .offset(at)
            .build()
            .flags(async_),
        Kind::Flush => opcode::Fsync::new(fd)
            .flags(types::FsyncFlags::DATASYNC)
            .build(),
    }
}

enum Outcome {
    /// Submit (the rest of) the operation again.
    Again,
    Done(io::Result<()>),
}

/// What a completion answering `op` with `res` means.
fn outcome(op: &mut Op, res: i32) -> Outcome {
    if res == -libc::EINTR || res == -libc::EAGAIN {
        return Outcome::Again;
    }
    if res < 0 {
        return Outcome::Done(Err(io::Error::from_raw_os_error(-res)));
    }
    if op.kind == Kind::Flush {
        return Outcome::Done(Ok(()));
    }
    if res == 0 && op.done < op.len {
        return Outcome::Done(Err(match op.kind {
            Kind::Read => {
                io::Error::new(io::ErrorKind::UnexpectedEof, "failed to fill whole buffer")
            }
            _ => io::Error::new(io::ErrorKind::WriteZero, "failed to write whole buffer"),
        }));
    }
    op.done += res as usize;
    if op.done < op.len {
        Outcome::Again
    } else {
        Outcome::Done(Ok(()))
    }
}

/// `op` done in the calling thread (the path without a ring).
fn one_by_one(op: &Op) -> io::Result<()> {
    use std::os::fd::FromRawFd;
    // SAFETY: the batch holds the file borrowed for 'a; the `File` is never
    // dropped, so the caller's descriptor is not closed.
    let file = std::mem::ManuallyDrop::new(unsafe { std::fs::File::from_raw_fd(op.fd) });
    match op.kind {
        Kind::Read => {
            // SAFETY: the batch borrows the buffer mutably for 'a.
            let buf = unsafe { std::slice::from_raw_parts_mut(op.ptr, op.len) };
            crate::sys::read_full_at(&file, buf, op.offset)
        }
        Kind::Write => {
            // SAFETY: the batch borrows the buffer for 'a.
            let buf = unsafe { std::slice::from_raw_parts(op.ptr, op.len) };
            crate::sys::write_full_at(&file, buf, op.offset)
        }
        Kind::Flush => crate::sys::data_sync(&file),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsFd;
    use std::os::unix::fs::FileExt;

    fn file(len: usize, fill: u8) -> std::fs::File {
        let f = crate::sys::memfd("batch-test", len as u64).unwrap();
        f.write_all_at(&vec![fill; len], 0).unwrap();
        f
    }

    #[test]
    fn reads_and_writes_of_several_files_land_and_each_is_reported_once() {
        let files: Vec<std::fs::File> = (0..4).map(|i| file(1 << 20, i as u8)).collect();
        let mut bufs: Vec<Vec<u8>> = (0..4).map(|_| vec![0u8; 256 << 10]).collect();
        let data = vec![0xabu8; 128 << 10];
        let mut batch = Batch::new();
        for (i, (f, b)) in files.iter().zip(bufs.iter_mut()).enumerate() {
            batch.read(i, f.as_fd(), b, 4096);
        }
        batch.write(9, files[3].as_fd(), &data, 512 << 10);
        batch.flush(10, files[3].as_fd());
        let mut seen = Vec::new();
        let mut met = false;
        let path = batch.run(&mut || met = true, &mut |tag, r| {
            r.unwrap();
            seen.push(tag)
        });
        assert!(met);
        seen.sort_unstable();
        assert_eq!(seen, vec![0, 1, 2, 3, 9, 10]);
        for (i, b) in bufs.iter().enumerate() {
            assert!(b.iter().all(|&x| x == i as u8), "file {i}");
        }
        let mut back = vec![0u8; 128 << 10];
        files[3].read_exact_at(&mut back, 512 << 10).unwrap();
        assert_eq!(back, data);
        // The kernels the tests run on have io_uring.
        assert_eq!(path, Path::Ring);
    }

    #[test]
    fn a_read_past_the_end_and_a_write_to_a_read_only_file_fail_alone() {
        let good = file(64 << 10, 7);
        let short = file(8 << 10, 1);
        let path = std::env::temp_dir().join(format!("nvraid-batch-ro-{}", std::process::id()));
        std::fs::write(&path, vec![3u8; 64 << 10]).unwrap();
        let ro = std::fs::File::open(&path).unwrap();
        let mut a = vec![0u8; 64 << 10];
        let mut b = vec![0u8; 16 << 10];
        let w = vec![9u8; 4096];
        let mut batch = Batch::new();
        batch.read(0, good.as_fd(), &mut a, 0);
        batch.read(1, short.as_fd(), &mut b, 0);
        batch.write(2, ro.as_fd(), &w, 0);
        let mut results = std::collections::BTreeMap::new();
        batch.run(&mut || {}, &mut |tag, r| {
            results.insert(tag, r.map_err(|e| e.kind()));
        });
        assert_eq!(results[&0], Ok(()));
        assert_eq!(results[&1], Err(io::ErrorKind::UnexpectedEof));
        assert!(results[&2].is_err(), "{:?}", results[&2]);
        assert!(a.iter().all(|&x| x == 7));
        // The short file's bytes were read before its end was met.
        assert!(b[..8 << 10].iter().all(|&x| x == 1));
        assert_eq!(std::fs::read(&path).unwrap(), vec![3u8; 64 << 10]);
        std::fs::remove_file(&path).unwrap();
    }

    #[test]
    fn more_operations_than_the_ring_holds_all_finish() {
        let f = file(4 << 20, 0);
        let chunks: Vec<Vec<u8>> = (0..200).map(|i| vec![i as u8; 4096]).collect();
        let mut batch = Batch::new();
        for (i, c) in chunks.iter().enumerate() {
            batch.write(i, f.as_fd(), c, i as u64 * 4096);
        }
        let mut count = 0;
        batch.run(&mut || {}, &mut |_, r| {
            r.unwrap();
            count += 1
        });
        assert_eq!(count, 200);
        for (i, c) in chunks.iter().enumerate() {
            let mut back = vec![0u8; 4096];
            f.read_exact_at(&mut back, i as u64 * 4096).unwrap();
            assert_eq!(&back, c);
        }
    }
}

#[cfg(test)]
mod release_tests {
    use super::*;
    use std::os::fd::AsFd;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::time::{Duration, Instant};

    /// A file written and flushed by a batch, then closed, is let go at
    /// once: opened again on the same thread, with no later batch to run
    /// the ring, it can be locked exclusively within a moment.
    ///
    /// The failure this guards against is a race: a kernel worker letting
    /// go of its operation only after this thread has reaped the
    /// completion. Busy threads on every core make that order likelier,
    /// but it stays rare: with the deferred task work the batches once
    /// used, this loop found a held file in about one run in three at
    /// 20,000 rounds (the CI failure it explains was one in a whole
    /// suite). It is kept short here; `NVRAID_BATCH_RELEASE_ROUNDS` runs
    /// it longer.
    #[test]
    fn a_file_closed_after_its_batch_is_let_go_by_the_ring() {
        let rounds: u32 = std::env::var("NVRAID_BATCH_RELEASE_ROUNDS")
            .ok()
            .and_then(|r| r.parse().ok())
            .unwrap_or(3000);
        let dir = std::env::temp_dir().join(format!("nvraid-batch-release-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("f");
        std::fs::write(&path, vec![0u8; 1 << 20]).unwrap();
        let data = vec![5u8; 256 << 10];
        let stop = std::sync::Arc::new(AtomicBool::new(false));
        let busy: Vec<_> = (0..3)
            .map(|_| {
                let stop = stop.clone();
                std::thread::spawn(move || {
                    while !stop.load(Ordering::Relaxed) {
                        std::hint::spin_loop()
                    }
                })
            })
            .collect();
        let open = || {
            std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .open(&path)
                .unwrap()
        };
        let mut held = None;
        'rounds: for round in 0..rounds {
            let f = open();
            assert!(crate::sys::try_lock_exclusive(&f).unwrap());
            let mut batch = Batch::new();
            batch.write(0, f.as_fd(), &data, 0);
            batch.write(1, f.as_fd(), &data, 256 << 10);
            batch.flush(2, f.as_fd());
            batch.run(&mut || {}, &mut |_, r| r.unwrap());
            drop(f);
            let again = open();
            let start = Instant::now();
            while !crate::sys::try_lock_exclusive(&again).unwrap() {
                if start.elapsed() > Duration::from_secs(3) {
                    held = Some(round);
                    break 'rounds;
                }
                std::thread::sleep(Duration::from_millis(1));
            }
        }
        stop.store(true, Ordering::Relaxed);
        for thread in busy {
            thread.join().unwrap();
        }
        std::fs::remove_dir_all(&dir).unwrap();
        assert_eq!(
            held, None,
            "the closed file was still held 3 s later in round"
        );
    }
}
