//! `nvraid-tune/1`: the chunk-size sweep of `nvraid tune --json`.

use crate::error::ReportError;
use crate::json::Node;
use crate::model::Provenance;

/// One figure of merit the sweep compares chunks by.
#[derive(Debug, Clone)]
pub(crate) struct Metric {
    /// `RND4K Q32T1 read`.
    pub key: String,
    /// `IOPS` or `MB/s`; higher is better for both.
    pub unit: String,
}

/// The results of one chunk size.
#[derive(Debug, Clone)]
pub(crate) struct Chunk {
    pub chunk_bytes: u64,
    /// (metric key, value) in the file's order.
    pub values: Vec<(String, f64)>,
}

/// The chunk size the sweep recommends, and why.
#[derive(Debug, Clone)]
pub(crate) struct Recommendation {
    pub chunk_bytes: u64,
    pub reason: String,
    /// Chunks whose scores are within `noise_pct` of the best score (the
    /// recommended one included); empty when one chunk won clearly.
    pub within_noise: Vec<u64>,
}

/// A whole `nvraid tune` result. Each chunk's full bench result is in the
/// file too; the page draws from the summary values only.
#[derive(Debug, Clone)]
pub(crate) struct Tune {
    pub provenance: Provenance,
    pub level: String,
    pub members: Vec<String>,
    pub workload: String,
    pub noise_pct: f64,
    pub metrics: Vec<Metric>,
    pub chunks: Vec<Chunk>,
    pub recommendation: Option<Recommendation>,
}

impl Chunk {
    fn read(node: Node<'_>) -> Result<Chunk, ReportError> {
        Ok(Chunk {
            chunk_bytes: node.get("chunk_bytes", |n| n.u64())?,
            values: node.get("values", |values| {
                values.entries(|key, value| Ok((key.to_string(), value.f64()?)))
            })?,
        })
    }

    /// The chunk's value of the metric `key`, if it was measured.
    pub(crate) fn value(&self, key: &str) -> Option<f64> {
        self.values
            .iter()
            .find(|(name, _)| name == key)
            .map(|(_, value)| *value)
    }
}

impl Recommendation {
    fn read(node: Node<'_>) -> Result<Recommendation, ReportError> {
        Ok(Recommendation {
            chunk_bytes: node.get("chunk_bytes", |n| n.u64())?,
            reason: node.get("reason", |n| n.str())?,
            within_noise: node.get("within_noise", |list| list.items(|n| n.u64()))?,
        })
    }
}

impl Tune {
    /// Reads a tune result whose schema has been checked.
    pub(crate) fn read(root: Node<'_>) -> Result<Tune, ReportError> {
        let metrics = root.get("metrics", |list| {
            list.items(|metric| {
                Ok(Metric {
                    key: metric.get("key", |n| n.str())?,
                    unit: metric.get("unit", |n| n.str())?,
                })
            })
        })?;
        let mut chunks = root.get("chunks", |list| list.items(Chunk::read))?;
        chunks.sort_by_key(|chunk| chunk.chunk_bytes);
        Ok(Tune {
            provenance: Provenance::read(root)?,
            level: root.get("level", |n| n.str())?,
            members: root.get("members", |n| n.strings())?,
            workload: root.get("workload", |n| n.str())?,
            noise_pct: root.get("noise_pct", |n| n.f64())?,
            metrics,
            chunks,
            recommendation: root.opt("recommendation", Recommendation::read)?,
        })
    }

    /// The best value of metric `key` over all chunks.
    pub(crate) fn best(&self, key: &str) -> Option<f64> {
        self.chunks
            .iter()
            .filter_map(|chunk| chunk.value(key))
            .reduce(f64::max)
    }
}
