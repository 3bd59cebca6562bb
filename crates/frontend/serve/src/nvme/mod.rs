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
//! - `controller.rs`: the subsystem, its controllers (host NQN, queues
//!   granted and connected, CC/CSTS, keep-alive) and the Connect rules.
//! - `data.rs`: the bytes the controller reports (Identify, log pages,
//!   properties).
//! - `queue.rs`: one connection: setup, the PDU loop, commands, and the
//!   writer.
//!
//! Bounds: connections count against the server's connection limit;
//! every length from the wire is bounded (the PDU reader bounds PDUs and
//! in-capsule data; commands are bounded by MDTS, the queue's size and the
//! in-flight byte budget); a host that does not finish its setup in the
//! handshake time, leaves a PDU half sent for the transfer time, or sends
//! nothing on the admin queue for its keep-alive timeout is disconnected.

mod controller;
mod data;
mod queue;

use std::net::{SocketAddr, TcpListener};
use std::os::fd::AsRawFd;
use std::sync::Arc;
use std::thread::JoinHandle;

use serde_json::{json, Value};

use crate::error::Error;
use crate::shared::Shared;

pub(crate) use controller::Subsystem;
pub(crate) use queue::NvmeQueue;

/// The well-known NQN of a discovery controller.
pub const DISCOVERY_NQN: &str = "nqn.2014-08.org.nvmexpress.discovery";
/// The TCP port NVMe/TCP uses by default.
pub const DEFAULT_PORT: u16 = 4420;

/// `--nvme-tcp`: what the NVMe/TCP target offers.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NvmeOptions {
    /// `HOST:PORT` (or `HOST`: port 4420) to listen on; port 0 picks one.
    pub listen: String,
    /// The subsystem's NQN; empty: `nqn.2014-08.org.nvraid:uuid:<uuid>` of
    /// `namespace_uuid` (the caller sets it from the array).
    pub nqn: String,
    /// Host NQNs allowed to connect; empty: any host.
    pub hosts: Vec<String>,
    /// The namespace's UUID (and NGUID): the array's UUID.
    pub namespace_uuid: [u8; 16],
    /// I/O queues one controller may have.
    pub queues_max: u16,
    /// Entries per queue (CAP.MQES + 1).
    pub queue_depth: u16,
    /// In-capsule data an I/O command may carry (larger writes use R2T).
    pub in_capsule_bytes: u32,
}

impl Default for NvmeOptions {
    fn default() -> Self {
        NvmeOptions {
            listen: format!("0.0.0.0:{DEFAULT_PORT}"),
            nqn: String::new(),
            hosts: Vec::new(),
            namespace_uuid: [0; 16],
            queues_max: 64,
            queue_depth: 128,
            in_capsule_bytes: 8192,
        }
    }
}

impl NvmeOptions {
    /// The subsystem NQN derived from a UUID.
    pub fn nqn_of_uuid(uuid: &[u8; 16]) -> String {
        let h = |r: std::ops::Range<usize>| {
            uuid[r]
                .iter()
                .map(|b| format!("{b:02x}"))
                .collect::<String>()
        };
        format!(
            "nqn.2014-08.org.nvraid:uuid:{}-{}-{}-{}-{}",
            h(0..4),
            h(4..6),
            h(6..8),
            h(8..10),
            h(10..16)
        )
    }

    /// The NQN served (the given one, or the one of the namespace UUID).
    pub fn subsystem_nqn(&self) -> String {
        if self.nqn.is_empty() {
            Self::nqn_of_uuid(&self.namespace_uuid)
        } else {
            self.nqn.clone()
        }
    }

    /// `HOST:PORT`, the port 4420 when none is given.
    pub fn parse_listen(text: &str) -> Result<String, String> {
        let text = text.strip_prefix("tcp:").unwrap_or(text);
        if text.is_empty() {
            return Err("--nvme-tcp: empty address (expected HOST:PORT or HOST)".into());
        }
        // [v6]:port, v6 alone, host:port, host.
        if let Some(rest) = text.strip_prefix('[') {
            return match rest.split_once(']') {
                Some((_, "")) => Ok(format!("{text}:{DEFAULT_PORT}")),
                Some((_, port)) if port.strip_prefix(':').is_some_and(valid_port) => {
                    Ok(text.to_string())
                }
                _ => Err(format!("--nvme-tcp {text:?}: expected [IPv6]:PORT")),
            };
        }
        match text.rsplit_once(':') {
            None => Ok(format!("{text}:{DEFAULT_PORT}")),
            Some((host, _)) if host.contains(':') => Ok(format!("[{text}]:{DEFAULT_PORT}")),
            Some((_, port)) if valid_port(port) => Ok(text.to_string()),
            Some(_) => Err(format!(
                "--nvme-tcp {text:?}: the port is not a number within 0..=65535"
            )),
        }
    }

