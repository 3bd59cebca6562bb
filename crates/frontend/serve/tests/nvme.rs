//! `serve --nvme-tcp`: the target driven by nvraid's own NVMe/TCP
//! initiator (nvraid-remote's `nvme+tcp://` member: in-capsule and R2T
//! writes, C2HData reads, Write Zeroes, Flush, digests, many commands at
//! once), by hand-made PDUs for what the initiator never does (discovery,
//! Dataset Management) and for the hostile host: a command before Connect,
//! a Connect for an unknown subsystem or from a host not allowed, more I/O
//! queues than granted, more commands than the queue's entries, more
//! connections than allowed, a giant in-capsule length, H2CData for a
//! command never sent, a PDU out of order, a bad data digest, a setup that
//! trickles (slow-loris), a host that stops sending Keep Alive. Each gets
//! its refusal or termination, and the server goes on serving. A served
//! target that grows is announced by an asynchronous event.

mod common;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::TestServer;
use nvraid_io::queue::Target;
use nvraid_nvme_tcp::command::{ConnectData, Cqe, DsmRange, Sqe, CONNECT_DATA_BYTES};
use nvraid_nvme_tcp::pdu::{
    data_digest_trailer, encode_capsule_cmd, encode_h2c_data, pdu_type, DataHeader, Digests,
    Header, IcReq, IcResp, IC_BYTES,
};
use nvraid_nvme_tcp::reader::{Event, Expect, PduReader, Role, Want};
use nvraid_remote::nvme::NvmeExport;
use nvraid_remote::RemoteOptions;
use nvraid_serve::{NvmeOptions, ServeOptions, DISCOVERY_NQN};
use nvraid_testing::MemTarget;

const MIB: u64 = 1 << 20;
const NQN: &str = "nqn.2014-08.org.nvraid:test";
const HOST: &str = "nqn.2014-08.org.nvraid:host-a";

fn nvme(o: &mut ServeOptions) {
    o.listen.clear();
    o.nvme = Some(NvmeOptions {
        listen: "127.0.0.1:0".into(),
        nqn: NQN.into(),
        ..NvmeOptions::default()
    });
}

fn start(size: u64, adjust: impl FnOnce(&mut ServeOptions)) -> TestServer {
    TestServer::start_with(MemTarget::new(size, 4096), |o| {
        nvme(o);
        adjust(o);
    })
}

fn addr(server: &TestServer) -> SocketAddr {
    server.info.nvme_listening.expect("the NVMe/TCP listener")
}

fn uri(server: &TestServer, query: &str) -> String {
    format!("nvme+tcp://{}/{NQN}{query}", addr(server))
}

fn remote() -> RemoteOptions {
    RemoteOptions {
        request_timeout: Duration::from_secs(10),
        connect_timeout: Duration::from_secs(5),
    }
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(29).wrapping_add(seed) ^ (i >> 12) as u8)
        .collect()
}

/// nvraid's initiator writes (in the capsule and by R2T), flushes, reads
/// back and zeroes; the target's bytes are the host's.
fn roundtrip(query: &str) {
    let server = start(64 * MIB, |_| {});
    let export = NvmeExport::open(&uri(&server, query), remote()).unwrap();
    assert_eq!(export.info().size_bytes, 64 * MIB);
    assert_eq!(export.info().block_bytes, 4096);
    let small = pattern(4096, 1);
    let big = pattern(1 << 20, 2);
    export.write_at(&small, 8192).unwrap();
    export.write_at(&big, 3 * MIB).unwrap();
    export.flush().unwrap();
    let durable = server.target.durable_contents();
    assert!(durable[8192..8192 + 4096] == small[..], "in-capsule write");
    assert!(
        durable[3 << 20..(3 << 20) + big.len()] == big[..],
        "R2T write not on the target after Flush"
    );
    let mut back = vec![0u8; big.len()];
    export.read_at(&mut back, 3 * MIB).unwrap();
    assert!(back == big, "the 1 MiB read back differently");
    let mut back = vec![0u8; 4096];
    export.read_at(&mut back, 8192).unwrap();
    assert_eq!(back, small);
    export.zero(3 * MIB, 64 << 10).unwrap();
    let mut back = vec![1u8; 64 << 10];
    export.read_at(&mut back, 3 * MIB).unwrap();
    assert!(back.iter().all(|b| *b == 0), "Write Zeroes left data");
    assert!(server.target.contents()[3 << 20..(3 << 20) + (64 << 10)]
        .iter()
        .all(|b| *b == 0));
    // A read past the end is refused, not served.
    let mut past = vec![0u8; 8192];
    assert!(export.read_at(&mut past, 64 * MIB - 4096).is_err());
    export.close();
}

#[test]
fn nvraids_initiator_writes_and_reads_back_through_the_nvme_tcp_export() {
    roundtrip("");
}

#[test]
fn nvraids_initiator_with_header_and_data_digests() {
    roundtrip("?digest=header,data");
}

