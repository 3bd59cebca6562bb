//! The NBD client against hostile or broken servers: a scripted server
//! (nvraid-nbd's server handshake, then hand-written replies) that closes
//! during the handshake, answers with a cookie it was never sent, sends a
//! short reply, a reply nobody asked for, a chunk past the request's
//! range, or never answers. Each time the operation fails with a clear
//! reason (reads after one retry on a new connection), no byte outside the
//! request's buffer changes, and nothing hangs.

mod common;

use common::plain_op;
use nvraid_io::engine::MemberOpKind;
use nvraid_io::remote::{Channel, RemoteFile};
use nvraid_nbd::consts::{reply_type, transmission_flags as tf};
use nvraid_nbd::server::{ExportInfo, ServerConfig, ServerEvent, ServerHandshake};
use nvraid_nbd::transmission::{encode_simple_reply, ChunkHeader, RequestHeader};
use nvraid_nbd::BlockSizes;
use nvraid_remote::{NbdChannel, RemoteError, RemoteExport, RemoteOptions};
use std::io::{Read, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

const SIZE: u64 = 1 << 20;

/// How the scripted server answers the first request of a connection.
#[derive(Clone, Copy, Debug)]
enum Misbehave {
    CloseInHandshake,
    WrongCookie,
    ShortReply,
    UnaskedReply,
    ChunkPastRange,
    Silent,
    /// A reply under the cookie a piece merged into the request would
    /// have: the request's slot + 1, sequence 0.
    PieceCookie,
}

struct Script {
    socket: PathBuf,
    _dir: tempfile::TempDir,
}

fn serve(how: Misbehave, structured: bool) -> Script {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("evil.sock");
    let listener = UnixListener::bind(&socket).unwrap();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(stream) = stream else { return };
            std::thread::spawn(move || connection(stream, how, structured));
        }
    });
    Script { socket, _dir: dir }
}

fn connection(mut stream: UnixStream, how: Misbehave, structured: bool) {
    let config = Arc::new(ServerConfig::new(vec![ExportInfo {
        name: String::new(),
        description: String::new(),
        size_bytes: SIZE,
        transmission_flags: tf::SEND_FLUSH | tf::SEND_FUA | tf::CAN_MULTI_CONN,
        block_sizes: BlockSizes {
            minimum_bytes: 1,
            preferred_bytes: 4096,
            maximum_bytes: 1 << 20,
        },
        base_allocation: false,
    }]));
    let mut hs = ServerHandshake::new(config);
    if let Misbehave::CloseInHandshake = how {
        let _ = stream.write_all(&hs.take_output()[..10]);
        return;
    }
    let mut buf = vec![0u8; 65536];
    let structured_agreed;
    'handshake: loop {
        let out = hs.take_output();
        if stream.write_all(&out).is_err() {
            return;
        }
        let n = match stream.read(&mut buf) {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        let mut input = &buf[..n];
        while !input.is_empty() {
            let (used, event) = hs.receive(input).unwrap();
            input = &input[used..];
            if let Some(ServerEvent::Ready(n)) = event {
                structured_agreed = n.structured_replies;
                let _ = stream.write_all(&hs.take_output());
                break 'handshake;
            }
        }
    }
    assert_eq!(
        structured_agreed, structured,
        "the client asks for structured replies"
    );
    let mut header = [0u8; 28];
    if stream.read_exact(&mut header).is_err() {
        return;
    }
    let request = RequestHeader::parse(&header).unwrap();
    let mut payload = vec![0u8; request.payload_bytes() as usize];
    let _ = stream.read_exact(&mut payload);
    let data = vec![0xabu8; request.length as usize];
    let mut out = Vec::new();
    match how {
        Misbehave::CloseInHandshake => unreachable!(),
        Misbehave::WrongCookie => {
            out.extend(encode_simple_reply(request.cookie ^ 0x5555, None));
            out.extend(&data);
        }
        Misbehave::ShortReply => {
            // A data chunk that promises the whole range, half of it, and
            // the connection closes.
            let header = ChunkHeader {
                flags: 1,
                reply_type: reply_type::OFFSET_DATA,
                cookie: request.cookie,
                length_bytes: 8 + request.length,
            };
            out.extend(header.encode());
            out.extend(request.offset.to_be_bytes());
            out.extend(&data[..data.len() / 2]);
            let _ = stream.write_all(&out);
            return;
        }
        Misbehave::PieceCookie => {
            // The request's last 4 KiB (a merged request's second piece)
            // under the cookie that piece would have. A connection whose
            // first request is no read, the export's closing one, is
            // just closed.
            if data.len() < 4096 {
                return;
            }
            let header = ChunkHeader {
                flags: 1,
                reply_type: reply_type::OFFSET_DATA,
                cookie: u64::from(request.cookie as u32 + 1),
                length_bytes: 8 + 4096,
            };
            out.extend(header.encode());
            out.extend((request.offset + u64::from(request.length) - 4096).to_be_bytes());
            out.extend(&data[..4096]);
        }
        Misbehave::UnaskedReply => {
            out.extend(encode_simple_reply(request.cookie + (1 << 40), None));
        }
        Misbehave::ChunkPastRange => {
            let header = ChunkHeader {
                flags: 1,
                reply_type: reply_type::OFFSET_DATA,
                cookie: request.cookie,
                length_bytes: 8 + request.length,
            };
            out.extend(header.encode());
            out.extend((request.offset + 4096).to_be_bytes());
            out.extend(&data);
        }
        Misbehave::Silent => {
            std::thread::sleep(Duration::from_secs(5));
            return;
        }
    }
    let _ = stream.write_all(&out);
    // Stay open a while: the client must not wait for more.
    std::thread::sleep(Duration::from_millis(2000));
}

