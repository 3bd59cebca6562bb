//! One queue of a ublk device, served by one thread.
//!
//! The queue keeps one I/O command in the kernel per tag: FETCH_REQ at
//! first, then COMMIT_AND_FETCH_REQ, which answers the tag's request and
//! asks for the next in one go. A command's completion hands the server a
//! request, described in the queue's descriptor array (mapped read-only
//! from /dev/ublkcN); a write's data is already in the tag's buffer, a
//! read's data goes there before the commit.
//!
//! The kernel binds a queue to the thread that fetched its tags: the same
//! thread must commit them. Nothing here blocks: [`Queue::fd`] is the
//! queue's ring, readable when requests are there, so a thread can sleep
//! in poll(2) on it beside its own sockets and eventfds, then
//! [`Queue::reap`] and answer each request at once or later with
//! [`Queue::commit_and_fetch`].
//!
//! When the device is stopped (or the queue cancelled), each tag's command
//! completes with ABORT and is not fetched again; once every tag has,
//! [`Queue::finished`] is true and the queue can be dropped (closing
//! /dev/ublkcN, which DEL_DEV waits for).

use std::fs::File;
use std::os::fd::{AsRawFd, RawFd};
use std::sync::Arc;

use crate::error::Error;
use crate::sys::{self, DescMap, IoRing, TagBuffers};
use crate::uapi::{self, DevInfo, IoDescRaw};

/// A request's operation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    Read,
    Write,
    Flush,
    Discard,
    WriteSame,
    WriteZeroes,
    /// One this crate does not know (zoned devices' and later ones).
    Other(u8),
}

/// One request: what to do, where.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct IoDesc {
    pub op: Op,
    /// `uapi::IO_F_*`, in place (bits 8-31).
    pub flags: u32,
    pub start_sector: u64,
    pub nr_sectors: u32,
}

impl IoDesc {
    fn from_raw(raw: IoDescRaw) -> IoDesc {
        let op = match (raw.op_flags & 0xff) as u8 {
            uapi::IO_OP_READ => Op::Read,
            uapi::IO_OP_WRITE => Op::Write,
            uapi::IO_OP_FLUSH => Op::Flush,
            uapi::IO_OP_DISCARD => Op::Discard,
            uapi::IO_OP_WRITE_SAME => Op::WriteSame,
            uapi::IO_OP_WRITE_ZEROES => Op::WriteZeroes,
            other => Op::Other(other),
        };
        IoDesc {
            op,
            flags: raw.op_flags & !0xff,
            start_sector: raw.start_sector,
            nr_sectors: raw.nr_sectors,
        }
    }

    /// Byte offset on the device (meaningless for FLUSH, whose sector the
    /// kernel leaves unset, often all ones).
    pub fn offset(&self) -> u64 {
        self.start_sector.saturating_mul(512)
    }

    /// Bytes.
    pub fn len(&self) -> u64 {
        self.nr_sectors as u64 * 512
    }

    pub fn is_empty(&self) -> bool {
        self.nr_sectors == 0
    }