/// Many commands at once on one queue, from several threads, answered out
/// of order by the workers: every block holds what its writer wrote.
#[test]
fn many_commands_in_flight_land_where_they_were_sent() {
    let server = start(32 * MIB, |o| o.workers = 3);
    let export = Arc::new(NvmeExport::open(&uri(&server, ""), remote()).unwrap());
    let threads: Vec<_> = (0..4u8)
        .map(|t| {
            let export = Arc::clone(&export);
            std::thread::spawn(move || {
                for i in 0..64u64 {
                    let at = (u64::from(t) * 64 + i) * 16384;
                    let data = pattern(16384, t.wrapping_mul(7).wrapping_add(i as u8));
                    export.write_at(&data, at).unwrap();
                    let mut back = vec![0u8; data.len()];
                    export.read_at(&mut back, at).unwrap();
                    assert!(back == data, "thread {t} block {i}");
                }
            })
        })
        .collect();
    threads.into_iter().for_each(|t| t.join().unwrap());
    let contents = server.target.contents();
    for t in 0..4u8 {
        for i in 0..64u64 {
            let at = ((u64::from(t) * 64 + i) * 16384) as usize;
            let data = pattern(16384, t.wrapping_mul(7).wrapping_add(i as u8));
            assert!(contents[at..at + 16384] == data[..], "thread {t} block {i}");
        }
    }
}

// ---- a hand-made host -------------------------------------------------

/// A host speaking PDUs by hand, one command at a time.
struct Host {
    stream: TcpStream,
    reader: PduReader,
    digests: Digests,
    cid: u16,
}

impl Host {
    fn connect_tcp(server: &TestServer) -> Host {
        Host::connect_addr(addr(server))
    }

    fn connect_addr(address: SocketAddr) -> Host {
        let stream = TcpStream::connect(address).unwrap();
        stream
            .set_read_timeout(Some(Duration::from_secs(10)))
            .unwrap();
        Host {
            stream,
            reader: PduReader::new(Role::Host, Digests::default(), 16 << 20, 0),
            digests: Digests::default(),
            cid: 0,
        }
    }

    fn ic(server: &TestServer) -> Host {
        Host::ic_with(server, Digests::default())
    }

    /// ICReq asking for `digests`; the target grants them.
    fn ic_with(server: &TestServer, digests: Digests) -> Host {
        Host::ic_at(addr(server), digests)
    }

    fn ic_at(address: SocketAddr, digests: Digests) -> Host {
        let mut host = Host::connect_addr(address);
        let req = IcReq {
            pfv: 0,
            hpda: 0,
            digests,
            maxr2t: 0,
        };
        host.stream.write_all(&req.encode()).unwrap();
        let mut b = [0u8; IC_BYTES];
        host.stream.read_exact(&mut b).unwrap();
        let resp = IcResp::parse(&b).unwrap();
        assert_eq!(resp.maxh2cdata, 128 << 10);
        assert_eq!(resp.digests, digests);
        host.digests = digests;
        host.reader = PduReader::new(Role::Host, digests, 16 << 20, 0);
        host
    }

    fn next_cid(&mut self) -> u16 {
        self.cid += 1;
        self.cid
    }

    /// Send a capsule with `data` in it.
    fn send(&mut self, mut sqe: Sqe, data: &[u8]) {
        if !data.is_empty() {
            sqe.set_sgl(data.len() as u32, true);
        }
        let mut b = Vec::new();
        encode_capsule_cmd(&mut b, &sqe, data.len(), self.digests, 0);
        b.extend_from_slice(data);
        if self.digests.data && !data.is_empty() {
            b.extend_from_slice(&data_digest_trailer(&[data]));
        }
        self.stream.write_all(&b).unwrap();
    }

    /// The next PDU: a response, data into `into`, an R2T, or a TermReq;
    /// `None` when the connection ended.
    fn next(&mut self, cid: u16, into: &mut [u8]) -> Option<Event> {
        self.next_with(cid, into, 0)
    }

    /// As `next`, for a command of `write_limit` bytes to the target.
    fn next_with(&mut self, cid: u16, into: &mut [u8], write_limit: u32) -> Option<Event> {
        let (limit, to_host) = if into.is_empty() {
            (write_limit, false)
        } else {
            (into.len() as u32, true)
        };
        let mut next = 0u32;
        loop {
            let lookup = |c: u16| {
                (c == cid && limit > 0).then_some(Expect {
                    limit,
                    next,
                    to_host,
                    ttag: 0,
                })
            };
            let event = match self.reader.want() {
                Want::Bytes(n) => {
                    let mut b = vec![0u8; n];
                    match self.stream.read(&mut b) {
                        Ok(0) | Err(_) => return None,
                        Ok(k) => {
                            self.reader.buffer()[..k].copy_from_slice(&b[..k]);
                            self.reader.filled(k, &lookup).unwrap()
                        }
                    }
                }
                Want::Data { offset, len, .. } => {
                    let piece = &mut into[offset as usize..(offset + len) as usize];
                    self.stream.read_exact(piece).ok()?;
                    self.reader.data_moved(piece).unwrap()
                }
            };
            match event {
                Some(Event::DataDone { len, .. }) => next += len,
                Some(Event::Header(Header::C2HData { .. })) | None => {}
                Some(e) => return Some(e),
            }
        }
    }

