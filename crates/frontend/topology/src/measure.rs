//! `--measure`: a short read-only sequential read per device, set beside its predicted ceiling.
//!
//! The `Measurer` trait lets the binary plug in the bench engine; `DirectReadMeasurer` is the
//! built-in fallback: a few threads issuing 1 MiB `pread`s with O_DIRECT (buffered when the
//! file system refuses O_DIRECT), each thread on its own interleaved share of the device. It
//! opens the path read-only and never writes.

use std::fs::{File, OpenOptions};
use std::io::{self, Seek, SeekFrom};
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use serde::Serialize;

/// What one sequential-read run achieved.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct Measured {
    pub bytes_per_sec: f64,
    pub iops: f64,
    /// CPU time of the reading threads over their wall time (0 = idle, 1 = every thread busy).
    pub cpu_busy_fraction: f64,
    /// False when the file system refused O_DIRECT and the page cache was in the way.
    pub direct_io: bool,
}

/// Something that can read a device sequentially for a while and say how fast it went.
pub trait Measurer {
    fn seq_read(&self, dev_path: &Path, duration: Duration) -> io::Result<Measured>;
}

/// What held a measured device back.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Bottleneck {
    LinkLimited,
    DeviceLimited,
    CpuLimited,
}

/// A measurement this close to the link ceiling is the link's doing.
pub const LINK_LIMITED_FRACTION: f64 = 0.85;
/// Reading threads this busy are the CPU's doing.
pub const CPU_LIMITED_FRACTION: f64 = 0.85;

/// Link-limited near the predicted ceiling, CPU-limited when the threads were busy, else the
/// device is what held the run back.
pub fn classify(measured: &Measured, ceiling_bytes_per_sec: Option<f64>) -> Bottleneck {
    let near_link =
        ceiling_bytes_per_sec.is_some_and(|c| measured.bytes_per_sec >= LINK_LIMITED_FRACTION * c);
    if near_link {
        Bottleneck::LinkLimited
    } else if measured.cpu_busy_fraction >= CPU_LIMITED_FRACTION {
        Bottleneck::CpuLimited
    } else {
        Bottleneck::DeviceLimited
    }
}

/// The built-in fallback measurer.
#[derive(Clone, Copy, Debug)]
pub struct DirectReadMeasurer {
    pub threads: usize,
    pub block_bytes: usize,
}

impl Default for DirectReadMeasurer {
    fn default() -> Self {
        DirectReadMeasurer {
            threads: 4,
            block_bytes: 1 << 20,
        }
    }
}

const ALIGN_BYTES: usize = 4096;

impl Measurer for DirectReadMeasurer {
    fn seq_read(&self, dev_path: &Path, duration: Duration) -> io::Result<Measured> {
        let (file, direct_io) = open_read_only(dev_path)?;
        let size_bytes = (&file).seek(SeekFrom::End(0))?;
        if size_bytes < ALIGN_BYTES as u64 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("{} is smaller than {ALIGN_BYTES} bytes", dev_path.display()),
            ));
        }
        let block_bytes = self.block_bytes_for(size_bytes);
        let blocks = size_bytes / block_bytes as u64;
        let threads = self.threads.max(1);
        let stop = AtomicBool::new(false);
        let started = Instant::now();
        let deadline = started + duration;
        let totals = std::thread::scope(|scope| {
            let handles: Vec<_> = (0..threads)
                .map(|t| {
                    let job = ReadJob {
                        file: &file,
                        block_bytes,
                        blocks,
                        first_block: t as u64,
                        stride_blocks: threads as u64,
                        deadline,
                        stop: &stop,
                    };
                    scope.spawn(move || job.run())
                })
                .collect();
            handles
                .into_iter()
                .map(|h| {
                    h.join()
                        .unwrap_or_else(|_| Err(io::Error::other("reader panicked")))
                })
                .collect::<io::Result<Vec<ThreadTotals>>>()
        })?;
        let elapsed_sec = started.elapsed().as_secs_f64().max(1e-6);
        Ok(summarise(&totals, elapsed_sec, threads, direct_io))
    }
}

impl DirectReadMeasurer {
    /// The request size: `block_bytes`, shrunk (to a multiple of 4 KiB) for tiny devices.
    fn block_bytes_for(&self, size_bytes: u64) -> usize {
        let wanted = self.block_bytes.max(ALIGN_BYTES) / ALIGN_BYTES * ALIGN_BYTES;
        let fits = (size_bytes / ALIGN_BYTES as u64 * ALIGN_BYTES as u64) as usize;
        wanted.min(fits.max(ALIGN_BYTES))
    }
}

fn open_read_only(path: &Path) -> io::Result<(File, bool)> {
    let direct = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECT)
        .open(path);
    match direct {
        Ok(file) => Ok((file, true)),
        Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {
            Ok((OpenOptions::new().read(true).open(path)?, false))
        }
        Err(e) => Err(e),
    }
}

