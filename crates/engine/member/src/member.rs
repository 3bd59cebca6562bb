use crate::claim;
use crate::size::{parse_size, SizeError};
use nvraid_io::remote::RemoteFile;
use nvraid_io::{buf, sys, AlignedBuf};
use nvraid_remote::{is_nbd_uri, is_nvme_uri, NvmeExport, RemoteExport, RemoteOptions};
use std::fs::{File, OpenOptions as FsOpenOptions};
use std::io;
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::fs::{FileTypeExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, RwLock};

/// What kind of device a member is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MemberKind {
    File,
    BlockDevice,
    Mem,
    Null,
    /// An NBD export (`nbd://`, `nbd+unix://`), reached with nvraid's own
    /// NBD client.
    Nbd,
    /// An NVMe/TCP namespace (`nvme+tcp://`), reached with nvraid's own
    /// NVMe/TCP initiator.
    NvmeTcp,
}

/// How the fast engines reach a member.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Backend {
    /// A file descriptor to read and write at byte offsets.
    Fd(RawFd),
    /// No device: reads return zeros, writes are dropped.
    Null,
    /// A remote export: each worker opens its own channel
    /// ([`Member::remote`]).
    Remote,
}

/// Why a member could not be opened or used.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum MemberError {
    #[error("{spec}: {source}")]
    Open { spec: String, source: io::Error },
    #[error("{spec}: {source}")]
    BadSize { spec: String, source: SizeError },
    #[error("{spec}: not a regular file or block device")]
    NotFileOrDevice { spec: String },
    #[error("{spec}: does not exist")]
    Missing { spec: String },
    #[error("{spec}: in use by {holder}; stop that first")]
    Busy { spec: String, holder: String },
    /// Another process holds a shared lock on it: udev probing it, for a
    /// moment (see `claim`). Worth trying again.
    #[error("{spec}: in use by {holder}; try again once it is done")]
    Probing { spec: String, holder: String },
    /// This very process holds the member's claim already: the command
    /// named it twice (perhaps under two names), or it is in use here.
    #[error(
        "{spec}: already opened for writing by this command (is it named twice, perhaps under \
         two names, or already part of the array?)"
    )]
    ClaimedHere { spec: String },
    #[error(transparent)]
    Remote(#[from] nvraid_remote::RemoteError),
    #[error(transparent)]
    Nvme(#[from] nvraid_remote::nvme::NvmeOpenError),
}

/// How to open a member.
#[derive(Clone, Copy, Debug)]
pub struct OpenOptions {
    /// Open for writing.
    pub write: bool,
    /// Create a missing file, and extend a smaller one, to this size.
    pub create_bytes: Option<u64>,
    /// Try O_DIRECT (falls back to buffered I/O when refused).
    pub direct: bool,
    /// Remote members: accept an export without FLUSH for writing.
    pub allow_no_flush: bool,
    /// Remote members: timeouts.
    pub remote: RemoteOptions,
}

/// What `OpenOptions::default()` uses for remote members: the command
/// line's `--unsafe-no-flush` and `--nbd-timeout`, set once at start.
static REMOTE_DEFAULTS: RwLock<(bool, Option<RemoteOptions>)> = RwLock::new((false, None));

/// Set the remote-member defaults for this process.
pub fn set_remote_defaults(allow_no_flush: bool, remote: RemoteOptions) {
    *REMOTE_DEFAULTS.write().unwrap_or_else(|e| e.into_inner()) = (allow_no_flush, Some(remote));
}

impl Default for OpenOptions {
    fn default() -> Self {
        let (allow_no_flush, remote) = *REMOTE_DEFAULTS.read().unwrap_or_else(|e| e.into_inner());
        OpenOptions {
            write: false,
            create_bytes: None,
            direct: true,
            allow_no_flush,
            remote: remote.unwrap_or_default(),
        }
    }
}

/// An open member. Shared between threads by reference; every method takes
/// `&self`.
#[derive(Debug)]
pub struct Member {
    spec: String,
    kind: MemberKind,
    file: Option<File>,
    /// Bytes the member holds: read at open, and again by
    /// [`Member::refresh_size`] (a file or device grown under a served
    /// array, `grow --socket --size max`).
    size_bytes: AtomicU64,
    logical_block_bytes: u32,
    physical_block_bytes: u32,
    direct: bool,
    direct_fallback: Option<String>,
    writable: bool,
    identity: Option<(u64, u64)>,
    remote: Option<Remote>,
    /// Requests in flight on this member (the read policy's load measure).
    inflight: AtomicU32,
}

/// Whether two specs name the same member, decided before either is
/// opened (and so before either is claimed): the same text, or paths to
/// the same file or device (device and inode, symbolic links followed).
/// Each `mem:` and `null:` spec is a member of its own; two URIs for one
/// NBD export are found once opened ([`Member::identity`]).
pub fn same_object(a: &str, b: &str) -> bool {
    let own = |s: &str| s.starts_with("mem:") || s.starts_with("null:");
    if own(a) || own(b) {
        return false;
    }
    if a == b {
        return true;
    }
    if is_nbd_uri(a) || is_nbd_uri(b) || is_nvme_uri(a) || is_nvme_uri(b) {
        return false;
    }
    match (std::fs::metadata(a), std::fs::metadata(b)) {
        (Ok(x), Ok(y)) => (x.dev(), x.ino()) == (y.dev(), y.ino()),
        _ => false,
    }
}

/// A member reached over the network: an NBD export or an NVMe/TCP
/// namespace, each through nvraid's own client.
#[derive(Debug)]
enum Remote {
    Nbd(Arc<RemoteExport>),
    Nvme(Arc<NvmeExport>),
}

/// Call the same method on either kind of remote member.
macro_rules! either {
    ($self:expr, $r:ident => $call:expr) => {
        match $self {
            Remote::Nbd($r) => $call,
            Remote::Nvme($r) => $call,
        }
    };
}

impl Remote {
    fn file(&self) -> Arc<dyn RemoteFile> {
        either!(self, r => Arc::clone(r) as Arc<dyn RemoteFile>)
    }
    fn close(&self) {
        either!(self, r => r.close())
    }
    fn set_identity_check(&self, check: Arc<dyn nvraid_io::remote::IdentityCheck>) {
        either!(self, r => r.set_identity_check(check))
    }
    fn identity_refused(&self) -> Option<String> {
        either!(self, r => r.identity_refused())
    }
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        either!(self, r => r.read_at(buf, offset))
    }
    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        either!(self, r => r.write_at(buf, offset))
    }
    fn flush(&self) -> io::Result<()> {
        either!(self, r => r.flush())
    }
    fn zero(&self, offset: u64, len: u64) -> io::Result<()> {
        either!(self, r => r.zero(offset, len))
    }
}

