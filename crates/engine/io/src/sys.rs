//! Checked wrappers over system calls `std` does not offer.

use std::ffi::CString;
use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd};
use std::os::unix::fs::FileExt;

const BLKSSZGET: libc::c_ulong = 0x1268;
const BLKPBSZGET: libc::c_ulong = 0x127b;
const BLKGETSIZE64: libc::c_ulong = 0x8008_1272;
const BLKDISCARD: libc::c_ulong = 0x1277;

fn cvt(ret: libc::c_int) -> io::Result<libc::c_int> {
    if ret < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(ret)
    }
}

/// Size in bytes of a block device.
pub fn block_device_bytes(file: &File) -> io::Result<u64> {
    let mut size: u64 = 0;
    // SAFETY: BLKGETSIZE64 writes one u64 through the pointer, which is valid.
    cvt(unsafe { libc::ioctl(file.as_raw_fd(), BLKGETSIZE64 as _, &mut size as *mut u64) })?;
    Ok(size)
}

/// Logical and physical block size of a block device.
pub fn block_device_block_bytes(file: &File) -> io::Result<(u32, u32)> {
    let mut logical: libc::c_int = 0;
    let mut physical: libc::c_uint = 0;
    // SAFETY: BLKSSZGET writes one int through the pointer, which is valid.
    cvt(unsafe {
        libc::ioctl(
            file.as_raw_fd(),
            BLKSSZGET as _,
            &mut logical as *mut libc::c_int,
        )
    })?;
    // SAFETY: BLKPBSZGET writes one unsigned int through the pointer, which is valid.
    cvt(unsafe {
        libc::ioctl(
            file.as_raw_fd(),
            BLKPBSZGET as _,
            &mut physical as *mut libc::c_uint,
        )
    })?;
    Ok((logical as u32, physical))
}

/// Discard a byte range of a block device.
pub fn block_device_discard(file: &File, offset: u64, len: u64) -> io::Result<()> {
    let range: [u64; 2] = [offset, len];
    // SAFETY: BLKDISCARD reads two u64 through the pointer, which is valid.
    cvt(unsafe { libc::ioctl(file.as_raw_fd(), BLKDISCARD as _, range.as_ptr()) })?;
    Ok(())
}

/// Deallocate a byte range of a regular file (reads then return zeros).
pub fn punch_hole(file: &File, offset: u64, len: u64) -> io::Result<()> {
    let mode = libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE;
    // SAFETY: fallocate takes plain integers; the fd is open for the call.
    cvt(unsafe {
        libc::fallocate(
            file.as_raw_fd(),
            mode,
            offset as libc::off_t,
            len as libc::off_t,
        )
    })?;
    Ok(())
}

/// An anonymous in-memory file (memfd) of `len` bytes, sparse.
pub fn memfd(name: &str, len: u64) -> io::Result<File> {
    let cname = CString::new(name)
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "NUL in name"))?;
    // SAFETY: cname is a valid NUL-terminated string for the duration of the call.
    let fd = cvt(unsafe { libc::memfd_create(cname.as_ptr(), libc::MFD_CLOEXEC) })?;
    // SAFETY: fd was just returned by memfd_create and is owned by nobody else.
    let file = unsafe { File::from_raw_fd(fd) };
    file.set_len(len)?;
    Ok(file)
}

/// Read exactly `buf.len()` bytes at `offset`, retrying short reads and
/// EINTR. Reading past the end of the file is an `UnexpectedEof` error.
pub fn read_full_at(file: &File, buf: &mut [u8], offset: u64) -> io::Result<()> {
    file.read_exact_at(buf, offset)
}

/// Write all of `buf` at `offset`, retrying short writes and EINTR.
pub fn write_full_at(file: &File, buf: &[u8], offset: u64) -> io::Result<()> {
    file.write_all_at(buf, offset)
}

/// Flush a file's data (and the metadata needed to read it back) to stable
/// storage.
pub fn data_sync(file: &File) -> io::Result<()> {
    file.sync_data()
}

/// Whether `path` lies on a tmpfs (RAM-backed, completes I/O in the caller).
pub fn is_on_tmpfs(path: &std::path::Path) -> bool {
    use std::os::unix::ffi::OsStrExt;
    let Ok(c_path) = CString::new(path.as_os_str().as_bytes()) else {
        return false;
    };
    // SAFETY: statfs is a plain C struct for which all-zero bytes are valid.
    let mut stat: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: c_path is a valid C string and stat a valid out-pointer for the call.
    let ret = unsafe { libc::statfs(c_path.as_ptr(), &mut stat) };
    ret == 0 && stat.f_type == libc::TMPFS_MAGIC
}

/// Take an exclusive advisory lock (`flock`) on an open file without
/// waiting: `Ok(false)` when another open file description holds a lock on
/// the same file. The lock lasts until the descriptor is closed.
pub fn try_lock_exclusive(file: &File) -> io::Result<bool> {
    use std::os::unix::io::AsRawFd;
    // SAFETY: flock on a descriptor this File owns; no memory is passed.
    let ret = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
    if ret == 0 {
        return Ok(true);
    }
    let err = io::Error::last_os_error();
    if err.raw_os_error() == Some(libc::EWOULDBLOCK) {
        Ok(false)
    } else {
        Err(err)
    }
}

/// Release a lock taken with [`try_lock_exclusive`].
pub fn unlock(file: &File) -> io::Result<()> {
    use std::os::unix::io::AsRawFd;
    // SAFETY: flock on a descriptor this File owns; no memory is passed.
    if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_UN) } == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Point `file`'s descriptor at /dev/null (dup2): the file or device it
