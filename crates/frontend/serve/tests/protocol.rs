//! Bad input and protocol semantics, driven by a raw client built on the
//! codec. After each misbehaving client the server must still serve
//! others, and must have logged a line naming the client.

mod common;

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::time::Duration;

use common::{random_bytes, TestServer};
use nvraid_nbd::consts::{cmd_flags, reply_type};
use nvraid_nbd::transmission::ReplyHeader;
use nvraid_nbd::{
    ClientConfig, ClientEvent, ClientHandshake, ClientNegotiated, Command, ErrorCode,
    OptionRequest, RequestHeader,
};
use nvraid_testing::MemTarget;

const MIB: u64 = 1 << 20;

struct Client {
    stream: UnixStream,
    negotiated: ClientNegotiated,
}

/// A reply: cookie, error value, data (for reads).
#[derive(Debug)]
struct Reply {
    cookie: u64,
    error: u32,
    data: Vec<u8>,
}

fn connect(server: &TestServer, structured: bool) -> Client {
    let stream = UnixStream::connect(&server.socket).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(20)))
        .unwrap();
    handshake(stream, structured, None)
}

/// The handshake on `stream`, whose first byte from the server may have
/// been read already.
fn handshake(mut stream: UnixStream, structured: bool, first: Option<u8>) -> Client {
    let config = ClientConfig {
        export: String::new(),
        tls: false,
        structured_replies: structured,
        meta_contexts: vec!["base:allocation".into()],
    };
    let mut handshake = ClientHandshake::new(config);
    let mut byte = [0u8; 1];
    let mut first = first;
    loop {
        stream.write_all(&handshake.take_output()).unwrap();
        match first.take() {
            Some(given) => byte[0] = given,
            None => stream.read_exact(&mut byte).unwrap(),
        }
        if let (_, Some(ClientEvent::Ready(negotiated))) = handshake.receive(&byte).unwrap() {
            return Client { stream, negotiated };
        }
    }
}

impl Client {
    fn send(
        &mut self,
        command: Command,
        flags: u16,
        cookie: u64,
        offset: u64,
        length: u32,
        payload: &[u8],
    ) {
        let header = RequestHeader {
            flags,
            command,
            cookie,
            offset,
            length,
        };
        self.stream.write_all(&header.encode()).unwrap();
        self.stream.write_all(payload).unwrap();
    }

    fn reply(&mut self) -> Reply {
        let mut head = [0u8; 20];
        self.stream.read_exact(&mut head[..4]).unwrap();
        let size =
            ReplyHeader::header_bytes(u32::from_be_bytes(head[..4].try_into().unwrap())).unwrap();
        self.stream.read_exact(&mut head[4..size]).unwrap();
        match ReplyHeader::parse(&head[..size]).unwrap().unwrap().0 {
            ReplyHeader::Simple { error, cookie } => Reply {
                cookie,
                error,
                data: Vec::new(),
            },
            ReplyHeader::Chunk(chunk) => {
                let mut payload = vec![0; chunk.length_bytes as usize];
                self.stream.read_exact(&mut payload).unwrap();
                assert!(chunk.is_done(), "this server sends one chunk per reply");
                match chunk.reply_type {
                    reply_type::OFFSET_DATA => Reply {
                        cookie: chunk.cookie,
                        error: 0,
                        data: payload[8..].to_vec(),
                    },
                    reply_type::ERROR => {
                        let error = u32::from_be_bytes(payload[..4].try_into().unwrap());
                        Reply {
                            cookie: chunk.cookie,
                            error,
                            data: Vec::new(),
                        }
                    }
                    _ => Reply {
                        cookie: chunk.cookie,
                        error: 0,
                        data: payload,
                    },
                }
            }
        }
    }

    /// Send and wait for the reply.
    fn call(
        &mut self,
        command: Command,
        flags: u16,
        offset: u64,
        length: u32,
        payload: &[u8],
    ) -> Reply {
        self.send(command, flags, 99, offset, length, payload);
        let reply = self.reply();
        assert_eq!(reply.cookie, 99);
        reply
    }

    fn read_simple_data(&mut self, length: usize) -> Vec<u8> {
        let mut data = vec![0; length];
        self.stream.read_exact(&mut data).unwrap();
        data
    }

    fn is_closed(&mut self) -> bool {
        let mut byte = [0u8; 1];
        matches!(self.stream.read(&mut byte), Ok(0) | Err(_))
    }
}

/// A new connection is closed by the server before any byte (refused at
/// accept).
fn assert_closed_at_accept(server: &TestServer, what: &str) {
    let mut extra = UnixStream::connect(&server.socket).unwrap();
    extra
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let mut byte = [0u8; 1];
    assert_eq!(extra.read(&mut byte).unwrap(), 0, "{what}");
}

/// The server still serves a well-behaved client.
fn still_serving(server: &TestServer) {
    let mut client = connect(server, true);
    let reply = client.call(Command::Read, 0, 0, 4096, &[]);
    assert_eq!(reply.error, 0);
    assert_eq!(reply.data.len(), 4096);
}

