//! Member operations: the unit of work every engine, and every channel to
//! a remote member, executes. A read, write, flush or zeroing of one file
//! (by index in the worker's file table) at one offset; the caller keeps
//! the memory it names valid until the operation completes.

/// What a member operation does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MemberOpKind {
    Read,
    Write,
    /// fdatasync of the whole file.
    Flush,
    /// Make `len` bytes at `offset` read as zeros; no data moves (`buf` is
    /// not used); 0 on success, like `Flush`. Local files: a hole punched
    /// with fallocate; NBD exports: WRITE_ZEROES.
    Zero,
}

/// One operation on one member file.
#[derive(Clone, Copy, Debug)]
pub struct MemberOp {
    pub kind: MemberOpKind,
    /// Index in the worker's file table.
    pub file: u32,
    pub offset: u64,
    pub buf: *mut u8,
    pub len: u32,
    /// A vectored operation: `iov_count` iovecs at `iov` (then `buf` and
    /// `len` are ignored). 0 for a plain one.
    pub iov: *const libc::iovec,
    pub iov_count: u32,
    /// Index of the registered buffer `buf` lies in.
    pub buf_index: u16,
    /// Write with RWF_DSYNC (durable on completion: FUA).
    pub dsync: bool,
    pub user_data: u64,
}
