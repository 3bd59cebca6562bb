//! A small NVMe/TCP target for tests, built on nvraid-nvme-tcp's
//! controller side: one subsystem, one RAM namespace, the admin commands
//! the initiator uses, Read (C2HData), Write (in-capsule or R2T/H2CData),
//! Flush and Write Zeroes, and scripted misbehaviour on reads.

use nvraid_nvme_tcp::command::{fctype, opcode, property, ConnectData, Cqe, Sqe, Status};
use nvraid_nvme_tcp::identify::IDENTIFY_BYTES;
use nvraid_nvme_tcp::pdu::{
    data_digest_trailer, encode_c2h_data, encode_capsule_resp, encode_r2t, DataHeader, Digests,
    Header, IcReq, IcResp, IC_BYTES,
};
use nvraid_nvme_tcp::reader::{Event, Expect, PduReader, Role, Want};
use std::collections::VecDeque;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};

/// How the target answers reads on I/O queues.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Misbehave {
    None,
    /// ICResp with PDU format version 1.
    BadPfv,
    /// The read's data digest is wrong.
    BadDataDigest,
    /// A C2HData longer than the read.
    C2HPastLength,
    /// A C2HData under a command id never sent.
    C2HUnknownCid,
    /// Reads are never answered.
    Silent,
    /// The first I/O connection is closed at its first read.
    DropFirstRead,
    /// A write that needs R2T: the R2T is sent, then the connection closed.
    DropMidR2T,
    /// At the first read the target "restarts": every connection ends, its
    /// controllers are forgotten, and the namespace comes back at half its
    /// size.
    RestartSmaller,
    /// Keep Alive is never answered.
    NoKeepAlive,
    /// A write that needs R2T: the R2T and a successful CapsuleResp are
    /// sent together, before any of the data arrived; nothing more is read.
    AnswerBeforeData,
}

pub struct FakeTarget {
    pub port: u16,
    pub nqn: String,
    pub data: Arc<Mutex<Vec<u8>>>,
    /// TCP connections accepted so far.
    pub connections: Arc<AtomicU32>,
    pub io_connects: Arc<AtomicU32>,
    /// Read commands received so far.
    pub read_commands: Arc<AtomicU32>,
    /// Restarts so far (RestartSmaller): controller ids of earlier ones are
    /// refused, and the namespace is halved for each.
    pub generation: Arc<AtomicU32>,
}

pub const BLOCK: usize = 512;
/// In-capsule data the fake takes on I/O queues (larger writes use R2T).
pub const IN_CAPSULE: u32 = 4096;
/// Largest H2CData the fake takes (so R2T data comes in several PDUs).
pub const MAXH2CDATA: u32 = 8192;

pub fn serve(size: usize, how: Misbehave) -> FakeTarget {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let nqn = "nqn.2026-11.test.nvraid:fake".to_string();
    let data = Arc::new(Mutex::new(vec![0u8; size]));
    let connections = Arc::new(AtomicU32::new(0));
    let io_connects = Arc::new(AtomicU32::new(0));
    let generation = Arc::new(AtomicU32::new(0));
    let read_commands = Arc::new(AtomicU32::new(0));
    let t = FakeTarget {
        read_commands: Arc::clone(&read_commands),
        generation: Arc::clone(&generation),
        port,
        nqn: nqn.clone(),
        data: Arc::clone(&data),
        connections: Arc::clone(&connections),
        io_connects: Arc::clone(&io_connects),
    };
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(stream) = stream else { return };
            connections.fetch_add(1, Ordering::SeqCst);
            let (nqn, data, io) = (nqn.clone(), Arc::clone(&data), Arc::clone(&io_connects));
            let generation = Arc::clone(&generation);
            let reads = Arc::clone(&read_commands);
            std::thread::spawn(move || {
                let _ = connection(stream, how, &nqn, &data, &io, &generation, &reads);
            });
        }
    });
    t
}

impl FakeTarget {
    pub fn uri(&self, query: &str) -> String {
        format!("nvme+tcp://127.0.0.1:{}/{}/1{query}", self.port, self.nqn)
    }
}

fn recv(stream: &mut TcpStream, buf: &mut [u8]) -> std::io::Result<()> {
    stream.read_exact(buf)
}

