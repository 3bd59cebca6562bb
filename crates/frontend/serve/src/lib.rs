//! nvraid-serve: an NBD server over any [`nvraid_io::queue::Target`] (an
//! assembled array, a member, a test double).
//!
//! Threads: one accept thread per listener; per client, a connection
//! thread (the handshake, then it waits for the end); a fixed pool of
//! workers, each owning one queue on the target. After the handshake a
//! connection, plaintext or TLS, belongs to one worker, which reads its
//! requests and sends its replies itself (see `reactor`). Requests run
//! concurrently and are answered out of order.
//!
//! Limits (all fixed at start): connections, requests and payload bytes in
//! flight per connection, request size, option size and count in the
//! handshake, handshake time, and the time a request's payload may take to
//! arrive and a reply to be read (the transfer deadline).
//!
//! Shutdown ([`ShutdownHandle::trigger`]): stop accepting, stop reading
//! from clients, let in-flight requests finish and their replies go out,
//! flush through every worker's queue, return. The caller then marks the
//! array clean.

pub mod cli;
mod client;
mod connection;
mod control;
mod error;
mod job;
mod nvme;
mod options;
mod reactor;
mod reply;
mod server;
mod shared;
mod shutdown;
mod slots;
pub mod stats;
mod stream;
mod transport;
mod ublk;
mod unaligned;
mod wire;
mod worker;

pub use cli::UblkId;
pub use control::{format_status, query_status, request};
pub use error::Error;
pub use nvme::{NvmeOptions, DEFAULT_PORT as NVME_DEFAULT_PORT, DISCOVERY_NQN};
pub use options::{
    stderr_log, CommandHook, ListenAddress, LogSink, ServeOptions, StatusHook, TlsFiles, TlsMode,
    UblkOptions, UblkStop,
};
pub use server::{bind, preflight, serve, start, start_bound, Bound, Server, ServerInfo};
pub use shutdown::ShutdownHandle;
pub use ublk::{list as ublk_devices, release as release_ublk, DeviceStatus as UblkDevice};
