//! One client connection: the handshake (on a thread of its own, within a
//! deadline), then its hand-over to a worker, which reads its requests and
//! sends its replies (see `reactor`); this thread waits for the end and
//! logs it. The `Connection` record is what the worker, the registry and
//! the status report share.
//!
//! Bounds: at most `inflight_max` requests and `inflight_max_bytes` payload
//! bytes in flight per connection (the worker takes no more of its
//! requests until a permit is free).

use std::io::{self, Read, Write};
use std::net::Shutdown;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use nvraid_nbd::{Negotiated, RequestRules, ServerEvent, ServerHandshake};

use crate::reactor::Handoff;
use crate::server::Shared;
use crate::stats::Counters;
use crate::stream::Stream;
use crate::transport::Channel;
use crate::unaligned::RangeLocks;
use crate::wire::Wire;

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
    shared: Arc<Shared>,
}

impl Connection {
    pub(crate) fn write_failed(&self, e: &io::Error) {
        self.log(&format!("event=write-failed error=\"{e}\""));
        self.socket.shutdown(Shutdown::Both);
    }

    pub(crate) fn log(&self, event: &str) {
        (self.shared.options.log)(&format!("nvraid-serve: client={} {event}", self.client));
    }

    /// Take a permit for one more request of `bytes` if the budget has
    /// room, without waiting (a worker that owns the connection).
    pub(crate) fn try_acquire(&self, bytes: u64) -> bool {
        let options = &self.shared.options;
        let mut permits = self.permits.lock().expect("permit lock");
        let (count, used) = *permits;
        let fits_bytes = count == 0 || used + bytes <= options.inflight_max_bytes;
        if count < options.inflight_max && fits_bytes {
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
        &self.shared.unaligned_ranges
    }

    /// How long a request's payload may take to arrive, and a reply to be
    /// taken by the client.
    pub(crate) fn transfer_timeout(&self) -> Duration {
        self.shared.options.transfer_timeout
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
        if buffers.len() < self.shared.options.inflight_max as usize && buffer.capacity() > 0 {
            buffers.push(buffer);
        }
    }

    /// Stop reading from the client (server shutdown, or an idle client
    /// making way for a new one).
    pub(crate) fn stop_reading(&self) {
        self.socket.shutdown(Shutdown::Read);
    }

    pub(crate) fn note_request(&self) {
        let now = self.shared.started.elapsed().as_millis() as u64;
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
        let now = self.shared.started.elapsed().as_millis() as u64;
        let last = self.last_request_ms.load(Ordering::Relaxed);
        Some(Duration::from_millis(now.saturating_sub(last)))
    }
}

/// Serve one accepted client to the end; its admission slot is given back
/// when it ends.
pub(crate) fn run(shared: Arc<Shared>, stream: Stream, id: u64, client: String) {
    let Ok(socket) = stream.try_clone() else {
        shared.finished();
        return;
    };
    let connection = Arc::new(Connection {
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
        shared: Arc::clone(&shared),
    });
    shared.register(&connection);
    connection.log("event=connected");
    let outcome = negotiate(&connection, Channel::Plain(stream));
    if let Some((channel, negotiated)) = outcome {
        transmit(&connection, channel, negotiated);
    }
    shared.unregister(&connection);
}

/// The handshake; `None` when the client left or was refused.
fn negotiate(connection: &Arc<Connection>, mut channel: Channel) -> Option<(Channel, Negotiated)> {
    let shared = &connection.shared;
    let limit = shared.options.handshake_timeout;
    let deadline = Instant::now() + limit;
    let mut handshake = ServerHandshake::new(Arc::clone(&shared.handshake));
    let mut buffer = [0u8; 4096];
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            connection.log(&format!(
                "event=disconnected phase=handshake reason=\"handshake not finished within {}s\"",
                limit.as_secs_f64()
            ));
            return None;
        }
        // Every read waits at most until the deadline.
        let _ = channel.stream().set_read_timeout(Some(left));
        let output = handshake.take_output();
        if let Err(e) = channel.write_all(&output).and_then(|_| channel.flush()) {
            connection.log(&format!("event=disconnected phase=handshake error=\"{e}\""));
            return None;
        }
        let wanted = handshake.bytes_wanted().min(buffer.len());
        let received = match channel.read(&mut buffer[..wanted]) {
            Ok(0) => {
                connection.log(
                    "event=disconnected phase=handshake reason=\"client closed the connection\"",
                );
                return None;
            }
            Ok(n) => n,
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                ) =>
            {
                connection.log(&format!(
                    "event=disconnected phase=handshake reason=\"handshake not finished within {}s\"",
                    limit.as_secs_f64()
                ));
                return None;
            }
            Err(e) => {
                connection.log(&format!("event=disconnected phase=handshake error=\"{e}\""));
                return None;
            }
        };
        let event = match handshake.receive(&buffer[..received]) {
            Ok((_, event)) => event,
            Err(e) => {
                connection.log(&format!("event=refused phase=handshake reason=\"{e}\""));
                return None;
            }
        };
        match event {
            None => {}
            Some(ServerEvent::Refused {
                option,
                reply,
                reason,
            }) => connection.log(&format!(
                "event=option-refused option={option} reply={reply:#x} reason=\"{reason}\""
            )),
            Some(ServerEvent::StartTls) => {
                channel = start_tls(connection, channel, &mut handshake)?;
            }
            Some(ServerEvent::Aborted) => {
                let _ = channel.write_all(&handshake.take_output());
                connection.log("event=disconnected phase=handshake reason=\"client aborted\"");
                return None;
            }
            Some(ServerEvent::Ready(negotiated)) => {
                let output = handshake.take_output();
                channel
                    .write_all(&output)
                    .and_then(|_| channel.flush())
                    .ok()?;
                let _ = channel.stream().set_read_timeout(None);
                return Some((channel, negotiated));
            }
        }
    }
}

