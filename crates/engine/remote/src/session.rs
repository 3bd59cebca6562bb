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
    #[error(
        "{uri}: NBD over TLS needs the CA that signed the server's certificate: give --nbd-tls-ca FILE"
    )]
    TlsNotConfigured { uri: String },
    #[error("{uri}: TLS: {reason}")]
    Tls { uri: String, reason: String },
    #[error("{uri}: the server does not offer TLS, and the URI (nbds://) requires it")]
    TlsRefused { uri: String },
    /// A new connection reached a device that failed the member's
    /// identity check (see `identity`).
    #[error("{uri}: {reason}")]
    NotTheMember { uri: String, reason: String },
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
            ConnectError::NotTheMember { .. } => libc::ENXIO,
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

    fn try_clone_socket(&self) -> io::Result<Socket> {
        Ok(match self {
            Socket::Tcp(s) => Socket::Tcp(s.try_clone()?),
            Socket::Unix(s) => Socket::Unix(s.try_clone()?),
        })
    }

    pub fn set_nonblocking(&self, on: bool) -> io::Result<()> {
        match self {
            Socket::Tcp(s) => s.set_nonblocking(on),
            Socket::Unix(s) => s.set_nonblocking(on),
        }
    }

    /// Tried again on EINTR ([`again_if_interrupted`]).
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        again_if_interrupted(|| match self {
            Socket::Tcp(s) => s.read(buf),
            Socket::Unix(s) => s.read(buf),
        })
    }

    fn write_all(&mut self, buf: &[u8]) -> io::Result<()> {
        match self {
            Socket::Tcp(s) => s.write_all(buf),
            Socket::Unix(s) => s.write_all(buf),
        }
    }
}

/// `op`, tried again while it fails with EINTR. A socket call of this
/// crate's is cut short so when its thread is woken with no signal sent:
/// the io_uring of the thread's batches (`nvraid_io::batch`) runs its
/// task work that way, and a blocking socket call with a timeout (the
/// handshake's) then fails with EINTR instead of being restarted by the
/// kernel.
fn again_if_interrupted<T>(mut op: impl FnMut() -> io::Result<T>) -> io::Result<T> {
    loop {
        match op() {
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            done => return done,
        }
    }
}

impl Read for Socket {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        Socket::read(self, buf)
    }
}

impl Write for Socket {
    /// Tried again on EINTR ([`again_if_interrupted`]).
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        again_if_interrupted(|| match self {
            Socket::Tcp(s) => s.write(buf),
            Socket::Unix(s) => s.write(buf),
        })
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// A connection's byte stream: the socket itself, or TLS over it.
pub enum Transport {
    Plain(Socket),
    Tls(Box<rustls::ClientConnection>, Socket),
}

impl std::fmt::Debug for Transport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Transport::Plain(s) => write!(f, "Plain({})", s.raw_fd()),
            Transport::Tls(_, s) => write!(f, "Tls({})", s.raw_fd()),
        }
    }
}

/// Bytes rustls holds for sending before `send_vectored` takes less (its
/// buffer limit, set when TLS starts).
const TLS_SEND_BUFFER_BYTES: usize = 1 << 20;

impl Transport {
    pub fn raw_fd(&self) -> RawFd {
        match self {
            Transport::Plain(s) | Transport::Tls(_, s) => s.raw_fd(),
        }
    }

    pub fn is_tls(&self) -> bool {
        matches!(self, Transport::Tls(..))
    }

    /// Whether ciphertext waits for the socket.
    pub fn wants_write(&self) -> bool {
        matches!(self, Transport::Tls(c, _) if c.wants_write())
    }

