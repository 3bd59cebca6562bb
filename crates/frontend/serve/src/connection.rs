//! One client connection: the handshake, then a reader (this thread) that
//! parses requests and hands them to workers. Replies are written by
//! whoever finishes the request (a worker, or this thread for requests it
//! answers itself), under the connection's reply lock; a worker buffers the
//! replies of one batch of completions and sends them together.
//!
//! Bounds: at most `inflight_max` requests and `inflight_max_bytes` payload
//! bytes in flight per connection (the reader waits for a permit before it
//! reads a payload or dispatches). A worker writing a reply to a client
//! that does not read waits on that client's socket.

use std::io::{self, BufWriter, Read, Write};
use std::net::Shutdown;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use nvraid_nbd::consts::{cmd_flags, REQUEST_HEADER_BYTES};
use nvraid_nbd::{
    Command, ErrorCode, Negotiated, RequestHeader, RequestRules, ServerEvent, ServerHandshake,
};

use crate::reactor::Handoff;
use crate::reply::{block_status_head, data_reply_head};
use crate::server::Shared;
use crate::stats::Counters;
use crate::stream::Stream;
use crate::transport::Channel;
use crate::unaligned::Unaligned;
use crate::worker::{Finish, InlineRunner, Job, Work};

/// A reply to send.
pub(crate) enum Outgoing {
    Reply {
        cookie: u64,
        command: Command,
        offset: u64,
        length: u32,
        result: Result<(), (ErrorCode, &'static str)>,
        data: Vec<u8>,
        permit_bytes: u64,
    },
    BlockStatus {
        cookie: u64,
        length: u32,
    },
}

/// The connection's write side, shared by everyone who sends replies.
struct ReplyWriter {
    out: Option<BufWriter<Box<dyn Write + Send>>>,
    structured: bool,
    broken: bool,
}

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
    replies: Mutex<ReplyWriter>,
    permits: Mutex<(u32, u64)>,
    permit_freed: Condvar,
    /// Threads waiting on `permit_freed`.
    permit_waiters: std::sync::atomic::AtomicU32,
    buffers: Mutex<Vec<Vec<u8>>>,
    shared: Arc<Shared>,
}

impl Finish for Connection {
    fn finish(&self, job: Job, result: Result<(), ErrorCode>) {
        let reply = Outgoing::Reply {
            cookie: job.cookie,
            command: job.command,
            offset: job.offset,
            length: job.length,
            result: result.map_err(|code| (code, "storage error")),
            data: job.buffer,
            permit_bytes: job.permit_bytes,
        };
        self.deliver(reply, false);
    }

    fn flush_replies(&self) {
        let mut writer = self.replies.lock().expect("reply lock");
        if writer.broken {
            return;
        }
        if let Some(out) = writer.out.as_mut() {
            if let Err(e) = out.flush() {
                writer.broken = true;
                drop(writer);
                self.write_failed(&e);
            }
        }
    }
}

impl Connection {
    /// Write `message` (and send it at once when `flush`), then settle it:
    /// count it, give back its permit and buffer.
    fn deliver(&self, message: Outgoing, flush: bool) {
        let mut writer = self.replies.lock().expect("reply lock");
        let structured = writer.structured;
        let failure = match (writer.broken, writer.out.as_mut()) {
            (false, Some(out)) => write_one(out, &message, structured)
                .and_then(|()| if flush { out.flush() } else { Ok(()) })
                .err(),
            _ => None,
        };
        if failure.is_some() {
            writer.broken = true;
        }
        drop(writer);
        if let Some(e) = failure {
            self.write_failed(&e);
        }
        settle(self, message);
    }

    pub(crate) fn write_failed(&self, e: &io::Error) {
        self.log(&format!("event=write-failed error=\"{e}\""));
        self.socket.shutdown(Shutdown::Both);
    }

    pub(crate) fn log(&self, event: &str) {
        (self.shared.options.log)(&format!("nvraid-serve: client={} {event}", self.client));
    }