fn code(error: ErrorCode) -> u32 {
    error.value()
}

#[test]
fn pipelined_requests_all_complete_with_the_right_data() {
    let server = TestServer::start(MemTarget::new(16 * MIB, 512));
    let mut client = connect(&server, true);
    for i in 0..64u64 {
        let payload = vec![i as u8; 64 * 1024];
        client.send(Command::Write, 0, i, i * 65536, 65536, &payload);
    }
    let mut seen: Vec<u64> = (0..64)
        .map(|_| client.reply())
        .inspect(|r| assert_eq!(r.error, 0))
        .map(|r| r.cookie)
        .collect();
    seen.sort();
    assert_eq!(seen, (0..64).collect::<Vec<_>>());
    for i in 0..64u64 {
        client.send(Command::Read, 0, 1000 + i, i * 65536, 65536, &[]);
    }
    for _ in 0..64 {
        let reply = client.reply();
        let i = reply.cookie - 1000;
        assert!(
            reply.data.iter().all(|b| *b == i as u8),
            "read {i} has wrong data"
        );
    }
    // A request larger than a worker's I/O size is split and reassembled.
    let big: Vec<u8> = common::random_bytes(5 * MIB as usize, 3);
    assert_eq!(
        client
            .call(Command::Write, 0, MIB, 5 * MIB as u32, &big)
            .error,
        0
    );
    assert_eq!(
        client.call(Command::Read, 0, MIB, 5 * MIB as u32, &[]).data,
        big
    );
}

#[test]
fn simple_replies_carry_read_data() {
    let server = TestServer::start(MemTarget::new(MIB, 512));
    let mut client = connect(&server, false);
    assert!(!client.negotiated.structured_replies);
    assert_eq!(
        client.call(Command::Write, 0, 512, 512, &[7u8; 512]).error,
        0
    );
    let reply = client.call(Command::Read, 0, 512, 512, &[]);
    assert_eq!(reply.error, 0);
    assert_eq!(client.read_simple_data(512), vec![7u8; 512]);
    // An error reply to a simple read carries no data.
    let reply = client.call(Command::Read, 0, MIB, 512, &[]);
    assert_eq!(reply.error, code(ErrorCode::Invalid));
    assert_eq!(client.call(Command::Flush, 0, 0, 0, &[]).error, 0);
}

#[test]
fn out_of_range_oversized_and_unaligned_requests_get_errors() {
    let server = TestServer::start(MemTarget::new(MIB, 4096));
    let mut client = connect(&server, true);
    assert_eq!(
        client.call(Command::Read, 0, MIB, 4096, &[]).error,
        code(ErrorCode::Invalid)
    );
    assert_eq!(
        client
            .call(Command::Write, 0, MIB - 4096, 8192, &[0; 8192])
            .error,
        code(ErrorCode::NoSpace)
    );
    assert_eq!(
        client
            .call(Command::Read, 0, u64::MAX - 4095, 4096, &[])
            .error,
        code(ErrorCode::Invalid)
    );
    assert_eq!(
        client.call(Command::Read, 0, 512, 4096, &[]).error,
        code(ErrorCode::Invalid)
    );
    assert_eq!(
        client.call(Command::Write, 0, 0, 1000, &[1; 1000]).error,
        code(ErrorCode::Invalid)
    );
    assert_eq!(
        client.call(Command::Unknown(77), 0, 0, 4096, &[]).error,
        code(ErrorCode::Invalid)
    );
    assert_eq!(
        client.call(Command::Read, 0x8000, 0, 4096, &[]).error,
        code(ErrorCode::Invalid)
    );
    // The connection is still in step after refused writes' payloads.
    let reply = client.call(Command::Read, 0, 0, 4096, &[]);
    assert_eq!(reply.error, 0);
    assert!(
        reply.data.iter().all(|b| *b == 0),
        "refused writes changed data"
    );
    server.wait_log(&[
        "client=unix:",
        "event=request-refused",
        "reason=\"range past the end of the export\"",
    ]);
    server.wait_log(&["reason=\"not aligned to the minimum block size\""]);
}

#[test]
fn oversized_write_is_drained_and_refused() {
    let server = TestServer::start_with(MemTarget::new(8 * MIB, 512), |o| {
        o.request_max_bytes = MIB as u32;
        o.inflight_max_bytes = 2 * MIB;
    });
    let mut client = connect(&server, true);
    assert_eq!(
        client.negotiated.block_sizes.unwrap().maximum_bytes,
        MIB as u32
    );
    let payload = vec![9u8; 2 * MIB as usize];
    let reply = client.call(Command::Write, 0, 0, 2 * MIB as u32, &payload);
    assert_eq!(reply.error, code(ErrorCode::Overflow));
    assert_eq!(
        client.call(Command::Read, 0, 0, 2 * MIB as u32, &[]).error,
        code(ErrorCode::Overflow)
    );
    assert_eq!(
        client.call(Command::Read, 0, 0, 4096, &[]).data,
        vec![0u8; 4096]
    );
}