    /// Blocking read (the handshake).
    fn read_blocking(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            Transport::Plain(s) => s.read(buf),
            Transport::Tls(c, s) => rustls::Stream::new(c.as_mut(), s).read(buf),
        }
    }

    /// Blocking write of all of `buf` (the handshake).
    fn write_all_blocking(&mut self, buf: &[u8]) -> io::Result<()> {
        match self {
            Transport::Plain(s) => s.write_all(buf),
            Transport::Tls(c, s) => {
                let mut stream = rustls::Stream::new(c.as_mut(), s);
                stream.write_all(buf)?;
                stream.flush()
            }
        }
    }

    /// Send ciphertext rustls has queued, without blocking.
    pub fn flush_tls(&mut self) -> io::Result<()> {
        if let Transport::Tls(c, s) = self {
            while c.wants_write() {
                match c.write_tls(s) {
                    Ok(_) => {}
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(()),
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                    Err(e) => return Err(e),
                }
            }
        }
        Ok(())
    }

    /// Non-blocking vectored send: bytes taken (WouldBlock when none).
    ///
    /// # Safety
    /// Every iovec must describe memory valid for reads of its length.
    pub unsafe fn send_vectored(&mut self, iov: &[libc::iovec]) -> io::Result<usize> {
        match self {
            // SAFETY: forwarded from the caller.
            Transport::Plain(s) => unsafe { nvraid_io::sys::send_vectored(s.raw_fd(), iov) },
            Transport::Tls(c, _) => {
                let mut taken = 0;
                for v in iov {
                    // SAFETY: the caller's iovec is valid for reads.
                    let bytes =
                        unsafe { std::slice::from_raw_parts(v.iov_base.cast::<u8>(), v.iov_len) };
                    let n = c.writer().write(bytes)?;
                    taken += n;
                    if n < bytes.len() {
                        break;
                    }
                }
                self.flush_tls()?;
                if taken == 0 {
                    return Err(io::ErrorKind::WouldBlock.into());
                }
                Ok(taken)
            }
        }
    }

    /// Non-blocking read into `buf`: bytes read (0: the peer closed).
    pub fn recv(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            Transport::Plain(s) => {
                let iov = [libc::iovec {
                    iov_base: buf.as_mut_ptr().cast(),
                    iov_len: buf.len(),
                }];
                // SAFETY: the iovec covers `buf`.
                unsafe { nvraid_io::sys::readv(s.raw_fd(), &iov) }
            }
            Transport::Tls(c, s) => loop {
                match c.reader().read(buf) {
                    Ok(n) => return Ok(n),
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                    Err(e) => return Err(e),
                }
                match c.read_tls(s) {
                    Ok(0) => return Ok(0),
                    Ok(_) => {
                        c.process_new_packets()
                            .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
                        if c.wants_write() {
                            let _ = c.write_tls(s);
                        }
                    }
                    Err(e) => return Err(e),
                }
            },
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
    pub transport: Transport,
    pub info: ExportInfo,
}

/// Connect to `uri` and run the handshake, all within `deadline`.
pub fn connect(uri: &NbdUri, timeout: Duration) -> Result<Session, ConnectError> {
    let name = uri.to_string();
    let tls = match uri.tls {
        true => Some(
            crate::tls::client_config()
                .ok_or(ConnectError::TlsNotConfigured { uri: name.clone() })?,
        ),
        false => None,
    };
    let deadline = Instant::now() + timeout;
    let unreachable = |source| ConnectError::Unreachable {
        uri: name.clone(),
        source,
    };
    let socket = match &uri.address {
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
        Address::Unix(path) => {
            Socket::Unix(again_if_interrupted(|| UnixStream::connect(path)).map_err(unreachable)?)
        }
    };
    let mut transport = Transport::Plain(socket);
    let negotiated = handshake(&mut transport, uri, &name, deadline, tls)
        .map_err(|e| e.with_timeout(timeout))?;
    let io_err = |source| ConnectError::Io {
        uri: name.clone(),
        source,
    };
    let socket = match &transport {
        Transport::Plain(s) | Transport::Tls(_, s) => s,
    };
    socket.set_timeouts(None).map_err(io_err)?;
    socket.set_nonblocking(true).map_err(io_err)?;
    Ok(Session {
        transport,
        info: ExportInfo::from_negotiated(&negotiated),
    })
}

