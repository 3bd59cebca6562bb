//! Every `unsafe` of the crate: the rings' submission (the kernel is handed
//! addresses), the read-only map of a queue's descriptor array, the tag
//! buffers the kernel copies request data into and out of, and a few
//! syscalls. Each type here keeps the promise its `SAFETY:` comments rely
//! on by itself, so the rest of the crate is safe code.
//!
//! The rule for a buffer the kernel is given: it stays allocated, and Rust
//! holds no reference to it, from the submission of the command that names
//! it until that command's completion has been read. Where a completion can
//! no longer be read (a ring dropped with commands in the kernel, a wait
//! that failed), the buffer is leaked rather than freed.

use std::alloc::{self, Layout};
use std::io;
use std::mem::size_of;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::ptr::NonNull;

use io_uring::{cqueue, opcode, squeue, types, IoUring};

use crate::uapi::{CtrlCmd, DevInfo, IoCmd, IoDescRaw, Params};

type Ring = IoUring<squeue::Entry128, cqueue::Entry>;

/// Plain data the kernel may read and fill: `#[repr(C)]`, every bit
/// pattern valid. Sealed: only the uapi structs.
pub trait Plain: Copy + 'static + private::Sealed {}
mod private {
    pub trait Sealed {}
}
macro_rules! plain {
    ($($t:ty),*) => {$(impl private::Sealed for $t {} impl Plain for $t {})*};
}
plain!(CtrlCmd, IoCmd, DevInfo, Params, u64);

/// A command's argument: `CtrlCmd` or `IoCmd`, neither of which has
/// padding bytes.
pub(crate) trait CmdArg: Plain {}
impl CmdArg for CtrlCmd {}
impl CmdArg for IoCmd {}

/// The 80-byte command area of an SQE128 holding `value`.
pub(crate) fn to_cmd_area<T: CmdArg>(value: &T) -> [u8; 80] {
    let mut area = [0u8; 80];
    let n = size_of::<T>().min(80);
    // SAFETY: `T` is `CtrlCmd` or `IoCmd`, which have no padding, so all
    // `n` bytes read are initialised; `area` has room for `n` bytes.
    unsafe {
        std::ptr::copy_nonoverlapping((value as *const T).cast::<u8>(), area.as_mut_ptr(), n)
    };
    area
}

fn new_ring(entries: u32) -> io::Result<Ring> {
    IoUring::<squeue::Entry128, cqueue::Entry>::builder().build(entries)
}

/// Submit what is queued, retrying when a signal interrupts.
fn submit(ring: &Ring, wait: usize) -> io::Result<()> {
    loop {
        match ring.submitter().submit_and_wait(wait) {
            Ok(_) => return Ok(()),
            Err(e) if e.raw_os_error() == Some(libc::EINTR) => continue,
            Err(e) => return Err(e),
        }
    }
}

/// A small ring for control commands, one at a time.
pub(crate) struct CtrlRing {
    ring: Ring,
    /// A command whose completion has not been read.
    busy: bool,
}

impl CtrlRing {
    pub(crate) fn new() -> io::Result<CtrlRing> {
        Ok(CtrlRing {
            ring: new_ring(4)?,
            busy: false,
        })
    }

    /// Run one command on `fd` (/dev/ublk-control) and wait for it; `buf`,
    /// when given, is what `cmd.addr` points at for the command (the
    /// kernel reads and/or fills it). The completion's result: >= 0, or a
    /// negative errno.
    pub(crate) fn run<T: Plain>(
        &mut self,
        fd: RawFd,
        op: u32,
        mut cmd: CtrlCmd,
        buf: Option<&mut T>,
    ) -> io::Result<i32> {
        assert!(!self.busy, "a control ring runs one command at a time");
        // The kernel gets a heap copy, so that the caller's value is never
        // referenced while the kernel may write it; if the completion
        // cannot be awaited, the copy is leaked instead of freed.
        let copy: Option<Box<T>> = buf.as_ref().map(|b| Box::new(**b));
        let ptr = copy.as_ref().map(|b| &**b as *const T as *mut T);
        match ptr {
            Some(p) => {
                cmd.addr = p as u64;
                cmd.len = size_of::<T>() as u16;
            }
            None => {
                cmd.addr = 0;
                cmd.len = 0;
            }
        }
        let entry = opcode::UringCmd80::new(types::Fd(fd), op)
            .cmd(to_cmd_area(&cmd))
            .build()
            .user_data(1);
        // SAFETY: the entry names `ptr` (a live heap allocation of
        // `size_of::<T>()` bytes, `T` plain data) or nothing. The
        // allocation is freed below only after this command's completion
        // was read; on any early return it is leaked.
        unsafe { self.ring.submission().push(&entry) }
            .map_err(|_| io::Error::other("control ring full"))?;
        self.busy = true;
        let result = loop {
            if let Err(e) = submit(&self.ring, 1) {
                std::mem::forget(copy);
                return Err(e);
            }
            if let Some(cqe) = self.ring.completion().next() {
                break cqe.result();
            }
        };
        self.busy = false;
        if let (Some(copy), Some(buf)) = (copy, buf) {
            // The kernel is done with it: read back what it wrote.
            // SAFETY: `p` came from `copy`, still allocated; `T` is plain
            // data, so whatever bytes the kernel left are a valid `T`.
            *buf = unsafe { std::ptr::read(ptr.unwrap()) };
            drop(copy);
        }
        Ok(result)
    }

