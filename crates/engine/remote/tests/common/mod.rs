//! Helpers shared by the remote crate's integration tests.
#![allow(dead_code)] // each test binary uses its own subset

use nvraid_io::engine::{MemberOp, MemberOpKind};

/// A plain (one-buffer) operation without FUA.
pub fn plain_op(
    kind: MemberOpKind,
    offset: u64,
    buf: *mut u8,
    len: u32,
    user_data: u64,
) -> MemberOp {
    MemberOp {
        kind,
        file: 0,
        offset,
        buf,
        len,
        iov: std::ptr::null(),
        iov_count: 0,
        buf_index: 0,
        dsync: false,
        user_data,
    }
}
