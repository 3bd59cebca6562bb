//! A job: what one benchmark step does, in fio's vocabulary.
//!
//! A [`JobSpec`] is checked against the targets with [`JobSpec::validate`]
//! before any I/O is issued; every refusal is a [`SpecError`] that names the
//! option at fault.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use nvraid_io::queue::Target;

use crate::units::{format_duration, format_size};

/// The largest block size accepted (each slot of each queue holds one).
pub const BS_BYTES_MAX: u32 = 256 << 20;
/// The largest queue depth accepted per worker and target.
pub const IODEPTH_MAX: u32 = 65_536;
/// The most worker threads one job may start.
pub const NUMJOBS_MAX: u32 = 1024;

/// The access pattern (fio's `rw=`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, clap::ValueEnum)]
pub enum RwMode {
    /// Sequential reads.
    Read,
    /// Sequential writes.
    Write,
    /// Uniformly random reads.
    Randread,
    /// Uniformly random writes.
    Randwrite,
    /// Uniformly random reads and writes, `rwmixread` percent reads.
    Randrw,
}

impl RwMode {
    /// fio's spelling of the mode.
    pub fn as_str(self) -> &'static str {
        match self {
            RwMode::Read => "read",
            RwMode::Write => "write",
            RwMode::Randread => "randread",
            RwMode::Randwrite => "randwrite",
            RwMode::Randrw => "randrw",
        }
    }

    /// Whether offsets are random rather than sequential.
    pub fn is_random(self) -> bool {
        matches!(self, RwMode::Randread | RwMode::Randwrite | RwMode::Randrw)
    }

    /// The share of I/Os that are reads, in percent, given fio's `rwmixread`.
    pub fn read_pct(self, rwmixread_pct: u32) -> u32 {
        match self {
            RwMode::Read | RwMode::Randread => 100,
            RwMode::Write | RwMode::Randwrite => 0,
            RwMode::Randrw => rwmixread_pct,
        }
    }
}

impl fmt::Display for RwMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One benchmark job.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct JobSpec {
    /// Name in reports (fio's `jobname`).
    pub name: String,
    /// Access pattern.
    pub rw: RwMode,
    /// Percentage of reads for [`RwMode::Randrw`] (0..=100).
    pub rwmixread_pct: u32,
    /// Bytes per I/O.
    pub bs_bytes: u32,
    /// I/Os each worker keeps in flight.
    pub iodepth: u32,
    /// Worker threads.
    pub numjobs: u32,
    /// Measured time, after the ramp.
    pub runtime: Duration,
    /// Time run before measuring starts (results discarded).
    pub ramp: Duration,
    /// Bytes of each target the job may touch, from `offset_bytes`; `None`:
    /// up to the end of the target.
    pub size_bytes: Option<u64>,
    /// First byte of each target the job may touch.
    pub offset_bytes: u64,
    /// O_DIRECT (carried for reports; the targets are opened by the caller).
    pub direct: bool,
}

impl JobSpec {
    /// A job with fio-like defaults (4 KiB, QD 1, one worker, 10 s, no ramp,
    /// whole target, 50% reads for randrw, O_DIRECT) and a generated name.
    pub fn new(rw: RwMode) -> JobSpec {
        let mut job = JobSpec {
            name: String::new(),
            rw,
            rwmixread_pct: 50,
            bs_bytes: 4096,
            iodepth: 1,
            numjobs: 1,
            runtime: Duration::from_secs(10),
            ramp: Duration::ZERO,
            size_bytes: None,
            offset_bytes: 0,
            direct: true,
        };
        job.name = job.default_name();
        job
    }

    /// A name in CrystalDiskMark's shorthand: `randread 4K Q32T1`.
    pub fn default_name(&self) -> String {
        let mix = match self.rw {
            RwMode::Randrw => format!(" {}%r", self.rwmixread_pct),
            _ => String::new(),
        };
        format!(
            "{}{} {} Q{}T{}",
            self.rw,
            mix,
            format_size(u64::from(self.bs_bytes)),
            self.iodepth,
            self.numjobs
        )
    }

    /// Whether the job writes (for the caller's `--destructive` check and the
    /// read-only check in [`JobSpec::validate`]).
    pub fn job_writes(&self) -> bool {
        self.rw.read_pct(self.rwmixread_pct) < 100
    }

    /// The byte range `[start, end)` of `target_size_bytes` the job touches.
    pub fn region_bytes(&self, target_size_bytes: u64) -> (u64, u64) {
        let start = self.offset_bytes;
        let end = match self.size_bytes {
            Some(size) => start.saturating_add(size),
            None => target_size_bytes,
        };
        (start, end)
    }

    /// Checks the job on its own, then against every target. Nothing is
    /// submitted before this passes.
    pub fn validate(&self, targets: &[Arc<dyn Target>]) -> Result<(), SpecError> {
        self.validate_alone()?;
        if targets.is_empty() {
            return Err(SpecError::NoTargets);
        }
        targets
            .iter()
            .try_for_each(|target| self.validate_target(target.as_ref()))
    }

    fn validate_alone(&self) -> Result<(), SpecError> {
        if self.bs_bytes == 0 || self.bs_bytes > BS_BYTES_MAX {
            return Err(SpecError::BlockSizeRange {
                bs_bytes: self.bs_bytes,
            });
        }
        if self.iodepth == 0 || self.iodepth > IODEPTH_MAX {
            return Err(SpecError::IodepthRange {
                iodepth: self.iodepth,
            });
        }
        if self.numjobs == 0 || self.numjobs > NUMJOBS_MAX {
            return Err(SpecError::NumjobsRange {
                numjobs: self.numjobs,
            });
        }
        if self.runtime.is_zero() {
            return Err(SpecError::ZeroRuntime);
        }
        if self.rwmixread_pct > 100 {
            return Err(SpecError::RwmixreadRange {
                pct: self.rwmixread_pct,
            });
        }
        if self.size_bytes == Some(0) {
            return Err(SpecError::ZeroSize);
        }
        Ok(())
    }

