//! What the server is told at start-up.

use std::fmt;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

/// Where to listen.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ListenAddress {
    Unix(PathBuf),
    /// `host:port`; port 0 picks a free port (see [`crate::ServerInfo`]).
    Tcp(String),
}

impl ListenAddress {
    /// Parse `unix:PATH`, `tcp:HOST:PORT`, `tcp:PORT` (binds 127.0.0.1) or
    /// a bare absolute path.
    pub fn parse(text: &str) -> Result<ListenAddress, String> {
        if let Some(path) = text.strip_prefix("unix:") {
            return Ok(ListenAddress::Unix(PathBuf::from(path)));
        }
        if let Some(rest) = text.strip_prefix("tcp:") {
            if rest.parse::<u16>().is_ok() {
                return Ok(ListenAddress::Tcp(format!("127.0.0.1:{rest}")));
            }
            if rest
                .rsplit_once(':')
                .is_some_and(|(_, p)| p.parse::<u16>().is_ok())
            {
                return Ok(ListenAddress::Tcp(rest.to_string()));
            }
            return Err(format!("{text:?}: expected tcp:HOST:PORT or tcp:PORT"));
        }
        if text.starts_with('/') {
            return Ok(ListenAddress::Unix(PathBuf::from(text)));
        }
        Err(format!("{text:?}: expected unix:PATH or tcp:HOST:PORT"))
    }
}

impl fmt::Display for ListenAddress {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ListenAddress::Unix(path) => write!(f, "unix:{}", path.display()),
            ListenAddress::Tcp(address) => write!(f, "tcp:{address}"),
        }
    }
}

/// TLS mode.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum TlsMode {
    /// Plaintext only.
    #[default]
    Off,
    /// Clients may upgrade with STARTTLS.
    On,
    /// Clients must upgrade before they see anything about the export.
    Require,
}

/// Certificate chain and key (PEM files).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TlsFiles {
    pub cert: PathBuf,
    pub key: PathBuf,
    /// Mutual TLS: the CA client certificates must chain to.
    pub client_ca: Option<PathBuf>,
}

/// `--ublk`: the target as a block device, `/dev/ublkbN`, served by the
/// workers beside (or instead of) the NBD listeners. The limits describe
/// the array (the caller knows its geometry); the logical block is the
/// target's sector.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UblkOptions {
    /// The device number; `None`: the first free one. A device of that
    /// number left quiesced by a killed server is taken over (user
    /// recovery) instead of added.
    pub id: Option<u32>,
    /// Requests in flight per queue (tags); one queue per worker.
    pub depth: u16,
    /// Largest request (each tag's buffer, and the worker's slots): at
    /// least a full stripe.
    pub max_io_bytes: u32,
    /// Physical block (a power of two, at least the target's sector).
    pub physical_block_bytes: u32,
    /// Minimum I/O size hint (the chunk), a power of two; 0: none.
    pub io_min_bytes: u32,
    /// Optimal I/O size hint (the full stripe), a power of two; 0: none
    /// (the kernel can only carry powers of two).
    pub io_opt_bytes: u32,
    /// Discards are rounded to this (the chunk).
    pub discard_granularity: u32,
    /// A file to write the device's number to before the device starts
    /// (removed when a clean stop deletes the device).
    pub record: Option<PathBuf>,
    /// What a clean stop (SIGTERM) does with the device.
    pub on_stop: UblkStop,
    /// Added with ublk's user recovery: a killed server leaves the device
    /// quiesced for the next one (I/O waits). Off: the device fails its
    /// I/O and goes when its server dies.
    pub recovery: bool,
}

/// `--ublk-stop`: at a clean stop, delete the device or leave it to the
/// next server.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum UblkStop {
    /// Leave it when it is in use (a mounted filesystem, device-mapper,
    /// an exclusive opener: a restart under them), delete it otherwise.
    #[default]
    Auto,
    /// Always delete it (requests in flight complete first).
    Delete,
    /// Always leave it, quiesced, for the next `serve --ublk ID`.
    Keep,
}