/// The next event from the host; in-capsule or H2CData payloads are
/// appended to `data`.
fn next_event(
    stream: &mut TcpStream,
    reader: &mut PduReader,
    lookup: &dyn Fn(u16) -> Option<Expect>,
    data: &mut Vec<u8>,
) -> Result<Event, String> {
    loop {
        let e = match reader.want() {
            Want::Bytes(n) => {
                let mut b = vec![0u8; n];
                recv(stream, &mut b).map_err(|e| e.to_string())?;
                reader.buffer().copy_from_slice(&b);
                reader.filled(n, lookup).map_err(|e| e.to_string())?
            }
            Want::Data { len, .. } => {
                let mut b = vec![0u8; len as usize];
                recv(stream, &mut b).map_err(|e| e.to_string())?;
                data.extend_from_slice(&b);
                reader.data_moved(&b).map_err(|e| e.to_string())?
            }
        };
        match e {
            Some(Event::Header(Header::H2CData { .. })) => {}
            Some(Event::Header(Header::CapsuleCmd { sqe })) if !reader.idle() => {
                // In-capsule data follows: collect it, then report.
                loop {
                    match reader.want() {
                        Want::Bytes(n) => {
                            let mut b = vec![0u8; n];
                            recv(stream, &mut b).map_err(|e| e.to_string())?;
                            reader.buffer().copy_from_slice(&b);
                            if let Some(Event::DataDone { .. }) =
                                reader.filled(n, lookup).map_err(|e| e.to_string())?
                            {
                                break;
                            }
                        }
                        Want::Data { len, .. } => {
                            let mut b = vec![0u8; len as usize];
                            recv(stream, &mut b).map_err(|e| e.to_string())?;
                            data.extend_from_slice(&b);
                            if let Some(Event::DataDone { .. }) =
                                reader.data_moved(&b).map_err(|e| e.to_string())?
                            {
                                break;
                            }
                        }
                    }
                }
                return Ok(Event::Header(Header::CapsuleCmd { sqe }));
            }
            Some(e) => return Ok(e),
            None => {}
        }
    }
}

fn respond(stream: &mut TcpStream, d: Digests, cid: u16, status: Status, result: u64) {
    let mut b = Vec::new();
    encode_capsule_resp(
        &mut b,
        &Cqe {
            result,
            sq_head: 0,
            sq_id: 0,
            cid,
            status,
        },
        d,
    );
    let _ = stream.write_all(&b);
}

fn send_data(stream: &mut TcpStream, d: Digests, cid: u16, offset: u32, data: &[u8], last: bool) {
    let mut b = Vec::new();
    let h = DataHeader {
        cid,
        ttag: 0,
        offset,
        length: data.len() as u32,
    };
    encode_c2h_data(&mut b, &h, last, last, d, 0);
    b.extend_from_slice(data);
    if d.data {
        b.extend_from_slice(&data_digest_trailer(&[data]));
    }
    let _ = stream.write_all(&b);
}

