//! I/O engines: how one worker thread moves bytes to and from member files.
//!
//! An engine executes *member operations* ([`MemberOp`]): a read, write or
//! flush of one file descriptor (by index in the worker's file table) at one
//! offset. It reports each operation's raw result — bytes moved or a negative
//! errno — tagged with the caller's `user_data`. It does not retry: the
//! caller (the array queue) owns short-transfer and EAGAIN handling, so both
//! engines behave alike and one conformance test covers them.
//!
//! - [`UringEngine`]: one io_uring per worker, the member files registered as
//!   fixed files and the worker's slot buffers registered as fixed buffers;
//!   submissions are batched until the caller waits.
//! - [`PsyncEngine`]: `pread`/`pwrite` in the calling thread; the operation
//!   is done when `push` returns. Best where the member's driver completes
//!   inline (tmpfs, zram), where io_uring only adds overhead.

use io_uring::{opcode, squeue, types, IoUring};
use std::io;
use std::os::fd::RawFd;
use std::time::Duration;

use crate::channel::RemoteFile;
pub use crate::op::{MemberOp, MemberOpKind};

/// fallocate(2) mode of [`MemberOpKind::Zero`]: a hole, which reads back as
/// zeros, the file's size unchanged. (ZERO_RANGE would keep the blocks
/// allocated, but tmpfs refuses it; every file system nvraid's members
/// live on, and block devices, punch holes.)
const ZERO_RANGE: i32 = libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE;

/// A per-worker I/O engine.
pub trait Engine {
    /// Queue (or, for psync, perform) one operation.
    ///
    /// # Safety
    /// `op.buf` must be valid for `op.len` bytes (writable for reads), or
    /// `op.iov` for `op.iov_count` iovecs each describing valid memory, until
    /// the operation's completion has been passed to [`Engine::complete`].
    unsafe fn push(&mut self, op: &MemberOp) -> io::Result<()>;

    /// Hand queued operations to the kernel, wait until at least `min`
    /// completions are available (0: don't wait), and pass each to
    /// `on_complete(user_data, result)`. Returns the number passed.
    fn complete(&mut self, min: u32, on_complete: &mut dyn FnMut(u64, i32)) -> io::Result<u32>;

    /// Short name for reports (`io_uring`, `psync`).
    fn name(&self) -> &'static str;

    /// Whether operations are done inside [`Engine::push`].
    fn completes_inline(&self) -> bool {
        false
    }

    /// Put `fd` at `index` of the file table (a member joined the array
    /// while it runs; -1 empties the entry). Operations already queued on
    /// the old file finish on it.
    fn update_file(&mut self, index: u32, fd: RawFd) -> io::Result<()>;

    /// Put a remote member at `index` (None: none there). Only the mixed
    /// engine (`remote::MixedEngine`) can hold remote members.
    fn update_remote(
        &mut self,
        index: u32,
        remote: Option<&std::sync::Arc<dyn RemoteFile>>,
    ) -> io::Result<()> {
        let _ = index;
        match remote {
            None => Ok(()),
            Some(_) => Err(io::Error::new(
                io::ErrorKind::Unsupported,
                "this engine cannot reach remote members",
            )),
        }
    }
}

/// Which engine to use.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EngineKind {
    Uring,
    Psync,
    /// psync with injected faults, for tests of the layers above.
    Faulty(FaultPlan),
    /// psync with the plan's faults and faults of single member files.
    FaultyMember(FaultPlan, MemberFaults),
}

/// Faults a [`FaultyEngine`] injects.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FaultPlan {
    /// Move at most this many bytes per operation (short transfers).
    pub transfer_bytes_max: u32,
    /// Answer every Nth operation with -EAGAIN without doing it (0: never).
    pub eagain_every: u32,
    /// Answer every read, write or flush on this file (index in the file
    /// table) with -EIO, without doing it: a member that has failed.
    pub eio_file: Option<u32>,
}