    /// Run a command and return its completion (`into`: data to the host).
    fn command(&mut self, sqe: Sqe, data: &[u8], into: &mut [u8]) -> Cqe {
        let cid = sqe.cid();
        self.send(sqe, data);
        match self.next(cid, into) {
            Some(Event::Header(Header::CapsuleResp { cqe })) => cqe,
            other => panic!("expected a response, got {other:?}"),
        }
    }

    fn connect(&mut self, subnqn: &str, hostnqn: &str, qid: u16, cntlid: u16, kato: u32) -> Cqe {
        let data = ConnectData {
            host_id: [7; 16],
            cntlid,
            subnqn: subnqn.into(),
            hostnqn: hostnqn.into(),
        }
        .encode()
        .unwrap();
        let cid = self.next_cid();
        let sqe = Sqe::connect(cid, qid, 31, kato, true);
        self.command(sqe, &data, &mut Vec::new())
    }

    /// Connect the admin queue and enable the controller; its id.
    fn admin(server: &TestServer, hostnqn: &str, kato: u32) -> (Host, u16) {
        Host::admin_at(addr(server), hostnqn, kato)
    }

    fn admin_at(address: SocketAddr, hostnqn: &str, kato: u32) -> (Host, u16) {
        let mut host = Host::ic_at(address, Digests::default());
        let cqe = host.connect(NQN, hostnqn, 0, 0xffff, kato);
        assert!(cqe.status.is_success(), "Connect: {}", cqe.status);
        let cntlid = cqe.result as u16;
        let cid = host.next_cid();
        let cc = 1 | 6 << 16 | 4 << 20;
        let cqe = host.command(Sqe::property_set(cid, 0x14, cc), &[], &mut Vec::new());
        assert!(cqe.status.is_success());
        (host, cntlid)
    }

    /// The connection is ended by the target (after a TermReq or not).
    fn ended(&mut self) -> bool {
        let mut b = [0u8; 4096];
        loop {
            match self.stream.read(&mut b) {
                Ok(0) => return true,
                Ok(_) => continue,
                Err(e)
                    if matches!(
                        e.kind(),
                        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                    ) =>
                {
                    return false
                }
                Err(_) => return true,
            }
        }
    }

    /// The first bytes the target sends are a C2HTermReq.
    fn term_req(&mut self) -> bool {
        let mut b = [0u8; 8];
        self.stream.read_exact(&mut b).is_ok() && b[0] == pdu_type::C2H_TERM_REQ
    }
}

/// After a hostile host, a good one is still served.
fn still_serves(server: &TestServer) {
    let export = NvmeExport::open(&uri(server, ""), remote()).unwrap();
    let data = pattern(8192, 9);
    export.write_at(&data, 0).unwrap();
    let mut back = vec![0u8; 8192];
    export.read_at(&mut back, 0).unwrap();
    assert_eq!(back, data);
    export.close();
}

#[test]
fn the_discovery_controller_lists_the_subsystem() {
    let server = start(8 * MIB, |_| {});
    let mut host = Host::ic(&server);
    let cqe = host.connect(DISCOVERY_NQN, HOST, 0, 0xffff, 0);
    assert!(cqe.status.is_success(), "{}", cqe.status);
    // Get Log Page 0x70, 4 KiB (NUMDL = 1023).
    let cid = host.next_cid();
    let mut sqe = Sqe::identify(cid, 0, 0);
    sqe.0[0] = 0x02;
    sqe.0[40..44].copy_from_slice(&(0x70u32 | 1023 << 16).to_le_bytes());
    let mut log = vec![0u8; 4096];
    let cqe = host.command(sqe, &[], &mut log);
    assert!(cqe.status.is_success(), "{}", cqe.status);
    assert_eq!(
        u64::from_le_bytes(log[8..16].try_into().unwrap()),
        1,
        "NUMREC"
    );
    let e = &log[1024..2048];
    assert_eq!(e[0], 3, "TCP");
    let text = |b: &[u8]| {
        String::from_utf8_lossy(b)
            .trim_end_matches('\0')
            .to_string()
    };
    assert_eq!(text(&e[512..768]), NQN);
    assert_eq!(text(&e[32..64]), addr(&server).port().to_string());
    assert_eq!(text(&e[256..512]), "127.0.0.1");
    // Identify Controller says it is a discovery controller.
    let cid = host.next_cid();
    let mut id = vec![0u8; 4096];
    let cqe = host.command(Sqe::identify(cid, 1, 0), &[], &mut id);
    assert!(cqe.status.is_success());
    assert_eq!(id[111], 2);
    assert_eq!(text(&id[768..1024]), DISCOVERY_NQN);
    // A discovery controller has no I/O queues.
    let mut io = Host::ic(&server);
    let cqe = io.connect(DISCOVERY_NQN, HOST, 1, cqe_cntlid(&id), 0);
    assert_eq!((cqe.status.code_type(), cqe.status.code()), (1, 0x82));
}

fn cqe_cntlid(identify: &[u8]) -> u16 {
    u16::from_le_bytes([identify[78], identify[79]])
}

