//! Connections to an NVMe/TCP target, set up synchronously: TCP within a
//! deadline, ICReq/ICResp, and commands run one at a time (Fabrics
//! Connect, Property Get/Set, Identify, Keep Alive, the identity probe)
//! before a connection is handed to a worker's channel.

use super::uri::NvmeUri;
use nvraid_nvme_tcp::command::{Cqe, Sqe, Status};
use nvraid_nvme_tcp::pdu::{
    self, encode_capsule_cmd, encode_h2c_data, DataHeader, Digests, Header, IcReq, IcResp, IC_BYTES,
};
use nvraid_nvme_tcp::reader::{Event, Expect, PduReader, Role, Want};
use nvraid_nvme_tcp::ParseError;
use std::io::{self, Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::time::{Duration, Instant};

/// Most data bytes accepted in one C2HData PDU.
pub(crate) const MAX_C2H_DATA: u32 = 16 << 20;

/// Why an NVMe/TCP target could not be used (or stopped being usable).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum NvmeError {
    #[error("{uri}: cannot reach the target: {source}")]
    Unreachable { uri: String, source: io::Error },
    #[error("{uri}: no answer in time while {during}")]
    Timeout { uri: String, during: String },
    #[error("{uri}: the target closed the connection while {during}")]
    Closed { uri: String, during: String },
    #[error("{uri}: protocol error while {during}: {source}")]
    Protocol {
        uri: String,
        during: String,
        source: ParseError,
    },
    #[error("{uri}: {what} failed: {status}")]
    Refused {
        uri: String,
        what: String,
        status: Status,
    },
    #[error("{uri}: {reason}")]
    Unusable { uri: String, reason: String },
    #[error("{uri}: {source}")]
    Io { uri: String, source: io::Error },
    /// A new connection reached a device that failed the member's identity
    /// check.
    #[error("{uri}: {reason}")]
    NotTheMember { uri: String, reason: String },
}

impl NvmeError {
    /// The errno the operations waiting for this connection fail with.
    pub fn errno(&self) -> i32 {
        match self {
            NvmeError::Unreachable { source, .. } | NvmeError::Io { source, .. } => {
                source.raw_os_error().unwrap_or(libc::EIO)
            }
            NvmeError::Timeout { .. } => libc::ETIMEDOUT,
            NvmeError::NotTheMember { .. } => libc::ENXIO,
            NvmeError::Refused { .. } | NvmeError::Unusable { .. } => libc::ENXIO,
            NvmeError::Closed { .. } | NvmeError::Protocol { .. } => libc::EIO,
        }
    }
}

/// One TCP connection after ICReq/ICResp.
#[derive(Debug)]
pub(crate) struct Conn {
    pub stream: TcpStream,
    pub digests: Digests,
    pub cpda: u8,
    pub maxh2cdata: u32,
    pub reader: PduReader,
    pub uri: String,
    next_cid: u16,
}

/// Connect to `uri`'s target and exchange ICReq/ICResp, by `deadline`.
pub(crate) fn open(uri: &NvmeUri, deadline: Instant) -> Result<Conn, NvmeError> {
    let name = uri.to_string();
    let unreachable = |source| NvmeError::Unreachable {
        uri: name.clone(),
        source,
    };
    let addrs: Vec<_> = (uri.host.as_str(), uri.port)
        .to_socket_addrs()
        .map_err(unreachable)?
        .collect();
    let mut last = io::Error::new(io::ErrorKind::NotFound, "host has no address");
    let mut stream = None;
    for addr in addrs {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            last = io::Error::from_raw_os_error(libc::ETIMEDOUT);
            break;
        }
        match TcpStream::connect_timeout(&addr, left) {
            Ok(s) => {
                stream = Some(s);
                break;
            }
            Err(e) => last = e,
        }
    }
    let stream = stream.ok_or_else(|| unreachable(last))?;
    stream.set_nodelay(true).map_err(unreachable)?;
    let mut conn = Conn {
        stream,
        digests: Digests::default(),
        cpda: 0,
        maxh2cdata: 0,
        reader: PduReader::new(Role::Host, Digests::default(), MAX_C2H_DATA, 0),
        uri: name,
        next_cid: 0,
    };
    let asked = Digests {
        header: uri.header_digest,
        data: uri.data_digest,
    };
    let req = IcReq {
        pfv: 0,
        hpda: 0,
        digests: asked,
        maxr2t: 0,
    };
    conn.send_all(&req.encode(), deadline, "sending ICReq")?;
    let mut b = [0u8; IC_BYTES];
    conn.recv_exact(&mut b, deadline, "waiting for ICResp")?;
    let resp = IcResp::parse(&b).map_err(|source| conn.protocol("reading ICResp", source))?;
    // The controller may turn down a digest, never add one not asked for.
    if (resp.digests.header && !asked.header) || (resp.digests.data && !asked.data) {
        return Err(conn.protocol(
            "reading ICResp",
            ParseError::Field {
                field: "digest bits not asked for",
                value: u64::from(resp.digests.header) | u64::from(resp.digests.data) << 1,
            },
        ));
    }
    conn.digests = resp.digests;
    conn.cpda = resp.cpda;
    conn.maxh2cdata = resp.maxh2cdata;
    conn.reader = PduReader::new(Role::Host, resp.digests, MAX_C2H_DATA, 0);
    Ok(conn)
}