impl FaultPlan {
    /// No faults: a plain psync engine.
    pub const NONE: FaultPlan = FaultPlan {
        transfer_bytes_max: u32::MAX,
        eagain_every: 0,
        eio_file: None,
    };
}

/// Faults a [`FaultyEngine`] injects on single member files, beside its
/// [`FaultPlan`]. Files are indexes in the file table; operations on a file
/// are numbered from 0 in push order (flushes included).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MemberFaults {
    /// Reads and/or writes touching a byte range of one file fail with EIO
    /// without being done (a bad region of a disk).
    pub eio_range: Option<FileRange>,
    /// `(file, n)`: every operation on `file` from its `n`-th on fails with
    /// EIO without being done (a disk that starts failing).
    pub eio_from_op: Option<(u32, u64)>,
    /// Sleep this long before each operation (on `latency_file` only, when
    /// set): a slow disk.
    pub latency: Duration,
    pub latency_file: Option<u32>,
    /// A write on one file touching a byte range moves only its first bytes,
    /// then fails with EIO (power cut in the middle of the write).
    pub torn_write: Option<TornFileWrite>,
}

/// Operations touching `[start, end)` of `file`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FileRange {
    pub file: u32,
    pub start: u64,
    pub end: u64,
    pub reads: bool,
    pub writes: bool,
}

/// A write of `file` touching `[start, end)` lands its first `keep_bytes`
/// bytes (from the write's own offset), then completes with EIO.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TornFileWrite {
    pub file: u32,
    pub start: u64,
    pub end: u64,
    pub keep_bytes: u32,
}

impl MemberFaults {
    /// No member faults.
    pub const NONE: MemberFaults = MemberFaults {
        eio_range: None,
        eio_from_op: None,
        latency: Duration::ZERO,
        latency_file: None,
        torn_write: None,
    };
}

impl EngineKind {
    pub fn name(self) -> &'static str {
        match self {
            EngineKind::Uring => "io_uring",
            EngineKind::Psync => "psync",
            EngineKind::Faulty(_) | EngineKind::FaultyMember(..) => "faulty-psync",
        }
    }
}

/// Build an engine for a worker. `files` is the file table (-1 for a slot
/// with no file, e.g. a null member); `buffers` the worker's slot buffers.
pub fn open_engine(
    kind: EngineKind,
    files: &[RawFd],
    buffers: &[(*mut u8, usize)],
    entries: u32,
) -> io::Result<Box<dyn Engine>> {
    Ok(match kind {
        EngineKind::Uring => Box::new(UringEngine::new(files, buffers, entries)?),
        EngineKind::Psync => Box::new(PsyncEngine::new(files, entries as usize)),
        EngineKind::Faulty(plan) => {
            Box::new(FaultyEngine::new(files, entries, plan, MemberFaults::NONE))
        }
        EngineKind::FaultyMember(plan, member) => {
            Box::new(FaultyEngine::new(files, entries, plan, member))
        }
    })
}

/// io_uring engine with fixed files and (when the kernel accepts them) fixed
/// buffers.
pub struct UringEngine {
    ring: IoUring,
    fixed_buffers: bool,
    queued: u32,
}

impl UringEngine {
    pub fn new(
        files: &[RawFd],
        buffers: &[(*mut u8, usize)],
        entries: u32,
    ) -> io::Result<UringEngine> {
        let entries = entries.clamp(8, 4096).next_power_of_two();
        let ring = Self::build_ring(entries)?;
        ring.submitter().register_files(files)?;
        let iovecs: Vec<libc::iovec> = buffers
            .iter()
            .map(|&(ptr, len)| libc::iovec {
                iov_base: ptr.cast(),
                iov_len: len,
            })
            .collect();
        // SAFETY: the caller keeps the buffers alive as long as the engine
        // (the array queue owns both and drops the engine first).
        let fixed_buffers =
            !iovecs.is_empty() && unsafe { ring.submitter().register_buffers(&iovecs) }.is_ok();
        Ok(UringEngine {
            ring,
            fixed_buffers,
            queued: 0,
        })
    }