    /// The options make sense (called by `ServeOptions::validate`).
    pub(crate) fn validate(&self) -> Result<(), String> {
        if !self.nqn.is_empty() {
            check_nqn(&self.nqn, "--nqn")?;
        }
        if self.nqn == DISCOVERY_NQN {
            return Err(format!(
                "--nqn {DISCOVERY_NQN} is the discovery controller's NQN, not a subsystem's"
            ));
        }
        for host in &self.hosts {
            check_nqn(host, "--nvme-host")?;
        }
        if self.queues_max == 0 || self.queues_max > 1024 {
            return Err("NVMe/TCP I/O queues per controller not within 1..=1024".into());
        }
        if !(2..=1024).contains(&self.queue_depth) {
            return Err("NVMe/TCP queue depth not within 2..=1024".into());
        }
        if !(1024..=(1 << 20)).contains(&self.in_capsule_bytes) {
            return Err("NVMe/TCP in-capsule data not within 1 KiB..=1 MiB".into());
        }
        Ok(())
    }
}

fn valid_port(port: &str) -> bool {
    port.parse::<u16>().is_ok()
}

/// An NQN as the specification has it: `nqn.` and at most 223 bytes of
/// UTF-8, no NUL.
pub(crate) fn check_nqn(nqn: &str, flag: &str) -> Result<(), String> {
    if !nqn.starts_with("nqn.") || nqn.len() > 223 || nqn.contains('\0') {
        return Err(format!(
            "{flag} {nqn:?}: not an NQN (nqn.YYYY-MM.reverse.domain:name, at most 223 bytes)"
        ));
    }
    Ok(())
}

/// The running NVMe/TCP target: its listener and subsystem.
pub(crate) struct NvmeTarget {
    pub subsystem: Arc<Subsystem>,
    listener: TcpListener,
}

impl NvmeTarget {
    /// Bind the listener (a refused address fails the server's start).
    pub(crate) fn bind(
        options: &NvmeOptions,
        size_bytes: u64,
        block_bytes: u32,
        read_only: bool,
        io_max_bytes: u32,
    ) -> Result<NvmeTarget, Error> {
        let listener = TcpListener::bind(&options.listen).map_err(|source| Error::Listen {
            address: format!("nvme-tcp:{}", options.listen),
            source,
        })?;
        let local = listener.local_addr().map_err(|source| Error::Listen {
            address: format!("nvme-tcp:{}", options.listen),
            source,
        })?;
        let subsystem = Arc::new(Subsystem::new(
            options,
            local,
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
            .spawn(move || accept_loop(&shared, &self.subsystem, &self.listener))
    }
}

fn accept_loop(shared: &Arc<Shared>, subsystem: &Arc<Subsystem>, listener: &TcpListener) {
    let fd = listener.as_raw_fd();
    while !shared.shutdown.is_triggered() {
        let mut fds = [libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        }];
        if nvraid_io::sys::poll(&mut fds, 200) == 0 {
            continue;
        }
        let (stream, peer) = match listener.accept() {
            Ok(pair) => pair,
            Err(e) => {
                shared.log(&format!("event=nvme-accept-failed error=\"{e}\""));
                std::thread::sleep(std::time::Duration::from_millis(50));
                continue;
            }
        };
        if shared.shutdown.is_triggered() {
            return;
        }
        let id = shared
            .next_id
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let client = format!("nvme-tcp:{peer}#{id}");
        if !shared.admit() {
            shared.log(&format!(
                "client={client} event=refused reason=\"connection limit ({}) reached\"",
                shared.options.connections_max
            ));
            continue;
        }
        let conn_shared = Arc::clone(shared);
        let conn_subsystem = Arc::clone(subsystem);
        let spawned = std::thread::Builder::new()
            .name(format!("nvme-conn-{id}"))
            .spawn(move || queue::run(conn_shared, conn_subsystem, stream, client));
        if spawned.is_err() {
            shared.finished();
        }
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
