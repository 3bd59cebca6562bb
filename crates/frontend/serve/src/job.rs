//! Jobs: requests a worker runs through its queue split into slot-sized
//! pieces (a request of its own connections too long for one slot, the
//! reads and writes of an unaligned request, the final flush), and where
//! each goes when it is done.

use std::sync::Arc;

use nvraid_io::queue::OpKind;
use nvraid_nbd::ErrorCode;

/// What a job does to the target.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Work {
    Read,
    Write,
    /// Write zeroes (the target has no zeroing op, so zero-filled writes).
    Zero,
    Discard,
    Flush,
}

impl Work {
    /// What an NBD or ublk request does to the target (the one mapping
    /// both frontends use); `None` for a command that moves nothing.
    pub(crate) fn of(command: nvraid_nbd::Command) -> Option<Work> {
        use nvraid_nbd::Command as C;
        match command {
            C::Read => Some(Work::Read),
            C::Write => Some(Work::Write),
            C::WriteZeroes => Some(Work::Zero),
            C::Trim => Some(Work::Discard),
            C::Flush => Some(Work::Flush),
            _ => None,
        }
    }

    /// The NBD command that does this work (how the counters and the
    /// latency histograms class it).
    pub(crate) fn command(self) -> nvraid_nbd::Command {
        use nvraid_nbd::Command as C;
        match self {
            Work::Read => C::Read,
            Work::Write => C::Write,
            Work::Zero => C::WriteZeroes,
            Work::Discard => C::Trim,
            Work::Flush => C::Flush,
        }
    }

    /// The target operation of one slot's piece (zeroing: a write of a
    /// zero-filled slot, see `Slots::prepare`).
    pub(crate) fn op(self) -> OpKind {
        match self {
            Work::Read => OpKind::Read,
            Work::Write | Work::Zero => OpKind::Write,
            Work::Discard => OpKind::Discard,
            Work::Flush => OpKind::Flush,
        }
    }
}

/// Where a finished job goes.
pub(crate) trait Finish: Send + Sync {
    /// The job is done.
    fn finish(&self, job: Job, result: Result<(), ErrorCode>);
}

/// One request for a worker.
pub(crate) struct Job {
    pub owner: Arc<dyn Finish>,
    pub cookie: u64,
    pub work: Work,
    pub offset: u64,
    pub length: u32,
    pub fua: bool,
    /// Payload of a write, or the destination of a read (`length` long).
    pub buffer: Vec<u8>,
    /// Bytes reserved against the connection's in-flight budget.
    pub permit_bytes: u64,
    pub command: nvraid_nbd::Command,
    /// A whole client request of this export (its time goes into the
    /// latency histograms); `None` for the parts of an unaligned request
    /// and the server's own flushes.
    pub timed: Option<crate::stats::Export>,
}