    /// A write that must be durable when answered.
    pub fn fua(&self) -> bool {
        self.flags & uapi::IO_F_FUA != 0
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum TagState {
    /// Not yet fetched.
    Idle,
    /// Its command is in the kernel, waiting for a request.
    InKernel,
    /// Its request is with the server, to be committed.
    Owned,
    /// Aborted: the device is going away; never fetched again.
    Done,
}

/// A device's /dev/ublkcN. The kernel lets it be open once at a time, so
/// a server opens it once and every queue holds a reference; DEL_DEV
/// completes once the last is dropped.
pub struct CharDev {
    file: File,
    info: DevInfo,
}

impl CharDev {
    /// Open the added device `info`'s /dev/ublkcN (EBUSY while another
    /// process, e.g. a dying server, still has it open).
    pub fn open(info: &DevInfo) -> Result<Arc<CharDev>, Error> {
        let path = format!("/dev/ublkc{}", info.dev_id);
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(&path)
            .map_err(|e| Error::io(&format!("open {path}"), e))?;
        Ok(Arc::new(CharDev { file, info: *info }))
    }

    pub fn info(&self) -> &DevInfo {
        &self.info
    }
}

/// One queue of a device, on the thread that serves it.
pub struct Queue {
    // Dropped in this order: the ring (cancelling what it has in the
    // kernel), the descriptor map, then /dev/ublkcN.
    ring: IoRing,
    descs: DescMap,
    file: Arc<CharDev>,
    dev: u32,
    q_id: u16,
    state: Vec<TagState>,
    done: usize,
    completions: Vec<(u16, i32)>,
}

impl Queue {
    /// Open queue `q_id` of the device behind `chardev` with a buffer per
    /// tag (at least `max_io_buf_bytes` each). Call it on the thread that
    /// will serve the queue.
    pub fn open(chardev: &Arc<CharDev>, q_id: u16, buffers: TagBuffers) -> Result<Queue, Error> {
        let info = chardev.info();
        let dev = info.dev_id;
        let depth = info.queue_depth;
        if q_id >= info.nr_hw_queues {
            return Err(Error::io(
                &format!("ublk device {dev} queue {q_id}"),
                std::io::Error::other(format!("the device has {} queues", info.nr_hw_queues)),
            ));
        }
        if buffers.count() < depth as usize || buffers.each() < info.max_io_buf_bytes as usize {
            return Err(Error::io(
                &format!("ublk device {dev} queue {q_id}"),
                std::io::Error::other(format!(
                    "{} buffers of {} bytes given, {depth} of {} needed",
                    buffers.count(),
                    buffers.each(),
                    info.max_io_buf_bytes
                )),
            ));
        }
        let path = format!("/dev/ublkc{dev}");
        let file = chardev.clone();
        let page = sys::page_size();
        let descs = DescMap::map(
            file.file.as_raw_fd(),
            uapi::desc_array_offset(q_id, page),
            uapi::desc_array_bytes(depth, page),
            depth,
        )
        .map_err(|e| Error::io(&format!("map queue {q_id}'s descriptors of {path}"), e))?;
        let ring = IoRing::new(depth, buffers)
            .map_err(|e| Error::io(&format!("create queue {q_id}'s ring"), e))?;
        Ok(Queue {
            ring,
            descs,
            file,
            dev,
            q_id,
            state: vec![TagState::Idle; depth as usize],
            done: 0,
            completions: Vec::with_capacity(depth as usize),
        })
    }

    pub fn q_id(&self) -> u16 {
        self.q_id
    }

    pub fn depth(&self) -> u16 {
        self.state.len() as u16
    }

    /// Send FETCH_REQ for every tag (returns once they are in the kernel;
    /// START_DEV or END_USER_RECOVERY can then complete).
    pub fn fetch_all(&mut self) -> Result<(), Error> {
        let fd = self.file.file.as_raw_fd();
        for tag in 0..self.depth() {
            if self.state[tag as usize] != TagState::Idle {
                continue;
            }
            self.ring
                .push(fd, uapi::U_IO_FETCH_REQ, self.q_id, tag, 0)
                .map_err(|e| self.ring_error("queue FETCH_REQ", e))?;
            self.state[tag as usize] = TagState::InKernel;
        }
        self.ring
            .submit()
            .map_err(|e| self.ring_error("submit FETCH_REQ", e))
    }

    /// The queue's ring: poll(2) it for POLLIN, then `reap`.
    pub fn fd(&self) -> RawFd {
        self.ring.fd()
    }

    /// Take the requests that have arrived, without blocking. `serve` gets
    /// each request's tag, description and the tag's buffer (the request's
    /// bytes for a read or write, empty otherwise) and answers it at once
    /// (`Some(result)`: bytes done, or a negative errno) or later (`None`:
    /// then [`Queue::commit_and_fetch`]). Returns how many requests came.
    /// Tags the kernel aborts (the device stopping) are retired.
    pub fn reap<F>(&mut self, mut serve: F) -> Result<usize, Error>
    where
        F: FnMut(u16, &IoDesc, &mut [u8]) -> Option<i32>,
    {
        // Send what is queued (completions are posted without entering).
        self.ring
            .submit()
            .map_err(|e| self.ring_error("submit", e))?;
        let mut completions = std::mem::take(&mut self.completions);
        completions.clear();
        self.ring.drain(&mut completions);
        let mut requests = 0;
        let mut failure = None;
        let fd = self.file.file.as_raw_fd();
        for &(tag, res) in &completions {
            let Some(state) = self.state.get_mut(tag as usize) else {
                continue;
            };
            match res {
                uapi::IO_RES_OK => {
                    *state = TagState::Owned;
                    requests += 1;
                    let desc = IoDesc::from_raw(self.descs.get(tag));
                    let len = match desc.op {
                        Op::Read | Op::Write => desc.len() as usize,
                        _ => 0,
                    };
                    let answer = serve(tag, &desc, self.ring.buffer(tag, len));
                    if let Some(result) = answer {
                        if let Err(e) = self.ring.push(
                            fd,
                            uapi::U_IO_COMMIT_AND_FETCH_REQ,
                            self.q_id,
                            tag,
                            result,
                        ) {
                            failure.get_or_insert(self.ring_error("queue COMMIT_AND_FETCH_REQ", e));
                            continue;
                        }
                        self.state[tag as usize] = TagState::InKernel;
                    }
                }
                uapi::IO_RES_ABORT => {
                    *state = TagState::Done;
                    self.done += 1;
                }
                other => {
                    *state = TagState::Done;
                    self.done += 1;
                    let errno = if other < 0 { -other } else { libc::EPROTO };
                    failure.get_or_insert(Error::Tag {
                        dev: self.dev,
                        q_id: self.q_id,
                        tag,
                        errno,
                        detail: if other == uapi::IO_RES_NEED_GET_DATA {
                            "NEED_GET_DATA, which this queue never asks for"
                        } else {
                            "the tag is retired"
                        },
                    });
                }
            }
        }
        self.completions = completions;
        if requests > 0 {
            self.ring
                .submit()
                .map_err(|e| self.ring_error("submit COMMIT_AND_FETCH_REQ", e))?;
        }
        match failure {
            Some(e) => Err(e),
            None => Ok(requests),
        }
    }

    /// Answer `tag`'s request (bytes done, or a negative errno) and fetch
    /// its next one.
    pub fn commit_and_fetch(&mut self, tag: u16, result: i32) -> Result<(), Error> {
        self.commit(tag, result)?;
        self.submit()
    }

    /// Answer `tag`'s request and queue the fetch of its next one, without
    /// entering the kernel: a server answering many tags at once calls
    /// this for each, then [`Queue::submit`] once.
    pub fn commit(&mut self, tag: u16, result: i32) -> Result<(), Error> {
        assert_eq!(
            self.state.get(tag as usize),
            Some(&TagState::Owned),
            "tag {tag} has no request to answer"
        );
        self.ring
            .push(
                self.file.file.as_raw_fd(),
                uapi::U_IO_COMMIT_AND_FETCH_REQ,
                self.q_id,
                tag,
                result,
            )
            .map_err(|e| self.ring_error("queue COMMIT_AND_FETCH_REQ", e))?;
        self.state[tag as usize] = TagState::InKernel;
        Ok(())
    }

    /// Hand what [`Queue::commit`] queued to the kernel.
    pub fn submit(&mut self) -> Result<(), Error> {
        self.ring
            .submit()
            .map_err(|e| self.ring_error("submit COMMIT_AND_FETCH_REQ", e))
    }

    /// The buffer of a tag whose request the server holds.
    pub fn buffer(&mut self, tag: u16, len: usize) -> &mut [u8] {
        assert_eq!(self.state.get(tag as usize), Some(&TagState::Owned));
        self.ring.buffer(tag, len)
    }

    /// The address of a tag's buffer (what the kernel copies to and from).
    pub fn buffer_addr(&self, tag: u16) -> u64 {
        self.ring.buffer_addr(tag)
    }

    /// Every tag aborted by the kernel: the device is stopped (or the
    /// queue cancelled) and nothing of the queue is in the kernel.
    pub fn finished(&self) -> bool {
        self.done == self.state.len() && self.ring.held() == 0
    }

    /// Requests the server holds (reaped, not yet committed).
    pub fn owned(&self) -> usize {
        self.state.iter().filter(|s| **s == TagState::Owned).count()
    }

    fn ring_error(&self, what: &str, e: std::io::Error) -> Error {
        Error::io(
            &format!("ublk device {} queue {}: {what}", self.dev, self.q_id),
            e,
        )
    }
}
