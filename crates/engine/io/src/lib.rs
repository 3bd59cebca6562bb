//! nvraid-io: the only crate that talks to the kernel's I/O interfaces.
//!
//! - [`queue`]: the per-worker queue interface every I/O target implements
//!   (an array, a single raw member, a test double). The benchmark and the
//!   NBD server drive targets only through it.

pub mod queue;