impl Default for UblkOptions {
    /// A 512 KiB request, 4 KiB blocks, no hints: what a caller that knows
    /// nothing of the target's geometry can say truthfully.
    fn default() -> Self {
        UblkOptions {
            id: None,
            depth: 32,
            max_io_bytes: 512 << 10,
            physical_block_bytes: 4096,
            io_min_bytes: 0,
            io_opt_bytes: 0,
            discard_granularity: 4096,
            record: None,
            on_stop: UblkStop::Auto,
            recovery: true,
        }
    }
}

/// A place log lines go (one line per call, no newline).
pub type LogSink = Arc<dyn Fn(&str) + Send + Sync>;

/// Extra JSON for the control socket's status (the array's `detail`,
/// per-member counters), provided by the caller that owns the array.
pub type StatusHook = Arc<dyn Fn() -> serde_json::Value + Send + Sync>;
/// Answers control-socket commands other than `status` (the request, as
/// JSON; the reply, as JSON, with `error` when refused).
pub type CommandHook = Arc<dyn Fn(&serde_json::Value) -> serde_json::Value + Send + Sync>;

/// Everything `serve` needs besides the target.
#[derive(Clone)]
pub struct ServeOptions {
    pub listen: Vec<ListenAddress>,
    pub export_name: String,
    pub description: String,
    pub read_only: bool,
    pub tls: TlsMode,
    pub tls_files: Option<TlsFiles>,
    /// Longest READ/WRITE accepted (the advertised maximum block size).
    pub request_max_bytes: u32,
    pub connections_max: u32,
    /// Requests in flight on one connection.
    pub inflight_max: u32,
    /// Payload bytes in flight on one connection (bounds its memory).
    pub inflight_max_bytes: u64,
    /// Preferred block size to advertise (the array's chunk, or 4 KiB).
    pub preferred_block_bytes: u32,
    /// Worker threads, each with its own queue on the target.
    pub workers: u32,
    /// Slots per worker queue.
    pub queue_depth: u32,
    /// Largest single I/O a worker submits (requests are split).
    pub io_max_bytes: u32,
    /// A client must finish the whole handshake within this time (a
    /// deadline, not a per-read timeout: a client trickling bytes cannot
    /// hold its slot either).
    pub handshake_timeout: Duration,
    /// When every connection slot is taken and another client arrives, the
    /// connection idle longest (no request in flight, none received for at
    /// least this long) is closed to make room for it; `None`: never. A
    /// client idle while slots are free is never disturbed.
    pub idle_timeout: Option<Duration>,
    /// After its header, a request's payload must have arrived within this
    /// time, and each reply must be taken by the client within this time
    /// of reaching the front of its queue; otherwise the connection is
    /// ended (its slots, buffers and permits are given back). A deadline,
    /// not a timeout between bytes: a client trickling its payload, or
    /// reading a reply a byte at a time, holds them no longer.
    pub transfer_timeout: Duration,
    /// Control socket path; `None` for none.
    pub control_socket: Option<PathBuf>,
    pub log: LogSink,
    pub status_hook: Option<StatusHook>,
    pub command_hook: Option<CommandHook>,
    /// `--ublk`: also (or only) a block device.
    pub ublk: Option<UblkOptions>,
    /// `--nvme-tcp`: also (or only) an NVMe/TCP target.
    pub nvme: Option<crate::nvme::options::NvmeOptions>,
    /// Filled with the server's request counters when it starts (for
    /// `--metrics`).
    pub totals: Option<crate::stats::TotalsProbe>,
}

impl fmt::Debug for ServeOptions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ServeOptions")
            .field("listen", &self.listen)
            .field("export_name", &self.export_name)
            .field("read_only", &self.read_only)
            .field("tls", &self.tls)
            .field("request_max_bytes", &self.request_max_bytes)
            .field("connections_max", &self.connections_max)
            .field("workers", &self.workers)
            .field("ublk", &self.ublk)
            .field("nvme", &self.nvme)
            .finish_non_exhaustive()
    }
}

