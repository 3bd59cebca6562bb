//! `nvraid-bench/1`: the fio-style JSON of `nvraid bench --json`.

use crate::error::ReportError;
use crate::json::Node;
use crate::model::Provenance;

/// How `nvraid bench` laid its text report out, which decides the figures.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Layout {
    /// CrystalDiskMark rows, read and write columns.
    Cdm,
    /// ATTO's transfer-size sweep.
    Atto,
    /// AS SSD's rows and score.
    AsSsd,
    /// One line per job.
    Jobs,
}

/// fio's `rw` of a job.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RwMode {
    Read,
    Write,
    RandRead,
    RandWrite,
    RandRw,
}

/// One direction (`read` or `write`) of a job's result.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Direction {
    pub iops: f64,
    pub bw_bytes: f64,
}

/// One job's result.
#[derive(Debug, Clone)]
pub(crate) struct Job {
    /// fio's `jobname`, unique within the file.
    pub name: String,
    /// The row label (`SEQ1M Q8T1`, `64M`, `T4 Q32`), shared by a row's
    /// read and write jobs.
    pub label: String,
    pub rw: RwMode,
    /// Transfer size in bytes, and as written (`4K`).
    pub bs_bytes: u64,
    pub bs: String,
    pub iodepth: u32,
    pub numjobs: u32,
    pub read: Direction,
    pub write: Direction,
    /// Completion-latency percentiles of both directions: (percent, ns),
    /// ascending; empty when the job completed no I/O.
    pub percentiles: Vec<(f64, f64)>,
}

/// AS SSD's score, present when every step it needs ran.
#[derive(Debug, Clone, Copy)]
pub(crate) struct AsSsdScore {
    pub read: f64,
    pub write: f64,
    pub total: f64,
}

/// A whole `nvraid bench` result.
#[derive(Debug, Clone)]
pub(crate) struct Bench {
    pub provenance: Provenance,
    pub layout: Layout,
    pub preset: Option<String>,
    pub jobs: Vec<Job>,
    /// Steps that did not run: (label, reason).
    pub skipped: Vec<(String, String)>,
    pub as_ssd_score: Option<AsSsdScore>,
}

impl RwMode {
    fn read(node: Node<'_>) -> Result<RwMode, ReportError> {
        Ok(match node.str()?.as_str() {
            "read" => RwMode::Read,
            "write" => RwMode::Write,
            "randread" => RwMode::RandRead,
            "randwrite" => RwMode::RandWrite,
            "randrw" => RwMode::RandRw,
            other => {
                return Err(node.error(format!(
                    "should be read, write, randread, randwrite or randrw, found \"{other}\""
                )))
            }
        })
    }

    /// Whether the job issues reads.
    pub(crate) fn reads(self) -> bool {
        matches!(self, RwMode::Read | RwMode::RandRead | RwMode::RandRw)
    }

    /// Whether the job issues writes.
    pub(crate) fn writes(self) -> bool {
        matches!(self, RwMode::Write | RwMode::RandWrite | RwMode::RandRw)
    }

    /// fio's spelling.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            RwMode::Read => "read",
            RwMode::Write => "write",
            RwMode::RandRead => "randread",
            RwMode::RandWrite => "randwrite",
            RwMode::RandRw => "randrw",
        }
    }
}

impl Layout {
    fn read(node: Node<'_>) -> Result<Layout, ReportError> {
        Ok(match node.str()?.as_str() {
            "cdm" => Layout::Cdm,
            "atto" => Layout::Atto,
            "as-ssd" => Layout::AsSsd,
            "jobs" => Layout::Jobs,
            other => {
                return Err(node.error(format!(
                    "should be cdm, atto, as-ssd or jobs, found \"{other}\""
                )))
            }
        })
    }
}

/// Bytes in a size as fio and nvraid write it: `512`, `4K`, `64M`, `1G`
/// (binary multiples).
pub(crate) fn parse_size(text: &str) -> Option<u64> {
    let text = text.trim();
    let (digits, shift) = match text.as_bytes().last()? {
        b'K' | b'k' => (&text[..text.len() - 1], 10),
        b'M' | b'm' => (&text[..text.len() - 1], 20),
        b'G' | b'g' => (&text[..text.len() - 1], 30),
        b'T' | b't' => (&text[..text.len() - 1], 40),
        _ => (text, 0),
    };
    digits.parse::<u64>().ok()?.checked_mul(1 << shift)
}

