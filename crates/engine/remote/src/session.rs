//! Opening a connection: the socket, then the fixed newstyle handshake
//! (nvraid-nbd's client state machine), each within a deadline.

use crate::uri::{Address, NbdUri};
use nvraid_nbd::consts::transmission_flags as tf;
use nvraid_nbd::{ClientConfig, ClientEvent, ClientHandshake, ClientNegotiated, ProtocolError};
use std::io::{self, Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};

/// Why a connection could not be made.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConnectError {
    #[error("{uri}: cannot reach the server: {source}")]
    Unreachable { uri: String, source: io::Error },
    #[error("{uri}: the server closed the connection during the handshake")]
    ClosedInHandshake { uri: String },
    #[error("{uri}: the handshake did not finish within {seconds} s")]
    HandshakeTimeout { uri: String, seconds: f64 },
    #[error("{uri}: the server has no export named {export:?} ({detail})")]
    NoSuchExport {
        uri: String,
        export: String,
        detail: String,
    },
    #[error("{uri}: {source}")]
    Protocol { uri: String, source: ProtocolError },
    #[error("{uri}: {source}")]
    Io { uri: String, source: io::Error },
    #[error("{uri}: NBD over TLS (nbds://) is not supported by this build's NBD client yet")]
    TlsUnsupported { uri: String },
}

impl ConnectError {
    fn with_timeout(self, timeout: Duration) -> ConnectError {
        match self {
            ConnectError::HandshakeTimeout { uri, .. } => ConnectError::HandshakeTimeout {
                uri,
                seconds: timeout.as_secs_f64(),
            },
            other => other,
        }
    }

    /// The errno a worker reports for this failure.
    pub fn errno(&self) -> i32 {
        match self {
            ConnectError::Unreachable { source, .. } | ConnectError::Io { source, .. } => {
                source.raw_os_error().unwrap_or(libc::EIO)
            }
            ConnectError::HandshakeTimeout { .. } => libc::ETIMEDOUT,
            _ => libc::EIO,
        }
    }
}

/// The socket of one connection.
#[derive(Debug)]
pub enum Socket {
    Tcp(TcpStream),
    Unix(UnixStream),
}

impl Socket {
    pub fn raw_fd(&self) -> RawFd {
        match self {
            Socket::Tcp(s) => s.as_raw_fd(),
            Socket::Unix(s) => s.as_raw_fd(),
        }
    }

    fn set_timeouts(&self, timeout: Option<Duration>) -> io::Result<()> {
        match self {
            Socket::Tcp(s) => {
                s.set_read_timeout(timeout)?;
                s.set_write_timeout(timeout)
            }
            Socket::Unix(s) => {
                s.set_read_timeout(timeout)?;
                s.set_write_timeout(timeout)
            }
        }
    }

    pub fn set_nonblocking(&self, on: bool) -> io::Result<()> {
        match self {
            Socket::Tcp(s) => s.set_nonblocking(on),
            Socket::Unix(s) => s.set_nonblocking(on),
        }
    }

    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            Socket::Tcp(s) => s.read(buf),
            Socket::Unix(s) => s.read(buf),
        }
    }

    fn write_all(&mut self, buf: &[u8]) -> io::Result<()> {
        match self {
            Socket::Tcp(s) => s.write_all(buf),
            Socket::Unix(s) => s.write_all(buf),
        }
    }
}

/// What the server agreed to, in the terms a member needs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ExportInfo {
    pub size_bytes: u64,
    pub flags: u16,
    /// (minimum, preferred, maximum payload) block sizes; the protocol's
    /// defaults (1, 4096, 32 MiB) when the server sent none.
    pub minimum_block: u32,
    pub preferred_block: u32,
    pub maximum_payload: u32,
    pub structured_replies: bool,
}

impl ExportInfo {
    fn from_negotiated(n: &ClientNegotiated) -> ExportInfo {
        let (minimum_block, preferred_block, maximum_payload) = match n.block_sizes {
            Some(b) => (b.minimum_bytes, b.preferred_bytes, b.maximum_bytes),
            None => (1, 4096, 32 << 20),
        };
        ExportInfo {
            size_bytes: n.size_bytes,
            flags: n.transmission_flags,
            minimum_block,
            preferred_block,
            maximum_payload,
            structured_replies: n.structured_replies,
        }
    }

    pub fn read_only(&self) -> bool {
        self.flags & tf::READ_ONLY != 0
    }
    pub fn can_flush(&self) -> bool {
        self.flags & tf::SEND_FLUSH != 0
    }
    pub fn can_fua(&self) -> bool {
        self.flags & tf::SEND_FUA != 0
    }
    pub fn can_trim(&self) -> bool {
        self.flags & tf::SEND_TRIM != 0
    }
    pub fn can_write_zeroes(&self) -> bool {
        self.flags & tf::SEND_WRITE_ZEROES != 0
    }
    pub fn can_multi_conn(&self) -> bool {
        self.flags & tf::CAN_MULTI_CONN != 0
    }
}

/// A connection in the transmission phase.
#[derive(Debug)]
pub struct Session {
    pub socket: Socket,
    pub info: ExportInfo,
}

