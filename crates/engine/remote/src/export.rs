//! A remote member: the export's URI and what the server agreed to, the
//! connection the simple (synchronous) path uses, and new channels for
//! the fast path's workers.

use crate::channel::{single_op, NbdChannel, RemoteOptions};
use crate::identity::Identity;
use crate::session::{ConnectError, ExportInfo};
use crate::shared::{SharedConnection, SharedHandle};
use crate::uri::{NbdUri, UriError};
use nvraid_io::engine::MemberOpKind;
use nvraid_io::remote::{Channel, IdentityCheck, RemoteFile};
use std::io;
use std::sync::{Arc, Mutex};

/// Why an export cannot be a member.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RemoteError {
    #[error(transparent)]
    Uri(#[from] UriError),
    #[error(transparent)]
    Connect(#[from] ConnectError),
    #[error("{uri}: the export is read-only, and the array needs to write to it")]
    ReadOnly { uri: String },
    #[error(
        "{uri}: the server does not support FLUSH, so writes it acknowledged can be lost when it \
         crashes or loses power (the array would report them durable); refused for a writable \
         array (--unsafe-no-flush accepts that risk)"
    )]
    NoFlush { uri: String },
}

/// An NBD export used as a member.
pub struct RemoteExport {
    uri: NbdUri,
    info: ExportInfo,
    options: RemoteOptions,
    sync: Mutex<Option<NbdChannel>>,
    /// Without CAN_MULTI_CONN: the one connection every user shares, and
    /// the simple path's handle on it.
    shared: Option<(Arc<SharedConnection>, Mutex<SharedHandle>)>,
    /// What every later connection must prove (shared with its channels).
    identity: Arc<Identity>,
}

impl std::fmt::Debug for RemoteExport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RemoteExport")
            .field("uri", &self.uri.to_string())
            .field("shared_connection", &self.shared.is_some())
            .finish()
    }
}

impl RemoteExport {
    /// Connect to `spec` (an NBD URI), learn the export, and keep the
    /// connection for the simple path.
    pub fn open(
        spec: &str,
        write: bool,
        allow_no_flush: bool,
        options: RemoteOptions,
    ) -> Result<RemoteExport, RemoteError> {
        let uri = NbdUri::parse(spec)?;
        let identity = Arc::new(Identity::default());
        let channel = NbdChannel::connect(&uri, options, None)?.with_identity(&identity);
        let info = channel.info().clone();
        if write && info.read_only() {
            return Err(RemoteError::ReadOnly {
                uri: uri.to_string(),
            });
        }
        if write && !info.can_flush() && !allow_no_flush {
            return Err(RemoteError::NoFlush {
                uri: uri.to_string(),
            });
        }
        // Without CAN_MULTI_CONN, a FLUSH on one connection need not cover
        // writes made on another: every user shares this one connection.
        let (sync, shared) = if info.can_multi_conn() {
            (Some(channel), None)
        } else {
            let connection = SharedConnection::new(channel);
            let handle = connection.handle().map_err(|source| ConnectError::Io {
                uri: uri.to_string(),
                source,
            })?;
            (None, Some((connection, Mutex::new(handle))))
        };
        Ok(RemoteExport {
            uri,
            info,
            options,
            sync: Mutex::new(sync),
            shared,
            identity,
        })
    }

    /// From now on, every new connection to the export (the simple path's,
    /// each worker's, a reconnection) must pass `check` before any request
    /// is sent on it. The connection open now was the one the caller
    /// checked itself.
    pub fn set_identity_check(&self, check: Arc<dyn IdentityCheck>) {
        self.identity.set(check);
    }

    /// Why the last new connection was refused as not this member (a
    /// different device answered at the address), if it was.
    pub fn identity_refused(&self) -> Option<String> {
        self.identity.refused()
    }

    /// Close the simple path's connection (the member left the array; a
    /// later operation connects again).
    pub fn close(&self) {
        *self.sync.lock().unwrap_or_else(|e| e.into_inner()) = None;
    }

    /// Whether every user shares one connection (the server did not
    /// advertise CAN_MULTI_CONN).
    pub fn shares_one_connection(&self) -> bool {
        self.shared.is_some()
    }

    pub fn uri(&self) -> &NbdUri {
        &self.uri
    }

    pub fn info(&self) -> &ExportInfo {
        &self.info
    }

    pub fn options(&self) -> RemoteOptions {
        self.options
    }

