//! The user-space side of Linux's ublk driver: a block device
//! (`/dev/ublkbN`) whose requests are served by this process, over
//! io_uring commands (`IORING_OP_URING_CMD` in 128-byte SQEs).
//!
//! - [`uapi`]: the kernel interface (command numbers, flags, structures).
//! - [`control`]: `/dev/ublk-control` — add a device, set its parameters,
//!   start, stop, delete, and hand it to a new server (user recovery).
//! - [`queue`]: one queue's requests, on the thread that serves it, with a
//!   ring fd to poll beside other descriptors.
//! - [`sys`]: every `unsafe` of the crate.
//!
//! The life of a device: `Control::add`, `Control::set_params`; on each
//! queue's thread `Queue::open` (all on one `CharDev`) and `Queue::fetch_all`; `Control::start`
//! (a [`Pending`] answered once every queue has fetched); then each
//! thread reaps and commits. `Control::stop` aborts every queue's tags;
//! the queues are dropped; `Control::delete`. With
//! [`uapi::F_USER_RECOVERY`] the device outlives a killed server: a new
//! one calls `Control::start_recovery_within`, opens and fetches the
//! queues, and `Control::end_recovery`.

//!
//! Why not the `libublk` crate (ublk's author maintains it): it drives each
//! queue from its own io_uring and event loop, and its build needs bindgen
//! and libclang. nvraid's serve worker already owns a thread, a poll(2)
//! loop and slot buffers: this crate gives it a queue whose ring fd it
//! polls beside its sockets and whose tag buffers are its slots (no copy),
//! with the workspace's `io-uring` crate and nothing else.

pub mod control;
pub mod error;
pub mod queue;
pub mod sys;
pub mod uapi;

pub use control::{Control, DeviceSpec, Pending};
pub use error::{Cmd, Error};
pub use queue::{CharDev, IoDesc, Op, Queue};
pub use sys::TagBuffers;
pub use uapi::{DevInfo, Params};
