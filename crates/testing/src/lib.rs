//! nvraid-testing: test-double targets for the layers that drive
//! [`nvraid_io::queue::Target`]s (the benchmark, the NBD server).
//!
//! [`MemTarget`] keeps its bytes in memory (or, built with
//! [`MemTarget::null`], moves none) and applies a [`Faults`] plan to every
//! operation: errors on byte ranges, errors from the N-th operation on,
//! added latency, a device that vanishes, torn writes, short transfers.
//!
//! Durability model (memory targets): two images, *current* (what reads
//! see) and *durable* (what survives [`MemTarget::crash`]). A write changes
//! *current*; a FUA write also changes *durable* for its range; a flush
//! copies *current* to *durable* (target-wide: it covers writes completed
//! on any queue); a torn write's surviving prefix reaches both.
//!
//! Requests are carried out when submitted and reported by the first
//! `reap` after their due time (submission time plus the plan's latency).
//! docs/fault-model.md compares these faults with the faulty engine's and
//! the real-device ones.
//!
//! [`CountingAllocator`] counts a process's allocations, for the tests
//! that prove a data path allocates nothing per operation; [`vm`] holds
//! what the kernel-VM tests share (host tools and libraries shipped in);
//! [`bootvm`] the reboot tests' whole Debian machine (`tools/bootvm`).

pub mod alloc;
pub mod bootvm;
mod faults;
pub mod nbdkit;
mod target;
pub mod vm;

pub use alloc::CountingAllocator;
pub use faults::{BadRange, Faults, TornWrite};
pub use target::{Counters, MemTarget};
