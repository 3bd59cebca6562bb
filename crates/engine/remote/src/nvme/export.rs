//! An NVMe/TCP namespace used as a member: the controller and what it
//! offers, the simple path's I/O queue, and new channels for workers.

use super::channel::NvmeChannel;
use super::setup::NvmeError;
use super::target::{NvmeInfo, Target};
use super::uri::NvmeUri;
use crate::channel::{single_op, RemoteOptions};
use crate::uri::UriError;
use nvraid_io::engine::MemberOpKind;
use nvraid_io::remote::{Channel, IdentityCheck, RemoteFile};
use std::io;
use std::sync::{Arc, Mutex};

/// Why a namespace cannot be a member.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum NvmeOpenError {
    #[error(transparent)]
    Uri(#[from] UriError),
    #[error(transparent)]
    Connect(#[from] NvmeError),
}

/// An NVMe/TCP namespace used as a member.
pub struct NvmeExport {
    target: Arc<Target>,
    sync: Mutex<Option<NvmeChannel>>,
}

impl std::fmt::Debug for NvmeExport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NvmeExport")
            .field("uri", &self.target.uri.to_string())
            .finish()
    }
}

impl NvmeExport {
    /// Connect to `spec`'s controller (admin queue, Identify) within the
    /// connect timeout; the simple path's I/O queue connects at its first
    /// operation. Writes are made durable with FUA and Flush, which every
    /// NVMe controller has, so nothing here depends on `write`.
    pub fn open(spec: &str, options: RemoteOptions) -> Result<NvmeExport, NvmeOpenError> {
        let uri = NvmeUri::parse(spec)?;
        let target = Target::open(uri, options)?;
        Ok(NvmeExport {
            target,
            sync: Mutex::new(None),
        })
    }

    pub fn uri(&self) -> &NvmeUri {
        &self.target.uri
    }

    pub fn info(&self) -> &NvmeInfo {
        &self.target.info
    }

    /// The host NQN nvraid connects as.
    pub fn hostnqn(&self) -> &str {
        &self.target.hostnqn
    }

    pub fn options(&self) -> RemoteOptions {
        self.target.options
    }

    /// Every new I/O queue from now on must pass `check` before use.
    pub fn set_identity_check(&self, check: Arc<dyn IdentityCheck>) {
        self.target.identity.set(check);
    }

    /// Why the last new connection was refused as not this member.
    pub fn identity_refused(&self) -> Option<String> {
        self.target.identity.refused()
    }

    /// Close the simple path's I/O queue.
    pub fn close(&self) {
        *self.sync.lock().unwrap_or_else(|e| e.into_inner()) = None;
    }

    fn sync_op(&self, kind: MemberOpKind, buf: *mut u8, len: usize, offset: u64) -> io::Result<()> {
        let op = single_op(kind, offset, buf, len, false);
        let mut guard = self.sync.lock().unwrap_or_else(|e| e.into_inner());
        let channel = guard.get_or_insert_with(|| NvmeChannel::new(Arc::clone(&self.target)));
        let mut result = None;
        // SAFETY: `buf` is valid for `len` bytes for the whole call, and
        // the call waits for the operation to complete.
        unsafe { channel.push(&op) }?;
        channel.wait_all(&mut |_, r| result = Some(r));
        match result {
            Some(r) if r < 0 => {
                let errno = -r;
                Err(match channel.last_failure() {
                    Some(why) => io::Error::new(
                        io::Error::from_raw_os_error(errno).kind(),
                        format!("{why} ({})", io::Error::from_raw_os_error(errno)),
                    ),
                    None => io::Error::from_raw_os_error(errno),
                })
            }
            Some(_) => Ok(()),
            None => Err(io::Error::other("operation lost")),
        }
    }

    const SYNC_PIECE: usize = 16 << 20;

    pub fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        for (i, piece) in buf.chunks_mut(Self::SYNC_PIECE).enumerate() {
            let at = offset + (i * Self::SYNC_PIECE) as u64;
            self.sync_op(MemberOpKind::Read, piece.as_mut_ptr(), piece.len(), at)?;
        }
        Ok(())
    }

    pub fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        for (i, piece) in buf.chunks(Self::SYNC_PIECE).enumerate() {
            let at = offset + (i * Self::SYNC_PIECE) as u64;
            // The channel only reads from a write's buffer.
            self.sync_op(
                MemberOpKind::Write,
                piece.as_ptr().cast_mut(),
                piece.len(),
                at,
            )?;
        }
        Ok(())
    }

    pub fn flush(&self) -> io::Result<()> {
        self.sync_op(MemberOpKind::Flush, std::ptr::null_mut(), 0, 0)
    }

    /// Make a range read as zeros (Write Zeroes where the controller has
    /// it, zeros written otherwise; never a plain deallocate, after which
    /// reads need not return zeros).
    pub fn zero(&self, offset: u64, len: u64) -> io::Result<()> {
        const PIECE: u64 = 1 << 30;
        let mut at = 0u64;
        while at < len {
            let n = (len - at).min(PIECE);
            self.sync_op(
                MemberOpKind::Zero,
                std::ptr::null_mut(),
                n as usize,
                offset + at,
            )?;
            at += n;
        }
        Ok(())
    }
}

impl RemoteFile for NvmeExport {
    fn open_channel(&self) -> io::Result<Box<dyn Channel>> {
        // It connects at its first operation.
        Ok(Box::new(NvmeChannel::new(Arc::clone(&self.target))))
    }
}
