//! One connection shared by every worker, for servers that do not advertise
//! CAN_MULTI_CONN. On such a server a FLUSH covers only the writes made on
//! its own connection, so all of a member's requests (the fast path's
//! workers and the simple path alike) go over one pipelined connection.
//!
//! Each user holds a [`SharedHandle`]. A handle tags its operations with its
//! own number (the top 16 bits of the user data); whichever handle happens
//! to make progress on the connection takes in every reply that has
//! arrived, keeps its own completions and puts the others' into their
//! inboxes, waking each owner through its eventfd. A handle waits on the
//! socket and on its own eventfd, so a completion received by another
//! worker wakes it.

use crate::channel::NbdChannel;
use nvraid_io::engine::MemberOp;
use nvraid_io::remote::Channel;
use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::{Arc, Mutex};
use std::time::Instant;

/// Bits of the user data left to the handle's caller.
const USER_BITS: u32 = 48;
const USER_MASK: u64 = (1 << USER_BITS) - 1;

/// The connection and the handles' inboxes.
pub struct SharedConnection {
    channel: Mutex<NbdChannel>,
    handles: Mutex<Vec<Inbox>>,
}

struct Inbox {
    done: Vec<(u64, i32)>,
    /// None: the slot's handle was dropped, and the slot may be reused.
    wake: Option<Arc<OwnedFd>>,
}

impl SharedConnection {
    pub fn new(channel: NbdChannel) -> Arc<SharedConnection> {
        Arc::new(SharedConnection {
            channel: Mutex::new(channel),
            handles: Mutex::new(Vec::new()),
        })
    }

    /// A new user of the connection.
    pub fn handle(self: &Arc<Self>) -> io::Result<SharedHandle> {
        let wake = Arc::new(nvraid_io::sys::eventfd()?);
        let mut handles = self.handles.lock().unwrap_or_else(|e| e.into_inner());
        let inbox = Inbox {
            done: Vec::new(),
            wake: Some(Arc::clone(&wake)),
        };
        // Reuse the slot of a handle that was dropped (queues come and go:
        // a server opens some per client).
        let id = match handles.iter().position(|i| i.wake.is_none()) {
            Some(free) => {
                handles[free] = inbox;
                free
            }
            None if handles.len() >= 1 << 16 => {
                return Err(io::Error::other("too many users of one connection"))
            }
            None => {
                handles.push(inbox);
                handles.len() - 1
            }
        };
        Ok(SharedHandle {
            shared: Arc::clone(self),
            id: id as u64,
            wake,
            inflight: 0,
        })
    }
}

/// One user's side of a [`SharedConnection`].
pub struct SharedHandle {
    shared: Arc<SharedConnection>,
    id: u64,
    wake: Arc<OwnedFd>,
    /// Operations pushed and not yet passed on.
    inflight: u32,
}

impl Channel for SharedHandle {
    unsafe fn push(&mut self, op: &MemberOp) -> io::Result<()> {
        assert!(op.user_data <= USER_MASK, "user data wider than 48 bits");
        let tagged = MemberOp {
            user_data: (self.id << USER_BITS) | op.user_data,
            ..*op
        };
        let mut channel = self
            .shared
            .channel
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        // SAFETY: forwarded from the caller; the operation's memory stays
        // valid until its completion reaches this handle's caller, whichever
        // handle takes in the reply.
        unsafe { channel.push(&tagged) }?;
        self.inflight += 1;
        Ok(())
    }

    fn progress(&mut self, on_complete: &mut dyn FnMut(u64, i32)) -> u32 {
        nvraid_io::sys::eventfd_drain(self.wake.as_raw_fd());
        let mut mine = Vec::new();
        {
            let mut channel = self
                .shared
                .channel
                .lock()
                .unwrap_or_else(|e| e.into_inner());
            let mut others: Vec<(u64, u64, i32)> = Vec::new();
            channel.progress(&mut |user_data, result| {
                let owner = user_data >> USER_BITS;
                if owner == self.id {
                    mine.push((user_data & USER_MASK, result));
                } else {
                    others.push((owner, user_data & USER_MASK, result));
                }
            });
            drop(channel);
            let mut handles = self
                .shared
                .handles
                .lock()
                .unwrap_or_else(|e| e.into_inner());
            for (owner, user_data, result) in others {
                let inbox = &mut handles[owner as usize];
                // A dropped handle had nothing in flight (its queue drained
                // first); a reply for it is dropped with it.
                if let Some(wake) = &inbox.wake {
                    inbox.done.push((user_data, result));
                    nvraid_io::sys::eventfd_signal(wake.as_raw_fd());
                }
            }
            mine.append(&mut handles[self.id as usize].done);
        }
        let passed = mine.len() as u32;
        self.inflight -= passed;
        for (user_data, result) in mine {
            on_complete(user_data, result);
        }
        passed
    }

    fn inflight(&self) -> u32 {
        self.inflight
    }

    fn poll_fds(&self, out: &mut Vec<libc::pollfd>) {
        out.push(libc::pollfd {
            fd: self.wake.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        });
        let channel = self
            .shared
            .channel
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        if let Some((fd, events)) = channel.poll_fd() {
            out.push(libc::pollfd {
                fd,
                events,
                revents: 0,
            });
        }
    }

    fn wake_at(&self) -> Option<Instant> {
        let handles = self
            .shared
            .handles
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        if !handles[self.id as usize].done.is_empty() {
            return Some(Instant::now());
        }
        drop(handles);
        self.shared
            .channel
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .wake_at()
    }
}

impl Drop for SharedHandle {
    fn drop(&mut self) {
        let mut handles = self
            .shared
            .handles
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        let inbox = &mut handles[self.id as usize];
        inbox.wake = None;
        inbox.done.clear();
    }
}

impl SharedHandle {
    /// Block until every operation of this handle has been passed on.
    pub fn wait_all(&mut self, on_complete: &mut dyn FnMut(u64, i32)) {
        while self.inflight > 0 {
            if self.progress(on_complete) == 0 {
                nvraid_io::remote::wait_for(std::iter::once(self as &dyn Channel), None);
            }
        }
    }
}