impl Member {
    /// Open the member named by `spec`. See the crate docs for the spec forms.
    pub fn open(spec: &str, options: OpenOptions) -> Result<Member, MemberError> {
        if let Some(size) = spec.strip_prefix("mem:") {
            let size_bytes = Self::spec_size(spec, size)?;
            let file = sys::memfd(spec, size_bytes).map_err(|source| MemberError::Open {
                spec: spec.into(),
                source,
            })?;
            return Ok(Self::new(
                spec,
                MemberKind::Mem,
                Some(file),
                size_bytes,
                (512, 4096),
                None,
                options.write,
            ));
        }
        if let Some(size) = spec.strip_prefix("null:") {
            let size_bytes = Self::spec_size(spec, size)?;
            return Ok(Self::new(
                spec,
                MemberKind::Null,
                None,
                size_bytes,
                (512, 4096),
                None,
                options.write,
            ));
        }
        if is_nbd_uri(spec) {
            return Self::open_remote(spec, options);
        }
        if is_nvme_uri(spec) {
            return Self::open_nvme(spec, options);
        }
        Self::open_path(spec, options)
    }

    fn open_remote(spec: &str, options: OpenOptions) -> Result<Member, MemberError> {
        let export =
            RemoteExport::open(spec, options.write, options.allow_no_flush, options.remote)?;
        let info = export.info();
        let logical = info.minimum_block.clamp(512, 64 * 1024);
        let physical = info.preferred_block.clamp(logical, 1 << 20);
        // Two specs for one export (same server, same name) are one member.
        let mut hasher = std::collections::hash_map::DefaultHasher::new();
        std::hash::Hash::hash(&export.uri().to_string(), &mut hasher);
        let identity = (u64::MAX, std::hash::Hasher::finish(&hasher));
        let mut member = Self::new(
            spec,
            MemberKind::Nbd,
            None,
            info.size_bytes,
            (logical, physical),
            Some(identity),
            options.write,
        );
        member.remote = Some(Remote::Nbd(Arc::new(export)));
        Ok(member)
    }

