//! nvraid-bench: the workload generator behind `nvraid bench`.
//!
//! - [`spec`]: a job in fio's vocabulary, and its validation;
//! - [`runner`]: worker threads driving [`nvraid_io::queue::Target`]s;
//! - [`hist`]: the latency histogram;
//! - [`presets`]: CrystalDiskMark, ATTO, AS SSD, IOMeter-style and sweeps;
//! - [`report`]: text, fio-style JSON and CSV;
//! - [`machine`]: the machine and command line a report records;
//! - [`cli`]: the `nvraid bench` flags and the entry point the binary calls;
//! - [`targets`]: the engine `--engine auto` picks for members, the target
//!   over an array, random data written over an array before it is
//!   measured, and the line a report carries on the array it measured.
//!
//! [`targets`] needs nvraid-array (its `Array` and `FanoutTarget`). That
//! adds no cycle: nvraid-array depends on engine and protocol crates only
//! (`cargo tree -p nvraid-array -e normal` lists io, layout, parity,
//! member, metadata, and through member remote and nbd; no frontend), so
//! the bench, which drives arrays, sits above it, and `nvraid bench`,
//! `tune` (nvraid-tune), `serve` and `topology` share one copy of these.
//!
//! docs/bench.md is the user's guide.

pub mod cli;
pub mod cpu;
pub mod hist;
pub mod machine;
pub mod presets;
pub mod report;
pub mod rng;
pub mod runner;
pub mod spec;
pub mod targets;
pub mod units;

pub use cli::{plan, run, BenchArgs};
pub use machine::{Machine, RunContext};
pub use report::BenchReport;
pub use runner::{run_job, JobResult, Progress};
pub use spec::{JobSpec, RwMode, SpecError};
pub use targets::{array_subject, array_target, engine_for, prefill, subject_line};

use std::io;

/// Why a benchmark did not produce results.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The job was refused before any I/O.
    #[error(transparent)]
    Spec(#[from] SpecError),
    /// A worker could not open its queue on a target.
    #[error("opening a queue on {target}: {source}")]
    OpenQueue {
        /// The target's name.
        target: String,
        /// What the engine said.
        source: io::Error,
    },
    /// Waiting for completions failed.
    #[error("reaping completions on {target}: {source}")]
    Reap {
        /// The target's name.
        target: String,
        /// What the engine said.
        source: io::Error,
    },
    /// I/Os failed or came back short: the job's numbers are not valid.
    #[error("job {job:?} failed: {count} I/O error(s); first: {first}")]
    IoFailed {
        /// The job's name.
        job: String,
        /// How many I/Os failed.
        count: u64,
        /// The first failure.
        first: String,
    },
    /// Writing the report failed.
    #[error("writing the report: {0}")]
    Output(#[from] io::Error),
    /// Random data for [`prefill`] could not be read.
    #[error("/dev/urandom: {0}")]
    Random(#[source] io::Error),
    /// The array refused a write or a flush of [`prefill`].
    #[error(transparent)]
    Array(#[from] nvraid_array::Error),
}
