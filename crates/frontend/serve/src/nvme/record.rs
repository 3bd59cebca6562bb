//! What an NVMe queue knows of the server: its log, the shutdown signal,
//! the deadlines, the NVMe counters and how to give its admission slot
//! back. The setup side (`setup.rs`) builds it from the server's shared
//! state; the queue (`queue.rs`), on its connection's thread or in the
//! worker that owns it, sees only this, never the server.

use std::sync::Arc;
use std::time::Duration;

use crate::options::LogSink;
use crate::shutdown::ShutdownHandle;
use crate::stats::Counters;

/// One NVMe/TCP connection's view of the server.
pub(crate) struct QueueRecord {
    /// The server's log (lines get the server's prefix here).
    pub log: LogSink,
    pub shutdown: ShutdownHandle,
    /// ICReq and Connect must come within it.
    pub handshake_timeout: Duration,
    /// A PDU, a write's data, or the host's taking of answers must move
    /// within it.
    pub transfer_timeout: Duration,
    /// An admin queue without a keep-alive timeout of its own ends after
    /// this long without a command (none: never).
    pub idle_timeout: Option<Duration>,
    /// The NVMe/TCP commands' counters (the server's totals read them).
    pub counters: Arc<Counters>,
    /// Give the connection's admission slot back.
    pub release: Box<dyn Fn() + Send + Sync>,
}

impl QueueRecord {
    pub(crate) fn log(&self, line: &str) {
        (self.log)(&format!("nvraid-serve: {line}"));
    }

    /// The connection has ended: its admission slot is free again. Called
    /// once, by whoever ends the connection.
    pub(crate) fn release_slot(&self) {
        (self.release)();
    }
}
