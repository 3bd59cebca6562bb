//! Members reached over a network rather than through a file descriptor.
//!
//! [`MixedEngine`] puts remote members' channels (see `channel`: a
//! [`RemoteFile`] opens one [`Channel`] per worker) beside an ordinary
//! engine: an operation on a file-table entry that is remote goes to that
//! entry's channel, every other one to the inner engine, and
//! [`Engine::complete`] gathers completions from both.
//!
//! This module is the dispatch, and the place the rest of nvraid names the
//! remote-member interface by (it is re-exported from `channel`); the NBD
//! client lives in nvraid-remote.

pub use crate::channel::{wait_for, Channel, IdentityCheck, RemoteFile};
use crate::engine::{Engine, MemberOp};
use std::io;
use std::os::fd::RawFd;
use std::sync::Arc;
use std::time::Duration;

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

    /// Put `engine` under a mixed engine in place, when a remote member
    /// first joins a queue whose engine had none (a queue of local members
    /// runs on its plain engine, with no dispatch per operation).
    /// `outstanding` operations pushed to `engine` have not completed yet;
    /// they complete through the mixed engine like any other. Remote
    /// entries are added afterwards with [`Engine::update_remote`].
    pub fn wrap_in_place(engine: &mut Box<dyn Engine>, outstanding: u32) {
        let inner = std::mem::replace(engine, Box::new(Vacant));
        *engine = Box::new(MixedEngine {
            inner,
            channels: Vec::new(),
            inner_outstanding: outstanding,
            remote_count: 0,
        });
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

    /// The inner engine passed on `count` completions: each is one of the
    /// operations pushed to it.
    fn inner_completed(&mut self, count: u32) {
        assert!(
            count <= self.inner_outstanding,
            "invariant: the inner engine completes only operations pushed to it ({count} completions, {} outstanding)",
            self.inner_outstanding
        );
        self.inner_outstanding -= count;
    }

    fn wait_channels(&self, cap: Option<Duration>) {
        wait_for(self.channels.iter().flatten().map(|c| c.as_ref()), cap);
    }
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
            self.inner_completed(passed);
            return Ok(passed);
        }
        let mut passed = 0u32;
        loop {
            let inner = self.inner.complete(0, on_complete)?;
            self.inner_completed(inner);
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
                self.inner_completed(inner);
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

/// Holds an engine's place for the instant [`MixedEngine::wrap_in_place`]
/// moves it (a zero-sized box: no allocation); never given an operation.
struct Vacant;

impl Engine for Vacant {
    unsafe fn push(&mut self, _op: &MemberOp) -> io::Result<()> {
        Err(io::Error::other("no engine"))
    }

    fn complete(&mut self, _min: u32, _on_complete: &mut dyn FnMut(u64, i32)) -> io::Result<u32> {
        Ok(0)
    }

    fn name(&self) -> &'static str {
        "none"
    }

    fn update_file(&mut self, _index: u32, _fd: RawFd) -> io::Result<()> {
        Ok(())
    }
}