    /// A ring owned by one thread: completions are run only when this
    /// thread waits for them (no task-work interruptions), where the kernel
    /// offers that (6.1+); a plain ring otherwise. Measured on tmpfs, where
    /// reads go through io_uring's worker threads: 4K random read at QD 32
    /// went from about 0.6x fio's io_uring engine to parity
    /// (docs/performance-history.md#what-the-profiles-showed-and-what-changed).
    /// A queue is not `Send`, so the ring never
    /// leaves the thread that made it, as the single-issuer mode requires.
    fn build_ring(entries: u32) -> io::Result<IoUring> {
        let single_thread = IoUring::builder()
            .setup_cqsize(entries * 2)
            .setup_coop_taskrun()
            .setup_taskrun_flag()
            .setup_single_issuer()
            .setup_defer_taskrun()
            .build(entries);
        match single_thread {
            Ok(ring) => Ok(ring),
            Err(_) => IoUring::builder().setup_cqsize(entries * 2).build(entries),
        }
    }

    fn entry(&self, op: &MemberOp) -> squeue::Entry {
        let fd = types::Fixed(op.file);
        let flags = if op.dsync { libc::RWF_DSYNC } else { 0 };
        let entry = match (op.kind, self.fixed_buffers) {
            (MemberOpKind::Read, _) if op.iov_count > 0 => {
                opcode::Readv::new(fd, op.iov, op.iov_count)
                    .offset(op.offset)
                    .build()
            }
            (MemberOpKind::Write, _) if op.iov_count > 0 => {
                opcode::Writev::new(fd, op.iov, op.iov_count)
                    .offset(op.offset)
                    .rw_flags(flags)
                    .build()
            }
            (MemberOpKind::Read, true) => opcode::ReadFixed::new(fd, op.buf, op.len, op.buf_index)
                .offset(op.offset)
                .build(),
            (MemberOpKind::Read, false) => opcode::Read::new(fd, op.buf, op.len)
                .offset(op.offset)
                .build(),
            (MemberOpKind::Write, true) => {
                opcode::WriteFixed::new(fd, op.buf, op.len, op.buf_index)
                    .offset(op.offset)
                    .rw_flags(flags)
                    .build()
            }
            (MemberOpKind::Write, false) => opcode::Write::new(fd, op.buf, op.len)
                .offset(op.offset)
                .rw_flags(flags)
                .build(),
            (MemberOpKind::Flush, _) => opcode::Fsync::new(fd)
                .flags(types::FsyncFlags::DATASYNC)
                .build(),
            (MemberOpKind::Zero, _) => opcode::Fallocate::new(fd, u64::from(op.len))
                .offset(op.offset)
                .mode(ZERO_RANGE)
                .build(),
        };
        entry.user_data(op.user_data)
    }
}

impl Engine for UringEngine {
    fn update_file(&mut self, index: u32, fd: RawFd) -> io::Result<()> {
        // The kernel keeps its own reference for requests in flight.
        self.ring
            .submitter()
            .register_files_update(index, &[fd])
            .map(|_| ())
    }

    unsafe fn push(&mut self, op: &MemberOp) -> io::Result<()> {
        let entry = self.entry(op);
        loop {
            // SAFETY: the caller guarantees the buffer outlives the operation.
            if unsafe { self.ring.submission().push(&entry) }.is_ok() {
                self.queued += 1;
                return Ok(());
            }
            // Submission queue full: hand what is queued to the kernel.
            self.ring.submit()?;
            self.queued = 0;
        }
    }