#[test]
fn writes_to_a_read_only_export_are_refused() {
    let server = TestServer::start_with(MemTarget::new(MIB, 512), |o| o.read_only = true);
    let mut client = connect(&server, true);
    assert_eq!(
        client.call(Command::Write, 0, 0, 512, &[1; 512]).error,
        code(ErrorCode::NotPermitted)
    );
    assert_eq!(
        client.call(Command::Trim, 0, 0, 512, &[]).error,
        code(ErrorCode::NotPermitted)
    );
    assert_eq!(
        client.call(Command::WriteZeroes, 0, 0, 512, &[]).error,
        code(ErrorCode::NotPermitted)
    );
    assert_eq!(client.call(Command::Read, 0, 0, 512, &[]).error, 0);
    assert!(server.target.contents().iter().all(|b| *b == 0));
}

#[test]
fn trim_zeroes_cache_and_block_status() {
    let server = TestServer::start(MemTarget::new(MIB, 512));
    server.target.fill(&vec![0xab; MIB as usize]);
    let mut client = connect(&server, true);
    assert_eq!(client.negotiated.meta_contexts.len(), 1);
    assert_eq!(
        client
            .call(Command::WriteZeroes, cmd_flags::NO_HOLE, 4096, 8192, &[])
            .error,
        0
    );
    assert_eq!(
        client.call(Command::Read, 0, 4096, 8192, &[]).data,
        vec![0u8; 8192]
    );
    assert_eq!(client.call(Command::Trim, 0, 65536, 4096, &[]).error, 0);
    assert_eq!(client.call(Command::Cache, 0, 0, 4096, &[]).error, 0);
    let status = client.call(Command::BlockStatus, 0, 0, 65536, &[]);
    assert_eq!(status.error, 0);
    // context id 1, one extent of the whole range, status 0 (allocated).
    assert_eq!(status.data, [0, 0, 0, 1, 0, 1, 0, 0, 0, 0, 0, 0]);
    assert_eq!(server.target.contents()[0], 0xab);
}

#[test]
fn storage_errors_become_eio_replies() {
    let server = TestServer::start(MemTarget::new(MIB, 512));
    server.target.fail_between(Some((8192, 16384)));
    let mut client = connect(&server, true);
    assert_eq!(
        client.call(Command::Read, 0, 8192, 512, &[]).error,
        code(ErrorCode::Io)
    );
    assert_eq!(
        client.call(Command::Write, 0, 0, 65536, &[1; 65536]).error,
        code(ErrorCode::Io)
    );
    assert_eq!(client.call(Command::Read, 0, 0, 4096, &[]).error, 0);
    server.target.fail_between(None);
    let status = nvraid_serve::query_status(&server.control).unwrap();
    assert_eq!(status["totals"]["errors"], 2);
}

#[test]
fn flush_on_one_connection_covers_writes_completed_on_another() {
    let server = TestServer::start(MemTarget::new(MIB, 512));
    let mut writer = connect(&server, true);
    let mut flusher = connect(&server, false);
    assert_eq!(writer.call(Command::Write, 0, 0, 4096, &[5; 4096]).error, 0);
    assert_eq!(
        server.target.durable_contents()[0],
        0,
        "write should not be durable yet"
    );
    assert_eq!(flusher.call(Command::Flush, 0, 0, 0, &[]).error, 0);
    assert_eq!(&server.target.durable_contents()[..4096], &[5; 4096][..]);
    assert_eq!(
        writer
            .call(Command::Write, cmd_flags::FUA, 8192, 512, &[6; 512])
            .error,
        0
    );
    assert_eq!(
        server.target.durable_contents()[8192],
        6,
        "FUA write not durable"
    );
}

#[test]
fn wrong_option_magic_disconnects_and_is_logged() {
    let server = TestServer::start(MemTarget::new(MIB, 512));
    let mut stream = UnixStream::connect(&server.socket).unwrap();
    let mut greeting = [0u8; 18];
    stream.read_exact(&mut greeting).unwrap();
    stream.write_all(&[0, 0, 0, 1]).unwrap();
    stream.write_all(b"NOTMAGIC\0\0\0\x07\0\0\0\0").unwrap();
    let mut rest = Vec::new();
    let _ = stream.read_to_end(&mut rest);
    assert!(rest.is_empty(), "server answered a bad magic");
    server.wait_log(&["client=unix:", "event=refused phase=handshake", "bad magic"]);
    still_serving(&server);
}