    /// An NVMe/TCP namespace: its controller connected and identified now;
    /// writes are made durable with FUA and Flush, which every controller
    /// has (so `--unsafe-no-flush` does not apply).
    fn open_nvme(spec: &str, options: OpenOptions) -> Result<Member, MemberError> {
        let export = NvmeExport::open(spec, options.remote)?;
        let info = export.info();
        let logical = info.block_bytes.clamp(512, 64 * 1024);
        let physical = info.preferred_bytes.clamp(logical, 1 << 20);
        // Two specs for one namespace (same address, NQN, NSID) are one
        // member.
        let mut hasher = std::collections::hash_map::DefaultHasher::new();
        std::hash::Hash::hash(&export.uri().to_string(), &mut hasher);
        let identity = (u64::MAX - 1, std::hash::Hasher::finish(&hasher));
        let mut member = Self::new(
            spec,
            MemberKind::NvmeTcp,
            None,
            info.size_bytes,
            (logical, physical),
            Some(identity),
            options.write,
        );
        member.remote = Some(Remote::Nvme(Arc::new(export)));
        Ok(member)
    }

    fn spec_size(spec: &str, size: &str) -> Result<u64, MemberError> {
        parse_size(size).map_err(|source| MemberError::BadSize {
            spec: spec.into(),
            source,
        })
    }

    fn new(
        spec: &str,
        kind: MemberKind,
        file: Option<File>,
        size_bytes: u64,
        (logical, physical): (u32, u32),
        identity: Option<(u64, u64)>,
        writable: bool,
    ) -> Member {
        Member {
            spec: spec.to_string(),
            kind,
            file,
            size_bytes: AtomicU64::new(size_bytes),
            logical_block_bytes: logical,
            physical_block_bytes: physical,
            direct: false,
            direct_fallback: None,
            writable,
            identity,
            remote: None,
            inflight: AtomicU32::new(0),
        }
    }