    fn complete(&mut self, min: u32, on_complete: &mut dyn FnMut(u64, i32)) -> io::Result<u32> {
        let mut passed = 0u32;
        loop {
            let ready = self.ring.completion().len() as u32;
            let want = if passed + ready >= min {
                0
            } else {
                (min - passed - ready) as usize
            };
            // With deferred task work, finished operations only reach the
            // completion queue when this thread enters the kernel; the
            // taskrun flag says some are waiting.
            let deferred = self.ring.submission().taskrun();
            if self.queued > 0 || want > 0 || deferred {
                match self.ring.submit_and_wait(want) {
                    Ok(_) => self.queued = 0,
                    Err(e) if e.raw_os_error() == Some(libc::EINTR) => continue,
                    Err(e) => return Err(e),
                }
            }
            for cqe in self.ring.completion() {
                on_complete(cqe.user_data(), cqe.result());
                passed += 1;
            }
            if passed >= min {
                return Ok(passed);
            }
        }
    }

    fn name(&self) -> &'static str {
        "io_uring"
    }
}

/// Synchronous positioned I/O in the calling thread.
pub struct PsyncEngine {
    files: Vec<RawFd>,
    done: Vec<(u64, i32)>,
}

impl PsyncEngine {
    pub fn new(files: &[RawFd], capacity: usize) -> PsyncEngine {
        PsyncEngine {
            files: files.to_vec(),
            done: Vec::with_capacity(capacity.max(16)),
        }
    }

    /// Perform `op` once; the raw result (bytes or -errno).
    ///
    /// # Safety
    /// As [`Engine::push`].
    unsafe fn perform(&self, op: &MemberOp) -> i32 {
        let fd = self.files[op.file as usize];
        let offset = op.offset as libc::off_t;
        let single = libc::iovec {
            iov_base: op.buf.cast(),
            iov_len: op.len as usize,
        };
        let (iov, count) = if op.iov_count > 0 {
            (op.iov, op.iov_count as i32)
        } else {
            (&single as *const libc::iovec, 1)
        };
        let flags = if op.dsync { libc::RWF_DSYNC } else { 0 };
        // SAFETY: the caller guarantees buf (or each iovec) is valid for its
        // length and that iov points at iov_count iovecs; `single` lives
        // until the call returns.
        let ret = unsafe {
            match op.kind {
                MemberOpKind::Read if count == 1 => {
                    libc::pread(fd, (*iov).iov_base, (*iov).iov_len, offset) as i64
                }
                MemberOpKind::Read => libc::preadv(fd, iov, count, offset) as i64,
                MemberOpKind::Write if count == 1 && flags == 0 => {
                    libc::pwrite(fd, (*iov).iov_base, (*iov).iov_len, offset) as i64
                }
                MemberOpKind::Write => libc::pwritev2(fd, iov, count, offset, flags) as i64,
                MemberOpKind::Flush => i64::from(libc::fdatasync(fd)),
                MemberOpKind::Zero => {
                    let len = libc::off_t::from(op.len);
                    i64::from(libc::fallocate(fd, ZERO_RANGE, offset, len))
                }
            }
        };
        if ret < 0 {
            -io::Error::last_os_error()
                .raw_os_error()
                .unwrap_or(libc::EIO)
        } else {
            ret as i32
        }
    }
}

impl Engine for PsyncEngine {
    fn update_file(&mut self, index: u32, fd: RawFd) -> io::Result<()> {
        self.files[index as usize] = fd;
        Ok(())
    }

    unsafe fn push(&mut self, op: &MemberOp) -> io::Result<()> {
        // SAFETY: forwarded from the caller.
        let result = unsafe { self.perform(op) };
        self.done.push((op.user_data, result));
        Ok(())
    }

    fn complete(&mut self, _min: u32, on_complete: &mut dyn FnMut(u64, i32)) -> io::Result<u32> {
        let count = self.done.len() as u32;
        for (user_data, result) in self.done.drain(..) {
            on_complete(user_data, result);
        }
        Ok(count)
    }