#[test]
fn dataset_management_deallocates_through_discard() {
    let server = start(16 * MIB, |_| {});
    server.target.fill(&vec![0xabu8; (16 * MIB) as usize]);
    let (mut admin, cntlid) = Host::admin(&server, HOST, 0);
    let _ = &mut admin;
    let mut io = Host::ic(&server);
    let cqe = io.connect(NQN, HOST, 1, cntlid, 0);
    assert!(cqe.status.is_success(), "{}", cqe.status);
    let ranges: Vec<u8> = [
        DsmRange {
            slba: 16,
            blocks: 16,
        },
        DsmRange {
            slba: 1024,
            blocks: 8,
        },
    ]
    .iter()
    .flat_map(|r| r.encode())
    .collect();
    let cid = io.next_cid();
    let cqe = io.command(
        Sqe::dsm_deallocate(cid, 1, 2, true),
        &ranges,
        &mut Vec::new(),
    );
    assert!(cqe.status.is_success(), "{}", cqe.status);
    assert!(
        server
            .target
            .counters()
            .discards
            .load(std::sync::atomic::Ordering::SeqCst)
            >= 2
    );
    // A range past the end: refused, nothing discarded.
    let before = server
        .target
        .counters()
        .discards
        .load(std::sync::atomic::Ordering::SeqCst);
    let bad: Vec<u8> = DsmRange {
        slba: 4095,
        blocks: 2,
    }
    .encode()
    .to_vec();
    let cid = io.next_cid();
    let cqe = io.command(Sqe::dsm_deallocate(cid, 1, 1, true), &bad, &mut Vec::new());
    assert_eq!((cqe.status.code_type(), cqe.status.code()), (0, 0x80));
    assert_eq!(
        server
            .target
            .counters()
            .discards
            .load(std::sync::atomic::Ordering::SeqCst),
        before
    );
}

/// Linux sends Dataset Management with 4 KiB of data (room for 256
/// ranges) whatever its range count: the ranges NR names are discarded,
/// the rest of the data ignored; data beyond 4 KiB is refused.
#[test]
fn a_dsm_with_more_data_than_its_ranges_discards_its_ranges_only() {
    let server = start(16 * MIB, |_| {});
    let (_admin, cntlid) = Host::admin(&server, HOST, 0);
    let mut io = Host::ic(&server);
    assert!(io.connect(NQN, HOST, 1, cntlid, 0).status.is_success());
    let discards = || {
        server
            .target
            .counters()
            .discards
            .load(std::sync::atomic::Ordering::SeqCst)
    };
    let mut data = vec![0u8; 4096];
    data[..16].copy_from_slice(&DsmRange { slba: 8, blocks: 8 }.encode());
    // A second range in the data that NR (one range) does not count.
    data[16..32].copy_from_slice(
        &DsmRange {
            slba: 64,
            blocks: 8,
        }
        .encode(),
    );
    let cid = io.next_cid();
    let cqe = io.command(Sqe::dsm_deallocate(cid, 1, 1, true), &data, &mut Vec::new());
    assert!(cqe.status.is_success(), "{}", cqe.status);
    assert_eq!(discards(), 1, "only the range NR names");
    let cid = io.next_cid();
    let cqe = io.command(
        Sqe::dsm_deallocate(cid, 1, 1, true),
        &vec![0u8; 4112],
        &mut Vec::new(),
    );
    assert_eq!((cqe.status.code_type(), cqe.status.code()), (0, 0x0f));
    assert_eq!(discards(), 1);
}

#[test]
fn a_command_before_connect_ends_the_connection_with_a_term_req() {
    let server = start(8 * MIB, |_| {});
    let mut host = Host::ic(&server);
    let cid = host.next_cid();
    host.send(Sqe::identify(cid, 1, 0), &[]);
    assert!(host.term_req(), "no C2HTermReq");
    assert!(host.ended());
    server.wait_log(&["event=nvme-disconnected", "before Fabrics Connect"]);
    still_serves(&server);
}

#[test]
fn a_connect_for_an_unknown_subsystem_is_refused() {
    let server = start(8 * MIB, |_| {});
    let mut host = Host::ic(&server);
    let cqe = host.connect("nqn.2014-08.org.example:other", HOST, 0, 0xffff, 0);
    assert_eq!((cqe.status.code_type(), cqe.status.code()), (1, 0x82));
    assert_eq!(cqe.result, 1 << 16 | 256, "the refused field: SUBNQN");
    assert!(host.ended());
    server.wait_log(&["Connect refused", "no subsystem"]);
    still_serves(&server);
}

#[test]
fn a_host_not_on_the_allow_list_is_refused() {
    let server = start(8 * MIB, |o| {
        o.nvme.as_mut().unwrap().hosts = vec![HOST.into()];
    });
    let mut host = Host::ic(&server);
    let cqe = host.connect(NQN, "nqn.2014-08.org.example:stranger", 0, 0xffff, 0);
    assert_eq!((cqe.status.code_type(), cqe.status.code()), (1, 0x84));
    assert!(host.ended());
    let (_admin, _) = Host::admin(&server, HOST, 0);
}

