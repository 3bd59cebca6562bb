//! Where a bench or tune result came from: the machine, what was measured
//! and the command that measured it.

use crate::error::ReportError;
use crate::json::Node;

/// The machine a run happened on (`machine` in the JSON).
#[derive(Debug, Clone)]
pub(crate) struct Machine {
    pub hostname: String,
    pub nproc: u64,
    pub cpu_model: String,
    pub kernel: String,
}

/// A result's origin. Results written before nvraid recorded these fields
/// lack them, so each is optional.
#[derive(Debug, Clone, Default)]
pub(crate) struct Provenance {
    pub machine: Option<Machine>,
    /// What was measured, in one line (the array and its members).
    pub subject: Option<String>,
    /// The command line that produced the result.
    pub command: Option<String>,
    /// The `nvraid version` that wrote it.
    pub version: Option<String>,
    /// Unix time of the run, in seconds.
    pub timestamp: Option<u64>,
}

impl Machine {
    fn read(node: Node<'_>) -> Result<Machine, ReportError> {
        Ok(Machine {
            hostname: node.get("hostname", |n| n.str())?,
            nproc: node.get("nproc", |n| n.u64())?,
            cpu_model: node.get("cpu_model", |n| n.str())?,
            kernel: node.get("kernel", |n| n.str())?,
        })
    }
}

impl Provenance {
    /// Reads the origin fields at the top level of a result.
    pub(crate) fn read(root: Node<'_>) -> Result<Provenance, ReportError> {
        Ok(Provenance {
            machine: root.opt("machine", Machine::read)?,
            subject: root.opt("subject", |n| n.str())?,
            command: root.opt("command", |n| n.str())?,
            version: root.opt("nvraid version", |n| n.str())?,
            timestamp: root.opt("timestamp", |n| n.u64())?,
        })
    }
}