    fn open_path(spec: &str, options: OpenOptions) -> Result<Member, MemberError> {
        let err = |source| MemberError::Open {
            spec: spec.into(),
            source,
        };
        let path = Path::new(spec);
        let grow_to = match (std::fs::metadata(path), options.create_bytes) {
            (Err(e), None) if e.kind() == io::ErrorKind::NotFound => {
                return Err(MemberError::Missing { spec: spec.into() })
            }
            (Err(e), None) => return Err(err(e)),
            (Ok(meta), Some(bytes)) if meta.is_file() && meta.len() < bytes => Some(bytes),
            (Err(_), Some(bytes)) => {
                File::options()
                    .write(true)
                    .create_new(true)
                    .open(path)
                    .map_err(err)?;
                Some(bytes)
            }
            _ => None,
        };
        let meta = std::fs::metadata(path).map_err(err)?;
        let kind = match meta.file_type() {
            t if t.is_file() => MemberKind::File,
            t if t.is_block_device() => MemberKind::BlockDevice,
            _ => return Err(MemberError::NotFileOrDevice { spec: spec.into() }),
        };
        let (file, direct_fallback) = Self::open_file(path, options)?;
        // A writer claims the member before it changes a byte of it.
        if options.write {
            match claim::claim(&file).map_err(err)? {
                Ok(()) => {}
                Err(claim::Holder::Me) => {
                    return Err(MemberError::ClaimedHere { spec: spec.into() })
                }
                Err(claim::Holder::Other(holder)) => {
                    return Err(MemberError::Busy {
                        spec: spec.into(),
                        holder,
                    })
                }
                Err(claim::Holder::Probing(holder)) => {
                    return Err(MemberError::Probing {
                        spec: spec.into(),
                        holder,
                    })
                }
            }
        }
        if let Some(bytes) = grow_to {
            file.set_len(bytes).map_err(err)?;
        }
        let meta = file.metadata().map_err(err)?;
        let (size_bytes, blocks) = match kind {
            MemberKind::BlockDevice => (
                sys::block_device_bytes(&file).map_err(err)?,
                sys::block_device_block_bytes(&file).map_err(err)?,
            ),
            _ => (meta.len(), (512, 4096)),
        };
        let identity = Some((meta.dev(), meta.ino()));
        let mut member = Self::new(
            spec,
            kind,
            Some(file),
            size_bytes,
            blocks,
            identity,
            options.write,
        );
        member.direct = options.direct && direct_fallback.is_none();
        member.direct_fallback = direct_fallback;
        Ok(member)
    }

    /// Open with O_DIRECT, falling back to buffered I/O if the kernel or
    /// the filesystem refuses it (at open or at the first aligned read).
    fn open_file(path: &Path, options: OpenOptions) -> Result<(File, Option<String>), MemberError> {
        let spec = path.display().to_string();
        let open = |flags: i32| {
            FsOpenOptions::new()
                .read(true)
                .write(options.write)
                .custom_flags(flags)
                .open(path)
        };
        if !options.direct {
            return open(0)
                .map(|f| (f, None))
                .map_err(|source| MemberError::Open { spec, source });
        }
        match open(libc::O_DIRECT) {
            Ok(file) => match Self::probe_direct(&file) {
                Ok(()) => Ok((file, None)),
                Err(reason) => {
                    let file = open(0).map_err(|source| MemberError::Open { spec, source })?;
                    Ok((
                        file,
                        Some(format!(
                            "O_DIRECT read failed ({reason}); using buffered I/O"
                        )),
                    ))
                }
            },
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {
                let file = open(0).map_err(|source| MemberError::Open { spec, source })?;
                Ok((
                    file,
                    Some("filesystem refuses O_DIRECT; using buffered I/O".into()),
                ))
            }
            Err(source) => Err(MemberError::Open { spec, source }),
        }
    }

