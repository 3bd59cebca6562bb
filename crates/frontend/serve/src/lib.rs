//! nvraid-serve: an NBD server over any [`nvraid_io::queue::Target`] (an
//! assembled array, a member, a test double).
//!
//! Threads: one accept thread per listener; per client, a connection
//! thread (handshake, then reading requests); a fixed pool of workers,
//! each owning one queue on the target, shared by all clients. Requests of
//! one client spread over the workers, so they run concurrently and are
//! answered out of order, each by the thread that finished it (a worker
//! sends the replies of one batch of completions together).
//!
//! Limits (all fixed at start): connections, requests and payload bytes in
//! flight per connection, request size, option size and count in the
//! handshake, handshake time.
//!
//! Shutdown ([`ShutdownHandle::trigger`]): stop accepting, stop reading
//! from clients, let in-flight requests finish and their replies go out,
//! flush through every worker's queue, return. The caller then marks the
//! array clean.

pub mod cli;
mod connection;
mod control;
mod error;
mod options;
mod server;
mod shutdown;
pub mod stats;
mod stream;
mod transport;
mod unaligned;
mod worker;

pub use control::{format_status, query_status, request};
pub use error::Error;
pub use options::{
    stderr_log, CommandHook, ListenAddress, LogSink, ServeOptions, StatusHook, TlsFiles, TlsMode,
};
pub use server::{serve, start, Server, ServerInfo};
pub use shutdown::ShutdownHandle;