impl Conn {
    pub(crate) fn protocol(&self, during: &str, source: ParseError) -> NvmeError {
        NvmeError::Protocol {
            uri: self.uri.clone(),
            during: during.to_string(),
            source,
        }
    }

    fn timed_out(&self, during: &str) -> NvmeError {
        NvmeError::Timeout {
            uri: self.uri.clone(),
            during: during.to_string(),
        }
    }

    fn set_timeout(&self, deadline: Instant, during: &str) -> Result<(), NvmeError> {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(self.timed_out(during));
        }
        let io = |source| NvmeError::Io {
            uri: self.uri.clone(),
            source,
        };
        self.stream
            .set_read_timeout(Some(left.max(Duration::from_millis(1))))
            .map_err(io)?;
        self.stream
            .set_write_timeout(Some(left.max(Duration::from_millis(1))))
            .map_err(io)
    }

    fn io_error(&self, e: io::Error, during: &str) -> NvmeError {
        match e.kind() {
            io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => self.timed_out(during),
            io::ErrorKind::UnexpectedEof
            | io::ErrorKind::ConnectionReset
            | io::ErrorKind::BrokenPipe => NvmeError::Closed {
                uri: self.uri.clone(),
                during: during.to_string(),
            },
            _ => NvmeError::Io {
                uri: self.uri.clone(),
                source: e,
            },
        }
    }

    pub(crate) fn send_all(
        &mut self,
        b: &[u8],
        deadline: Instant,
        during: &str,
    ) -> Result<(), NvmeError> {
        self.set_timeout(deadline, during)?;
        let r = self.stream.write_all(b);
        r.map_err(|e| self.io_error(e, during))
    }

    fn recv_exact(
        &mut self,
        b: &mut [u8],
        deadline: Instant,
        during: &str,
    ) -> Result<(), NvmeError> {
        let mut at = 0;
        while at < b.len() {
            self.set_timeout(deadline, during)?;
            match self.stream.read(&mut b[at..]) {
                Ok(0) => {
                    return Err(NvmeError::Closed {
                        uri: self.uri.clone(),
                        during: during.to_string(),
                    })
                }
                Ok(n) => at += n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(self.io_error(e, during)),
            }
        }
        Ok(())
    }

    /// A command id for a command run with [`Conn::command`].
    pub(crate) fn cid(&mut self) -> u16 {
        self.next_cid = self.next_cid.wrapping_add(1);
        self.next_cid
    }

    /// Run one command and wait for its completion (nothing else may be
    /// in flight on the connection): `out` is its data to the controller
    /// (in the capsule when no longer than `in_capsule`, else by R2T),
    /// `inn` its data from the controller. Err: transport failures; a
    /// command that failed comes back as its completion.
    pub(crate) fn command(
        &mut self,
        mut sqe: Sqe,
        out: Option<&[u8]>,
        inn: Option<&mut [u8]>,
        in_capsule: u32,
        deadline: Instant,
        during: &str,
    ) -> Result<Cqe, NvmeError> {
        let cid = sqe.cid();
        let mut buf = Vec::new();
        let mut inline_len = 0;
        if let Some(out) = out {
            let inline = out.len() as u64 <= u64::from(in_capsule);
            sqe.set_sgl(out.len() as u32, inline);
            if inline {
                inline_len = out.len();
            }
        }
        encode_capsule_cmd(&mut buf, &sqe, inline_len, self.digests, self.cpda);
        if inline_len > 0 {
            let out = out.unwrap_or_default();
            buf.extend_from_slice(out);
            if self.digests.data {
                buf.extend_from_slice(&pdu::data_digest_trailer(&[out]));
            }
        }
        self.send_all(&buf, deadline, during)?;
        let (to_host, limit) = match (&out, &inn) {
            (_, Some(b)) => (true, b.len() as u32),
            (Some(b), None) if inline_len == 0 => (false, b.len() as u32),
            _ => (false, 0),
        };
        let mut inn = inn;
        let mut next = 0u32;
        let mut scratch = [0u8; 256];
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
                    self.recv_exact(&mut scratch[..n], deadline, during)?;
                    self.reader.buffer().copy_from_slice(&scratch[..n]);
                    self.reader
                        .filled(n, &lookup)
                        .map_err(|e| self.protocol(during, e))?
                }
                Want::Data { offset, len, .. } => {
                    let dest = inn
                        .as_deref_mut()
                        .expect("invariant: data PDUs only for a command with a buffer");
                    let piece = &mut dest[offset as usize..(offset + len) as usize];
                    self.recv_exact(piece, deadline, during)?;
                    let dest = inn.as_deref().unwrap_or_default();
                    let piece = &dest[offset as usize..(offset + len) as usize];
                    self.reader
                        .data_moved(piece)
                        .map_err(|e| self.protocol(during, e))?
                }
            };
            match event {
                None | Some(Event::Header(Header::C2HData { .. })) => {}
                Some(Event::Header(Header::CapsuleResp { cqe })) => {
                    if cqe.cid != cid {
                        return Err(self.protocol(
                            during,
                            ParseError::UnknownCommand {
                                pdu: "CapsuleResp",
                                cid: cqe.cid,
                            },
                        ));
                    }
                    return Ok(cqe);
                }
                Some(Event::Header(Header::R2T { data })) => {
                    let out = out.unwrap_or_default();
                    next += data.length;
                    let mut at = data.offset;
                    let end = data.offset + data.length;
                    while at < end {
                        let n = (end - at).min(self.maxh2cdata);
                        let mut b = Vec::new();
                        let h = DataHeader {
                            cid,
                            ttag: data.ttag,
                            offset: at,
                            length: n,
                        };
                        encode_h2c_data(&mut b, &h, at + n == end, self.digests, self.cpda);
                        let piece = &out[at as usize..(at + n) as usize];
                        b.extend_from_slice(piece);
                        if self.digests.data {
                            b.extend_from_slice(&pdu::data_digest_trailer(&[piece]));
                        }
                        self.send_all(&b, deadline, during)?;
                        at += n;
                    }
                }
                Some(Event::DataDone { len, success, .. }) => {
                    next += len;
                    if success {
                        if next != limit {
                            return Err(self.protocol(
                                during,
                                ParseError::DataLength {
                                    pdu_type: pdu::pdu_type::C2H_DATA,
                                    data_len: limit,
                                    carried: next,
                                },
                            ));
                        }
                        return Ok(Cqe {
                            result: 0,
                            sq_head: 0,
                            sq_id: 0,
                            cid,
                            status: Status::SUCCESS,
                        });
                    }
                }
                Some(Event::Term(t)) => {
                    return Err(self.protocol(during, ParseError::Terminated(t.to_string())))
                }
                Some(Event::Header(other)) => {
                    return Err(self.protocol(
                        during,
                        ParseError::Field {
                            field: "unexpected PDU",
                            value: match other {
                                Header::CapsuleCmd { .. } => 4,
                                Header::H2CData { .. } => 6,
                                _ => 0,
                            },
                        },
                    ))
                }
            }
        }
    }

    /// [`Conn::command`], a failed completion turned into an error.
    pub(crate) fn command_ok(
        &mut self,
        sqe: Sqe,
        out: Option<&[u8]>,
        inn: Option<&mut [u8]>,
        in_capsule: u32,
        deadline: Instant,
        what: &str,
    ) -> Result<Cqe, NvmeError> {
        let cqe = self.command(sqe, out, inn, in_capsule, deadline, what)?;
        if !cqe.status.is_success() {
            return Err(NvmeError::Refused {
                uri: self.uri.clone(),
                what: what.to_string(),
                status: cqe.status,
            });
        }
        Ok(cqe)
    }
}