    fn validate_target(&self, target: &dyn Target) -> Result<(), SpecError> {
        let name = target.describe();
        let sector_bytes = target.sector_bytes();
        if sector_bytes == 0 || !self.bs_bytes.is_multiple_of(sector_bytes) {
            return Err(SpecError::BlockSizeUnaligned {
                bs_bytes: self.bs_bytes,
                sector_bytes,
                target: name,
            });
        }
        if !self.offset_bytes.is_multiple_of(u64::from(sector_bytes)) {
            return Err(SpecError::OffsetUnaligned {
                offset_bytes: self.offset_bytes,
                sector_bytes,
                target: name,
            });
        }
        let target_bytes = target.size_bytes();
        let (start, end) = self.region_bytes(target_bytes);
        if end > target_bytes || start >= end {
            return Err(SpecError::RegionOutside {
                offset_bytes: start,
                size_bytes: end.saturating_sub(start),
                target_bytes,
                target: name,
            });
        }
        if end - start < u64::from(self.bs_bytes) {
            return Err(SpecError::RegionSmallerThanBlock {
                region_bytes: end - start,
                bs_bytes: self.bs_bytes,
                target: name,
            });
        }
        if self.job_writes() && !target.writable() {
            return Err(SpecError::ReadOnlyTarget {
                rw: self.rw,
                target: name,
            });
        }
        Ok(())
    }

    /// One-line description of the options, for reports.
    pub fn summary(&self) -> String {
        format!(
            "rw={} bs={} iodepth={} numjobs={} runtime={} ramp={}",
            self.rw,
            format_size(u64::from(self.bs_bytes)),
            self.iodepth,
            self.numjobs,
            format_duration(self.runtime),
            format_duration(self.ramp)
        )
    }
}

/// Why a job was refused before any I/O. Each message names the option.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SpecError {
    /// `--bs` is 0 or above [`BS_BYTES_MAX`].
    #[error("--bs {bs_bytes}: the block size must be between 1 byte and 256 MiB")]
    BlockSizeRange {
        /// The block size given.
        bs_bytes: u32,
    },
    /// `--bs` is not a multiple of a target's sector size.
    #[error(
        "--bs {bs_bytes}: not a multiple of the sector size ({sector_bytes} bytes) of {target}"
    )]
    BlockSizeUnaligned {
        /// The block size given.
        bs_bytes: u32,
        /// The target's sector size.
        sector_bytes: u32,
        /// The target's name.
        target: String,
    },
    /// `--iodepth` is 0 or above [`IODEPTH_MAX`].
    #[error("--iodepth {iodepth}: the queue depth must be between 1 and 65536")]
    IodepthRange {
        /// The depth given.
        iodepth: u32,
    },
    /// `--numjobs` is 0 or above [`NUMJOBS_MAX`].
    #[error("--numjobs {numjobs}: the number of workers must be between 1 and 1024")]
    NumjobsRange {
        /// The count given.
        numjobs: u32,
    },
    /// `--runtime` is 0.
    #[error("--runtime 0: the measured time must be longer than zero")]
    ZeroRuntime,
    /// `--rwmixread` above 100.
    #[error("--rwmixread {pct}: a percentage must be between 0 and 100")]
    RwmixreadRange {
        /// The percentage given.
        pct: u32,
    },
    /// `--size 0`.
    #[error("--size 0: the region must be at least one block")]
    ZeroSize,
    /// `--offset` is not sector aligned.
    #[error("--offset {offset_bytes}: not a multiple of the sector size ({sector_bytes} bytes) of {target}")]
    OffsetUnaligned {
        /// The offset given.
        offset_bytes: u64,
        /// The target's sector size.
        sector_bytes: u32,
        /// The target's name.
        target: String,
    },
    /// `--offset` + `--size` run past the end of a target.
    #[error("--offset {offset_bytes} --size {size_bytes}: past the end of {target} ({target_bytes} bytes)")]
    RegionOutside {
        /// Start of the region.
        offset_bytes: u64,
        /// Length of the region.
        size_bytes: u64,
        /// The target's size.
        target_bytes: u64,
        /// The target's name.
        target: String,
    },
    /// The region is shorter than one block.
    #[error("--size/--offset leave {region_bytes} bytes of {target}, less than one block (--bs {bs_bytes})")]
    RegionSmallerThanBlock {
        /// Bytes in the region.
        region_bytes: u64,
        /// The block size.
        bs_bytes: u32,
        /// The target's name.
        target: String,
    },
    /// A writing job on a target opened read-only.
    #[error("--rw {rw}: the job writes, but {target} is open read-only")]
    ReadOnlyTarget {
        /// The mode given.
        rw: RwMode,
        /// The target's name.
        target: String,
    },
    /// Nothing to run on.
    #[error("no target to run the job on")]
    NoTargets,
    /// `--preset` names no preset.
    #[error("--preset {name}: no such preset (known: {known})")]
    UnknownPreset {
        /// The name given.
        name: String,
        /// The names that exist.
        known: String,
    },
    /// An option could not be read.
    #[error("{option}: {message}")]
    BadValue {
        /// The option.
        option: &'static str,
        /// What was wrong.
        message: String,
    },
}