fn start_tls(
    connection: &Arc<Connection>,
    mut channel: Channel,
    handshake: &mut ServerHandshake,
) -> Option<Channel> {
    let output = handshake.take_output();
    channel.write_all(&output).ok()?;
    let config = connection.shared.tls.as_ref()?;
    match channel.start_tls(config) {
        Ok(channel) => {
            handshake.tls_started();
            *connection.tls.lock().expect("tls flag") = true;
            connection.log("event=tls-started");
            Some(channel)
        }
        Err(e) => {
            connection.log(&format!("event=disconnected phase=tls error=\"{e}\""));
            None
        }
    }
}

fn transmit(connection: &Arc<Connection>, channel: Channel, negotiated: Negotiated) {
    let shared = &connection.shared;
    connection.log(&format!(
        "event=transmission export={:?} structured={} tls={}",
        shared.options.export_name, negotiated.structured_replies, negotiated.tls_active
    ));
    let rules = RequestRules {
        size_bytes: shared.size_bytes,
        minimum_block_bytes: shared.block_sizes.minimum_bytes,
        maximum_payload_bytes: shared.block_sizes.maximum_bytes,
        transmission_flags: negotiated.transmission_flags,
        block_status: !negotiated.meta_context_ids.is_empty(),
        any_alignment: !negotiated.block_sizes_requested,
    };
    connection.note_request();
    connection.serving.store(true, Ordering::Release);
    // The connection is served by one worker from here on, which reads
    // its requests and sends its replies itself (see `reactor`); this
    // thread only waits to hear why it ended.
    let wire = match channel {
        Channel::Plain(stream) => Wire::new(stream, None),
        Channel::Tls(tls, stream) => Wire::new(stream, Some(tls)),
    };
    let wire = match wire {
        Ok(wire) => wire,
        Err(e) => return connection.log(&format!("event=disconnected error=\"{e}\"")),
    };
    let (done, ended) = std::sync::mpsc::sync_channel(1);
    shared.workers.adopt(Handoff {
        connection: Arc::clone(connection),
        wire,
        rules,
        structured: negotiated.structured_replies,
        block_bytes: shared.block_sizes.minimum_bytes,
        done,
    });
    let reason = ended
        .recv()
        .unwrap_or_else(|_| "the server stopped".to_string());
    let totals = connection.counters.snapshot();
    connection.log(&format!(
        "event=disconnected reason=\"{reason}\" reads={} writes={} errors={}",
        totals.reads, totals.writes, totals.errors
    ));
}