#[test]
fn unknown_option_gets_err_unsup_then_go_works() {
    let server = TestServer::start(MemTarget::new(MIB, 512));
    let mut stream = UnixStream::connect(&server.socket).unwrap();
    let mut greeting = [0u8; 18];
    stream.read_exact(&mut greeting).unwrap();
    stream.write_all(&[0, 0, 0, 3]).unwrap();
    stream
        .write_all(
            &OptionRequest::Unknown {
                option: 4242,
                data: b"hello".to_vec(),
            }
            .encode(),
        )
        .unwrap();
    let mut reply = [0u8; 20];
    stream.read_exact(&mut reply).unwrap();
    assert_eq!(&reply[8..12], &4242u32.to_be_bytes());
    assert_eq!(
        &reply[12..16],
        &nvraid_nbd::consts::rep::ERR_UNSUP.to_be_bytes()
    );
    let mut message = vec![0u8; u32::from_be_bytes(reply[16..20].try_into().unwrap()) as usize];
    stream.read_exact(&mut message).unwrap();
    server.wait_log(&["event=option-refused option=4242"]);
    stream
        .write_all(&OptionRequest::ExportName(String::new()).encode())
        .unwrap();
    let mut export = [0u8; 10];
    stream.read_exact(&mut export).unwrap();
    assert_eq!(u64::from_be_bytes(export[..8].try_into().unwrap()), MIB);
}

#[test]
fn disconnects_mid_handshake_and_mid_request_are_logged() {
    let server = TestServer::start(MemTarget::new(MIB, 512));
    {
        let mut stream = UnixStream::connect(&server.socket).unwrap();
        let mut greeting = [0u8; 18];
        stream.read_exact(&mut greeting).unwrap();
        stream.write_all(&[0, 0]).unwrap();
    }
    server.wait_log(&["event=disconnected phase=handshake"]);
    {
        let mut client = connect(&server, true);
        let header = RequestHeader {
            flags: 0,
            command: Command::Write,
            cookie: 1,
            offset: 0,
            length: 65536,
        };
        client.stream.write_all(&header.encode()).unwrap();
        client.stream.write_all(&[3; 1000]).unwrap();
    }
    server.wait_log(&["event=disconnected", "mid-request"]);
    {
        let mut client = connect(&server, true);
        client.stream.write_all(&[0x25, 0x60, 0x95]).unwrap();
    }
    let mid_request = || {
        server
            .log_lines()
            .iter()
            .filter(|l| l.contains("mid-request"))
            .count()
    };
    for _ in 0..200 {
        if mid_request() >= 2 {
            break;
        }
        std::thread::sleep(Duration::from_millis(25));
    }
    assert_eq!(mid_request(), 2, "{}", server.log_lines().join("\n"));
    still_serving(&server);
    assert!(
        server.target.contents().iter().all(|b| *b == 0),
        "a partial write reached the target"
    );
}

#[test]
fn garbage_after_the_handshake_disconnects() {
    let server = TestServer::start(MemTarget::new(MIB, 512));
    let mut client = connect(&server, true);
    client.stream.write_all(&[0x55; 28]).unwrap();
    assert!(client.is_closed());
    server.wait_log(&["event=bad-request", "bad magic"]);
    server.wait_log(&["event=disconnected", "protocol violation"]);
    still_serving(&server);
}