struct ReadJob<'a> {
    file: &'a File,
    block_bytes: usize,
    blocks: u64,
    first_block: u64,
    stride_blocks: u64,
    deadline: Instant,
    stop: &'a AtomicBool,
}

#[derive(Clone, Copy, Debug, Default)]
struct ThreadTotals {
    bytes: u64,
    reads: u64,
    cpu_ns: u64,
}

impl ReadJob<'_> {
    fn run(self) -> io::Result<ThreadTotals> {
        let cpu_start_ns = thread_cpu_ns();
        let mut storage = vec![0u8; self.block_bytes + ALIGN_BYTES];
        let offset = storage.as_ptr().align_offset(ALIGN_BYTES);
        let buffer = &mut storage[offset..offset + self.block_bytes];
        let mut totals = ThreadTotals::default();
        let mut block = self.first_block % self.blocks;
        while Instant::now() < self.deadline && !self.stop.load(Ordering::Relaxed) {
            let position = block * self.block_bytes as u64;
            let n = match self.file.read_at(buffer, position) {
                Ok(n) => n,
                Err(e) => {
                    self.stop.store(true, Ordering::Relaxed);
                    return Err(e);
                }
            };
            totals.bytes += n as u64;
            totals.reads += 1;
            block = (block + self.stride_blocks) % self.blocks;
        }
        totals.cpu_ns = thread_cpu_ns().saturating_sub(cpu_start_ns);
        Ok(totals)
    }
}

/// CPU time of the calling thread from `/proc/thread-self/schedstat` (0 where unavailable).
fn thread_cpu_ns() -> u64 {
    std::fs::read_to_string("/proc/thread-self/schedstat")
        .ok()
        .and_then(|t| t.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

fn summarise(
    totals: &[ThreadTotals],
    elapsed_sec: f64,
    threads: usize,
    direct_io: bool,
) -> Measured {
    let bytes: u64 = totals.iter().map(|t| t.bytes).sum();
    let reads: u64 = totals.iter().map(|t| t.reads).sum();
    let cpu_sec = totals.iter().map(|t| t.cpu_ns).sum::<u64>() as f64 / 1e9;
    Measured {
        bytes_per_sec: bytes as f64 / elapsed_sec,
        iops: reads as f64 / elapsed_sec,
        cpu_busy_fraction: (cpu_sec / (elapsed_sec * threads as f64)).min(1.0),
        direct_io,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn measured(bytes_per_sec: f64, cpu_busy_fraction: f64) -> Measured {
        Measured {
            bytes_per_sec,
            iops: 0.0,
            cpu_busy_fraction,
            direct_io: true,
        }
    }

    #[test]
    fn near_the_ceiling_is_link_limited() {
        let m = measured(3.2e9, 0.2);
        assert_eq!(classify(&m, Some(3.5e9)), Bottleneck::LinkLimited);
    }

    #[test]
    fn busy_threads_below_the_ceiling_are_cpu_limited() {
        let m = measured(1.0e9, 0.95);
        assert_eq!(classify(&m, Some(3.5e9)), Bottleneck::CpuLimited);
        assert_eq!(classify(&m, None), Bottleneck::CpuLimited);
    }

    #[test]
    fn idle_threads_below_the_ceiling_are_device_limited() {
        let m = measured(1.0e9, 0.1);
        assert_eq!(classify(&m, Some(3.5e9)), Bottleneck::DeviceLimited);
    }

    #[test]
    fn request_size_shrinks_for_tiny_devices() {
        let m = DirectReadMeasurer::default();
        assert_eq!(m.block_bytes_for(1 << 30), 1 << 20);
        assert_eq!(m.block_bytes_for(10_000), 8192);
        assert_eq!(m.block_bytes_for(4096), 4096);
    }

    #[test]
    fn reads_a_regular_file_without_changing_it() {
        let mut file = tempfile::NamedTempFile::new().unwrap();
        let data: Vec<u8> = (0..(4u32 << 20)).map(|i| (i % 251) as u8).collect();
        std::io::Write::write_all(&mut file, &data).unwrap();
        let before = std::fs::read(file.path()).unwrap();
        let reader = DirectReadMeasurer {
            threads: 2,
            block_bytes: 1 << 20,
        };
        let m = reader
            .seq_read(file.path(), Duration::from_millis(200))
            .unwrap();
        assert!(m.bytes_per_sec > 0.0);
        assert!(m.iops > 0.0);
        assert!((0.0..=1.0).contains(&m.cpu_busy_fraction));
        assert_eq!(std::fs::read(file.path()).unwrap(), before);
    }

    #[test]
    fn missing_and_tiny_files_are_errors_not_panics() {
        let reader = DirectReadMeasurer::default();
        let missing = reader.seq_read(Path::new("/nonexistent/dev"), Duration::from_millis(10));
        assert!(missing.is_err());
        let tiny = tempfile::NamedTempFile::new().unwrap();
        let err = reader
            .seq_read(tiny.path(), Duration::from_millis(10))
            .unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::InvalidInput);
    }
}