/// The default log sink: standard error.
pub fn stderr_log() -> LogSink {
    Arc::new(|line: &str| eprintln!("{line}"))
}

impl Default for ServeOptions {
    fn default() -> Self {
        let cores = std::thread::available_parallelism().map_or(2, |n| n.get() as u32);
        ServeOptions {
            listen: Vec::new(),
            export_name: String::new(),
            description: String::new(),
            read_only: false,
            tls: TlsMode::Off,
            tls_files: None,
            request_max_bytes: 32 << 20,
            connections_max: 16,
            inflight_max: 64,
            inflight_max_bytes: 64 << 20,
            preferred_block_bytes: 4096,
            workers: cores.clamp(1, 8),
            queue_depth: 32,
            io_max_bytes: 1 << 20,
            handshake_timeout: Duration::from_secs(10),
            idle_timeout: Some(Duration::from_secs(60)),
            transfer_timeout: Duration::from_secs(30),
            control_socket: None,
            log: stderr_log(),
            status_hook: None,
            command_hook: None,
            ublk: None,
            nvme: None,
            totals: None,
        }
    }
}

impl ServeOptions {
    /// Check the limits make sense together.
    pub fn validate(&self) -> Result<(), String> {
        let checks = [
            (
                self.listen.is_empty() && self.ublk.is_none() && self.nvme.is_none(),
                "no listen address (and no --ublk or --nvme-tcp)",
            ),
            (
                self.ublk
                    .as_ref()
                    .is_some_and(|u| !u.recovery && u.on_stop == UblkStop::Keep),
                "--ublk-stop keep needs the device's user recovery (--ublk-recovery on)",
            ),
            (self.request_max_bytes < 4096, "maximum request below 4 KiB"),
            (self.connections_max == 0, "maximum connections is 0"),
            (
                self.inflight_max == 0,
                "in-flight requests per connection is 0",
            ),
            (
                self.inflight_max_bytes < u64::from(self.request_max_bytes),
                "in-flight bytes below one request",
            ),
            (
                !self.preferred_block_bytes.is_power_of_two(),
                "preferred block size not a power of two",
            ),
            (
                self.workers == 0 || self.queue_depth == 0,
                "no workers or zero queue depth",
            ),
            (self.transfer_timeout.is_zero(), "transfer timeout is 0"),
            (
                self.io_max_bytes < 4096 || !self.io_max_bytes.is_power_of_two(),
                "worker I/O size not a power of two >= 4 KiB",
            ),
            (
                self.tls != TlsMode::Off && self.tls_files.is_none(),
                "TLS needs --tls-cert and --tls-key",
            ),
        ];
        if let Some((_, reason)) = checks.iter().find(|(bad, _)| *bad) {
            return Err(reason.to_string());
        }
        if let Some(nvme) = &self.nvme {
            nvme.validate()?;
        }
        if let Some(ublk) = &self.ublk {
            let pow2_or_0 = |n: u32| n == 0 || n.is_power_of_two();
            let checks = [
                (
                    ublk.depth == 0 || ublk.depth > 4096,
                    "ublk queue depth not within 1..=4096",
                ),
                (
                    ublk.max_io_bytes < 4096 || ublk.max_io_bytes % 4096 != 0,
                    "ublk request size not a multiple of 4 KiB",
                ),
                (
                    !ublk.physical_block_bytes.is_power_of_two(),
                    "ublk physical block not a power of two",
                ),
                (
                    !pow2_or_0(ublk.io_min_bytes) || !pow2_or_0(ublk.io_opt_bytes),
                    "ublk io_min/io_opt not powers of two",
                ),
            ];
            if let Some((_, reason)) = checks.iter().find(|(bad, _)| *bad) {
                return Err(reason.to_string());
            }
        }
        if let Some(control) = &self.control_socket {
            if self
                .listen
                .iter()
                .any(|a| matches!(a, ListenAddress::Unix(path) if path == control))
            {
                return Err(format!(
                    "the control socket {} is also a listen address; give --control another path",
                    control.display()
                ));
            }
        }
        Ok(())
    }
}