#[test]
fn connection_flood_beyond_the_limit_is_refused() {
    let server = TestServer::start_with(MemTarget::new(MIB, 512), |o| o.connections_max = 3);
    let mut held: Vec<Client> = (0..3).map(|_| connect(&server, true)).collect();
    assert_closed_at_accept(&server, "connection beyond the limit was served");
    server.wait_log(&["event=refused", "connection limit (3) reached"]);
    for client in &mut held {
        assert_eq!(client.call(Command::Read, 0, 0, 512, &[]).error, 0);
    }
    held.pop();
    // Once one leaves, a new client is admitted.
    for _ in 0..100 {
        let status = nvraid_serve::query_status(&server.control).unwrap();
        if status["connections"].as_array().unwrap().len() < 3 {
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    still_serving(&server);
}

/// Clients that finish the handshake and sit idle hold every slot: a new
/// client takes the slot of the one idle longest once it has been idle for
/// the idle timeout, and is served; the idle client's slot is given up
/// with a log line that says why. Without the timeout the new client is
/// refused, as before.
#[test]
fn an_idle_client_makes_way_for_a_new_one_when_the_slots_are_full() {
    let server = TestServer::start_with(MemTarget::new(MIB, 512), |o| {
        o.connections_max = 3;
        o.idle_timeout = Some(Duration::from_millis(500));
    });
    let mut held: Vec<Client> = (0..3).map(|_| connect(&server, true)).collect();
    // The third keeps working: it is never the one to go.
    for _ in 0..6 {
        std::thread::sleep(Duration::from_millis(150));
        assert_eq!(held[2].call(Command::Read, 0, 0, 512, &[]).error, 0);
    }
    let mut newcomer = connect(&server, true);
    assert_eq!(newcomer.call(Command::Read, 0, 0, 512, &[]).error, 0);
    server.wait_log(&["event=evicted", "idle for", "connection limit (3)"]);
    assert_eq!(
        held[2].call(Command::Read, 0, 0, 512, &[]).error,
        0,
        "the busy client is still served"
    );
    // One of the first two was closed.
    let mut closed = 0;
    for client in &mut held[..2] {
        let mut byte = [0u8; 1];
        client
            .stream
            .set_read_timeout(Some(Duration::from_secs(2)))
            .unwrap();
        // A closed connection reads its end; an open idle one times out.
        match client.stream.read(&mut byte) {
            Ok(0) => closed += 1,
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) => {}
            other => panic!("unexpected {other:?}"),
        }
    }
    assert_eq!(closed, 1, "exactly one idle client made way");

    let strict = TestServer::start_with(MemTarget::new(MIB, 512), |o| {
        o.connections_max = 2;
        o.idle_timeout = None;
    });
    let _held: Vec<Client> = (0..2).map(|_| connect(&strict, true)).collect();
    std::thread::sleep(Duration::from_millis(600));
    assert_closed_at_accept(&strict, "refused without a timeout");
}

/// Clients that connect and never finish the handshake (silent, or
/// trickling a byte now and then) lose their slot at the handshake
/// deadline, so a real client gets in.
#[test]
fn the_handshake_has_a_deadline_not_a_per_read_timeout() {
    let server = TestServer::start_with(MemTarget::new(MIB, 512), |o| {
        o.connections_max = 2;
        o.handshake_timeout = Duration::from_millis(800);
        o.idle_timeout = None;
    });
    let _silent = UnixStream::connect(&server.socket).unwrap();
    let trickler = UnixStream::connect(&server.socket).unwrap();
    let started = std::time::Instant::now();
    let trickle = std::thread::spawn(move || {
        let mut trickler = trickler;
        let mut greeting = [0u8; 18];
        let _ = trickler.read_exact(&mut greeting);
        // One byte of the client flags every 300 ms: each read finishes
        // well inside any per-read timeout.
        for _ in 0..10 {
            if trickler.write_all(&[0]).is_err() {
                break;
            }
            std::thread::sleep(Duration::from_millis(300));
        }
    });
    server.wait_log(&[
        "event=disconnected",
        "phase=handshake",
        "handshake not finished within 0.8s",
    ]);
    let mut client = connect(&server, true);
    assert_eq!(client.call(Command::Read, 0, 0, 512, &[]).error, 0);
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "{:?}",
        started.elapsed()
    );
    trickle.join().unwrap();
    let lines = server.log_lines();
    let gone = lines
        .iter()
        .filter(|l| l.contains("handshake not finished within"))
        .count();
    assert_eq!(
        gone, 2,
        "both the silent and the trickling client lost their slots: {lines:?}"
    );
}

#[test]
fn shutdown_finishes_in_flight_requests_and_flushes() {
    let server = TestServer::start(MemTarget::new(16 * MIB, 512));
    let mut client = connect(&server, true);
    for i in 0..32u64 {
        client.send(
            Command::Write,
            0,
            i,
            i * 262144,
            262144,
            &vec![i as u8 + 1; 262144],
        );
    }
    let shutdown = server.shutdown.clone();
    let replies =
        std::thread::spawn(move || (0..32).map(|_| client.reply().error).collect::<Vec<_>>());
    shutdown.trigger();
    let errors = replies.join().unwrap();
    assert!(errors.iter().all(|e| *e == 0), "{errors:?}");
    let target = server.target.clone();
    server.stop();
    let durable = target.durable_contents();
    for i in 0..32usize {
        assert_eq!(
            durable[i * 262144],
            i as u8 + 1,
            "write {i} not durable after shutdown"
        );
    }
}

#[test]
fn control_socket_reports_connections_and_counters() {
    let server = TestServer::start(MemTarget::new(MIB, 512));
    let mut client = connect(&server, true);
    client.call(Command::Write, 0, 0, 4096, &[1; 4096]);
    client.call(Command::Read, 0, 0, 4096, &[]);
    let status = nvraid_serve::query_status(&server.control).unwrap();
    assert_eq!(status["export"]["size_bytes"], MIB);
    assert_eq!(status["export"]["block_sizes"]["minimum_bytes"], 512);
    assert_eq!(status["totals"]["reads"], 1);
    assert_eq!(status["totals"]["writes"], 1);
    assert_eq!(status["totals"]["written_bytes"], 4096);
    let connections = status["connections"].as_array().unwrap();
    assert_eq!(connections.len(), 1);
    assert!(connections[0]["client"]
        .as_str()
        .unwrap()
        .starts_with("unix:"));
    assert!(status["rates"]["iops"].is_number());
    let text = nvraid_serve::format_status(&status);
    assert!(text.contains("connections: 1"), "{text}");
    // Garbage on the control socket gets an error, the server stays up.
    let mut raw = UnixStream::connect(&server.control).unwrap();
    raw.write_all(b"not json\n").unwrap();
    let mut answer = String::new();
    raw.read_to_string(&mut answer).unwrap();
    assert!(answer.contains("error"), "{answer}");
    assert!(nvraid_serve::query_status(&server.control).is_ok());
}