fn handshake(
    socket: &mut Transport,
    uri: &NbdUri,
    name: &str,
    deadline: Instant,
    tls: Option<std::sync::Arc<rustls::ClientConfig>>,
) -> Result<ClientNegotiated, ConnectError> {
    let mut hs = ClientHandshake::new(ClientConfig {
        export: uri.export.clone(),
        tls: tls.is_some(),
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
        let raw = match socket {
            Transport::Plain(s) | Transport::Tls(_, s) => s,
        };
        raw.set_timeouts(Some(left))
            .map_err(|source| ConnectError::Io {
                uri: name.to_string(),
                source,
            })?;
        let out = hs.take_output();
        if !out.is_empty() {
            socket
                .write_all_blocking(&out)
                .map_err(|e| io_failure(e, name))?;
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
            .read_blocking(&mut buf[..want])
            .map_err(|e| io_failure(e, name))?;
        if n == 0 {
            return Err(ConnectError::ClosedInHandshake {
                uri: name.to_string(),
            });
        }
        if let Some(negotiated) = feed_handshake(&mut hs, socket, &buf[..n], &tls, uri, name)? {
            return Ok(negotiated);
        }
    }
}

/// Hands `received` to the handshake: the export as negotiated once it is
/// ready (its last output sent), or None while it wants more. TLS is
/// started where the server accepted STARTTLS.
fn feed_handshake(
    hs: &mut ClientHandshake,
    socket: &mut Transport,
    received: &[u8],
    tls: &Option<std::sync::Arc<rustls::ClientConfig>>,
    uri: &NbdUri,
    name: &str,
) -> Result<Option<ClientNegotiated>, ConnectError> {
    let n = received.len();
    let mut fed = 0;
    while fed < n {
        let (taken, event) = hs
            .receive(&received[fed..n])
            .map_err(|source| refusal(source, uri, name))?;
        fed += taken;
        match event {
            Some(ClientEvent::Ready(negotiated)) => {
                let out = hs.take_output();
                if !out.is_empty() {
                    socket
                        .write_all_blocking(&out)
                        .map_err(|e| io_failure(e, name))?;
                }
                return Ok(Some(negotiated));
            }
            Some(ClientEvent::StartTls) => {
                let Some(config) = tls.clone() else {
                    panic!("invariant: the handshake starts TLS only when TLS was asked for");
                };
                start_tls(socket, config, uri, name)?;
                hs.tls_started();
                // Whatever came after the ACK is ciphertext.
                if fed + taken < n {
                    return Err(ConnectError::Protocol {
                        uri: name.to_string(),
                        source: ProtocolError::Malformed("plaintext after STARTTLS"),
                    });
                }
                break;
            }
            None => {}
        }
        if taken == 0 {
            break;
        }
    }
    Ok(None)
}

/// Turn the plain socket into TLS and run the TLS handshake (blocking,
/// within the socket's timeouts).
fn start_tls(
    transport: &mut Transport,
    config: std::sync::Arc<rustls::ClientConfig>,
    uri: &NbdUri,
    name: &str,
) -> Result<(), ConnectError> {
    let server_name = crate::tls::server_name(uri).map_err(|reason| ConnectError::Tls {
        uri: name.to_string(),
        reason,
    })?;
    let conn =
        rustls::ClientConnection::new(config, server_name).map_err(|e| ConnectError::Tls {
            uri: name.to_string(),
            reason: e.to_string(),
        })?;
    let placeholder = Transport::Plain(match transport {
        Transport::Plain(s) => s.try_clone_socket().map_err(|source| ConnectError::Io {
            uri: name.to_string(),
            source,
        })?,
        Transport::Tls(..) => {
            return Err(ConnectError::Protocol {
                uri: name.to_string(),
                source: ProtocolError::Malformed("STARTTLS twice"),
            })
        }
    });
    let Transport::Plain(socket) = std::mem::replace(transport, placeholder) else {
        unreachable!()
    };
    let mut conn = Box::new(conn);
    conn.set_buffer_limit(Some(TLS_SEND_BUFFER_BYTES));
    let mut socket = socket;
    while conn.is_handshaking() {
        if let Err(e) = conn.complete_io(&mut socket) {
            return Err(ConnectError::Tls {
                uri: name.to_string(),
                reason: e.to_string(),
            });
        }
    }
    *transport = Transport::Tls(conn, socket);
    Ok(())
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
