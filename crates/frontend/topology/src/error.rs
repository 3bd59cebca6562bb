//! Typed errors of the library. Per-device problems are not errors: they are recorded in
//! [`crate::BlockDevice::problems`] and the walk goes on.

use std::path::PathBuf;

/// What made a whole command fail (exit code 2).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The directory has no `block/` folder: it is not a sysfs tree.
    #[error("{root} is not a sysfs tree: {reason}")]
    NotSysfs { root: PathBuf, reason: String },
    /// A device named on the command line is not in the tree.
    #[error("no block device named {0:?} in the sysfs tree")]
    UnknownDevice(String),
    /// `--plan` with no devices, or another unusable combination of flags.
    #[error("invalid arguments: {0}")]
    Usage(String),
    /// Writing the report failed.
    #[error("writing the report failed: {0}")]
    Output(#[from] std::io::Error),
    /// Serialising the JSON report failed.
    #[error("encoding the JSON report failed: {0}")]
    Json(#[from] serde_json::Error),
}

impl Error {
    /// The process exit code for this error: always 2 (see docs/topology.md).
    pub fn exit_code(&self) -> i32 {
        2
    }
}