    fn probe_direct(file: &File) -> io::Result<()> {
        let mut block = AlignedBuf::zeroed(4096);
        match nvraid_io::sys::read_full_at(file, &mut block, 0) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// Fails with [`MemberError::Busy`] when another process has claimed
    /// this member for writing (a member opened for reading only can ask).
    pub fn check_claimable(&self) -> Result<(), MemberError> {
        let Some(file) = &self.file else {
            return Ok(());
        };
        if !matches!(self.kind, MemberKind::File | MemberKind::BlockDevice) || self.writable {
            return Ok(());
        }
        match claim::claimable(file) {
            Ok(Ok(())) => Ok(()),
            Ok(Err(claim::Holder::Me)) => Err(MemberError::ClaimedHere {
                spec: self.spec.clone(),
            }),
            Ok(Err(claim::Holder::Other(holder))) => Err(MemberError::Busy {
                spec: self.spec.clone(),
                holder,
            }),
            Ok(Err(claim::Holder::Probing(holder))) => Err(MemberError::Probing {
                spec: self.spec.clone(),
                holder,
            }),
            Err(source) => Err(MemberError::Open {
                spec: self.spec.clone(),
                source,
            }),
        }
    }

    /// Let go of the member, for one taken out of a running array: the
    /// claim is given up and the file or device closed (its descriptor is
    /// pointed at /dev/null, so a queue that still holds the number reads
    /// end-of-file and writes nowhere until it refreshes), so that it can
    /// be opened again, reset or pulled. I/O already queued on it finishes.
    pub fn detach(&self) {
        if let Some(remote) = &self.remote {
            remote.close();
        }
        if let Some(file) = &self.file {
            // Best effort: what cannot be let go stays open until exit.
            if self.writable {
                let _ = nvraid_io::sys::unlock(file);
            }
            let _ = nvraid_io::sys::point_at_null(file);
        }
    }

    /// The spec the member was opened with (its path, or `mem:SIZE`).
    pub fn spec(&self) -> &str {
        &self.spec
    }

    /// The path, for members that have one.
    pub fn path(&self) -> Option<PathBuf> {
        matches!(self.kind, MemberKind::File | MemberKind::BlockDevice)
            .then(|| PathBuf::from(&self.spec))
    }

    pub fn kind(&self) -> MemberKind {
        self.kind
    }

    /// Whether the member's bytes outlive this process (a file, a block
    /// device, an NBD export), so that data on it must be protected.
    pub fn is_persistent(&self) -> bool {
        matches!(
            self.kind,
            MemberKind::File | MemberKind::BlockDevice | MemberKind::Nbd | MemberKind::NvmeTcp
        )
    }

    pub fn size_bytes(&self) -> u64 {
        self.size_bytes.load(Ordering::Acquire)
    }

    /// Read the member's size again from its file or block device (it may
    /// have grown since it was opened: a truncated file, a resized
    /// volume) and keep it; the new size. A member reached over the
    /// network or held in memory keeps the size it was opened with (an
    /// export's size is told once, at its handshake).
    pub fn refresh_size(&self) -> io::Result<u64> {
        let Some(file) = self
            .file
            .as_ref()
            .filter(|_| matches!(self.kind, MemberKind::File | MemberKind::BlockDevice))
        else {
            return Ok(self.size_bytes());
        };
        let bytes = match self.kind {
            MemberKind::BlockDevice => sys::block_device_bytes(file)?,
            _ => file.metadata()?.len(),
        };
        self.size_bytes.store(bytes, Ordering::Release);
        Ok(bytes)
    }

    /// Smallest I/O unit the member accepts.
    pub fn logical_block_bytes(&self) -> u32 {
        self.logical_block_bytes
    }

    pub fn physical_block_bytes(&self) -> u32 {
        self.physical_block_bytes
    }

    /// Whether I/O bypasses the page cache.
    pub fn is_direct(&self) -> bool {
        self.direct
    }

    /// Why O_DIRECT was not used, if it was asked for and refused.
    pub fn direct_fallback(&self) -> Option<&str> {
        self.direct_fallback.as_deref()
    }

    pub fn is_writable(&self) -> bool {
        self.writable
    }

    /// (device, inode) of files and block devices: two specs naming the same
    /// object have the same identity.
    pub fn identity(&self) -> Option<(u64, u64)> {
        self.identity
    }

    /// How the fast engines reach this member.
    pub fn backend(&self) -> Backend {
        match (&self.file, &self.remote) {
            (Some(file), _) => Backend::Fd(file.as_raw_fd()),
            (None, Some(_)) => Backend::Remote,
            (None, None) => Backend::Null,
        }
    }

    /// The export of a remote member, for opening worker channels.
    pub fn remote(&self) -> Option<Arc<dyn RemoteFile>> {
        self.remote.as_ref().map(Remote::file)
    }

    /// A remote member: from now on every new connection to it must pass
    /// `check` before a request is sent on it (see
    /// [`nvraid_io::remote::IdentityCheck`]). Nothing for local members:
    /// their descriptor stays open to the same object.
    pub fn set_identity_check(&self, check: Arc<dyn nvraid_io::remote::IdentityCheck>) {
        if let Some(remote) = &self.remote {
            remote.set_identity_check(check);
        }
    }

    /// A remote member: why the last new connection was refused as not
    /// this member, if it was.
    pub fn identity_refused(&self) -> Option<String> {
        self.remote.as_ref().and_then(|r| r.identity_refused())
    }

    /// What the NBD server agreed to, for an NBD member.
    pub fn remote_info(&self) -> Option<&nvraid_remote::ExportInfo> {
        match &self.remote {
            Some(Remote::Nbd(r)) => Some(r.info()),
            _ => None,
        }
    }

    /// What the namespace and its controller offer, for an NVMe/TCP
    /// member.
    pub fn nvme_info(&self) -> Option<&nvraid_remote::nvme::NvmeInfo> {
        match &self.remote {
            Some(Remote::Nvme(r)) => Some(r.info()),
            _ => None,
        }
    }

    /// Requests in flight on the member right now.
    pub fn inflight(&self) -> u32 {
        self.inflight.load(Ordering::Relaxed)
    }

    /// Count a request as in flight until the guard drops.
    pub fn track(&self) -> InflightGuard<'_> {
        self.inflight.fetch_add(1, Ordering::Relaxed);
        InflightGuard(&self.inflight)
    }