/// had open is let go (once nothing else holds it), while the descriptor
/// number stays valid and owned by `file`, so a thread that still uses the
/// number reads end-of-file and writes nowhere, never another file that
/// took the number.
pub fn point_at_null(file: &File) -> io::Result<()> {
    use std::os::unix::io::AsRawFd;
    let null = File::options().read(true).write(true).open("/dev/null")?;
    // SAFETY: dup2 onto a descriptor this File owns, from one `null` owns;
    // no memory is passed. `null` closes its own descriptor when dropped.
    if unsafe { libc::dup2(null.as_raw_fd(), file.as_raw_fd()) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// The major and minor numbers of a `st_dev`.
pub fn dev_major_minor(dev: u64) -> (u32, u32) {
    (libc::major(dev), libc::minor(dev))
}

/// poll(2): wait until one of `fds` is ready or `timeout_ms` passed (-1:
/// no limit). Interruptions and errors count as a wake-up; the caller
/// looks again either way.
pub fn poll(fds: &mut [libc::pollfd], timeout_ms: i32) -> usize {
    // SAFETY: `fds` is a valid slice of pollfd for its length.
    let ret = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, timeout_ms) };
    ret.max(0) as usize
}

/// readv(2) on a socket or pipe: bytes read (0 at end of stream).
///
/// # Safety
/// Every iovec must describe memory valid for writes of its length.
pub unsafe fn readv(fd: i32, iov: &[libc::iovec]) -> io::Result<usize> {
    // SAFETY: forwarded from the caller.
    let ret = unsafe { libc::readv(fd, iov.as_ptr(), iov.len().min(1024) as i32) };
    if ret < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(ret as usize)
    }
}

/// writev(2) on a socket (with MSG_NOSIGNAL semantics: a closed peer is
/// EPIPE, never SIGPIPE): bytes written.
///
/// # Safety
/// Every iovec must describe memory valid for reads of its length.
pub unsafe fn send_vectored(fd: i32, iov: &[libc::iovec]) -> io::Result<usize> {
    // SAFETY: an all-zero msghdr is valid; the iovecs are the caller's.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = iov.as_ptr().cast_mut();
    msg.msg_iovlen = iov.len().min(1024) as _;
    // SAFETY: `msg` points at the caller's valid iovecs.
    let ret = unsafe { libc::sendmsg(fd, &msg, libc::MSG_NOSIGNAL) };
    if ret < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(ret as usize)
    }
}

/// SO_RCVLOWAT: poll(2) reports a socket readable only once `bytes` are
/// waiting (or the peer closed).
pub fn set_rcvlowat(fd: i32, bytes: usize) -> io::Result<()> {
    let value = bytes.min(i32::MAX as usize) as libc::c_int;
    // SAFETY: `value` is a valid c_int for the call's duration.
    let ret = unsafe {
        libc::setsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_RCVLOWAT,
            (&value as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if ret < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

/// shutdown(2) of both directions of a socket. On a listening socket it
/// wakes a thread blocked in accept(2) (which fails with EINVAL), with no
/// connection needed (its path may be gone).
pub fn shutdown_socket(fd: i32) {
    // SAFETY: shutdown takes no pointers; a bad descriptor is an error.
    let _ = unsafe { libc::shutdown(fd, libc::SHUT_RDWR) };
}

/// SIGKILL to every process of the process group `pgid` (a child started
/// as the leader of its own group, and whatever it started in turn).
pub fn kill_process_group(pgid: u32) -> io::Result<()> {
    let pgid =
        libc::pid_t::try_from(pgid).map_err(|_| io::Error::from_raw_os_error(libc::ESRCH))?;
    if pgid <= 1 {
        return Err(io::Error::from_raw_os_error(libc::ESRCH));
    }
    // SAFETY: kill takes no pointers; a negative pid names a group.
    cvt(unsafe { libc::kill(-pgid, libc::SIGKILL) }).map(drop)
}

/// A non-blocking eventfd, for waking a thread that sleeps in poll(2).
pub fn eventfd() -> io::Result<std::os::fd::OwnedFd> {
    // SAFETY: eventfd takes no pointers.
    let fd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `fd` is a new descriptor owned by nobody else.
    Ok(unsafe { std::os::fd::OwnedFd::from_raw_fd(fd) })
}

/// Make an eventfd readable (best effort: a full counter is readable anyway).
pub fn eventfd_signal(fd: i32) {
    let one: u64 = 1;
    // SAFETY: writes 8 bytes from `one`.
    let _ = unsafe { libc::write(fd, (&one as *const u64).cast(), 8) };
}

/// Reset an eventfd to not readable.
pub fn eventfd_drain(fd: i32) {
    let mut value: u64 = 0;
    // SAFETY: reads 8 bytes into `value`.
    let _ = unsafe { libc::read(fd, (&mut value as *mut u64).cast(), 8) };
}

/// Whether standard output is a pipe (or socket) whose reader has gone:
/// what `nvraid ... | head` meets once `head` has what it wanted.
pub fn stdout_reader_gone() -> bool {
    let mut fds = [libc::pollfd {
        fd: libc::STDOUT_FILENO,
        events: 0,
        revents: 0,
    }];
    poll(&mut fds, 0) > 0 && fds[0].revents & (libc::POLLERR | libc::POLLHUP) != 0
}

/// End the process as a program that does not ignore SIGPIPE ends when it
/// writes to a pipe nobody reads (`cat`, `ls`): quietly, by that signal.
pub fn exit_by_sigpipe() -> ! {
    // SAFETY: restoring the default action of one signal and raising it in
    // this thread; nothing else is touched.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
        libc::raise(libc::SIGPIPE);
    }
    // Not reached unless the signal is blocked: the shell's code for it.
    std::process::exit(128 + libc::SIGPIPE)
}
