//! nvraid-member: one device an array is built from.
//!
//! A member is named by a *spec*: a path (regular file or block device), or
//! `mem:SIZE` (RAM, backed by a memfd so the io_uring engine can use it like
//! any file) or `null:SIZE` (reads return zeros, writes are dropped; for
//! measuring the engine itself), or an NBD URI (`nbd://HOST[:PORT]/EXPORT`,
//! `nbd+unix:///EXPORT?socket=PATH`: a remote export, see nvraid-remote),
//! or an NVMe/TCP URI (`nvme+tcp://HOST[:PORT]/SUBSYSTEM-NQN[/NSID]`: a
//! namespace on an NVMe-oF target, see nvraid-remote's `nvme`). Files and
//! block devices are opened with
//! O_DIRECT when the kernel allows it, falling back to buffered I/O with the
//! reason recorded ([`Member::direct_fallback`]).
//!
//! The synchronous methods here ([`Member::read_at`] …) are the simple path
//! used for metadata and the library API; the fast engines in nvraid-io
//! address members by their raw file descriptor ([`Member::backend`]).
//! [`batch::run_together`] puts several members' reads, writes or flushes
//! in flight at once (background work: a reshape's step, a rebuild).

pub mod batch;
mod claim;
mod member;
mod size;

pub use member::{
    same_object, set_remote_defaults, Backend, Member, MemberError, MemberKind, OpenOptions,
};
pub use nvraid_remote::RemoteOptions;
pub use size::{format_size, parse_size, SizeError};