    fn name(&self) -> &'static str {
        "psync"
    }

    fn completes_inline(&self) -> bool {
        true
    }
}

/// psync with injected faults: those of a [`FaultPlan`] (short transfers,
/// EAGAIN answers, a failed file) and of [`MemberFaults`].
pub struct FaultyEngine {
    inner: PsyncEngine,
    plan: FaultPlan,
    count: u32,
    member: MemberFaults,
    /// Operations pushed on the file of `member.eio_from_op`.
    file_ops: u64,
}

impl FaultyEngine {
    /// A faulty engine over the file table `files` (as [`open_engine`]).
    pub fn new(
        files: &[RawFd],
        entries: u32,
        plan: FaultPlan,
        member: MemberFaults,
    ) -> FaultyEngine {
        FaultyEngine {
            inner: PsyncEngine::new(files, entries as usize),
            plan,
            count: 0,
            member,
            file_ops: 0,
        }
    }

    /// Whether a member fault answers `op` (slept, counted, and for a torn
    /// write partly done): the answer to report instead of doing it.
    ///
    /// # Safety
    /// As [`Engine::push`].
    unsafe fn member_fault(&mut self, op: &MemberOp) -> Option<i32> {
        let member = self.member;
        if !member.latency.is_zero() && member.latency_file.is_none_or(|f| f == op.file) {
            std::thread::sleep(member.latency);
        }
        if let Some((file, from)) = member.eio_from_op {
            if file == op.file {
                let nth = self.file_ops;
                self.file_ops += 1;
                if nth >= from {
                    return Some(-libc::EIO);
                }
            }
        }
        if matches!(op.kind, MemberOpKind::Flush | MemberOpKind::Zero) {
            return None;
        }
        // SAFETY: forwarded from the caller.
        let len = unsafe { op_bytes(op) };
        let touches = |file: u32, start: u64, end: u64| {
            file == op.file && op.offset < end && op.offset + len > start
        };
        if let Some(range) = member.eio_range {
            let applies = match op.kind {
                MemberOpKind::Read => range.reads,
                _ => range.writes,
            };
            if applies && touches(range.file, range.start, range.end) {
                return Some(-libc::EIO);
            }
        }
        match member.torn_write {
            Some(torn)
                if op.kind == MemberOpKind::Write && touches(torn.file, torn.start, torn.end) =>
            {
                // SAFETY: forwarded from the caller.
                let landed = unsafe { self.write_prefix(op, u64::from(torn.keep_bytes)) };
                Some(if landed < 0 { landed } else { -libc::EIO })
            }
            _ => None,
        }
    }

    /// Writes the first `keep` bytes of `op` (plain writes, one per iovec);
    /// 0 or the first negative errno.
    ///
    /// # Safety
    /// As [`Engine::push`].
    unsafe fn write_prefix(&self, op: &MemberOp, keep: u64) -> i32 {
        let single = libc::iovec {
            iov_base: op.buf.cast(),
            iov_len: op.len as usize,
        };
        let pieces = if op.iov_count > 0 {
            // SAFETY: the caller guarantees op.iov holds iov_count entries.
            unsafe { std::slice::from_raw_parts(op.iov, op.iov_count as usize) }
        } else {
            std::slice::from_ref(&single)
        };
        let mut done = 0u64;
        for piece in pieces {
            let len = (piece.iov_len as u64).min(keep - done);
            if len == 0 {
                break;
            }
            let part = MemberOp {
                buf: piece.iov_base.cast(),
                len: len as u32,
                iov: std::ptr::null(),
                iov_count: 0,
                offset: op.offset + done,
                ..*op
            };
            // SAFETY: `part` lies inside the caller's buffer.
            let moved = unsafe { self.inner.perform(&part) };
            if moved < 0 {
                return moved;
            }
            done += len;
        }
        0
    }
}