#[test]
fn more_io_queues_than_granted_are_refused() {
    let server = start(8 * MIB, |_| {});
    let (mut admin, cntlid) = Host::admin(&server, HOST, 0);
    // Ask for 2 I/O queues.
    let cid = admin.next_cid();
    let cqe = admin.command(Sqe::set_queue_count(cid, 2), &[], &mut Vec::new());
    assert!(cqe.status.is_success());
    assert_eq!(cqe.result & 0xffff, 1, "two queues granted");
    for qid in 1..=2 {
        let mut io = Host::ic(&server);
        let cqe = io.connect(NQN, HOST, qid, cntlid, 0);
        assert!(cqe.status.is_success(), "queue {qid}: {}", cqe.status);
        std::mem::forget(io);
    }
    let mut third = Host::ic(&server);
    let cqe = third.connect(NQN, HOST, 3, cntlid, 0);
    assert_eq!((cqe.status.code_type(), cqe.status.code()), (1, 0x82));
    assert_eq!(cqe.result, 42, "the refused field: QID");
    // The same queue twice, or another host's controller: refused too.
    let mut again = Host::ic(&server);
    let cqe = again.connect(NQN, HOST, 1, cntlid, 0);
    assert_eq!((cqe.status.code_type(), cqe.status.code()), (1, 0x82));
    let mut stranger = Host::ic(&server);
    let cqe = stranger.connect(NQN, "nqn.2014-08.org.example:b", 2, cntlid, 0);
    assert_eq!((cqe.status.code_type(), cqe.status.code()), (1, 0x82));
    // The status shows the host and its queues.
    let status = nvraid_serve::query_status(&server.control).unwrap();
    let controllers = status["nvme"]["controllers"].as_array().unwrap();
    let c = controllers
        .iter()
        .find(|c| c["cntlid"] == cntlid)
        .expect("the controller in the status");
    assert_eq!(c["hostnqn"], HOST);
    assert_eq!(c["io_queues"], serde_json::json!([1, 2]));
    let text = nvraid_serve::format_status(&status);
    assert!(text.contains(HOST), "{text}");
}

#[test]
fn a_giant_in_capsule_length_ends_the_connection() {
    let server = start(8 * MIB, |_| {});
    let (_admin, cntlid) = Host::admin(&server, HOST, 0);
    let mut io = Host::ic(&server);
    assert!(io.connect(NQN, HOST, 1, cntlid, 0).status.is_success());
    // A write capsule claiming 1 GiB of in-capsule data.
    let cid = io.next_cid();
    let mut sqe = Sqe::write(cid, 1, 0, 1, 4096, true, false);
    sqe.set_sgl(1 << 30, true);
    let mut b = Vec::new();
    encode_capsule_cmd(&mut b, &sqe, 1 << 30, Digests::default(), 0);
    io.stream.write_all(&b).unwrap();
    assert!(io.term_req(), "no C2HTermReq");
    assert!(io.ended());
    server.wait_log(&["event=nvme-disconnected", "protocol error"]);
    assert!(server.target.contents()[..4096].iter().all(|b| *b == 0));
    still_serves(&server);
}

#[test]
fn h2c_data_for_a_command_never_sent_ends_the_connection() {
    let server = start(8 * MIB, |_| {});
    let (_admin, cntlid) = Host::admin(&server, HOST, 0);
    let mut io = Host::ic(&server);
    assert!(io.connect(NQN, HOST, 1, cntlid, 0).status.is_success());
    let mut b = Vec::new();
    let header = DataHeader {
        cid: 77,
        ttag: 77,
        offset: 0,
        length: 4096,
    };
    encode_h2c_data(&mut b, &header, true, Digests::default(), 0);
    b.extend_from_slice(&[0x55; 4096]);
    io.stream.write_all(&b).unwrap();
    assert!(io.term_req(), "no C2HTermReq");
    assert!(io.ended());
    assert!(server.target.contents()[..8192].iter().all(|b| *b == 0));
    still_serves(&server);
}