impl Direction {
    fn read(node: Node<'_>) -> Result<Direction, ReportError> {
        Ok(Direction {
            iops: node.get("iops", |n| n.f64())?,
            bw_bytes: node.get("bw_bytes", |n| n.f64())?,
        })
    }
}

/// `clat_ns.percentile` as (percent, ns), ascending.
fn read_percentiles(node: Node<'_>) -> Result<Vec<(f64, f64)>, ReportError> {
    let mut points = node.entries(|key, value| {
        let percent: f64 = key
            .parse()
            .ok()
            .filter(|p| (0.0..=100.0).contains(p))
            .ok_or_else(|| value.error("is not named by a percentile from 0 to 100"))?;
        Ok((percent, value.f64()?))
    })?;
    points.sort_by(|a, b| a.0.total_cmp(&b.0));
    Ok(points)
}

impl Job {
    fn read(node: Node<'_>) -> Result<Job, ReportError> {
        let (rw, bs, bs_bytes, iodepth, numjobs) = node.get("job options", |options| {
            let bs = options.get("bs", |n| n.str())?;
            let bs_bytes = options.get("bs", |n| {
                parse_size(&bs).ok_or_else(|| n.error(format!("should be a size, found \"{bs}\"")))
            })?;
            Ok((
                options.get("rw", RwMode::read)?,
                bs,
                bs_bytes,
                options.get("iodepth", |n| n.parsed("a queue depth"))?,
                options.get("numjobs", |n| n.parsed("a worker count"))?,
            ))
        })?;
        let (label, percentiles) = node.get("nvraid", |nvraid| {
            Ok((
                nvraid.get("label", |n| n.str())?,
                nvraid.get("clat_ns", |clat| clat.get("percentile", read_percentiles))?,
            ))
        })?;
        Ok(Job {
            name: node.get("jobname", |n| n.str())?,
            label,
            rw,
            bs_bytes,
            bs,
            iodepth,
            numjobs,
            read: node.get("read", Direction::read)?,
            write: node.get("write", Direction::read)?,
            percentiles,
        })
    }

    /// Bytes per second in both directions.
    pub(crate) fn total_bw_bytes(&self) -> f64 {
        self.read.bw_bytes + self.write.bw_bytes
    }

    /// I/Os per second in both directions.
    pub(crate) fn total_iops(&self) -> f64 {
        self.read.iops + self.write.iops
    }
}

impl AsSsdScore {
    fn read(node: Node<'_>) -> Result<AsSsdScore, ReportError> {
        Ok(AsSsdScore {
            read: node.get("read", |n| n.f64())?,
            write: node.get("write", |n| n.f64())?,
            total: node.get("total", |n| n.f64())?,
        })
    }
}

impl Bench {
    /// Reads a bench result whose schema has been checked.
    pub(crate) fn read(root: Node<'_>) -> Result<Bench, ReportError> {
        let skipped = root
            .opt("skipped", |list| {
                list.items(|item| {
                    Ok((
                        item.get("label", |n| n.str())?,
                        item.get("reason", |n| n.str())?,
                    ))
                })
            })?
            .unwrap_or_default();
        Ok(Bench {
            provenance: Provenance::read(root)?,
            layout: root.get("layout", Layout::read)?,
            preset: root.opt("preset", |n| n.str())?,
            jobs: root.get("jobs", |jobs| jobs.items(Job::read))?,
            skipped,
            as_ssd_score: root.opt("as_ssd_score", AsSsdScore::read)?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_as_nvraid_writes_them() {
        assert_eq!(parse_size("512"), Some(512));
        assert_eq!(parse_size("4K"), Some(4096));
        assert_eq!(parse_size("64M"), Some(64 << 20));
        assert_eq!(parse_size("1G"), Some(1 << 30));
        assert_eq!(parse_size("K"), None);
        assert_eq!(parse_size("1.5M"), None);
    }
}