    /// One operation on the simple path's connection, waited for.
    fn sync_op(
        &self,
        kind: MemberOpKind,
        buf: *mut u8,
        len: usize,
        offset: u64,
        dsync: bool,
    ) -> io::Result<()> {
        let op = single_op(kind, offset, buf, len, dsync);
        let mut result = None;
        if let Some((_, handle)) = &self.shared {
            let mut handle = handle.lock().unwrap_or_else(|e| e.into_inner());
            // SAFETY: `buf` is valid for `len` bytes for the whole call, and
            // the call waits for the operation to complete.
            unsafe { handle.push(&op) }?;
            handle.wait_all(&mut |_, r| result = Some(r));
        } else {
            let mut guard = self.sync.lock().unwrap_or_else(|e| e.into_inner());
            let channel = match &mut *guard {
                Some(channel) => channel,
                None => guard.insert(
                    NbdChannel::connect_as(&self.uri, self.options, &self.info, &self.identity)
                        .map_err(|e| io::Error::from_raw_os_error(e.errno()))?,
                ),
            };
            // SAFETY: as above.
            unsafe { channel.push(&op) }?;
            channel.wait_all(&mut |_, r| result = Some(r));
        }
        match result {
            Some(r) if r < 0 => Err(io::Error::from_raw_os_error(-r)),
            Some(_) => Ok(()),
            None => Err(io::Error::other("operation lost")),
        }
    }

    fn check_range(&self, offset: u64, len: usize) -> io::Result<()> {
        let end = offset.checked_add(len as u64);
        if end.is_none_or(|end| end > self.info.size_bytes) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "{}: I/O at {offset}+{len} is past the end ({} bytes)",
                    self.uri, self.info.size_bytes
                ),
            ));
        }
        Ok(())
    }

    /// Operations longer than this are cut (the channel splits too, but
    /// `MemberOp::len` is a u32).
    const SYNC_PIECE: usize = 16 << 20;

    pub fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        self.check_range(offset, buf.len())?;
        for (i, piece) in buf.chunks_mut(Self::SYNC_PIECE).enumerate() {
            let at = offset + (i * Self::SYNC_PIECE) as u64;
            self.sync_op(
                MemberOpKind::Read,
                piece.as_mut_ptr(),
                piece.len(),
                at,
                false,
            )?;
        }
        Ok(())
    }

    pub fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        self.check_range(offset, buf.len())?;
        for (i, piece) in buf.chunks(Self::SYNC_PIECE).enumerate() {
            let at = offset + (i * Self::SYNC_PIECE) as u64;
            // The channel only reads from a write's buffer.
            self.sync_op(
                MemberOpKind::Write,
                piece.as_ptr().cast_mut(),
                piece.len(),
                at,
                false,
            )?;
        }
        Ok(())
    }

    pub fn flush(&self) -> io::Result<()> {
        if !self.info.can_flush() {
            return Ok(());
        }
        self.sync_op(MemberOpKind::Flush, std::ptr::null_mut(), 0, 0, false)
    }

    /// Make a range read as zeros: NBD_CMD_WRITE_ZEROES where the export
    /// takes it (the server may free the space, but reads must return
    /// zeros), explicit zero writes otherwise. Never TRIM: NBD's TRIM
    /// promises nothing about what reads return, and mirrored members must
    /// read alike.
    pub fn zero(&self, offset: u64, len: u64) -> io::Result<()> {
        self.check_range(offset, len as usize)?;
        if self.info.can_write_zeroes() {
            // The channel splits each piece at the server's maximum.
            const PIECE: u64 = 1 << 30;
            let mut at = 0u64;
            while at < len {
                let n = (len - at).min(PIECE);
                let target = offset + at;
                self.sync_op(
                    MemberOpKind::Zero,
                    std::ptr::null_mut(),
                    n as usize,
                    target,
                    false,
                )?;
                at += n;
            }
            return Ok(());
        }
        let zeros = vec![0u8; (len as usize).min(1 << 20)];
        let mut at = 0u64;
        while at < len {
            let n = (len - at).min(zeros.len() as u64) as usize;
            self.write_at(&zeros[..n], offset + at)?;
            at += n as u64;
        }
        Ok(())
    }
}

impl RemoteFile for RemoteExport {
    fn open_channel(&self) -> io::Result<Box<dyn Channel>> {
        if let Some((connection, _)) = &self.shared {
            return Ok(Box::new(connection.handle()?));
        }
        // It connects at its first operation: a worker opened beside a
        // member that failed must not wait on that member's server.
        Ok(Box::new(
            NbdChannel::unconnected(&self.uri, self.options, self.info.clone())
                .with_identity(&self.identity),
        ))
    }
}
