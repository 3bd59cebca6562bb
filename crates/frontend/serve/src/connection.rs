//! One client connection's record: what its thread (`client`: the
//! handshake, the hand-over, the wait for the end), the worker that owns
//! it (`reactor`), the registry and the status report share.
//!
//! Bounds: at most `inflight_max` requests and `inflight_max_bytes` payload
//! bytes in flight per connection (the worker takes no more of its
//! requests until a permit is free).

use std::io;
use std::net::Shutdown;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::options::{LogSink, ServeOptions};
use crate::stats::Counters;
use crate::stream::Stream;
use crate::unaligned::RangeLocks;

/// State shared by a connection's reader, writer, workers and the status
/// report.
pub(crate) struct Connection {
    pub id: u64,
    pub client: String,
    pub started: Instant,
    pub counters: Counters,
    pub tls: Mutex<bool>,
    socket: Stream,
    /// In the transmission phase (past the handshake).
    serving: AtomicBool,
    /// When its last request arrived, in milliseconds since the server
    /// started.
    last_request_ms: AtomicU64,
    permits: Mutex<(u32, u64)>,
    buffers: Mutex<Vec<Vec<u8>>>,
    /// The server's log.
    log: LogSink,
    /// Requests, and their payload bytes, in flight at most.
    inflight_max: u32,
    inflight_max_bytes: u64,
    transfer_timeout: Duration,
    /// When the server started (request times count from it).
    server_started: Instant,
    unaligned_ranges: Arc<RangeLocks>,
}

impl Connection {
    /// A new client's record, under the server's `options`.
    pub(crate) fn new(
        id: u64,
        client: String,
        socket: Stream,
        options: &ServeOptions,
        server_started: Instant,
        unaligned_ranges: Arc<RangeLocks>,
    ) -> Connection {
        Connection {
            id,
            client,
            started: Instant::now(),
            counters: Counters::default(),
            tls: Mutex::new(false),
            socket,
            serving: AtomicBool::new(false),
            last_request_ms: AtomicU64::new(0),
            permits: Mutex::new((0, 0)),
            buffers: Mutex::new(Vec::new()),
            log: Arc::clone(&options.log),
            inflight_max: options.inflight_max,
            inflight_max_bytes: options.inflight_max_bytes,
            transfer_timeout: options.transfer_timeout,
            server_started,
            unaligned_ranges,
        }
    }

    /// Past the handshake: from now on the connection may be idle.
    pub(crate) fn start_serving(&self) {
        self.serving.store(true, Ordering::Release);
    }

    pub(crate) fn write_failed(&self, e: &io::Error) {
        self.log(&format!("event=write-failed error=\"{e}\""));
        self.socket.shutdown(Shutdown::Both);
    }

    pub(crate) fn log(&self, event: &str) {
        (self.log)(&format!("nvraid-serve: client={} {event}", self.client));
    }

    /// Take a permit for one more request of `bytes` if the budget has
    /// room, without waiting (a worker that owns the connection).
    pub(crate) fn try_acquire(&self, bytes: u64) -> bool {
        let mut permits = self.permits.lock().expect("permit lock");
        let (count, used) = *permits;
        let fits_bytes = count == 0 || used + bytes <= self.inflight_max_bytes;
        if count < self.inflight_max && fits_bytes {
            *permits = (count + 1, used + bytes);
            return true;
        }
        false
    }

    /// Requests taken and not yet answered.
    pub(crate) fn in_flight(&self) -> u32 {
        self.permits.lock().expect("permit lock").0
    }

    /// The ranges unaligned writes' read-modify-writes hold, server-wide.
    pub(crate) fn unaligned_ranges(&self) -> &RangeLocks {
        &self.unaligned_ranges
    }

    /// How long a request's payload may take to arrive, and a reply to be
    /// taken by the client.
    pub(crate) fn transfer_timeout(&self) -> Duration {
        self.transfer_timeout
    }

    /// Close both directions (the client missed a deadline).
    pub(crate) fn hang_up(&self) {
        self.socket.shutdown(Shutdown::Both);
    }

    /// A request was answered: its permit is free again.
    pub(crate) fn release(&self, bytes: u64) {
        let mut permits = self.permits.lock().expect("permit lock");
        permits.0 -= 1;
        permits.1 -= bytes;
    }

    /// A buffer of `length` bytes, reused when possible.
    pub(crate) fn buffer(&self, length: u32) -> Vec<u8> {
        let mut buffer = self
            .buffers
            .lock()
            .expect("buffer lock")
            .pop()
            .unwrap_or_default();
        buffer.clear();
        buffer.resize(length as usize, 0);
        buffer
    }

    pub(crate) fn recycle(&self, buffer: Vec<u8>) {
        let mut buffers = self.buffers.lock().expect("buffer lock");
        if buffers.len() < self.inflight_max as usize && buffer.capacity() > 0 {
            buffers.push(buffer);
        }
    }

    /// Stop reading from the client (server shutdown, or an idle client
    /// making way for a new one).
    pub(crate) fn stop_reading(&self) {
        self.socket.shutdown(Shutdown::Read);
    }

    pub(crate) fn note_request(&self) {
        let now = self.server_started.elapsed().as_millis() as u64;
        self.last_request_ms.store(now, Ordering::Relaxed);
    }

    /// How long the connection has been idle: past its handshake, no
    /// request in flight and none received for this long (`None` when it
    /// is not idle).
    pub(crate) fn idle_for(&self) -> Option<Duration> {
        if !self.serving.load(Ordering::Acquire) || self.permits.lock().expect("permit lock").0 > 0
        {
            return None;
        }
        let now = self.server_started.elapsed().as_millis() as u64;
        let last = self.last_request_ms.load(Ordering::Relaxed);
        Some(Duration::from_millis(now.saturating_sub(last)))
    }
}
