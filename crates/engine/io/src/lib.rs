//! nvraid-io: the only crate that talks to the kernel's I/O interfaces, and
//! the only one with `unsafe`.
//!
//! - [`queue`]: the per-worker queue interface every I/O target implements
//!   (an array, a single raw member, a test double). The benchmark and the
//!   NBD server drive targets only through it.
//! - [`op`]: member operations, what engines and channels execute.
//! - [`channel`]: the interface of members reached over a network (one
//!   channel per worker).
//! - [`engine`]: the io_uring and psync engines that execute member operations.
//! - [`remote`]: the engine that puts remote members beside local files.
//! - [`batch`]: reads, writes and flushes of several member files put in
//!   flight together on the calling thread's io_uring (background work).
//! - [`buf`]: heap buffers aligned for O_DIRECT.
//! - [`bounded`]: whole files named on the command line, read with a bound.
//! - [`sys`]: thin, checked wrappers over the system calls nvraid needs that
//!   `std` lacks (positioned full reads/writes, block-device ioctls, memfd,
//!   hole punching, O_DIRECT opens).

pub mod batch;
pub mod bounded;
pub mod buf;
pub mod channel;
pub mod engine;
pub mod op;
pub mod queue;
pub mod random;
pub mod remote;
pub mod sys;

pub use buf::AlignedBuf;