/// The bytes `op` moves in full.
///
/// # Safety
/// As [`Engine::push`].
unsafe fn op_bytes(op: &MemberOp) -> u64 {
    if op.iov_count == 0 {
        return u64::from(op.len);
    }
    // SAFETY: the caller guarantees op.iov holds iov_count entries.
    let iovs = unsafe { std::slice::from_raw_parts(op.iov, op.iov_count as usize) };
    iovs.iter().map(|iov| iov.iov_len as u64).sum()
}

impl Engine for FaultyEngine {
    fn update_file(&mut self, index: u32, fd: RawFd) -> io::Result<()> {
        self.inner.update_file(index, fd)
    }

    unsafe fn push(&mut self, op: &MemberOp) -> io::Result<()> {
        self.count = self.count.wrapping_add(1);
        if self.plan.eio_file == Some(op.file) {
            self.inner.done.push((op.user_data, -libc::EIO));
            return Ok(());
        }
        // SAFETY: forwarded from the caller.
        if let Some(answer) = unsafe { self.member_fault(op) } {
            self.inner.done.push((op.user_data, answer));
            return Ok(());
        }
        if self.plan.eagain_every > 0 && self.count.is_multiple_of(self.plan.eagain_every) {
            self.inner.done.push((op.user_data, -libc::EAGAIN));
            return Ok(());
        }
        let mut short = *op;
        if !matches!(op.kind, MemberOpKind::Flush | MemberOpKind::Zero) {
            // A short transfer: the first iovec only, capped.
            if op.iov_count > 0 {
                // SAFETY: the caller guarantees op.iov holds iov_count >= 1 entries.
                let first = unsafe { *op.iov };
                short.buf = first.iov_base.cast();
                short.len = first.iov_len as u32;
                short.iov_count = 0;
            }
            short.len = short.len.min(self.plan.transfer_bytes_max.max(1));
        }
        // SAFETY: forwarded from the caller; the shortened range lies inside the original.
        unsafe { self.inner.push(&short) }
    }

    fn complete(&mut self, min: u32, on_complete: &mut dyn FnMut(u64, i32)) -> io::Result<u32> {
        self.inner.complete(min, on_complete)
    }