    fn check_range(&self, offset: u64, len: usize) -> io::Result<()> {
        let end = offset.checked_add(len as u64);
        let size = self.size_bytes();
        if end.is_none_or(|end| end > size) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "{}: I/O at {offset}+{len} is past the end ({} bytes)",
                    self.spec, size
                ),
            ));
        }
        Ok(())
    }

    fn needs_bounce(&self, ptr: *const u8, len: usize, offset: u64) -> bool {
        self.direct
            && !(buf::is_aligned(ptr, len, buf::BUF_ALIGN_BYTES)
                && offset.is_multiple_of(u64::from(self.logical_block_bytes)))
    }

    /// Read exactly `buf.len()` bytes at `offset`.
    pub fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        self.check_range(offset, buf.len())?;
        if let Some(remote) = &self.remote {
            let _guard = self.track();
            return remote.read_at(buf, offset);
        }
        let Some(file) = &self.file else {
            buf.fill(0);
            return Ok(());
        };
        let _guard = self.track();
        if self.needs_bounce(buf.as_ptr(), buf.len(), offset) {
            let mut bounce = AlignedBuf::zeroed(buf.len().next_multiple_of(buf::BUF_ALIGN_BYTES));
            sys::read_full_at(file, &mut bounce[..buf.len()], offset)?;
            buf.copy_from_slice(&bounce[..buf.len()]);
            return Ok(());
        }
        sys::read_full_at(file, buf, offset)
    }

    /// Write all of `buf` at `offset`.
    pub fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        self.check_range(offset, buf.len())?;
        if let Some(remote) = &self.remote {
            let _guard = self.track();
            return remote.write_at(buf, offset);
        }
        let Some(file) = &self.file else {
            return Ok(());
        };
        let _guard = self.track();
        if self.needs_bounce(buf.as_ptr(), buf.len(), offset) {
            let mut bounce = AlignedBuf::zeroed(buf.len());
            bounce.copy_from_slice(buf);
            return sys::write_full_at(file, &bounce, offset);
        }
        sys::write_full_at(file, buf, offset)
    }

    /// Make completed writes durable.
    pub fn flush(&self) -> io::Result<()> {
        if let Some(remote) = &self.remote {
            return remote.flush();
        }
        match (&self.file, self.kind) {
            (Some(file), MemberKind::File | MemberKind::BlockDevice) => sys::data_sync(file),
            _ => Ok(()),
        }
    }

    /// Discard a range: later reads return zeros on files and mem members,
    /// and whatever the device returns after a discard on block devices.
    pub fn discard(&self, offset: u64, len: u64) -> io::Result<()> {
        self.check_range(offset, len as usize)?;
        if let Some(remote) = &self.remote {
            return remote.zero(offset, len);
        }
        match (&self.file, self.kind) {
            (Some(file), MemberKind::BlockDevice) => sys::block_device_discard(file, offset, len),
            (Some(file), _) => sys::punch_hole(file, offset, len),
            (None, _) => Ok(()),
        }
    }
}