    /// Submit a command that names no buffer, without waiting for it.
    pub(crate) fn submit(&mut self, fd: RawFd, op: u32, mut cmd: CtrlCmd) -> io::Result<()> {
        assert!(!self.busy, "a control ring runs one command at a time");
        cmd.addr = 0;
        cmd.len = 0;
        let entry = opcode::UringCmd80::new(types::Fd(fd), op)
            .cmd(to_cmd_area(&cmd))
            .build()
            .user_data(1);
        // SAFETY: the command carries no address (addr = 0, len = 0), so
        // the kernel touches no user memory for it.
        unsafe { self.ring.submission().push(&entry) }
            .map_err(|_| io::Error::other("control ring full"))?;
        submit(&self.ring, 0)?;
        self.busy = true;
        Ok(())
    }

    /// The submitted command's result once it has completed; blocks for
    /// it with `wait`.
    pub(crate) fn complete(&mut self, wait: bool) -> io::Result<Option<i32>> {
        if !self.busy {
            return Ok(None);
        }
        submit(&self.ring, usize::from(wait))?;
        Ok(self.ring.completion().next().map(|cqe| {
            self.busy = false;
            cqe.result()
        }))
    }

    pub(crate) fn fd(&self) -> RawFd {
        self.ring.as_raw_fd()
    }
}

/// One queue's descriptor array in /dev/ublkcN, mapped read-only.
pub(crate) struct DescMap {
    ptr: NonNull<u8>,
    len: usize,
    depth: u16,
}

// SAFETY: the map is a read-only view of kernel memory; nothing in it is
// tied to the thread that made it.
unsafe impl Send for DescMap {}

impl DescMap {
    pub(crate) fn map(fd: RawFd, offset: u64, len: usize, depth: u16) -> io::Result<DescMap> {
        assert!(depth as usize * size_of::<IoDescRaw>() <= len);
        // SAFETY: a new shared read-only mapping chosen by the kernel; no
        // existing memory is affected.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ,
                libc::MAP_SHARED | libc::MAP_POPULATE,
                fd,
                offset as libc::off_t,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        Ok(DescMap {
            ptr: NonNull::new(ptr.cast()).expect("mmap returned null"),
            len,
            depth,
        })
    }

    /// The descriptor of `tag`, copied out.
    pub(crate) fn get(&self, tag: u16) -> IoDescRaw {
        assert!(tag < self.depth);
        // SAFETY: `tag < depth`, and the map holds `depth` descriptors
        // (checked in `map`), 8-aligned (the map is page-aligned and a
        // descriptor is 24 bytes). The kernel writes it before it
        // completes the tag's command and not again until the tag is
        // committed, so the copy is consistent when the server reads it;
        // a volatile read because the memory is shared with the kernel.
        unsafe { std::ptr::read_volatile(self.ptr.as_ptr().cast::<IoDescRaw>().add(tag as usize)) }
    }
}

impl Drop for DescMap {
    fn drop(&mut self) {
        // SAFETY: unmaps exactly what `map` mapped; no reference into it
        // survives (`get` copies).
        unsafe { libc::munmap(self.ptr.as_ptr().cast(), self.len) };
    }
}

/// One data buffer per tag: the kernel copies a write's data into the
/// tag's buffer before handing the request over, and a read's data out of
/// it when the request is committed.
pub struct TagBuffers {
    addrs: Vec<*mut u8>,
    each: usize,
    /// The allocation, when the buffers are the crate's.
    owned: Option<(NonNull<u8>, Layout)>,
}