/// A client that negotiates no block sizes (NBD_OPT_EXPORT_NAME, as
/// nbd-tester-client does) over a raw socket: the export's size.
fn connect_export_name(server: &TestServer) -> (UnixStream, u64) {
    let mut stream = UnixStream::connect(&server.socket).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(20)))
        .unwrap();
    let mut greeting = [0u8; 18];
    stream.read_exact(&mut greeting).unwrap();
    // FIXED_NEWSTYLE | NO_ZEROES, then EXPORT_NAME "" (option 1, no data).
    stream.write_all(&3u32.to_be_bytes()).unwrap();
    stream.write_all(b"IHAVEOPT").unwrap();
    stream.write_all(&1u32.to_be_bytes()).unwrap();
    stream.write_all(&0u32.to_be_bytes()).unwrap();
    let mut info = [0u8; 10];
    stream.read_exact(&mut info).unwrap();
    (stream, u64::from_be_bytes(info[..8].try_into().unwrap()))
}

fn raw_call(
    stream: &mut UnixStream,
    command: Command,
    offset: u64,
    length: u32,
    payload: &[u8],
) -> (u32, Vec<u8>) {
    let header = RequestHeader {
        flags: 0,
        command,
        cookie: 77,
        offset,
        length,
    };
    stream.write_all(&header.encode()).unwrap();
    stream.write_all(payload).unwrap();
    let mut head = [0u8; 16];
    stream.read_exact(&mut head).unwrap();
    let error = u32::from_be_bytes(head[4..8].try_into().unwrap());
    assert_eq!(u64::from_be_bytes(head[8..16].try_into().unwrap()), 77);
    let mut data = Vec::new();
    if command == Command::Read && error == 0 {
        data = vec![0u8; length as usize];
        stream.read_exact(&mut data).unwrap();
    }
    (error, data)
}

/// proto.md: a server SHOULD serve requests of any alignment from a client
/// that negotiated no block sizes. Writes and reads at odd offsets and
/// lengths, inside one block, across two and across many, over 512-byte
/// and 4 KiB blocks, all land exactly (checked against a model); a zero
/// write and a trim too. A client that did negotiate is still held to the
/// minimum block size (`out_of_range_oversized_and_unaligned_requests_get_errors`).
#[test]
fn unaligned_requests_from_a_client_without_block_sizes_are_served() {
    for block in [512u32, 4096] {
        let server = TestServer::start(MemTarget::new(4 * MIB, block));
        let (mut stream, size) = connect_export_name(&server);
        assert_eq!(size, 4 * MIB);
        let mut model = random_bytes(64 * 1024, u64::from(block));
        let (error, _) = raw_call(&mut stream, Command::Write, 0, model.len() as u32, &model);
        assert_eq!(error, 0);
        let cases: [(u64, u32); 7] = [
            (1, 1),
            (700, 1000),
            (4000, 200),
            (4095, 2),
            (3 * 4096 + 17, 3 * 4096 + 100),
            (511, 513),
            (10_000, 20_000),
        ];
        for (i, &(offset, length)) in cases.iter().enumerate() {
            let data = random_bytes(length as usize, 1000 + i as u64);
            let (error, _) = raw_call(&mut stream, Command::Write, offset, length, &data);
            assert_eq!(error, 0, "write {offset}+{length} over {block}-byte blocks");
            model[offset as usize..(offset + u64::from(length)) as usize].copy_from_slice(&data);
            let (error, back) = raw_call(
                &mut stream,
                Command::Read,
                offset - offset.min(3),
                length + 5,
                &[],
            );
            assert_eq!(error, 0);
            let from = (offset - offset.min(3)) as usize;
            assert!(
                back == model[from..from + length as usize + 5],
                "read around {offset}+{length}"
            );
        }
        let (error, _) = raw_call(&mut stream, Command::WriteZeroes, 33, 5000, &[]);
        assert_eq!(error, 0);
        model[33..5033].fill(0);
        let (error, _) = raw_call(
            &mut stream,
            Command::Trim,
            1,
            2 * u64::from(block) as u32,
            &[],
        );
        assert_eq!(error, 0, "an unaligned trim is accepted");
        let (error, back) = raw_call(&mut stream, Command::Read, 0, 64 * 1024, &[]);
        assert_eq!(error, 0);
        // The trim may have zeroed the whole block inside its range; every
        // other byte is the model's.
        let trimmed = (u64::from(block) as usize)..(2 * block as usize);
        for (at, (&got, &want)) in back.iter().zip(model.iter()).enumerate() {
            if !trimmed.contains(&at) {
                assert_eq!(got, want, "byte {at} over {block}-byte blocks");
            }
        }
    }
}