    /// Wait until one more request of `bytes` fits in the budget.
    fn acquire(&self, bytes: u64) {
        let options = &self.shared.options;
        let mut permits = self.permits.lock().expect("permit lock");
        loop {
            let (count, used) = *permits;
            let fits_bytes = count == 0 || used + bytes <= options.inflight_max_bytes;
            if count < options.inflight_max && fits_bytes {
                *permits = (count + 1, used + bytes);
                return;
            }
            permits = self.wait_permit(permits);
        }
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

    /// The lock every unaligned write's read-modify-write holds.
    pub(crate) fn unaligned_lock(&self) -> &Mutex<()> {
        &self.shared.unaligned_lock
    }

    /// Wait for a release, counted as a waiter (changed only under the
    /// lock, so `release` wakes only when someone waits).
    fn wait_permit<'a>(
        &self,
        permits: std::sync::MutexGuard<'a, (u32, u64)>,
    ) -> std::sync::MutexGuard<'a, (u32, u64)> {
        self.permit_waiters.fetch_add(1, Ordering::Relaxed);
        let permits = self.permit_freed.wait(permits).expect("permit lock");
        self.permit_waiters.fetch_sub(1, Ordering::Relaxed);
        permits
    }

    pub(crate) fn release(&self, bytes: u64) {
        let mut permits = self.permits.lock().expect("permit lock");
        permits.0 -= 1;
        permits.1 -= bytes;
        // A wake-up is a system call: only when someone waits.
        if self.permit_waiters.load(Ordering::Relaxed) > 0 {
            self.permit_freed.notify_all();
        }
    }

    fn wait_idle(&self) {
        let mut permits = self.permits.lock().expect("permit lock");
        while permits.0 > 0 {
            permits = self.wait_permit(permits);
        }
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
    let replies = Mutex::new(ReplyWriter {
        out: None,
        structured: false,
        broken: false,
    });
    let connection = Arc::new(Connection {
        id,
        client,
        started: Instant::now(),
        counters: Counters::default(),
        tls: Mutex::new(false),
        socket,
        serving: AtomicBool::new(false),
        last_request_ms: AtomicU64::new(0),
        replies,
        permits: Mutex::new((0, 0)),
        permit_freed: Condvar::new(),
        permit_waiters: std::sync::atomic::AtomicU32::new(0),
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
    let reason = match channel {
        // A plaintext connection is served by one worker, which reads its
        // requests and sends its replies itself (see `reactor`); this
        // thread only waits to hear why it ended.
        Channel::Plain(stream) => {
            let (done, ended) = std::sync::mpsc::sync_channel(1);
            shared.workers.adopt(Handoff {
                connection: Arc::clone(connection),
                stream,
                rules,
                structured: negotiated.structured_replies,
                target: Arc::clone(&shared.target),
                block_bytes: shared.block_sizes.minimum_bytes,
                max_payload_bytes: shared.block_sizes.maximum_bytes,
                done,
            });
            ended
                .recv()
                .unwrap_or_else(|_| "the server stopped".to_string())
        }
        channel => {
            let unaligned = Unaligned::new(
                Arc::clone(&shared.target),
                shared.block_sizes.minimum_bytes,
                shared.block_sizes.maximum_bytes,
            );
            read_on_this_thread(connection, channel, &rules, negotiated, unaligned)
        }
    };
    let totals = connection.counters.snapshot();
    connection.log(&format!(
        "event=disconnected reason=\"{reason}\" reads={} writes={} errors={}",
        totals.reads, totals.writes, totals.errors
    ));
}

/// A TLS connection: this thread reads (rustls decrypts here) and hands
/// requests to the workers as jobs; returns why it ended.
fn read_on_this_thread(
    connection: &Arc<Connection>,
    channel: Channel,
    rules: &RequestRules,
    negotiated: Negotiated,
    mut unaligned: Unaligned,
) -> String {
    let shared = &connection.shared;
    let (mut reader, writer) = match channel.split() {
        Ok(halves) => halves,
        Err(e) => return format!("{e}"),
    };
    {
        let mut replies = connection.replies.lock().expect("reply lock");
        replies.out = Some(BufWriter::with_capacity(256 * 1024, writer));
        replies.structured = negotiated.structured_replies;
    }
    let mut inline = InlineRunner::open(&shared.target, shared.options.io_max_bytes);
    let reason = read_requests(
        connection,
        &mut reader,
        rules,
        inline.as_mut(),
        &mut unaligned,
    );
    connection.wait_idle();
    connection.flush_replies();
    connection.replies.lock().expect("reply lock").out = None;
    reason
}

/// Read and dispatch requests until the client leaves; returns why.
fn read_requests(
    connection: &Arc<Connection>,
    reader: &mut dyn Read,
    rules: &RequestRules,
    mut inline: Option<&mut InlineRunner>,
    unaligned: &mut Unaligned,
) -> String {
    let mut header = [0u8; REQUEST_HEADER_BYTES];
    loop {
        match read_full(reader, &mut header) {
            Ok(true) => {}
            Ok(false) => return "client closed the connection".into(),
            Err(e) => return format!("disconnected mid-request: {e}"),
        }
        connection.note_request();
        let request = match RequestHeader::parse(&header) {
            Ok(request) => request,
            Err(e) => {
                connection.log(&format!("event=bad-request reason=\"{e}\""));
                return "protocol violation".into();
            }
        };
        if request.command == Command::Disconnect {
            return "client sent NBD_CMD_DISC".into();
        }
        let result = if unaligned.is_aligned(request.offset, request.length)
            || !matches!(
                request.command,
                Command::Read | Command::Write | Command::WriteZeroes | Command::Trim
            )
            || rules.check(&request).is_err()
        {
            handle(connection, reader, rules, request, inline.as_deref_mut())
        } else {
            handle_unaligned(connection, reader, rules, request, unaligned)
        };
        if let Err(e) = result {
            return format!("disconnected mid-request: {e}");
        }
    }
}

/// A checked request that is not block-aligned (the client negotiated no
/// block sizes): served on this thread (see `unaligned`).
fn handle_unaligned(
    connection: &Arc<Connection>,
    reader: &mut dyn Read,
    rules: &RequestRules,
    request: RequestHeader,
    unaligned: &mut Unaligned,
) -> io::Result<()> {
    let fua = request.flags & cmd_flags::FUA != 0;
    let shared = &connection.shared;
    let (result, data) = match request.command {
        Command::Read => match unaligned.read(request.offset, request.length) {
            Ok(data) => (Ok(()), data),
            Err(code) => (Err(code), Vec::new()),
        },
        Command::Write => {
            let mut payload = vec![0u8; request.length as usize];
            if !read_full(reader, &mut payload)? {
                return Err(io::ErrorKind::UnexpectedEof.into());
            }
            let lock = &shared.unaligned_lock;
            let r = unaligned.write(lock, request.offset, request.length, Some(&payload), fua);
            (r, Vec::new())
        }
        Command::WriteZeroes => {
            let lock = &shared.unaligned_lock;
            let r = unaligned.write(lock, request.offset, request.length, None, fua);
            (r, Vec::new())
        }
        Command::Trim => match unaligned.trim_inside(request.offset, request.length) {
            // The whole blocks inside go the usual way, as their own trim.
            Some((offset, length)) => {
                let inner = RequestHeader {
                    offset,
                    length,
                    ..request
                };
                return handle(connection, reader, rules, inner, None);
            }
            None => (Ok(()), Vec::new()),
        },
        _ => unreachable!("only data commands come here"),
    };
    connection.acquire(0);
    let result = result.map_err(|code| (code, "unaligned request failed"));
    send(connection, &request, result, data, 0);
    Ok(())
}

/// Fill `buffer`; `Ok(false)` on a clean end of stream before any byte.
fn read_full(reader: &mut dyn Read, buffer: &mut [u8]) -> io::Result<bool> {
    let mut filled = 0;
    while filled < buffer.len() {
        match reader.read(&mut buffer[filled..]) {
            Ok(0) if filled == 0 => return Ok(false),
            Ok(0) => return Err(io::ErrorKind::UnexpectedEof.into()),
            Ok(n) => filled += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(true)
}

fn handle(
    connection: &Arc<Connection>,
    reader: &mut dyn Read,
    rules: &RequestRules,
    request: RequestHeader,
    inline: Option<&mut InlineRunner>,
) -> io::Result<()> {
    if let Err(rejection) = rules.check(&request) {
        if request.command == Command::Write {
            io::copy(&mut reader.take(u64::from(request.length)), &mut io::sink())?;
        }
        connection.log(&format!(
            "event=request-refused command={:?} offset={} length={} error={:?} reason=\"{}\"",
            request.command, request.offset, request.length, rejection.code, rejection.reason
        ));
        connection.acquire(0);
        send(
            connection,
            &request,
            Err((rejection.code, rejection.reason)),
            Vec::new(),
            0,
        );
        return Ok(());
    }
    let work = match request.command {
        Command::Read => Work::Read,
        Command::Write => Work::Write,
        Command::Flush => Work::Flush,
        Command::Trim => Work::Discard,
        Command::WriteZeroes => Work::Zero,
        Command::BlockStatus => {
            connection.acquire(0);
            connection.deliver(
                Outgoing::BlockStatus {
                    cookie: request.cookie,
                    length: request.length,
                },
                true,
            );
            return Ok(());
        }
        _ => {
            connection.acquire(0);
            send(connection, &request, Ok(()), Vec::new(), 0);
            return Ok(());
        }
    };
    let with_data = matches!(work, Work::Read | Work::Write);
    let bytes = if with_data {
        u64::from(request.length)
    } else {
        0
    };
    connection.acquire(bytes);
    let mut buffer = if with_data {
        connection.buffer(request.length)
    } else {
        Vec::new()
    };
    if work == Work::Write {
        if let Err(e) = read_full(reader, &mut buffer).and_then(|full| {
            if full {
                Ok(())
            } else {
                Err(io::ErrorKind::UnexpectedEof.into())
            }
        }) {
            connection.release(bytes);
            return Err(e);
        }
    }
    let job = Job {
        owner: Arc::clone(connection) as Arc<dyn Finish>,
        cookie: request.cookie,
        work,
        offset: request.offset,
        length: if work == Work::Flush {
            0
        } else {
            request.length
        },
        fua: request.flags & cmd_flags::FUA != 0,
        buffer,
        permit_bytes: bytes,
        command: request.command,
    };
    match inline {
        Some(runner) if job.length >= INLINE_MIN_BYTES => runner.run(job),
        _ => connection.shared.workers.dispatch(job),
    }
    Ok(())
}

/// Requests at least this long run on the connection's own thread when the
/// target completes I/O inline: they are bound by copying, and running them
/// where they were read saves two thread hand-offs. Smaller ones go to the
/// worker pool, which batches them across connections. Measured with
/// bench/vs-nbdkit.py (docs/PERFORMANCE.md): all inline, 1 MiB reads gained
/// and 4 KiB requests lost.
const INLINE_MIN_BYTES: u32 = 128 * 1024;

fn send(
    connection: &Connection,
    request: &RequestHeader,
    result: Result<(), (ErrorCode, &'static str)>,
    data: Vec<u8>,
    permit_bytes: u64,
) {
    let reply = Outgoing::Reply {
        cookie: request.cookie,
        command: request.command,
        offset: request.offset,
        length: request.length,
        result,
        data,
        permit_bytes,
    };
    connection.deliver(reply, true);
}

/// Count a sent reply, give back its permit and buffer.
fn settle(connection: &Connection, message: Outgoing) {
    match message {
        Outgoing::Reply {
            command,
            length,
            result,
            data,
            permit_bytes,
            ..
        } => {
            connection.counters.record(command, length, result.is_ok());
            connection.recycle(data);
            connection.release(permit_bytes);
        }
        Outgoing::BlockStatus { .. } => {
            connection.counters.record(Command::BlockStatus, 0, true);
            connection.release(0);
        }
    }
}

fn write_one(out: &mut impl Write, message: &Outgoing, structured: bool) -> io::Result<()> {
    match message {
        Outgoing::Reply {
            cookie,
            command,
            offset,
            result,
            data,
            ..
        } => {
            let result = result.map_err(|(code, reason)| (code, reason));
            let head = data_reply_head(
                structured,
                *cookie,
                *command,
                *offset,
                data.len() as u32,
                result,
            );
            out.write_all(head.as_slice())?;
            if result.is_ok() && *command == Command::Read {
                out.write_all(data)?;
            }
            Ok(())
        }
        Outgoing::BlockStatus { cookie, length } => {
            out.write_all(block_status_head(*cookie, *length).as_slice())
        }
    }
}