fn options() -> RemoteOptions {
    RemoteOptions {
        request_timeout: Duration::from_millis(300),
        connect_timeout: Duration::from_secs(2),
    }
}

fn uri(script: &Script) -> String {
    format!("nbd+unix:///?socket={}", script.socket.display())
}

/// Read 8 KiB at 64 KiB into the middle of a guarded buffer; returns the
/// result, the buffer, and how long it took.
fn read_one(channel: &mut dyn Channel) -> (i32, Vec<u8>, Duration) {
    let mut buf = vec![0x11u8; 3 * 8192];
    let op = plain_op(
        MemberOpKind::Read,
        65536,
        buf[8192..].as_mut_ptr(),
        8192,
        42,
    );
    let start = Instant::now();
    unsafe { channel.push(&op) }.unwrap();
    let mut result = None;
    while result.is_none() {
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "the read never completed"
        );
        channel.progress(&mut |user_data, r| {
            assert_eq!(user_data, 42);
            result = Some(r);
        });
        let mut fds: Vec<libc::pollfd> = Vec::new();
        channel.poll_fds(&mut fds);
        nvraid_io::sys::poll(&mut fds, 5);
    }
    (result.unwrap(), buf, start.elapsed())
}

/// Push `n` reads of 4 KiB that continue one another from 64 KiB (they go
/// as one request), each into the middle of its own guarded buffer; wait
/// for all. Returns each read's result (by push order) and the buffers.
fn read_run(channel: &mut dyn Channel, n: usize) -> (Vec<i32>, Vec<Vec<u8>>) {
    let mut bufs: Vec<Vec<u8>> = (0..n).map(|_| vec![0x11u8; 3 * 4096]).collect();
    for (i, buf) in bufs.iter_mut().enumerate() {
        let offset = 65536 + 4096 * i as u64;
        let op = plain_op(
            MemberOpKind::Read,
            offset,
            buf[4096..].as_mut_ptr(),
            4096,
            i as u64,
        );
        unsafe { channel.push(&op) }.unwrap();
    }
    let start = Instant::now();
    let mut results: Vec<Option<i32>> = vec![None; n];
    while results.iter().any(Option::is_none) {
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "reads never completed: {results:?}"
        );
        channel.progress(&mut |user_data, r| {
            let slot = &mut results[user_data as usize];
            assert!(slot.is_none(), "read {user_data} completed twice");
            *slot = Some(r);
        });
        let mut fds: Vec<libc::pollfd> = Vec::new();
        channel.poll_fds(&mut fds);
        nvraid_io::sys::poll(&mut fds, 5);
    }
    assert_eq!(channel.inflight(), 0);
    (results.into_iter().map(Option::unwrap).collect(), bufs)
}