/// A connection is served by one worker, which also serves others: a
/// client that sends reads and never reads the replies must not hold up
/// another client of that worker, and gets all its data once it reads.
#[test]
fn a_client_that_reads_no_replies_holds_up_no_other_client() {
    let server = TestServer::start_with(MemTarget::new(64 * MIB, 512), |o| o.workers = 1);
    let pattern = random_bytes(8 * MIB as usize, 7);
    let mut writer = connect(&server, true);
    let reply = writer.call(Command::Write, 0, 0, pattern.len() as u32, &pattern);
    assert_eq!(reply.error, 0);
    let mut stuck = connect(&server, true);
    // 48 MiB of replies: far more than the socket holds, and more reads
    // than the worker has slots.
    for i in 0..48u64 {
        stuck.send(Command::Read, 0, i, (i % 8) * MIB, MIB as u32, &[]);
    }
    std::thread::sleep(Duration::from_millis(300));
    let mut other = connect(&server, true);
    for i in 0..64u64 {
        let block = random_bytes(4096, 100 + i);
        let offset = 16 * MIB + i * 4096;
        assert_eq!(other.call(Command::Write, 0, offset, 4096, &block).error, 0);
        assert_eq!(other.call(Command::Read, 0, offset, 4096, &[]).data, block);
    }
    let mut cookies = Vec::new();
    for _ in 0..48 {
        let reply = stuck.reply();
        assert_eq!(reply.error, 0);
        let at = ((reply.cookie % 8) * MIB) as usize;
        assert!(
            reply.data == pattern[at..at + MIB as usize],
            "read {} returned other data",
            reply.cookie
        );
        cookies.push(reply.cookie);
    }
    cookies.sort();
    assert_eq!(cookies, (0..48).collect::<Vec<_>>());
}

/// Requests arrive in pieces cut anywhere (inside a header, inside a
/// payload, several requests in one piece): every write lands whole.
#[test]
fn requests_cut_at_any_byte_are_put_together() {
    let server = TestServer::start_with(MemTarget::new(48 * MIB, 512), |o| o.workers = 1);
    let mut client = connect(&server, false);
    let mut wire = Vec::new();
    let mut expected = Vec::new();
    for i in 0..24u64 {
        // Small writes, and writes longer than a worker's slot (1 MiB).
        let length = if i % 6 == 5 {
            1536 * 1024
        } else {
            512 * (1 + i as usize % 9)
        };
        let offset = i * 2 * MIB;
        let payload = random_bytes(length, 500 + i);
        let header = RequestHeader {
            flags: 0,
            command: Command::Write,
            cookie: i,
            offset,
            length: length as u32,
        };
        wire.extend_from_slice(&header.encode());
        wire.extend_from_slice(&payload);
        expected.push((offset, payload));
    }
    let mut at = 0;
    let mut step = 1;
    while at < wire.len() {
        let end = (at + step).min(wire.len());
        client.stream.write_all(&wire[at..end]).unwrap();
        at = end;
        // Pieces of 1, 2, 3, ... 28, 29 bytes, then much larger ones.
        step = if step < 29 {
            step + 1
        } else {
            7919 + at % 65536
        };
        if at < 4096 {
            std::thread::sleep(Duration::from_millis(1));
        }
    }
    let mut cookies: Vec<u64> = (0..24)
        .map(|_| {
            let reply = client.reply();
            assert_eq!(reply.error, 0, "write {} failed", reply.cookie);
            reply.cookie
        })
        .collect();
    cookies.sort();
    assert_eq!(cookies, (0..24).collect::<Vec<_>>());
    for (i, (offset, payload)) in expected.iter().enumerate() {
        client.send(
            Command::Read,
            0,
            i as u64,
            *offset,
            payload.len() as u32,
            &[],
        );
        let reply = client.reply();
        assert_eq!(reply.error, 0);
        let data = client.read_simple_data(payload.len());
        assert!(data == *payload, "write {i} did not land whole");
    }
}

/// A client that sends many requests and closes without reading their
/// replies: the worker that owns it drops the replies, lets the
/// connection go, and serves the next client.
#[test]
fn a_client_that_leaves_with_requests_in_flight_is_let_go() {
    let server = TestServer::start_with(MemTarget::new(64 * MIB, 512), |o| o.workers = 1);
    for round in 0..3u64 {
        let mut client = connect(&server, round % 2 == 0);
        for i in 0..40u64 {
            client.send(Command::Read, 0, i, (i % 32) * MIB, MIB as u32, &[]);
            let payload = vec![round as u8; 4096];
            client.send(
                Command::Write,
                0,
                100 + i,
                40 * MIB + i * 4096,
                4096,
                &payload,
            );
        }
        drop(client);
    }
    still_serving(&server);
    // Every connection ends, and the status shows none left.
    for _ in 0..200 {
        let ended = server
            .log_lines()
            .iter()
            .filter(|l| l.contains("event=disconnected"))
            .count();
        if ended >= 4 {
            break;
        }
        std::thread::sleep(Duration::from_millis(25));
    }
    let ended: Vec<String> = server
        .log_lines()
        .into_iter()
        .filter(|l| l.contains("event=disconnected"))
        .collect();
    assert_eq!(ended.len(), 4, "{ended:#?}");
}

/// A server whose socket file was removed (someone cleaned its directory)
/// still stops when told to: its accept thread is woken without a
/// connection to that path.
#[test]
fn a_server_whose_socket_file_is_gone_still_stops() {
    let server = TestServer::start(MemTarget::new(MIB, 512));
    still_serving(&server);
    std::fs::remove_file(&server.socket).unwrap();
    let (done, stopped) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        server.stop();
        let _ = done.send(());
    });
    assert!(
        stopped.recv_timeout(Duration::from_secs(20)).is_ok(),
        "the server did not stop"
    );
}

