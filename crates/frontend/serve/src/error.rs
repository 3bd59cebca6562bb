//! The server's error type.

use std::io;

/// Why the server could not start or stopped abnormally.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    #[error("cannot listen on {address}: {source}")]
    Listen { address: String, source: io::Error },
    #[error("cannot open an I/O queue on the target: {0}")]
    OpenQueue(io::Error),
    #[error("TLS setup: {0}")]
    Tls(String),
    #[error("invalid option: {0}")]
    Options(String),
    #[error("control socket: {0}")]
    Control(String),
    #[error("final flush failed: {0:?}")]
    Flush(nvraid_nbd::ErrorCode),
    #[error("{0}")]
    Ublk(String),
    #[error("I/O error: {0}")]
    Io(#[from] io::Error),
}
