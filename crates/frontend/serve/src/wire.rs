//! A connection's byte stream as its worker uses it after the handshake:
//! non-blocking, plaintext or TLS. With TLS, rustls decrypts into the
//! caller's buffers (a write's payload still lands in its slot) and
//! encrypts replies as the socket takes them.

use std::io::{self, IoSlice, IoSliceMut, Read, Write};
use std::net::Shutdown;

use rustls::ServerConnection;

use crate::stream::Stream;

pub(crate) struct Wire {
    stream: Stream,
    tls: Option<Box<ServerConnection>>,
}

/// The socket as `Read`/`Write` through a shared reference, for rustls.
struct Socket<'a>(&'a Stream);

impl Read for Socket<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.0.recv_vectored(&mut [IoSliceMut::new(buf)])
    }
}

impl Write for Socket<'_> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.0.send_vectored(&[IoSlice::new(buf)])
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl Wire {
    pub(crate) fn new(stream: Stream, tls: Option<Box<ServerConnection>>) -> io::Result<Wire> {
        stream.set_nonblocking(true)?;
        Ok(Wire { stream, tls })
    }

    pub(crate) fn raw_fd(&self) -> std::os::fd::RawFd {
        self.stream.raw_fd()
    }

    /// Bytes received into `bufs` (0: the client closed); WouldBlock when
    /// nothing is there yet.
    pub(crate) fn recv(&mut self, bufs: &mut [IoSliceMut<'_>]) -> io::Result<usize> {
        let Some(tls) = self.tls.as_mut() else {
            return self.stream.recv_vectored(bufs);
        };
        loop {
            match tls.reader().read_vectored(bufs) {
                // 0: the client's close_notify.
                Ok(n) => return Ok(n),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                // The socket ended without close_notify.
                Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(0),
                Err(e) => return Err(e),
            }
            // No plaintext yet: take in more ciphertext (WouldBlock when
            // the socket has none).
            tls.read_tls(&mut Socket(&self.stream))?;
            if let Err(e) = tls.process_new_packets() {
                // Tell the client why (an alert), as far as the socket takes it.
                let _ = tls.write_tls(&mut Socket(&self.stream));
                return Err(io::Error::new(io::ErrorKind::InvalidData, e));
            }
        }
    }

    /// Bytes of `bufs` taken (sent, or with TLS encrypted and queued);
    /// WouldBlock when none could be.
    pub(crate) fn send(&mut self, bufs: &[IoSlice<'_>]) -> io::Result<usize> {
        let Some(tls) = self.tls.as_mut() else {
            return self.stream.send_vectored(bufs);
        };
        flush_tls(tls, &self.stream)?;
        let taken = tls.writer().write_vectored(bufs)?;
        match flush_tls(tls, &self.stream) {
            Err(e) if e.kind() != io::ErrorKind::WouldBlock => return Err(e),
            _ => {}
        }
        if taken == 0 {
            return Err(io::ErrorKind::WouldBlock.into());
        }
        Ok(taken)
    }

    /// Whether encrypted bytes wait for the socket.
    pub(crate) fn wants_write(&self) -> bool {
        self.tls.as_ref().is_some_and(|tls| tls.wants_write())
    }

    /// Send what TLS has queued (WouldBlock when the socket is full).
    pub(crate) fn flush(&mut self) -> io::Result<()> {
        match self.tls.as_mut() {
            Some(tls) => flush_tls(tls, &self.stream),
            None => Ok(()),
        }
    }

    /// The end: a TLS close_notify (as far as the socket takes it), then
    /// both directions shut.
    pub(crate) fn close(&mut self) {
        if let Some(tls) = self.tls.as_mut() {
            tls.send_close_notify();
            let _ = flush_tls(tls, &self.stream);
        }
        self.stream.shutdown(Shutdown::Both);
    }
}

fn flush_tls(tls: &mut ServerConnection, stream: &Stream) -> io::Result<()> {
    while tls.wants_write() {
        tls.write_tls(&mut Socket(stream))?;
    }
    Ok(())
}
