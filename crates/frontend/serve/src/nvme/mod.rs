//! `serve --nvme-tcp`: the target as an NVMe over TCP subsystem with one
//! namespace (the array), beside the NBD listeners and the ublk device.
//!
//! Threads: one accept thread; per TCP connection (one NVMe queue: the
//! admin queue of a controller or one of its I/O queues) a thread that
//! does the setup (ICReq/ICResp and Fabrics Connect, within the handshake
//! deadline) with a writer thread beside it. An admin queue stays there:
//! its thread reads and runs admin commands, the writer sends the
//! answers. An I/O queue, once connected, is handed to the worker owning
//! fewest connections (as NBD's connections are), which from then on
//! reads its PDUs, runs its commands as jobs in its own slots and writes
//! the answers itself, without blocking; its commands run concurrently and
//! complete out of order.
//!
//! The files stack one way (none imports a file above it):
//! - `options.rs`: what the server is told (`--nvme-tcp`, NQNs, hosts).
//! - `record.rs`: what a queue knows of the server (log, shutdown,
//!   deadlines, counters, its admission slot), built by `setup.rs`.
//! - `controller.rs`: the subsystem, its controllers (host NQN, queues
//!   granted and connected, CC/CSTS, keep-alive) and the Connect rules.
//! - `data.rs`: the bytes the controller reports (Identify, log pages,
//!   properties).
//! - `queue.rs`: one queue past ICReq: the PDU loop, commands, the
//!   writer, and `NvmeQueue` (an I/O queue a worker owns). It uses the
//!   record, `job.rs`, `slots.rs`, `stats.rs` and the codec, never the
//!   server (`Shared`) or the worker pool.
//! - `setup.rs`: the server's side: the accept loop, a connection's
//!   thread (ICReq/ICResp, the record, the queue until Connect) and the
//!   hand-over to a worker (`WorkerPool::adopt_nvme`).
//! - this file: the listener (`NvmeTarget`, whose accept thread runs
//!   `setup.rs`) and the status report.
//!
//! Only `setup.rs` and this file use the server's `Shared`. `shared.rs`
//! takes `Subsystem` from `controller.rs` and `worker.rs` takes
//! `NvmeQueue` from `queue.rs`: nothing those import leads back to
//! `shared.rs` or `worker.rs`.
//!
//! Bounds: connections count against the server's connection limit;
//! every length from the wire is bounded (the PDU reader bounds PDUs and
//! in-capsule data; commands are bounded by MDTS, the queue's size and the
//! in-flight byte budget); a host that does not finish its setup in the
//! handshake time, leaves a PDU half sent for the transfer time, or sends
//! nothing on the admin queue for its keep-alive timeout is disconnected.

pub(crate) mod controller;
mod data;
pub(crate) mod options;
pub(crate) mod queue;
mod record;
mod setup;

use std::net::{SocketAddr, TcpListener};
use std::sync::{Arc, Weak};
use std::thread::JoinHandle;

use nvraid_io::queue::Target;

use serde_json::{json, Value};

use crate::error::Error;
use crate::shared::Shared;

use controller::Subsystem;
pub use options::{NvmeOptions, DEFAULT_PORT, DISCOVERY_NQN};

/// The running NVMe/TCP target: its listener and subsystem.
pub(crate) struct NvmeTarget {
    pub subsystem: Arc<Subsystem>,
    listener: TcpListener,
}

impl NvmeTarget {
    /// Bind the listener (a refused address fails the server's start;
    /// `nvraid serve` binds it before it assembles the array).
    pub(crate) fn listen(options: &NvmeOptions) -> Result<TcpListener, Error> {
        TcpListener::bind(&options.listen).map_err(|source| Error::Listen {
            address: format!("nvme-tcp:{}", options.listen),
            source,
        })
    }

    /// The target on a bound listener, serving a namespace of `size_bytes`.
    /// Its size is `watched`'s, looked at again while it serves.
    pub(crate) fn new(
        listener: TcpListener,
        options: &NvmeOptions,
        watched: Option<Weak<dyn Target>>,
        size_bytes: u64,
        block_bytes: u32,
        read_only: bool,
        io_max_bytes: u32,
    ) -> Result<NvmeTarget, Error> {
        let local = listener.local_addr().map_err(|source| Error::Listen {
            address: format!("nvme-tcp:{}", options.listen),
            source,
        })?;
        let subsystem = Arc::new(Subsystem::new(
            options,
            local,
            watched,
            size_bytes,
            block_bytes,
            read_only,
            io_max_bytes,
        ));
        Ok(NvmeTarget {
            subsystem,
            listener,
        })
    }

    pub(crate) fn local(&self) -> SocketAddr {
        self.subsystem.local
    }

    /// Start the accept thread; it ends at shutdown.
    pub(crate) fn spawn(self, shared: Arc<Shared>) -> std::io::Result<JoinHandle<()>> {
        std::thread::Builder::new()
            .name("nvme-accept".into())
            .spawn(move || setup::accept_loop(&shared, &self.subsystem, &self.listener))
    }
}

/// The status report's `nvme` part: where, which NQN, and each
/// controller's host and queues.
pub(crate) fn status(subsystem: &Subsystem) -> Value {
    json!({
        "listen": subsystem.local.to_string(),
        "nqn": subsystem.nqn,
        "hosts_allowed": subsystem.hosts,
        "controllers": subsystem.controllers_status(),
    })
}
