//! Members reached over a network rather than through a file descriptor.
//!
//! A [`RemoteFile`] (an NBD export, for instance) opens one [`Channel`] per
//! worker engine: the worker's own connection, on which it pipelines its
//! operations and from which it takes their replies, with no other thread
//! involved. [`MixedEngine`] puts channels beside an ordinary engine: an
//! operation on a file-table entry that is remote goes to that entry's
//! channel, every other one to the inner engine, and [`Engine::complete`]
//! gathers completions from both.
//!
//! This module only defines the interface and the dispatch; the NBD client
//! lives in nvraid-remote.

use crate::engine::{Engine, MemberOp};
use std::fmt;
use std::io;
use std::os::fd::RawFd;
use std::sync::Arc;
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
    /// As [`Engine::push`]: the op's memory stays valid until its
    /// completion has been passed on.
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

/// An ordinary engine plus a channel for each remote entry of the file
/// table.
pub struct MixedEngine {
    inner: Box<dyn Engine>,
    channels: Vec<Option<Box<dyn Channel>>>,
    /// Operations pushed to the inner engine and not yet completed.
    inner_outstanding: u32,
    remote_count: usize,
}

impl MixedEngine {
    /// `remotes[i]` is the remote file at index `i` of the file table (the
    /// inner engine has -1 there), or `None`.
    pub fn new(
        inner: Box<dyn Engine>,
        remotes: &[Option<Arc<dyn RemoteFile>>],
    ) -> io::Result<MixedEngine> {
        let mut engine = MixedEngine {
            inner,
            channels: (0..remotes.len()).map(|_| None).collect(),
            inner_outstanding: 0,
            remote_count: 0,
        };
        for (index, remote) in remotes.iter().enumerate() {
            engine.set_remote(index as u32, remote.as_ref())?;
        }
        Ok(engine)
    }

    fn set_remote(&mut self, index: u32, remote: Option<&Arc<dyn RemoteFile>>) -> io::Result<()> {
        let index = index as usize;
        if index >= self.channels.len() {
            self.channels.resize_with(index + 1, || None);
        }
        self.channels[index] = match remote {
            Some(remote) => Some(remote.open_channel()?),
            None => None,
        };
        self.remote_count = self.channels.iter().filter(|c| c.is_some()).count();
        Ok(())
    }

    fn remote_inflight(&self) -> u32 {
        self.channels.iter().flatten().map(|c| c.inflight()).sum()
    }

    /// Progress every channel; returns completions passed.
    fn progress_channels(&mut self, on_complete: &mut dyn FnMut(u64, i32)) -> u32 {
        let mut passed = 0;
        for channel in self.channels.iter_mut().flatten() {
            if channel.inflight() > 0 {
                passed += channel.progress(on_complete);
            }
        }
        passed
    }

    fn wait_channels(&self, cap: Option<Duration>) {
        wait_for(self.channels.iter().flatten().map(|c| c.as_ref()), cap);
    }
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

impl Engine for MixedEngine {
    unsafe fn push(&mut self, op: &MemberOp) -> io::Result<()> {
        match self.channels.get_mut(op.file as usize) {
            // SAFETY: forwarded from the caller.
            Some(Some(channel)) => unsafe { channel.push(op) },
            _ => {
                // SAFETY: forwarded from the caller.
                unsafe { self.inner.push(op) }?;
                self.inner_outstanding += 1;
                Ok(())
            }
        }
    }

    fn complete(&mut self, min: u32, on_complete: &mut dyn FnMut(u64, i32)) -> io::Result<u32> {
        if self.remote_count == 0 {
            let passed = self.inner.complete(min, on_complete)?;
            self.inner_outstanding = self.inner_outstanding.saturating_sub(passed);
            return Ok(passed);
        }
        let mut passed = 0u32;
        loop {
            let inner = self.inner.complete(0, on_complete)?;
            self.inner_outstanding = self.inner_outstanding.saturating_sub(inner);
            passed += inner + self.progress_channels(on_complete);
            if passed >= min {
                return Ok(passed);
            }
            let remote = self.remote_inflight();
            if remote == 0 {
                if self.inner_outstanding == 0 {
                    return Ok(passed);
                }
                let inner = self.inner.complete(min - passed, on_complete)?;
                self.inner_outstanding = self.inner_outstanding.saturating_sub(inner);
                return Ok(passed + inner);
            }
            if self.inner_outstanding == 0 || self.inner.completes_inline() {
                self.wait_channels(None);
            } else {
                // Both kinds in flight: look at the sockets briefly, then
                // at the ring again.
                self.wait_channels(Some(Duration::from_micros(200)));
            }
        }
    }

    fn name(&self) -> &'static str {
        self.inner.name()
    }

    fn completes_inline(&self) -> bool {
        self.remote_count == 0 && self.inner.completes_inline()
    }

    fn update_file(&mut self, index: u32, fd: RawFd) -> io::Result<()> {
        self.inner.update_file(index, fd)
    }

    fn update_remote(
        &mut self,
        index: u32,
        remote: Option<&Arc<dyn RemoteFile>>,
    ) -> io::Result<()> {
        self.set_remote(index, remote)
    }
}