// SAFETY: the buffers are plain memory owned by this value (or promised
// to it by `from_raw`'s caller), usable from any thread.
unsafe impl Send for TagBuffers {}

impl TagBuffers {
    /// `count` buffers of `each` bytes (rounded up to 4 KiB), page-aligned
    /// and zeroed.
    pub fn allocate(count: u16, each: usize) -> TagBuffers {
        let each = each.max(1).next_multiple_of(4096);
        let layout = Layout::from_size_align(each * count.max(1) as usize, 4096)
            .expect("tag buffers too large");
        // SAFETY: the layout has a non-zero size.
        let base = unsafe { alloc::alloc_zeroed(layout) };
        let Some(base) = NonNull::new(base) else {
            alloc::handle_alloc_error(layout)
        };
        let addrs = (0..count as usize)
            // SAFETY: tag t's buffer starts t * each bytes into an
            // allocation of count * each bytes.
            .map(|t| unsafe { base.as_ptr().add(t * each) })
            .collect();
        TagBuffers {
            addrs,
            each,
            owned: Some((base, layout)),
        }
    }

    /// Buffers the caller already has (e.g. a worker's I/O slots), tag `t`
    /// at `addrs[t]`, each `each` bytes.
    ///
    /// # Safety
    /// Each `addrs[t]` must point to `each` bytes valid for reads and
    /// writes, distinct from every other tag's, that nothing else uses
    /// while the queue holds them, and that stay allocated until the
    /// queue that takes them is dropped, or forever if the queue is dropped
    /// before [`crate::Queue::finished`] (the kernel may still copy into a
    /// buffer whose command it holds).
    pub unsafe fn from_raw(addrs: Vec<*mut u8>, each: usize) -> TagBuffers {
        TagBuffers {
            addrs,
            each,
            owned: None,
        }
    }

    pub fn count(&self) -> usize {
        self.addrs.len()
    }

    /// Bytes in each tag's buffer.
    pub fn each(&self) -> usize {
        self.each
    }

    pub(crate) fn addr(&self, tag: u16) -> u64 {
        self.addrs[tag as usize] as u64
    }

    /// Tag `tag`'s buffer, its first `len` bytes. Only [`IoRing`] calls it,
    /// for a tag whose command is not in the kernel.
    fn slice_mut(&mut self, tag: u16, len: usize) -> &mut [u8] {
        let len = len.min(self.each);
        // SAFETY: the tag's buffer holds `each` bytes (allocate's layout,
        // or from_raw's promise); the `&mut self` borrow and the caller's
        // check that the kernel does not hold the tag make this the only
        // access.
        unsafe { std::slice::from_raw_parts_mut(self.addrs[tag as usize], len) }
    }
}

impl Drop for TagBuffers {
    fn drop(&mut self) {
        if let Some((base, layout)) = self.owned {
            // SAFETY: allocated in `allocate` with this layout. An
            // `IoRing` forgets its buffers rather than drop them while the
            // kernel may use one.
            unsafe { alloc::dealloc(base.as_ptr(), layout) };
        }
    }
}

/// A queue's ring of I/O commands and the tag buffers they name. It knows
/// which tags' commands are in the kernel, hands out a tag's buffer only
/// when it is not, and leaks the buffers if it is dropped while any is.
pub(crate) struct IoRing {
    ring: Ring,
    buffers: Option<TagBuffers>,
    in_kernel: Vec<bool>,
    held: usize,
}

impl IoRing {
    pub(crate) fn new(depth: u16, buffers: TagBuffers) -> io::Result<IoRing> {
        assert!(buffers.count() >= depth as usize, "a buffer per tag");
        Ok(IoRing {
            ring: new_ring(u32::from(depth).next_power_of_two().max(2))?,
            buffers: Some(buffers),
            in_kernel: vec![false; depth as usize],
            held: 0,
        })
    }

    /// Queue an I/O command for `tag` (FETCH_REQ or COMMIT_AND_FETCH_REQ)
    /// naming the tag's buffer; sent with the next `submit`.
    pub(crate) fn push(
        &mut self,
        fd: RawFd,
        op: u32,
        q_id: u16,
        tag: u16,
        result: i32,
    ) -> io::Result<()> {
        assert!(
            !self.in_kernel[tag as usize],
            "tag {tag} already in the kernel"
        );
        let cmd = IoCmd {
            q_id,
            tag,
            result,
            addr: self.buffers.as_ref().expect("buffers").addr(tag),
        };
        let entry = opcode::UringCmd80::new(types::Fd(fd), op)
            .cmd(to_cmd_area(&cmd))
            .build()
            .user_data(tag as u64);
        if self.ring.submission().is_full() {
            submit(&self.ring, 0)?;
        }
        // SAFETY: the entry names the tag's buffer, which stays allocated
        // while `in_kernel[tag]` (set now, cleared only when the tag's
        // completion is read in `drain`): `Drop` leaks the buffers while
        // any tag is in the kernel, and `buffer` refuses such a tag.
        unsafe { self.ring.submission().push(&entry) }
            .map_err(|_| io::Error::other("queue ring full"))?;
        self.in_kernel[tag as usize] = true;
        self.held += 1;
        Ok(())
    }