/// Reads merged into one request whose connection breaks are sent again
/// one by one on a new connection, and when that fails too, each fails on
/// its own: every read completes once, with an error, and no byte outside
/// its buffer changes.
#[test]
fn merged_reads_come_apart_when_their_connection_is_lost() {
    for how in [
        Misbehave::ShortReply,
        Misbehave::ChunkPastRange,
        Misbehave::Silent,
    ] {
        let script = serve(how, true);
        let export = RemoteExport::open(&uri(&script), false, false, options()).unwrap();
        let mut channel =
            NbdChannel::unconnected(export.uri(), export.options(), export.info().clone());
        let (results, bufs) = read_run(&mut channel, 4);
        assert!(results.iter().all(|&r| r < 0), "{how:?}: {results:?}");
        for (i, buf) in bufs.iter().enumerate() {
            assert!(
                buf[..4096].iter().all(|&b| b == 0x11) && buf[8192..].iter().all(|&b| b == 0x11),
                "{how:?}: bytes outside read {i}'s buffer changed"
            );
        }
    }
}

/// A piece merged into another request has no cookie of its own: a reply
/// under the one it would have is refused, not taken as its data.
#[test]
fn a_reply_to_a_merged_piece_ends_the_connection() {
    let script = serve(Misbehave::PieceCookie, true);
    let export = RemoteExport::open(&uri(&script), false, false, options()).unwrap();
    let mut channel =
        NbdChannel::unconnected(export.uri(), export.options(), export.info().clone());
    let (results, bufs) = read_run(&mut channel, 2);
    assert!(results.iter().all(|&r| r < 0), "{results:?}");
    let why = channel.last_failure().unwrap_or_default().to_string();
    assert!(why.contains("not sent"), "reason {why:?}");
    assert!(
        bufs.iter().all(|b| b.iter().all(|&x| x == 0x11)),
        "a refused reply's data reached a buffer"
    );
}

fn check_refused_read(how: Misbehave, structured: bool, reason: &str) {
    let script = serve(how, structured);
    let export = RemoteExport::open(&uri(&script), false, false, options()).unwrap();
    let mut channel =
        NbdChannel::unconnected(export.uri(), export.options(), export.info().clone());
    let (result, buf, took) = read_one(&mut channel);
    assert!(result < 0, "{how:?}: the read succeeded ({result})");
    let why = channel.last_failure().unwrap_or_default().to_string();
    assert!(why.contains(reason), "{how:?}: reason {why:?}");
    assert!(
        buf[..8192].iter().all(|&b| b == 0x11) && buf[16384..].iter().all(|&b| b == 0x11),
        "{how:?}: bytes outside the request's buffer changed"
    );
    assert!(took < Duration::from_secs(5), "{how:?}: took {took:?}");
    // The export's own path also fails cleanly.
    let mut small = vec![0u8; 4096];
    assert!(export.read_at(&mut small, 0).is_err(), "{how:?}");
}

#[test]
fn a_reply_with_a_cookie_never_sent_ends_the_connection() {
    check_refused_read(Misbehave::WrongCookie, true, "not sent");
}

#[test]
fn a_reply_nobody_asked_for_ends_the_connection() {
    check_refused_read(Misbehave::UnaskedReply, true, "not sent");
}

#[test]
fn a_short_reply_is_not_taken_as_data() {
    check_refused_read(Misbehave::ShortReply, true, "closed");
}

#[test]
fn a_chunk_past_the_request_range_ends_the_connection() {
    check_refused_read(Misbehave::ChunkPastRange, true, "outside the request");
}

#[test]
fn a_server_that_never_answers_times_out() {
    check_refused_read(Misbehave::Silent, true, "no reply within");
}

#[test]
fn a_server_that_closes_during_the_handshake_is_named() {
    let script = serve(Misbehave::CloseInHandshake, true);
    let err = RemoteExport::open(&uri(&script), false, false, options()).unwrap_err();
    assert!(matches!(err, RemoteError::Connect(_)), "{err}");
    let text = err.to_string();
    assert!(
        text.starts_with(&uri(&script))
            && text.contains("closed the connection during the handshake"),
        "{text}"
    );
}

#[test]
fn tls_uris_are_refused_with_the_reason() {
    let err = RemoteExport::open("nbds://127.0.0.1:1/x", false, false, options()).unwrap_err();
    assert!(err.to_string().contains("TLS"), "{err}");
}

/// The remote file opens channels that connect lazily: a channel to a
/// server that is gone fails its first operation, with the reason.
#[test]
fn a_channel_to_a_vanished_server_fails_its_operations() {
    let script = serve(Misbehave::Silent, true);
    let export = RemoteExport::open(&uri(&script), false, false, options()).unwrap();
    let mut channel = export.open_channel().unwrap();
    drop(script);
    let (result, _, _) = read_one(channel.as_mut());
    assert!(result < 0, "{result}");
}
