//! Listening sockets and accepted streams, Unix or TCP.

use std::io::{self, Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::PathBuf;
use std::time::Duration;

use crate::error::Error;
use crate::options::ListenAddress;

/// A bound listener.
#[derive(Debug)]
pub(crate) enum Listener {
    Unix(UnixListener, PathBuf),
    Tcp(TcpListener),
}

/// Bind a Unix socket that is already listening when its path appears.
///
/// `UnixListener::bind` makes the path at `bind(2)` and only then calls
/// `listen(2)`: a client that waits for the path and connects in between
/// is refused. The socket is bound under a private name beside `path` and
/// linked into place once it listens, so whoever sees `path` can connect.
pub(crate) fn bind_unix(path: &std::path::Path) -> io::Result<UnixListener> {
    let name = path
        .file_name()
        .map_or_else(|| std::ffi::OsString::from("socket"), |n| n.to_os_string());
    let mut hidden = std::ffi::OsString::from(".");
    hidden.push(&name);
    hidden.push(format!(".{}.binding", std::process::id()));
    let temporary = path.with_file_name(hidden);
    let _ = std::fs::remove_file(&temporary);
    let listener = UnixListener::bind(&temporary)?;
    // A link, not a rename: it never replaces what may have appeared at
    // `path` since it was checked (that fails, as bind(2) would).
    let linked = std::fs::hard_link(&temporary, path);
    let _ = std::fs::remove_file(&temporary);
    linked.map(|()| listener)
}

impl Listener {
    pub(crate) fn bind(address: &ListenAddress) -> Result<Listener, Error> {
        let fail = |source| Error::Listen {
            address: address.to_string(),
            source,
        };
        match address {
            ListenAddress::Unix(path) => {
                remove_stale_socket(path);
                bind_unix(path)
                    .map(|l| Listener::Unix(l, path.clone()))
                    .map_err(fail)
            }
            ListenAddress::Tcp(host_port) => TcpListener::bind(host_port)
                .map(Listener::Tcp)
                .map_err(fail),
        }
    }

    /// The address actually bound (with the real port for port 0).
    pub(crate) fn local(&self) -> ListenAddress {
        match self {
            Listener::Unix(_, path) => ListenAddress::Unix(path.clone()),
            Listener::Tcp(l) => {
                ListenAddress::Tcp(l.local_addr().map_or(String::new(), |a| a.to_string()))
            }
        }
    }

    /// Accept one client, naming it for log lines.
    pub(crate) fn accept(&self, id: u64) -> io::Result<(Stream, String)> {
        match self {
            Listener::Unix(l, path) => {
                let (s, _) = l.accept()?;
                Ok((Stream::Unix(s), format!("unix:{}#{id}", path.display())))
            }
            Listener::Tcp(l) => {
                let (s, peer) = l.accept()?;
                s.set_nodelay(true)?;
                Ok((Stream::Tcp(s), format!("tcp:{peer}#{id}")))
            }
        }
    }

    /// Make a blocked `accept` return (used on shutdown): the listening
    /// socket is shut down, which wakes `accept` even when the socket's
    /// path was removed meanwhile (a connection to ourselves, the old way,
    /// then cannot reach it).
    pub(crate) fn poke(&self) {
        use std::os::fd::AsRawFd;
        let fd = match self {
            Listener::Unix(l, _) => l.as_raw_fd(),
            Listener::Tcp(l) => l.as_raw_fd(),
        };
        nvraid_io::sys::shutdown_socket(fd);
    }
}

impl Drop for Listener {
    fn drop(&mut self) {
        if let Listener::Unix(_, path) = self {
            let _ = std::fs::remove_file(path);
        }
    }
}

/// Remove a socket file left by a previous run (never a regular file).
fn remove_stale_socket(path: &std::path::Path) {
    use std::os::unix::fs::FileTypeExt;
    let is_socket = std::fs::symlink_metadata(path).is_ok_and(|m| m.file_type().is_socket());
    if is_socket && UnixStream::connect(path).is_err() {
        let _ = std::fs::remove_file(path);
    }
}

/// A connected stream.
#[derive(Debug)]
pub(crate) enum Stream {
    Unix(UnixStream),
    Tcp(TcpStream),
}

impl Stream {
    pub(crate) fn try_clone(&self) -> io::Result<Stream> {
        match self {
            Stream::Unix(s) => s.try_clone().map(Stream::Unix),
            Stream::Tcp(s) => s.try_clone().map(Stream::Tcp),
        }
    }

    pub(crate) fn shutdown(&self, how: Shutdown) {
        let _ = match self {
            Stream::Unix(s) => s.shutdown(how),
            Stream::Tcp(s) => s.shutdown(how),
        };
    }

    pub(crate) fn set_nonblocking(&self, on: bool) -> io::Result<()> {
        match self {
            Stream::Unix(s) => s.set_nonblocking(on),
            Stream::Tcp(s) => s.set_nonblocking(on),
        }
    }

    pub(crate) fn raw_fd(&self) -> std::os::fd::RawFd {
        use std::os::fd::AsRawFd;
        match self {
            Stream::Unix(s) => s.as_raw_fd(),
            Stream::Tcp(s) => s.as_raw_fd(),
        }
    }

    /// readv(2) through a shared reference (a worker's own connection).
    pub(crate) fn recv_vectored(&self, bufs: &mut [io::IoSliceMut<'_>]) -> io::Result<usize> {
        match self {
            Stream::Unix(s) => (&*s).read_vectored(bufs),
            Stream::Tcp(s) => (&*s).read_vectored(bufs),
        }
    }

    /// writev(2) through a shared reference. A peer that closed gives
    /// EPIPE (Rust programs ignore SIGPIPE).
    pub(crate) fn send_vectored(&self, bufs: &[io::IoSlice<'_>]) -> io::Result<usize> {
        match self {
            Stream::Unix(s) => (&*s).write_vectored(bufs),
            Stream::Tcp(s) => (&*s).write_vectored(bufs),
        }
    }

    pub(crate) fn set_read_timeout(&self, timeout: Option<Duration>) -> io::Result<()> {
        match self {
            Stream::Unix(s) => s.set_read_timeout(timeout),
            Stream::Tcp(s) => s.set_read_timeout(timeout),
        }
    }
}

impl Read for Stream {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            Stream::Unix(s) => s.read(buf),
            Stream::Tcp(s) => s.read(buf),
        }
    }
}

impl Write for Stream {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self {
            Stream::Unix(s) => s.write(buf),
            Stream::Tcp(s) => s.write(buf),
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_unix_socket_answers_as_soon_as_its_path_is_there_and_leaves_nothing_else() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.sock");
        let listener = bind_unix(&path).unwrap();
        UnixStream::connect(&path).unwrap();
        listener.accept().unwrap();
        let names: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, ["s.sock"]);
        // Something already at the path is left as it was.
        let file = dir.path().join("f");
        std::fs::write(&file, b"kept").unwrap();
        let err = bind_unix(&file).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::AlreadyExists, "{err}");
        assert_eq!(std::fs::read(&file).unwrap(), b"kept");
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 2);
    }
}
