//! What a member reached over a network offers a worker: a [`RemoteFile`]
//! (an NBD export, for instance) opens one [`Channel`] per worker engine,
//! the worker's own connection, on which it pipelines its operations and
//! from which it takes their replies, with no other thread involved; an
//! [`IdentityCheck`] is what every new connection proves before it is
//! used. [`wait_for`] sleeps on several channels at once.
//!
//! Only the interface lives here; the mixed engine that dispatches to
//! channels is `remote`, the NBD client is nvraid-remote.

use crate::op::MemberOp;
use std::fmt;
use std::io;
use std::time::{Duration, Instant};

/// Something a worker can open its own channel to.
pub trait RemoteFile: Send + Sync + fmt::Debug {
    /// A new channel (a connection of its own, when the server allows
    /// several; otherwise whatever keeps the server's ordering rules).
    fn open_channel(&self) -> io::Result<Box<dyn Channel>>;
}

/// How a member reached over a network proves, on every new connection,
/// that the device answering is still the one the array was assembled
/// from (not another export put behind the same address, a member of
/// another array, or an older copy of this one). The transport reads
/// [`IdentityCheck::probe`] on the new connection before it sends any
/// other request there, and hands the bytes to [`IdentityCheck::verify`];
/// a connection that fails the check is closed and its operations fail
/// (`ENXIO`), with the reason kept for the array (see
/// [`IdentityCheck::verify`]).
pub trait IdentityCheck: Send + Sync + fmt::Debug {
    /// The byte range to read on each new connection: (offset, length).
    fn probe(&self) -> (u64, usize);
    /// Whether `bytes` (the probe's range, just read) show the expected
    /// device. Err: what differs, in words (the transport adds where it
    /// was connected to).
    fn verify(&self, bytes: &[u8]) -> Result<(), String>;
}

/// One worker's connection to a remote member. Every method returns
/// without blocking, except where it says otherwise.
pub trait Channel: Send {
    /// Queue `op` and start sending it. A channel that cannot take it
    /// (its connection is down) completes it with an error at the next
    /// [`Channel::progress`] rather than failing here.
    ///
    /// # Safety
    /// As `Engine::push` (the engine module): the op's memory stays valid
    /// until its completion has been passed on.
    unsafe fn push(&mut self, op: &MemberOp) -> io::Result<()>;

    /// Send what can be sent, take in what has arrived, enforce the
    /// per-request timeout, and pass each finished operation to
    /// `on_complete(user_data, bytes or -errno)`. Returns how many passed.
    fn progress(&mut self, on_complete: &mut dyn FnMut(u64, i32)) -> u32;

    /// Operations pushed and not yet passed on.
    fn inflight(&self) -> u32;

    /// The descriptors to wait on, with the `poll(2)` events wanted, while
    /// operations are in flight (appended to `out`).
    fn poll_fds(&self, out: &mut Vec<libc::pollfd>);

    /// When the channel next needs [`Channel::progress`] even if its
    /// descriptor stays quiet (the oldest request's deadline, a reconnect
    /// attempt, a completion already decided).
    fn wake_at(&self) -> Option<Instant>;
}

/// Sleep until one of `channels` with work in flight has its descriptor
/// ready or needs attention ([`Channel::wake_at`]), at most `cap` (None:
/// no cap). Returns at once when none has anything to wait for.
pub fn wait_for<'a>(channels: impl Iterator<Item = &'a dyn Channel>, cap: Option<Duration>) {
    let mut fds: Vec<libc::pollfd> = Vec::new();
    let mut wake: Option<Instant> = None;
    for channel in channels {
        if channel.inflight() == 0 {
            continue;
        }
        channel.poll_fds(&mut fds);
        if let Some(at) = channel.wake_at() {
            wake = Some(wake.map_or(at, |w| w.min(at)));
        }
    }
    let now = Instant::now();
    let mut timeout = wake.map(|at| at.saturating_duration_since(now));
    if let Some(cap) = cap {
        timeout = Some(timeout.map_or(cap, |t| t.min(cap)));
    }
    let timeout_ms = match timeout {
        None => -1,
        // Round up: a deadline 0.3 ms away must not spin.
        Some(t) => t.as_micros().div_ceil(1000).min(i32::MAX as u128) as i32,
    };
    if fds.is_empty() && timeout_ms < 0 {
        return;
    }
    crate::sys::poll(&mut fds, timeout_ms);
}