    fn name(&self) -> &'static str {
        "faulty-psync"
    }

    fn completes_inline(&self) -> bool {
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sys;
    use std::fs::File;
    use std::os::fd::AsRawFd;
    use std::time::Instant;

    /// Two 64 KiB member files, file `i` filled with byte `i + 1`.
    fn members() -> [File; 2] {
        [1u8, 2].map(|fill| {
            let file = sys::memfd("faulty-engine-test", 65536).unwrap();
            sys::write_full_at(&file, &[fill; 65536], 0).unwrap();
            file
        })
    }

    fn engine(files: &[File; 2], plan: FaultPlan, member: MemberFaults) -> Box<dyn Engine> {
        open(files, EngineKind::FaultyMember(plan, member))
    }

    fn open(files: &[File; 2], kind: EngineKind) -> Box<dyn Engine> {
        let fds = files.each_ref().map(|f| f.as_raw_fd());
        open_engine(kind, &fds, &[], 16).unwrap()
    }

    fn op(kind: MemberOpKind, file: u32, offset: u64, buf: &mut [u8]) -> MemberOp {
        MemberOp {
            kind,
            file,
            offset,
            buf: buf.as_mut_ptr(),
            len: buf.len() as u32,
            iov: std::ptr::null(),
            iov_count: 0,
            buf_index: 0,
            dsync: false,
            user_data: 7,
        }
    }

    /// Pushes `op` and returns its raw result.
    fn run(engine: &mut dyn Engine, op: &MemberOp) -> i32 {
        // SAFETY: the op's buffer (or iovecs) outlive this call, which
        // completes the op before returning.
        unsafe { engine.push(op) }.unwrap();
        let mut result = None;
        engine
            .complete(1, &mut |user_data, r| {
                assert_eq!(user_data, 7);
                result = Some(r);
            })
            .unwrap();
        result.unwrap()
    }

    fn read(engine: &mut dyn Engine, file: u32, offset: u64, len: usize) -> i32 {
        let mut buf = vec![0u8; len];
        run(engine, &op(MemberOpKind::Read, file, offset, &mut buf))
    }

    fn write(engine: &mut dyn Engine, file: u32, offset: u64, data: &[u8]) -> i32 {
        let mut buf = data.to_vec();
        run(engine, &op(MemberOpKind::Write, file, offset, &mut buf))
    }

    fn bytes(file: &File, offset: u64, len: usize) -> Vec<u8> {
        let mut buf = vec![0u8; len];
        sys::read_full_at(file, &mut buf, offset).unwrap();
        buf
    }

    #[test]
    fn plan_faults_behave_as_before() {
        let files = members();
        let plan = FaultPlan {
            transfer_bytes_max: 1000,
            eagain_every: 3,
            eio_file: Some(1),
        };
        let member = EngineKind::FaultyMember(plan, MemberFaults::NONE);
        for kind in [EngineKind::Faulty(plan), member] {
            assert_eq!(kind.name(), "faulty-psync");
            let mut e = open(&files, kind);
            assert_eq!(read(&mut *e, 0, 0, 4096), 1000, "short transfer");
            assert_eq!(read(&mut *e, 0, 0, 4096), 1000);
            assert_eq!(read(&mut *e, 0, 0, 4096), -libc::EAGAIN, "every third");
            assert_eq!(read(&mut *e, 1, 0, 512), -libc::EIO, "failed file");
            assert_eq!(write(&mut *e, 0, 0, &[6; 512]), 512);
            assert_eq!(read(&mut *e, 0, 0, 512), -libc::EAGAIN);
        }
        assert_eq!(bytes(&files[0], 0, 1), [6]);
    }

    #[test]
    fn range_errors_hit_only_that_file_and_range() {
        let files = members();
        let member = MemberFaults {
            eio_range: Some(FileRange {
                file: 1,
                start: 8192,
                end: 12288,
                reads: true,
                writes: false,
            }),
            ..MemberFaults::NONE
        };
        let mut e = engine(&files, FaultPlan::NONE, member);
        assert_eq!(read(&mut *e, 1, 4096, 4097), -libc::EIO);
        assert_eq!(read(&mut *e, 1, 12287, 1), -libc::EIO);
        assert_eq!(read(&mut *e, 1, 4096, 4096), 4096);
        assert_eq!(read(&mut *e, 1, 12288, 4096), 4096);
        assert_eq!(read(&mut *e, 0, 8192, 4096), 4096, "other file");
        assert_eq!(write(&mut *e, 1, 8192, &[9; 512]), 512, "reads only");
        assert_eq!(bytes(&files[1], 8192, 1), [9]);

        let writes = FileRange {
            reads: false,
            writes: true,
            ..member.eio_range.unwrap()
        };
        let member = MemberFaults {
            eio_range: Some(writes),
            ..MemberFaults::NONE
        };
        let mut e = engine(&files, FaultPlan::NONE, member);
        assert_eq!(write(&mut *e, 1, 8192, &[8; 512]), -libc::EIO);
        assert_eq!(
            bytes(&files[1], 8192, 1),
            [9],
            "a failed write moves nothing"
        );
        assert_eq!(read(&mut *e, 1, 8192, 512), 512);
    }

    /// A Zero operation makes its range read as zeros on both engines, and
    /// leaves the bytes around it and the file's size alone.
    #[test]
    fn zero_ranges_read_back_as_zeros_on_every_engine() {
        for kind in [EngineKind::Psync, EngineKind::Uring] {
            let files = members();
            let mut e = open(&files, kind);
            let zero = MemberOp {
                len: 8192,
                buf: std::ptr::null_mut(),
                ..op(MemberOpKind::Zero, 1, 4096, &mut [])
            };
            assert_eq!(run(&mut *e, &zero), 0, "{kind:?}");
            assert_eq!(bytes(&files[1], 4096, 8192), vec![0u8; 8192], "{kind:?}");
            assert_eq!(bytes(&files[1], 4095, 1), [2], "{kind:?}: before the range");
            assert_eq!(bytes(&files[1], 12288, 1), [2], "{kind:?}: after the range");
            assert_eq!(bytes(&files[0], 4096, 1), [1], "{kind:?}: the other file");
            assert_eq!(files[1].metadata().unwrap().len(), 65536, "{kind:?}: size");
        }
    }

    #[test]
    fn errors_from_the_nth_operation_on_one_file() {
        let files = members();
        let member = MemberFaults {
            eio_from_op: Some((0, 2)),
            ..MemberFaults::NONE
        };
        let mut e = engine(&files, FaultPlan::NONE, member);
        assert_eq!(read(&mut *e, 0, 0, 512), 512);
        assert_eq!(read(&mut *e, 1, 0, 512), 512);
        assert_eq!(write(&mut *e, 0, 0, &[5; 512]), 512);
        let flush = op(MemberOpKind::Flush, 0, 0, &mut []);
        assert_eq!(run(&mut *e, &flush), -libc::EIO, "the third op on file 0");
        assert_eq!(read(&mut *e, 0, 4096, 512), -libc::EIO);
        assert_eq!(read(&mut *e, 1, 4096, 512), 512, "file 1 is fine");
        assert_eq!(bytes(&files[0], 0, 1), [5]);
    }

    #[test]
    fn latency_slows_one_file() {
        let files = members();
        let latency = Duration::from_millis(20);
        let member = MemberFaults {
            latency,
            latency_file: Some(1),
            ..MemberFaults::NONE
        };
        let mut e = engine(&files, FaultPlan::NONE, member);
        let started = Instant::now();
        assert_eq!(read(&mut *e, 1, 0, 512), 512);
        assert!(started.elapsed() >= latency);
        let started = Instant::now();
        for _ in 0..5 {
            assert_eq!(read(&mut *e, 0, 0, 512), 512);
        }
        assert!(started.elapsed() < latency, "file 0 is not slowed");
    }

    #[test]
    fn torn_writes_land_a_prefix_then_fail() {
        let files = members();
        let member = MemberFaults {
            torn_write: Some(TornFileWrite {
                file: 0,
                start: 16384,
                end: 16385,
                keep_bytes: 1000,
            }),
            ..MemberFaults::NONE
        };
        let mut e = engine(&files, FaultPlan::NONE, member);
        assert_eq!(write(&mut *e, 0, 12288, &[7; 8192]), -libc::EIO);
        let after = bytes(&files[0], 12288, 8192);
        assert!(after[..1000].iter().all(|&b| b == 7));
        assert!(after[1000..].iter().all(|&b| b == 1));
        assert_eq!(write(&mut *e, 1, 16384, &[7; 512]), 512, "other file");
        assert_eq!(write(&mut *e, 0, 0, &[7; 512]), 512, "outside the range");

        // A vectored write: the prefix spans iovecs.
        let (mut a, mut b) = (vec![3u8; 512], vec![4u8; 4096]);
        let iovs = [&mut a, &mut b].map(|v| libc::iovec {
            iov_base: v.as_mut_ptr().cast(),
            iov_len: v.len(),
        });
        let vectored = MemberOp {
            iov: iovs.as_ptr(),
            iov_count: 2,
            ..op(MemberOpKind::Write, 0, 16384, &mut [])
        };
        assert_eq!(run(&mut *e, &vectored), -libc::EIO);
        let after = bytes(&files[0], 16384, 4608);
        assert!(after[..512].iter().all(|&x| x == 3));
        assert!(after[512..1000].iter().all(|&x| x == 4));
        assert!(after[1000..].iter().all(|&x| x == 1));
    }
}
