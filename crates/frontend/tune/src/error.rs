//! Why tune refused a run or could not finish one. Each message names the
//! culprit: the flag and the value given, the member, or the chunk and
//! round that failed.

use crate::Position;
use nvraid_bench::units::ParseError;
use nvraid_bench::SpecError;
use nvraid_layout::GeometryError;
use nvraid_member::MemberError;
use std::io;

/// Everything that can go wrong in tune.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// `--level` is not a level (the message is nvraid-layout's).
    #[error("{0}")]
    Level(String),
    /// `--level 1`: a mirror has no chunk.
    #[error("--level 1: a raid1 has no chunk to tune (use 0, 10, 4, 5 or 6)")]
    NoChunk,
    /// `--noise` is negative, infinite or not a number.
    #[error("--noise {0}: a percentage, 0 or more")]
    Noise(f64),
    /// `--chunks` has an empty entry.
    #[error("--chunks {text:?}: an empty entry")]
    EmptyChunk {
        /// The list given.
        text: String,
    },
    /// A `--chunks` entry is not a size.
    #[error("--chunks: {0}")]
    ChunkText(ParseError),
    /// A `--chunks` entry is not a power of two.
    #[error("--chunks: {entry} ({bytes} bytes) is not a power of two")]
    NotPowerOfTwo {
        /// The entry as given.
        entry: String,
        /// Its value.
        bytes: u64,
    },
    /// A `--chunks` entry is below 4K or above 4M.
    #[error("--chunks: {entry} is outside 4K-4M")]
    ChunkRange {
        /// The entry as given.
        entry: String,
    },
    /// `--workload` is neither `default`, a preset nor job options.
    #[error(
        "--workload {text:?}: not a workload; use default, a preset ({presets}) or job \
         options such as rw=randread,bs=4k,iodepth=32"
    )]
    UnknownWorkload {
        /// The text given.
        text: String,
        /// The presets' names, comma-separated.
        presets: String,
    },
    /// `--workload`'s job options do not read.
    #[error("--workload {text:?}: {what}")]
    JobOption {
        /// The text given.
        text: String,
        /// What is wrong with it.
        what: String,
    },
    /// The level cannot be made over this many members with a chunk tried.
    #[error("--level {level} over {members} member(s): {source}")]
    Geometry {
        /// The level as given, without `raid`.
        level: String,
        /// How many members.
        members: u32,
        /// What the geometry said.
        source: GeometryError,
    },
    /// A member's signature could not be read.
    #[error("{spec}: cannot read: {source}")]
    Read {
        /// The member.
        spec: String,
        /// What the read said.
        source: io::Error,
    },
    /// Members whose bytes outlive the run, without `--destructive`.
    #[error(
        "tune creates throwaway arrays on every member, destroying what they hold: {}; \
         add --destructive to go ahead",
        found.join("; ")
    )]
    Destructive {
        /// What each such member holds: `m0 holds an ext2/3/4 filesystem`.
        found: Vec<String>,
    },
    /// The smallest member cannot hold an array with this chunk.
    #[error("{spec}: too small for a chunk of {chunk}: {source}")]
    TooSmall {
        /// The smallest member.
        spec: String,
        /// The chunk, as `64K`.
        chunk: String,
        /// What the geometry said.
        source: GeometryError,
    },
    /// `--size 0`.
    #[error("--size 0: the workload needs some of the array")]
    NoRegion,
    /// A step of the workload is refused on the arrays it would run on.
    #[error("--workload {workload}: {source}")]
    Job {
        /// The workload's name.
        workload: String,
        /// What bench's checks said.
        source: SpecError,
    },
    /// Every step of the workload is skipped on these members.
    #[error("--workload {workload}: no step can run on these members")]
    NothingRuns {
        /// The workload's name.
        workload: String,
    },
    /// A member could not be opened or is claimed by another writer.
    #[error(transparent)]
    Member(#[from] MemberError),
    /// Creating or closing an array failed.
    #[error(transparent)]
    Array(Box<nvraid_array::Error>),
    /// Filling an array with random data failed.
    #[error(transparent)]
    Bench(Box<nvraid_bench::Error>),
    /// A step failed: `at` names the round and chunk, `job` the step.
    #[error("{at}: {job}: {source}")]
    Step {
        /// The round and chunk: `round 2/5, chunk 64K (3/9)`.
        at: Position,
        /// The step's job name.
        job: String,
        /// What the bench said.
        source: Box<nvraid_bench::Error>,
    },
    /// The throwaway array was still held when it was to be closed.
    #[error("the array of chunk {chunk_bytes} is still in use")]
    StillInUse {
        /// Its chunk.
        chunk_bytes: u64,
    },
}

// The engine's and the bench's errors are large; boxed, tune's stays small.
impl From<nvraid_array::Error> for Error {
    fn from(error: nvraid_array::Error) -> Error {
        Error::Array(Box::new(error))
    }
}

impl From<nvraid_bench::Error> for Error {
    fn from(error: nvraid_bench::Error) -> Error {
        Error::Bench(Box::new(error))
    }
}
