use nvraid_layout::GeometryError;
use nvraid_member::MemberError;
use nvraid_metadata::DecodeError;
use std::io;

/// Everything that can go wrong in the array layer. Messages name the member
/// (its spec) and the reason.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    #[error(transparent)]
    Member(#[from] MemberError),
    #[error(transparent)]
    Geometry(#[from] GeometryError),
    #[error("{spec}: does not exist (give --size to create member files)")]
    MissingMember { spec: String },
    #[error(
        "{small} has {} but {large} has {}: the array would use only the smallest member's \
         size on every member and leave {} unused in all; give --size to choose how much of \
         each member to use, or use members of equal size",
        size_text(*small_bytes), size_text(*large_bytes), size_text(*lost_bytes)
    )]
    UnequalSizes {
        small: String,
        small_bytes: u64,
        large: String,
        large_bytes: u64,
        lost_bytes: u64,
    },
    #[error("{spec}: {source}")]
    Superblock { spec: String, source: DecodeError },
    #[error("{spec}: {source}")]
    Io { spec: String, source: io::Error },
    #[error("{spec}: already carries {what} (use --force to overwrite it)")]
    InUse { spec: String, what: String },
    #[error(
        "{spec}: {size_bytes} bytes is too small: a member needs {min_bytes} bytes ({reason})"
    )]
    TooSmall {
        spec: String,
        size_bytes: u64,
        min_bytes: u64,
        reason: String,
    },
    #[error("{spec}: given twice (the same {what} as {other})")]
    Duplicate {
        spec: String,
        other: String,
        what: &'static str,
    },
    #[error("{spec} belongs to array {uuid} but {other} belongs to array {other_uuid}: members of two different arrays")]
    MixedArrays {
        spec: String,
        uuid: String,
        other: String,
        other_uuid: String,
    },
    #[error("{spec} and {other} both claim role {role}")]
    SameRole {
        spec: String,
        other: String,
        role: u16,
    },
    #[error("{spec}: truncated: the superblock needs {needed_bytes} bytes but the member has {size_bytes}")]
    Truncated {
        spec: String,
        needed_bytes: u64,
        size_bytes: u64,
    },
    #[error("{spec}: {what} is not supported")]
    Unsupported { spec: String, what: String },
    #[error(
        "{spec}: its superblock's {field} is {value} but {other}'s is {other_value}: the members \
         disagree about the array's geometry (md refuses such a set too); give only the members \
         whose superblocks are right"
    )]
    Disagree {
        spec: String,
        other: String,
        field: &'static str,
        value: String,
        other_value: String,
    },
    #[error("{spec}: its superblock describes no array nvraid can lay out ({fields}): {source}")]
    BadGeometry {
        spec: String,
        fields: String,
        source: GeometryError,
    },
    #[error("{spec}: its superblock's {field} ({value}) {why}")]
    BadField {
        spec: String,
        field: &'static str,
        value: String,
        why: String,
    },
    #[error("{option}: {why}")]
    BadOption { option: String, why: String },
    #[error("array cannot start: {0}")]
    NotStartable(String),
    #[error("{spec}: {source} (it holds the only copy of some data)")]
    LastCopy { spec: String, source: io::Error },
    #[error("{spec}: writing the member being rebuilt failed: {source}; the rebuild stopped and the array stays degraded")]
    RebuildTarget { spec: String, source: io::Error },
    #[error("{spec}: cannot be re-added: {why}")]
    NotReAddable { spec: String, why: String },
    #[error("{spec}: cannot become the array's write journal: {why}")]
    NoJournal { spec: String, why: String },
    #[error("split brain: {0}")]
    SplitBrain(String),
    #[error("bytes {offset}+{len} of the array have no readable copy (the members holding them are missing, being recovered there, or list the range as bad blocks)")]
    Unreadable { offset: u64, len: u64 },
    #[error("request {offset}+{len} is past the end of the array ({size_bytes} bytes)")]
    OutOfRange {
        offset: u64,
        len: u64,
        size_bytes: u64,
    },
    #[error("request {offset}+{len} is not aligned to the array's {sector_bytes}-byte sector")]
    Unaligned {
        offset: u64,
        len: u64,
        sector_bytes: u32,
    },
    #[error("the array is read-only")]
    ReadOnly,
    #[error("no members given")]
    NoMembers,
}

/// `8388608 bytes (8 MiB)`.
fn size_text(bytes: u64) -> String {
    format!("{bytes} bytes ({})", nvraid_member::format_size(bytes))
}

impl Error {
    pub(crate) fn io(spec: &str, source: io::Error) -> Error {
        Error::Io {
            spec: spec.to_string(),
            source,
        }
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;