/// A server whose socket files were removed under it (its directory
/// deleted, say) still stops when asked: its listeners are woken by
/// shutdown(2), not by connecting to their paths. (The control socket's
/// thread used to wait for a connection that could no longer come.)
#[test]
fn a_server_whose_socket_files_are_gone_still_stops() {
    let server = TestServer::start(MemTarget::new(MIB, 512));
    std::fs::remove_file(&server.socket).unwrap();
    std::fs::remove_file(&server.control).unwrap();
    let (done, stopped) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        drop(server.stop());
        let _ = done.send(());
    });
    assert!(
        stopped.recv_timeout(Duration::from_secs(30)).is_ok(),
        "the server did not stop within 30 s of its shutdown"
    );
}

/// Connect until a client is served (a READ answered), for at most
/// `limit`: while every slot is held, a new client is closed at accept.
/// How long it took, or None.
fn served_within(server: &TestServer, limit: Duration) -> Option<Duration> {
    let started = std::time::Instant::now();
    while started.elapsed() < limit {
        let mut probe = UnixStream::connect(&server.socket).unwrap();
        probe
            .set_read_timeout(Some(Duration::from_secs(5)))
            .unwrap();
        let mut byte = [0u8; 1];
        if matches!(probe.read(&mut byte), Ok(1)) {
            // A slot was given: go on as a real client.
            let mut client = handshake(probe, true, Some(byte[0]));
            assert_eq!(client.call(Command::Read, 0, 0, 4096, &[]).error, 0);
            return Some(started.elapsed());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    None
}

/// Four clients fill every slot (`--max-connections 4`), each with a
/// request the server cannot finish without them: `start` sends it, and
/// `trickle` drags it out (a byte every 200 ms, slow-loris). Within the
/// transfer deadline (2 s) plus a margin, the hostages are let go and a new
/// client is served; the log says why they went, and each hostage finds
/// its connection ended.
fn slow_loris_lose_their_slots_at_the_transfer_deadline(
    size: u64,
    start: fn(&mut Client, u64),
    trickle: fn(&mut Client),
    reason: &str,
) {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;
    let server = TestServer::start_with(MemTarget::new(size, 512), |o| {
        o.connections_max = 4;
        o.idle_timeout = Some(Duration::from_secs(2));
        o.transfer_timeout = Duration::from_secs(2);
    });
    let stop = Arc::new(AtomicBool::new(false));
    let started = std::time::Instant::now();
    let hostages: Vec<_> = (0..4)
        .map(|i| {
            let mut client = connect(&server, true);
            start(&mut client, i);
            let stop = Arc::clone(&stop);
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    std::thread::sleep(Duration::from_millis(200));
                    trickle(&mut client);
                }
                client
            })
        })
        .collect();
    std::thread::sleep(Duration::from_millis(300));
    assert_closed_at_accept(&server, "every slot is held by a hostage");
    let waited = served_within(&server, Duration::from_secs(12));
    let elapsed = started.elapsed();
    stop.store(true, Ordering::Relaxed);
    assert!(
        waited.is_some() && elapsed < Duration::from_secs(5),
        "a new client was served after {waited:?} ({elapsed:?} after the hostages came; \
         deadline 2 s)"
    );
    server.wait_log(&["event=transfer-timeout", reason, "within 2s"]);
    for hostage in hostages {
        let mut client = hostage.join().unwrap();
        client
            .stream
            .set_read_timeout(Some(Duration::from_secs(5)))
            .unwrap();
        // What the socket still holds, then its end (a timeout: still open).
        let mut rest = Vec::new();
        let ended = client.stream.read_to_end(&mut rest);
        assert!(
            ended.is_ok(),
            "the hostage's connection was ended: {ended:?}"
        );
    }
}

/// Slow-loris on request payloads: a 1 MiB WRITE's header and 10 bytes of
/// its payload, then a byte every 200 ms. Such a request holds a permit (so
/// the idle timeout never picks the connection) and a slot.
#[test]
fn slow_loris_payloads_lose_their_slots_at_the_transfer_deadline() {
    slow_loris_lose_their_slots_at_the_transfer_deadline(
        4 * MIB,
        |client, cookie| client.send(Command::Write, 0, cookie, 0, MIB as u32, &[7u8; 10]),
        |client| drop(client.stream.write_all(&[7])),
        "request payload not received",
    );
}

/// Slow-loris on replies: a 32 MiB READ whose reply is taken a byte every
/// 200 ms. Its data and permit stay with the server until it is read.
#[test]
fn slow_loris_readers_lose_their_slots_at_the_transfer_deadline() {
    slow_loris_lose_their_slots_at_the_transfer_deadline(
        32 * MIB,
        |client, cookie| client.send(Command::Read, 0, cookie, 0, 32 * MIB as u32, &[]),
        |client| drop(client.stream.read(&mut [0u8; 1])),
        "reply not taken by the client",
    );
}