/// Connect to `uri` and run the handshake, all within `deadline`.
pub fn connect(uri: &NbdUri, timeout: Duration) -> Result<Session, ConnectError> {
    let name = uri.to_string();
    if uri.tls {
        return Err(ConnectError::TlsUnsupported { uri: name });
    }
    let deadline = Instant::now() + timeout;
    let unreachable = |source| ConnectError::Unreachable {
        uri: name.clone(),
        source,
    };
    let mut socket = match &uri.address {
        Address::Tcp { host, port } => {
            let addrs: Vec<_> = (host.as_str(), *port)
                .to_socket_addrs()
                .map_err(unreachable)?
                .collect();
            let mut last = io::Error::new(io::ErrorKind::NotFound, "host has no address");
            let mut stream = None;
            for addr in addrs {
                let left = deadline.saturating_duration_since(Instant::now());
                match TcpStream::connect_timeout(&addr, left.max(Duration::from_millis(1))) {
                    Ok(s) => {
                        stream = Some(s);
                        break;
                    }
                    Err(e) => last = e,
                }
            }
            let stream = stream.ok_or_else(|| unreachable(last))?;
            stream.set_nodelay(true).map_err(unreachable)?;
            Socket::Tcp(stream)
        }
        Address::Unix(path) => Socket::Unix(UnixStream::connect(path).map_err(unreachable)?),
    };
    let negotiated =
        handshake(&mut socket, uri, &name, deadline).map_err(|e| e.with_timeout(timeout))?;
    let io_err = |source| ConnectError::Io {
        uri: name.clone(),
        source,
    };
    socket.set_timeouts(None).map_err(io_err)?;
    socket.set_nonblocking(true).map_err(io_err)?;
    Ok(Session {
        socket,
        info: ExportInfo::from_negotiated(&negotiated),
    })
}

fn handshake(
    socket: &mut Socket,
    uri: &NbdUri,
    name: &str,
    deadline: Instant,
) -> Result<ClientNegotiated, ConnectError> {
    let mut hs = ClientHandshake::new(ClientConfig {
        export: uri.export.clone(),
        tls: false,
        structured_replies: true,
        meta_contexts: Vec::new(),
    });
    let mut buf = vec![0u8; 64 * 1024];
    let timed_out = || ConnectError::HandshakeTimeout {
        uri: name.to_string(),
        seconds: 0.0,
    };
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(timed_out());
        }
        socket
            .set_timeouts(Some(left))
            .map_err(|source| ConnectError::Io {
                uri: name.to_string(),
                source,
            })?;
        let out = hs.take_output();
        if !out.is_empty() {
            socket.write_all(&out).map_err(|e| io_failure(e, name))?;
        }
        let want = hs.bytes_wanted().min(buf.len());
        if want == 0 {
            // StartTls would wait here; TLS was refused above.
            return Err(ConnectError::Protocol {
                uri: name.to_string(),
                source: ProtocolError::Malformed("handshake stalled"),
            });
        }
        let n = socket
            .read(&mut buf[..want])
            .map_err(|e| io_failure(e, name))?;
        if n == 0 {
            return Err(ConnectError::ClosedInHandshake {
                uri: name.to_string(),
            });
        }
        let mut fed = 0;
        while fed < n {
            let (taken, event) = hs
                .receive(&buf[fed..n])
                .map_err(|source| refusal(source, uri, name))?;
            fed += taken;
            match event {
                Some(ClientEvent::Ready(negotiated)) => {
                    let out = hs.take_output();
                    if !out.is_empty() {
                        socket.write_all(&out).map_err(|e| io_failure(e, name))?;
                    }
                    return Ok(negotiated);
                }
                Some(ClientEvent::StartTls) => {
                    return Err(ConnectError::TlsUnsupported {
                        uri: name.to_string(),
                    })
                }
                None => {}
            }
            if taken == 0 {
                break;
            }
        }
    }
}

fn io_failure(e: io::Error, name: &str) -> ConnectError {
    match e.kind() {
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => ConnectError::HandshakeTimeout {
            uri: name.to_string(),
            seconds: 0.0,
        },
        io::ErrorKind::UnexpectedEof
        | io::ErrorKind::ConnectionReset
        | io::ErrorKind::BrokenPipe => ConnectError::ClosedInHandshake {
            uri: name.to_string(),
        },
        _ => ConnectError::Io {
            uri: name.to_string(),
            source: e,
        },
    }
}

fn refusal(source: ProtocolError, uri: &NbdUri, name: &str) -> ConnectError {
    use nvraid_nbd::consts::{opt, rep};
    match source {
        ProtocolError::Refused {
            option,
            reply,
            message,
        } if (option == opt::GO || option == opt::EXPORT_NAME)
            && (reply == rep::ERR_UNKNOWN
                || reply == rep::ERR_UNSUP
                || reply == rep::ERR_INVALID) =>
        {
            ConnectError::NoSuchExport {
                uri: name.to_string(),
                export: uri.export.clone(),
                detail: if message.is_empty() {
                    format!("reply {reply:#x}")
                } else {
                    message
                },
            }
        }
        source => ConnectError::Protocol {
            uri: name.to_string(),
            source,
        },
    }
}