#[test]
fn a_slow_loris_setup_is_cut_at_the_handshake_deadline() {
    let server = start(8 * MIB, |o| o.handshake_timeout = Duration::from_secs(1));
    // ICReq a byte at a time, slower than the deadline allows.
    let mut host = Host::connect_tcp(&server);
    let req = IcReq {
        pfv: 0,
        hpda: 0,
        digests: Digests::default(),
        maxr2t: 0,
    }
    .encode();
    let began = Instant::now();
    let mut cut = false;
    for byte in req.iter() {
        if host.stream.write_all(&[*byte]).is_err() {
            cut = true;
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
        if began.elapsed() > Duration::from_secs(3) {
            break;
        }
    }
    assert!(cut || host.ended(), "the trickling host was not cut");
    assert!(began.elapsed() < Duration::from_secs(4));
    server.wait_log(&["event=nvme-refused", "within the handshake time"]);
    // ICReq done, no Connect: cut too.
    let mut host = Host::ic(&server);
    std::thread::sleep(Duration::from_millis(1500));
    assert!(host.ended());
    server.wait_log(&["no Connect within the handshake time"]);
    still_serves(&server);
}

#[test]
fn a_host_that_stops_sending_keep_alive_is_dropped_with_its_queues() {
    let server = start(8 * MIB, |_| {});
    let (mut admin, cntlid) = Host::admin(&server, HOST, 1000);
    let mut io = Host::ic(&server);
    assert!(io.connect(NQN, HOST, 1, cntlid, 0).status.is_success());
    // Silent for longer than KATO (1 s) and its grace.
    std::thread::sleep(Duration::from_millis(3000));
    assert!(admin.ended(), "the admin queue is still open");
    assert!(io.ended(), "the I/O queue outlived its controller");
    server.wait_log(&["keep-alive timeout"]);
    let status = nvraid_serve::query_status(&server.control).unwrap();
    assert!(status["nvme"]["controllers"]
        .as_array()
        .unwrap()
        .iter()
        .all(|c| c["cntlid"] != cntlid));
    // Its controller id is gone: an I/O queue cannot join it.
    let mut late = Host::ic(&server);
    let cqe = late.connect(NQN, HOST, 1, cntlid, 0);
    assert_eq!((cqe.status.code_type(), cqe.status.code()), (1, 0x82));
    still_serves(&server);
}

#[test]
fn connect_data_by_r2t_is_taken() {
    // A Connect whose 1 KiB comes by R2T/H2CData rather than in the capsule.
    let server = start(8 * MIB, |_| {});
    let mut host = Host::ic(&server);
    let data = ConnectData {
        host_id: [1; 16],
        cntlid: 0xffff,
        subnqn: NQN.into(),
        hostnqn: HOST.into(),
    }
    .encode()
    .unwrap();
    let cid = host.next_cid();
    let sqe = Sqe::connect(cid, 0, 31, 0, false);
    host.send(sqe, &[]);
    let r2t = match host.next_with(cid, &mut Vec::new(), CONNECT_DATA_BYTES as u32) {
        Some(Event::Header(Header::R2T { data })) => data,
        other => panic!("expected an R2T, got {other:?}"),
    };
    assert_eq!((r2t.offset, r2t.length), (0, CONNECT_DATA_BYTES as u32));
    let mut b = Vec::new();
    let header = DataHeader {
        cid,
        ttag: r2t.ttag,
        offset: 0,
        length: CONNECT_DATA_BYTES as u32,
    };
    encode_h2c_data(&mut b, &header, true, Digests::default(), 0);
    b.extend_from_slice(&data);
    host.stream.write_all(&b).unwrap();
    match host.next(cid, &mut Vec::new()) {
        Some(Event::Header(Header::CapsuleResp { cqe })) => {
            assert!(cqe.status.is_success(), "{}", cqe.status)
        }
        other => panic!("expected the Connect response, got {other:?}"),
    }
}

#[test]
fn more_commands_than_the_queues_entries_end_the_connection() {
    // Slow I/O keeps the first commands in flight while more arrive.
    let target = Arc::new(
        MemTarget::mem(8 * MIB)
            .sector_bytes(4096)
            .latency(Duration::from_millis(300)),
    );
    let server = TestServer::start_with(target, nvme);
    let (_admin, cntlid) = Host::admin(&server, HOST, 0);
    let mut io = Host::ic(&server);
    // An I/O queue of 2 entries (SQSIZE 1).
    let data = ConnectData {
        host_id: [7; 16],
        cntlid,
        subnqn: NQN.into(),
        hostnqn: HOST.into(),
    }
    .encode()
    .unwrap();
    let cid = io.next_cid();
    let cqe = io.command(Sqe::connect(cid, 1, 1, 0, true), &data, &mut Vec::new());
    assert!(cqe.status.is_success(), "{}", cqe.status);
    // Three reads in one write: they arrive together, before any ends.
    let mut b = Vec::new();
    for _ in 0..3 {
        let cid = io.next_cid();
        encode_capsule_cmd(
            &mut b,
            &Sqe::read(cid, 1, 0, 1, 4096),
            0,
            Digests::default(),
            0,
        );
    }
    io.stream.write_all(&b).unwrap();
    server.wait_log(&[
        "event=nvme-disconnected",
        "more commands in flight than the queue's 2 entries",
    ]);
    still_serves(&server);
}

#[test]
fn connections_past_the_limit_are_refused_and_the_rest_go_on() {
    let server = start(8 * MIB, |o| o.connections_max = 2);
    let (mut admin, _) = Host::admin(&server, HOST, 0);
    let _second = Host::ic(&server);
    let mut third = Host::connect_tcp(&server);
    assert!(third.ended(), "a third connection was kept");
    server.wait_log(&["event=refused", "connection limit (2) reached"]);
    // The admitted ones still work.
    let cid = admin.next_cid();
    let cqe = admin.command(Sqe::keep_alive(cid), &[], &mut Vec::new());
    assert!(cqe.status.is_success());
}

/// A write whose in-capsule data does not match its data digest: the
/// connection ends with a TermReq and not a byte of it is written.
#[test]
fn a_write_with_a_bad_data_digest_ends_the_connection_and_writes_nothing() {
    let server = start(8 * MIB, |_| {});
    let both = Digests {
        header: true,
        data: true,
    };
    let mut admin = Host::ic_with(&server, both);
    let cqe = admin.connect(NQN, HOST, 0, 0xffff, 0);
    assert!(cqe.status.is_success(), "{}", cqe.status);
    let cntlid = cqe.result as u16;
    let cid = admin.next_cid();
    let cc = 1 | 6 << 16 | 4 << 20;
    let cqe = admin.command(Sqe::property_set(cid, 0x14, cc), &[], &mut Vec::new());
    assert!(cqe.status.is_success());
    let mut io = Host::ic_with(&server, both);
    assert!(io.connect(NQN, HOST, 1, cntlid, 0).status.is_success());
    // A good digested write first: it lands.
    let good = pattern(4096, 3);
    let cid = io.next_cid();
    let cqe = io.command(
        Sqe::write(cid, 1, 0, 1, 4096, true, false),
        &good,
        &mut Vec::new(),
    );
    assert!(cqe.status.is_success(), "{}", cqe.status);
    assert!(server.target.contents()[..4096] == good[..]);
    // Then one whose trailer is wrong.
    let bad = pattern(4096, 4);
    let cid = io.next_cid();
    let mut sqe = Sqe::write(cid, 1, 1, 1, 4096, true, false);
    sqe.set_sgl(4096, true);
    let mut b = Vec::new();
    encode_capsule_cmd(&mut b, &sqe, 4096, both, 0);
    b.extend_from_slice(&bad);
    let mut trailer = data_digest_trailer(&[&bad]);
    trailer[0] ^= 0xff;
    b.extend_from_slice(&trailer);
    io.stream.write_all(&b).unwrap();
    assert!(io.term_req(), "no C2HTermReq");
    assert!(io.ended());
    server.wait_log(&["event=nvme-disconnected", "digest"]);
    assert!(
        server.target.contents()[4096..8192].iter().all(|b| *b == 0),
        "the write with the bad digest reached the target"
    );
    still_serves(&server);
}

/// An ICReq after the setup, or a PDU type only a controller sends, is out
/// of order: TermReq, the connection ends, the server goes on.
#[test]
fn a_pdu_out_of_order_ends_the_connection() {
    let server = start(8 * MIB, |_| {});
    let (_admin, cntlid) = Host::admin(&server, HOST, 0);
    for (qid, pdu) in (1u16..).zip([
        IcReq {
            pfv: 0,
            hpda: 0,
            digests: Digests::default(),
            maxr2t: 0,
        }
        .encode()
        .to_vec(),
        // An R2T (controller to host) sent by the host.
        {
            let mut b = vec![pdu_type::R2T, 0, 24, 0, 24, 0, 0, 0];
            b.resize(24, 0);
            b
        },
    ]) {
        let mut io = Host::ic(&server);
        assert!(io.connect(NQN, HOST, qid, cntlid, 0).status.is_success());
        io.stream.write_all(&pdu).unwrap();
        assert!(io.term_req(), "no C2HTermReq");
        assert!(io.ended());
    }
    server.wait_log(&["event=nvme-disconnected", "protocol error"]);
    still_serves(&server);
}

/// A host that sends reads and never takes their data cannot hold the
/// worker's memory: past the transfer time the queue is ended.
#[test]
fn a_host_that_never_reads_its_answers_is_cut_at_the_transfer_deadline() {
    let server = start(64 * MIB, |o| o.transfer_timeout = Duration::from_secs(1));
    let (_admin, cntlid) = Host::admin(&server, HOST, 0);
    let mut io = Host::ic(&server);
    assert!(io.connect(NQN, HOST, 1, cntlid, 0).status.is_success());
    let mut b = Vec::new();
    // 31 reads of 512 KiB (the queue has 32 entries): more than the
    // sockets hold.
    for i in 0..31u64 {
        let cid = io.next_cid();
        let sqe = Sqe::read(cid, 1, i * 128, 128, 512 << 10);
        encode_capsule_cmd(&mut b, &sqe, 0, Digests::default(), 0);
    }
    io.stream.write_all(&b).unwrap();
    server.wait_log(&[
        "event=nvme-disconnected",
        "took none of its answers within the transfer time",
    ]);
    still_serves(&server);
}

/// A memory target whose reported size the test changes (an array that
/// grew while served); its memory is the largest size from the start.
struct Growing {
    inner: Arc<MemTarget>,
    size: std::sync::atomic::AtomicU64,
}

impl Target for Growing {
    fn size_bytes(&self) -> u64 {
        self.size.load(std::sync::atomic::Ordering::Acquire)
    }
    fn sector_bytes(&self) -> u32 {
        Target::sector_bytes(self.inner.as_ref())
    }
    fn writable(&self) -> bool {
        Target::writable(self.inner.as_ref())
    }
    fn describe(&self) -> String {
        format!("growing {}", self.inner.describe())
    }
    fn open_queue(
        &self,
        depth: u32,
        max_io_bytes: u32,
    ) -> std::io::Result<Box<dyn nvraid_io::queue::Queue>> {
        Target::open_queue(self.inner.as_ref(), depth, max_io_bytes)
    }
}

/// A Get Log Page command for `lid`, 4 KiB.
fn get_log_page(cid: u16, lid: u8) -> Sqe {
    let mut sqe = Sqe::identify(cid, 0, 0);
    sqe.0[0] = 0x02;
    sqe.0[40..44].copy_from_slice(&(u32::from(lid) | 1023 << 16).to_le_bytes());
    sqe
}

/// The served array grows: the controller raises Namespace Attribute
/// Changed on the Asynchronous Event Request its host holds there (once:
/// masked until the host reads the Changed Namespace List, which names
/// NSID 1 and is empty when read again), Identify Namespace reports the new
/// size, and I/O past the old end is served.
#[test]
fn a_namespace_that_grows_is_announced_by_an_async_event_with_its_changed_list() {
    let dir = tempfile::tempdir().unwrap();
    let logs = Arc::new(std::sync::Mutex::new(Vec::new()));
    let mut opts = common::options(dir.path(), &logs);
    nvme(&mut opts);
    let target = Arc::new(Growing {
        inner: MemTarget::new(16 * MIB, 4096),
        size: std::sync::atomic::AtomicU64::new(8 * MIB),
    });
    let shutdown = nvraid_serve::ShutdownHandle::new();
    let served: Arc<dyn Target> = target.clone();
    let server = nvraid_serve::start(served, opts, shutdown.clone()).unwrap();
    let address = server.info().nvme_listening.unwrap();
    let waiting = std::thread::spawn(move || server.wait());
    let (mut host, _) = Host::admin_at(address, HOST, 0);
    // The controller offers Namespace Attribute Notices (OAES bit 8).
    let cid = host.next_cid();
    let mut id = vec![0u8; 4096];
    assert!(host
        .command(Sqe::identify(cid, 1, 0), &[], &mut id)
        .status
        .is_success());
    assert_ne!(
        u32::from_le_bytes(id[92..96].try_into().unwrap()) & 1 << 8,
        0,
        "OAES"
    );
    // The host asks for them, and leaves an Asynchronous Event Request.
    let cid = host.next_cid();
    let mut sqe = Sqe::set_queue_count(cid, 1);
    sqe.0[40..44].copy_from_slice(&0x0bu32.to_le_bytes());
    sqe.0[44..48].copy_from_slice(&(1u32 << 8).to_le_bytes());
    assert!(host.command(sqe, &[], &mut Vec::new()).status.is_success());
    let aer = host.next_cid();
    let mut sqe = Sqe::keep_alive(aer);
    sqe.0[0] = 0x0c;
    host.send(sqe, &[]);
    let aer2 = host.next_cid();
    sqe.set_cid(aer2);
    host.send(sqe, &[]);
    // Nothing has changed: a Keep Alive is answered, the requests held.
    let cid = host.next_cid();
    let cqe = host.command(Sqe::keep_alive(cid), &[], &mut Vec::new());
    assert_eq!(cqe.cid, cid, "an event request answered before any event");

    target
        .size
        .store(16 * MIB, std::sync::atomic::Ordering::Release);
    let cqe = match host.next(aer, &mut []) {
        Some(Event::Header(Header::CapsuleResp { cqe })) => cqe,
        other => panic!("expected the event, got {other:?}"),
    };
    assert_eq!(cqe.cid, aer);
    assert!(cqe.status.is_success(), "{}", cqe.status);
    assert_eq!(
        cqe.result & 0xff_ffff,
        0x04_00_02,
        "Notice, NS changed, log 04h"
    );

    // The Changed Namespace List names NSID 1, then nothing.
    let mut log = vec![0u8; 4096];
    let cid = host.next_cid();
    assert!(host
        .command(get_log_page(cid, 0x04), &[], &mut log)
        .status
        .is_success());
    assert_eq!(u32::from_le_bytes(log[..4].try_into().unwrap()), 1);
    let cid = host.next_cid();
    assert!(host
        .command(get_log_page(cid, 0x04), &[], &mut log)
        .status
        .is_success());
    assert!(log.iter().all(|&b| b == 0), "read twice, the list is empty");
    // Identify Namespace: the new size.
    let cid = host.next_cid();
    assert!(host
        .command(Sqe::identify(cid, 0, 1), &[], &mut id)
        .status
        .is_success());
    assert_eq!(
        u64::from_le_bytes(id[..8].try_into().unwrap()),
        16 * MIB / 4096,
        "NSZE"
    );
    // The second request is still held (the event was reported once).
    let cid = host.next_cid();
    let cqe = host.command(Sqe::keep_alive(cid), &[], &mut Vec::new());
    assert_eq!(cqe.cid, cid, "the event reported twice");
    // Past the old end, the namespace is served.
    let export = NvmeExport::open(&format!("nvme+tcp://{address}/{NQN}"), remote()).unwrap();
    assert_eq!(export.info().size_bytes, 16 * MIB);
    let data = pattern(8192, 3);
    export.write_at(&data, 12 * MIB).unwrap();
    let mut back = vec![0u8; 8192];
    export.read_at(&mut back, 12 * MIB).unwrap();
    assert_eq!(back, data);
    export.close();
    assert!(
        logs.lock().unwrap().iter().any(
            |l| l.contains("event=nvme-namespace-resized old_bytes=8388608 new_bytes=16777216")
        ),
        "{:?}",
        logs.lock().unwrap()
    );
    drop(host);
    shutdown.trigger();
    waiting.join().unwrap().unwrap();
}
