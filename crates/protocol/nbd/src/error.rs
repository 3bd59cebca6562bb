//! Errors: the protocol's error values (one mapping from errno, here and
//! nowhere else) and this crate's own parse/handshake errors.

use std::io;

/// An error value the protocol allows in a reply (proto.md, "Error values").
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ErrorCode {
    /// EPERM: the export is read-only.
    NotPermitted,
    /// EIO: the storage failed.
    Io,
    /// ENOMEM: the server could not allocate (avoided where possible).
    NoMemory,
    /// EINVAL: malformed, unaligned or unknown request.
    Invalid,
    /// ENOSPC: a write past the end of the export.
    NoSpace,
    /// EOVERFLOW: the request is longer than the server accepts.
    Overflow,
    /// ENOTSUP: the operation is not supported (fast zero).
    NotSupported,
    /// ESHUTDOWN: the server is shutting down.
    Shutdown,
}

impl ErrorCode {
    /// The number sent on the wire.
    pub fn value(self) -> u32 {
        match self {
            ErrorCode::NotPermitted => 1,
            ErrorCode::Io => 5,
            ErrorCode::NoMemory => 12,
            ErrorCode::Invalid => 22,
            ErrorCode::NoSpace => 28,
            ErrorCode::Overflow => 75,
            ErrorCode::NotSupported => 95,
            ErrorCode::Shutdown => 108,
        }
    }

    /// Decode a wire value; unknown non-zero values read as `Io` by the
    /// caller's choice, so this returns `None` for them.
    pub fn from_value(value: u32) -> Option<ErrorCode> {
        let code = match value {
            1 => ErrorCode::NotPermitted,
            5 => ErrorCode::Io,
            12 => ErrorCode::NoMemory,
            22 => ErrorCode::Invalid,
            28 => ErrorCode::NoSpace,
            75 => ErrorCode::Overflow,
            95 => ErrorCode::NotSupported,
            108 => ErrorCode::Shutdown,
            _ => return None,
        };
        Some(code)
    }

    /// Map a local errno to the protocol's value. This is the only place
    /// the server turns storage errors into wire errors.
    pub fn from_errno(errno: i32) -> ErrorCode {
        match errno {
            libc::EPERM | libc::EACCES | libc::EROFS => ErrorCode::NotPermitted,
            libc::ENOMEM => ErrorCode::NoMemory,
            libc::EINVAL => ErrorCode::Invalid,
            libc::ENOSPC | libc::EDQUOT | libc::EFBIG => ErrorCode::NoSpace,
            libc::EOVERFLOW => ErrorCode::Overflow,
            libc::EOPNOTSUPP => ErrorCode::NotSupported,
            libc::ESHUTDOWN => ErrorCode::Shutdown,
            _ => ErrorCode::Io,
        }
    }

    /// Map an `io::Error` (EIO when it carries no errno).
    pub fn from_io_error(error: &io::Error) -> ErrorCode {
        error
            .raw_os_error()
            .map_or(ErrorCode::Io, ErrorCode::from_errno)
    }

    /// The errno this value stands for on Linux (for clients).
    pub fn to_errno(self) -> i32 {
        self.value() as i32
    }
}

/// Why a handshake or a message could not be decoded. A peer that causes
/// one of these is disconnected (the protocol's "hard disconnect").
#[derive(Clone, Debug, thiserror::Error, PartialEq, Eq)]
#[non_exhaustive]
pub enum ProtocolError {
    #[error("bad magic: expected {expected:#x}, found {found:#x}")]
    BadMagic { expected: u64, found: u64 },
    #[error("client sent unknown flags {0:#x}")]
    UnknownClientFlags(u32),
    #[error("option {option} carries {length_bytes} bytes, more than the {max_bytes} allowed")]
    OptionTooLong {
        option: u32,
        length_bytes: u32,
        max_bytes: u32,
    },
    #[error("more than {0} options in one handshake")]
    TooManyOptions(u32),
    #[error("client chose export {0:?}, which does not exist")]
    UnknownExport(String),
    #[error("client tried to skip TLS, which this server requires")]
    TlsRequired,
    #[error("input after the handshake ended")]
    HandshakeFinished,
    #[error("malformed message: {0}")]
    Malformed(&'static str),
    #[error("server refused option {option} with reply {reply:#x}: {message}")]
    Refused {
        option: u32,
        reply: u32,
        message: String,
    },
    #[error("server sent reply {reply:#x} to option {option}, which was not expected")]
    UnexpectedReply { option: u32, reply: u32 },
}