/// Decrements a member's in-flight count when dropped.
pub struct InflightGuard<'a>(&'a AtomicU32);

impl Drop for InflightGuard<'_> {
    fn drop(&mut self) {
        let before = self.0.fetch_sub(1, Ordering::Relaxed);
        assert!(
            before > 0,
            "invariant: the member's in-flight count counts this request"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mem_member_round_trips_unaligned_buffers() {
        let m = Member::open(
            "mem:1M",
            OpenOptions {
                write: true,
                ..Default::default()
            },
        )
        .unwrap();
        assert_eq!(m.size_bytes(), 1 << 20);
        let data: Vec<u8> = (0..1536u32).map(|i| (i % 251) as u8).collect();
        m.write_at(&data[1..1025], 512).unwrap();
        let mut back = vec![0u8; 1024];
        m.read_at(&mut back, 512).unwrap();
        assert_eq!(back, data[1..1025]);
        assert!(
            m.read_at(&mut back, (1 << 20) - 512).is_err(),
            "read past end must fail"
        );
    }

    #[test]
    fn null_member_reads_zeros_and_drops_writes() {
        let m = Member::open(
            "null:8G",
            OpenOptions {
                write: true,
                ..Default::default()
            },
        )
        .unwrap();
        assert_eq!(m.size_bytes(), 8 << 30);
        m.write_at(&[1u8; 4096], 4096).unwrap();
        let mut back = vec![9u8; 4096];
        m.read_at(&mut back, 4096).unwrap();
        assert!(back.iter().all(|&b| b == 0));
        assert_eq!(m.backend(), Backend::Null);
    }

    #[test]
    fn file_member_is_created_extended_and_direct_or_explains_why_not() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("m0");
        let spec = path.to_str().unwrap();
        assert!(matches!(
            Member::open(spec, OpenOptions::default()),
            Err(MemberError::Missing { .. })
        ));
        let m = Member::open(
            spec,
            OpenOptions {
                write: true,
                create_bytes: Some(4 << 20),
                direct: true,
                ..Default::default()
            },
        )
        .unwrap();
        assert_eq!(m.size_bytes(), 4 << 20);
        assert!(m.is_direct() || m.direct_fallback().is_some());
        let data = vec![0x5au8; 8192];
        m.write_at(&data[..4608], 512 * 3).unwrap();
        let mut back = vec![0u8; 4608];
        m.read_at(&mut back, 512 * 3).unwrap();
        assert_eq!(back, data[..4608]);
        m.discard(0, 1 << 20).unwrap();
        m.read_at(&mut back, 512 * 3).unwrap();
        assert!(back.iter().all(|&b| b == 0), "punched hole reads zeros");
        m.flush().unwrap();
    }

    #[test]
    fn bad_specs_are_named() {
        let err = Member::open("mem:12Q", OpenOptions::default()).unwrap_err();
        assert!(err.to_string().starts_with("mem:12Q"), "{err}");
        let err = Member::open("/dev/null", OpenOptions::default()).unwrap_err();
        assert!(
            err.to_string()
                .contains("not a regular file or block device"),
            "{err}"
        );
    }
}
