//! One client's thread: the handshake (within a deadline), then the
//! connection's hand-over to a worker, which reads its requests and sends
//! its replies (see `reactor`); this thread waits for the end and logs it.
//!
//! Bounds: at most `inflight_max` requests and `inflight_max_bytes` payload
//! bytes in flight per connection (the worker takes no more of its
//! requests until a permit is free; see `Connection::try_acquire`).

use std::io::{self, Read, Write};
use std::sync::Arc;
use std::time::{Duration, Instant};

use nvraid_nbd::{Negotiated, RequestRules, ServerEvent, ServerHandshake};

use crate::connection::Connection;
use crate::reactor::Handoff;
use crate::shared::Shared;
use crate::stream::Stream;
use crate::transport::Channel;
use crate::wire::Wire;

/// Serve one accepted client to the end; its admission slot is given back
/// when it ends.
pub(crate) fn run(shared: Arc<Shared>, stream: Stream, id: u64, client: String) {
    let Ok(socket) = stream.try_clone() else {
        shared.finished();
        return;
    };
    let connection = Arc::new(Connection::new(
        id,
        client,
        socket,
        &shared.options,
        shared.started,
        Arc::clone(&shared.unaligned_ranges),
    ));
    shared.register(&connection);
    connection.log("event=connected");
    let outcome = negotiate(&shared, &connection, Channel::Plain(stream));
    if let Some((channel, negotiated, size_bytes)) = outcome {
        transmit(&shared, &connection, channel, negotiated, size_bytes);
    }
    shared.unregister(&connection);
}

/// The handshake; `None` when the client left or was refused. With the
/// export's size the client was told.
fn negotiate(
    shared: &Shared,
    connection: &Arc<Connection>,
    mut channel: Channel,
) -> Option<(Channel, Negotiated, u64)> {
    let limit = shared.options.handshake_timeout;
    let deadline = Instant::now() + limit;
    let config = shared.handshake_now();
    let size_bytes = config
        .exports
        .first()
        .map_or(shared.size_bytes, |e| e.size_bytes);
    let mut handshake = ServerHandshake::new(config);
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
        let received = read_handshake(connection, &mut channel, &mut buffer[..wanted], limit)?;
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
                channel = start_tls(shared, connection, channel, &mut handshake)?;
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
                return Some((channel, negotiated, size_bytes));
            }
        }
    }
}

/// One read of the handshake into `buffer`: the bytes read, or None (and
/// the reason logged) when the client closed the connection, the read
/// failed or the handshake's time (`limit`) ran out.
fn read_handshake(
    connection: &Connection,
    channel: &mut Channel,
    buffer: &mut [u8],
    limit: Duration,
) -> Option<usize> {
    match channel.read(buffer) {
        Ok(0) => {
            connection
                .log("event=disconnected phase=handshake reason=\"client closed the connection\"");
            None
        }
        Ok(n) => Some(n),
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
            None
        }
        Err(e) => {
            connection.log(&format!("event=disconnected phase=handshake error=\"{e}\""));
            None
        }
    }
}

fn start_tls(
    shared: &Shared,
    connection: &Arc<Connection>,
    mut channel: Channel,
    handshake: &mut ServerHandshake,
) -> Option<Channel> {
    let output = handshake.take_output();
    channel.write_all(&output).ok()?;
    let config = shared.tls.as_ref()?;
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

fn transmit(
    shared: &Shared,
    connection: &Arc<Connection>,
    channel: Channel,
    negotiated: Negotiated,
    size_bytes: u64,
) {
    connection.log(&format!(
        "event=transmission export={:?} structured={} tls={}",
        shared.options.export_name, negotiated.structured_replies, negotiated.tls_active
    ));
    let rules = RequestRules {
        size_bytes,
        minimum_block_bytes: shared.block_sizes.minimum_bytes,
        maximum_payload_bytes: shared.block_sizes.maximum_bytes,
        transmission_flags: negotiated.transmission_flags,
        block_status: !negotiated.meta_context_ids.is_empty(),
        any_alignment: !negotiated.block_sizes_requested,
    };
    connection.note_request();
    connection.start_serving();
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