fn connection(
    mut stream: TcpStream,
    how: Misbehave,
    nqn: &str,
    store: &Mutex<Vec<u8>>,
    io_connects: &AtomicU32,
    generation: &AtomicU32,
    read_commands: &AtomicU32,
) -> Result<(), String> {
    let born = generation.load(Ordering::SeqCst);
    stream.set_nodelay(true).unwrap();
    let mut ic = [0u8; IC_BYTES];
    recv(&mut stream, &mut ic).map_err(|e| e.to_string())?;
    let req = IcReq::parse(&ic).map_err(|e| e.to_string())?;
    let mut resp = IcResp {
        pfv: 0,
        cpda: 0,
        digests: req.digests,
        maxh2cdata: MAXH2CDATA,
    }
    .encode();
    if how == Misbehave::BadPfv {
        resp[8] = 1;
    }
    stream.write_all(&resp).map_err(|e| e.to_string())?;
    let d = req.digests;
    let mut reader = PduReader::new(Role::Controller, d, 1 << 20, 8192);
    let mut qid = 0u16;
    let mut cc = 0u32;
    let mut io_index = 0;
    // A write waiting for its H2CData: (cid, length, received).
    let pending: Mutex<Option<(u16, u32, u32)>> = Mutex::new(None);
    // Commands that arrived while a write waited for its data.
    let mut backlog: VecDeque<(Sqe, Vec<u8>)> = VecDeque::new();
    loop {
        let lookup = |cid: u16| {
            let p = *pending.lock().unwrap();
            p.filter(|p| p.0 == cid).map(|(_, len, got)| Expect {
                limit: len,
                next: got,
                to_host: false,
                ttag: 1,
            })
        };
        let (sqe, mut data) = match backlog.pop_front() {
            Some(next) => next,
            None => {
                let mut data = Vec::new();
                let event = next_event(&mut stream, &mut reader, &lookup, &mut data)?;
                let Event::Header(Header::CapsuleCmd { sqe }) = event else {
                    return Err(format!("unexpected {event:?}"));
                };
                (sqe, data)
            }
        };
        let cid = sqe.cid();
        let ok = Status::SUCCESS;
        match sqe.opcode() {
            opcode::FABRICS => match sqe.fctype() {
                fctype::CONNECT => {
                    let c = ConnectData::parse(&data).map_err(|e| e.to_string())?;
                    qid = u16::from_le_bytes([sqe.0[42], sqe.0[43]]);
                    let now = generation.load(Ordering::SeqCst);
                    // The controller id of this target's life.
                    let cntlid = 1 + now as u16;
                    let stale = qid > 0 && c.cntlid != cntlid;
                    if c.subnqn != nqn || stale {
                        respond(&mut stream, d, cid, Status::new(1, 0x82, true), 0);
                        continue;
                    }
                    if qid > 0 {
                        io_connects.fetch_add(1, Ordering::SeqCst);
                        reader = PduReader::new(Role::Controller, d, 1 << 20, IN_CAPSULE);
                    }
                    respond(&mut stream, d, cid, ok, u64::from(cntlid));
                }
                fctype::PROPERTY_GET => {
                    let v = match sqe.cdw(11) {
                        property::CAP => 127 | (2 << 24),
                        property::VS => 0x0001_0400,
                        property::CSTS => u64::from(cc & 1),
                        property::CC => u64::from(cc),
                        _ => 0,
                    };
                    respond(&mut stream, d, cid, ok, v);
                }
                fctype::PROPERTY_SET => {
                    cc = sqe.cdw(12);
                    respond(&mut stream, d, cid, ok, 0);
                }
                _ => respond(&mut stream, d, cid, Status::new(0, 1, true), 0),
            },
            opcode::IDENTIFY if qid == 0 => {
                let mut b = vec![0u8; IDENTIFY_BYTES];
                if sqe.cdw(10) == 1 {
                    b[24..28].copy_from_slice(b"fake");
                    b[516..520].copy_from_slice(&1u32.to_le_bytes());
                    b[520..522].copy_from_slice(&0x000cu16.to_le_bytes());
                    b[525] = 1;
                    let ioccsz = (64 + IN_CAPSULE) / 16;
                    b[1792..1796].copy_from_slice(&ioccsz.to_le_bytes());
                } else if sqe.nsid() == 1 {
                    let shift = generation.load(Ordering::SeqCst);
                    let blocks = (store.lock().unwrap().len() / BLOCK) as u64 >> shift;
                    b[0..8].copy_from_slice(&blocks.to_le_bytes());
                    b[8..16].copy_from_slice(&blocks.to_le_bytes());
                    b[128 + 2] = 9;
                }
                send_data(&mut stream, d, cid, 0, &b[..4096], true);
            }
            // Keep Alive never answered: the controller looks gone.
            opcode::KEEP_ALIVE if how == Misbehave::NoKeepAlive => {}
            opcode::SET_FEATURES | opcode::KEEP_ALIVE if qid == 0 => {
                respond(&mut stream, d, cid, ok, 3 | (3 << 16));
            }
            opcode::READ if qid > 0 => {
                let (slba, blocks) = sqe.lba_range();
                let at = slba as usize * BLOCK;
                let len = blocks as usize * BLOCK;
                io_index += 1;
                read_commands.fetch_add(1, Ordering::SeqCst);
                match how {
                    Misbehave::Silent => continue,
                    Misbehave::DropFirstRead if io_connects.load(Ordering::SeqCst) == 1 => {
                        return Ok(())
                    }
                    Misbehave::RestartSmaller if born == 0 => {
                        generation.store(1, Ordering::SeqCst);
                        return Ok(());
                    }
                    Misbehave::C2HPastLength => {
                        let bytes = vec![0xee; len + 512];
                        send_data(&mut stream, d, cid, 0, &bytes, true);
                        continue;
                    }
                    Misbehave::C2HUnknownCid => {
                        send_data(&mut stream, d, cid ^ 0x4000, 0, &vec![0xee; len], true);
                        continue;
                    }
                    Misbehave::BadDataDigest => {
                        let bytes = store.lock().unwrap()[at..at + len].to_vec();
                        let mut b = Vec::new();
                        let h = DataHeader {
                            cid,
                            ttag: 0,
                            offset: 0,
                            length: len as u32,
                        };
                        encode_c2h_data(&mut b, &h, true, true, d, 0);
                        b.extend_from_slice(&bytes);
                        let mut trailer = data_digest_trailer(&[&bytes]);
                        trailer[0] ^= 0xff;
                        b.extend_from_slice(&trailer);
                        let _ = stream.write_all(&b);
                        continue;
                    }
                    _ => {}
                }
                let bytes = store.lock().unwrap()[at..at + len].to_vec();
                // In pieces of 16 KiB, the last one marked SUCCESS (no
                // CapsuleResp) on every other read, a CapsuleResp after
                // the data otherwise.
                let chunks: Vec<&[u8]> = bytes.chunks(16384).collect();
                let with_resp = io_index % 2 == 0;
                for (i, c) in chunks.iter().enumerate() {
                    let last = i + 1 == chunks.len();
                    let mut b = Vec::new();
                    let h = DataHeader {
                        cid,
                        ttag: 0,
                        offset: (i * 16384) as u32,
                        length: c.len() as u32,
                    };
                    encode_c2h_data(&mut b, &h, last, last && !with_resp, d, 0);
                    b.extend_from_slice(c);
                    if d.data {
                        b.extend_from_slice(&data_digest_trailer(&[c]));
                    }
                    let _ = stream.write_all(&b);
                }
                if with_resp {
                    respond(&mut stream, d, cid, ok, 0);
                }
            }
            opcode::WRITE if qid > 0 => {
                let (slba, blocks) = sqe.lba_range();
                let at = slba as usize * BLOCK;
                let len = blocks as usize * BLOCK;
                if data.is_empty() && how == Misbehave::AnswerBeforeData {
                    let mut b = Vec::new();
                    let h = DataHeader {
                        cid,
                        ttag: 1,
                        offset: 0,
                        length: len as u32,
                    };
                    encode_r2t(&mut b, &h, d);
                    encode_capsule_resp(
                        &mut b,
                        &Cqe {
                            result: 0,
                            sq_head: 0,
                            sq_id: 0,
                            cid,
                            status: ok,
                        },
                        d,
                    );
                    let _ = stream.write_all(&b);
                    std::thread::sleep(std::time::Duration::from_secs(2));
                    return Ok(());
                }
                if data.is_empty() && how == Misbehave::DropMidR2T {
                    let mut b = Vec::new();
                    let h = DataHeader {
                        cid,
                        ttag: 1,
                        offset: 0,
                        length: len as u32,
                    };
                    encode_r2t(&mut b, &h, d);
                    let _ = stream.write_all(&b);
                    return Ok(());
                }
                if data.is_empty() {
                    *pending.lock().unwrap() = Some((cid, len as u32, 0));
                    let mut b = Vec::new();
                    encode_r2t(
                        &mut b,
                        &DataHeader {
                            cid,
                            ttag: 1,
                            offset: 0,
                            length: len as u32,
                        },
                        d,
                    );
                    stream.write_all(&b).map_err(|e| e.to_string())?;
                    while data.len() < len {
                        let mut other = Vec::new();
                        let e = next_event(&mut stream, &mut reader, &lookup, &mut other)?;
                        match e {
                            Event::Header(Header::CapsuleCmd { sqe }) => {
                                backlog.push_back((sqe, other));
                            }
                            Event::DataDone { len: n, .. } => {
                                data.extend_from_slice(&other);
                                let mut p = pending.lock().unwrap();
                                if let Some(p) = p.as_mut() {
                                    p.2 += n;
                                }
                            }
                            other => return Err(format!("expected H2CData, got {other:?}")),
                        }
                    }
                    *pending.lock().unwrap() = None;
                }
                if data.len() != len {
                    return Err(format!("write of {len} carried {}", data.len()));
                }
                store.lock().unwrap()[at..at + len].copy_from_slice(&data);
                respond(&mut stream, d, cid, ok, 0);
            }
            opcode::WRITE_ZEROES if qid > 0 => {
                let (slba, blocks) = sqe.lba_range();
                let at = slba as usize * BLOCK;
                let len = blocks as usize * BLOCK;
                store.lock().unwrap()[at..at + len].fill(0);
                respond(&mut stream, d, cid, ok, 0);
            }
            opcode::FLUSH if qid > 0 => respond(&mut stream, d, cid, ok, 0),
            _ => respond(&mut stream, d, cid, Status::new(0, 1, true), 0),
        }
    }
}