    /// Send the queued commands (and let completions be posted), not waiting.
    pub(crate) fn submit(&mut self) -> io::Result<()> {
        // Nothing queued: no need to enter the kernel. The ring is a plain
        // one (no deferred task work), so the kernel posts completions
        // whenever this thread returns to user space, entered or not.
        if self.ring.submission().is_empty() {
            return Ok(());
        }
        submit(&self.ring, 0)
    }

    /// Completions posted so far, as (tag, result).
    pub(crate) fn drain(&mut self, out: &mut Vec<(u16, i32)>) {
        for cqe in self.ring.completion() {
            let tag = cqe.user_data() as u16;
            if let Some(flag) = self.in_kernel.get_mut(tag as usize) {
                if *flag {
                    *flag = false;
                    self.held -= 1;
                }
            }
            out.push((tag, cqe.result()));
        }
    }

    /// Tags whose command the kernel holds.
    pub(crate) fn held(&self) -> usize {
        self.held
    }

    /// Tag `tag`'s buffer (first `len` bytes), while the server holds the tag.
    pub(crate) fn buffer(&mut self, tag: u16, len: usize) -> &mut [u8] {
        assert!(!self.in_kernel[tag as usize], "tag {tag} is in the kernel");
        self.buffers.as_mut().expect("buffers").slice_mut(tag, len)
    }

    pub(crate) fn buffer_addr(&self, tag: u16) -> u64 {
        self.buffers.as_ref().expect("buffers").addr(tag)
    }

    pub(crate) fn fd(&self) -> RawFd {
        self.ring.as_raw_fd()
    }
}

impl Drop for IoRing {
    fn drop(&mut self) {
        if self.held > 0 {
            // The kernel may still copy into a tag's buffer: never free it.
            std::mem::forget(self.buffers.take());
        }
    }
}

/// The system's page size.
pub(crate) fn page_size() -> usize {
    // SAFETY: sysconf takes no pointers.
    let size = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    if size > 0 {
        size as usize
    } else {
        4096
    }
}

/// poll(2): how many descriptors are ready (0 on timeout or a signal).
pub fn poll(fds: &mut [libc::pollfd], timeout_ms: i32) -> usize {
    // SAFETY: `fds` is a valid slice of pollfd for its length.
    let ret = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, timeout_ms) };
    ret.max(0) as usize
}

/// Block `signals` in this thread (and the threads it starts later) and
/// return a non-blocking signalfd that reports them.
pub fn signal_fd(signals: &[i32]) -> io::Result<OwnedFd> {
    // SAFETY: `set` is a local sigset_t initialised by sigemptyset before
    // use; the calls take pointers to it only for their duration.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        for &s in signals {
            libc::sigaddset(&mut set, s);
        }
        if libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut()) != 0 {
            return Err(io::Error::last_os_error());
        }
        let fd = libc::signalfd(-1, &set, libc::SFD_NONBLOCK | libc::SFD_CLOEXEC);
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(OwnedFd::from_raw_fd(fd))
    }
}

/// The next signal a `signal_fd` has, if any.
pub fn read_signal(fd: RawFd) -> Option<i32> {
    let mut info = [0u8; 128];
    // SAFETY: reads at most 128 bytes (one signalfd_siginfo) into `info`.
    let n = unsafe { libc::read(fd, info.as_mut_ptr().cast(), info.len()) };
    (n == 128).then(|| u32::from_ne_bytes(info[..4].try_into().unwrap()) as i32)
}

/// Deallocate `len` bytes at `offset` of a file (it reads zeros there
/// afterwards; its size is kept).
pub fn punch_hole(fd: RawFd, offset: u64, len: u64) -> io::Result<()> {
    // SAFETY: fallocate takes no pointers.
    let ret = unsafe {
        libc::fallocate(
            fd,
            libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
            offset as libc::off_t,
            len as libc::off_t,
        )
    };
    if ret < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}
