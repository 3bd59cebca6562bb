//! Worker threads. Each owns one [`Queue`] on the target (queues are never
//! shared) and does two kinds of work with its slots:
//!
//! - it *owns connections* (handed over after their handshake; see
//!   `reactor`): it reads their requests from the socket itself (through
//!   rustls for TLS ones), straight into its slot buffers, submits them,
//!   and sends each reply from the slot that holds its data. A request
//!   never changes thread.
//! - it runs *jobs*: requests of its own connections too long for one slot
//!   (split into slot-sized pieces; the owner is told when the last
//!   completes), and, from its inbox, the final flush at shutdown.
//!
//! A worker with nothing to do sleeps in poll(2) on its connections'
//! sockets and an eventfd that whoever hands it a job or a connection
//! signals (only when it sleeps), until the next transfer deadline of its
//! connections at the latest. While its queue has I/O in flight it
//! waits in the queue's reap instead, and looks at its sockets after each
//! completion.

use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::atomic::{fence, AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc::{self, Receiver, SyncSender, TryRecvError, TrySendError};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use nvraid_io::queue::{Completion, OpKind, Queue, Target};
use nvraid_io::sys;
use nvraid_nbd::ErrorCode;

use crate::reactor::{Handoff, Owned};
use crate::Error;

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
}

/// What the pool knows of one worker.
struct Handle {
    inbox: SyncSender<Option<Job>>,
    /// Signalled to wake the worker from poll(2), when `sleeping`.
    wake: OwnedFd,
    sleeping: AtomicBool,
    handoffs: Mutex<Vec<Handoff>>,
    /// Connections it owns (to hand a new one to the least loaded).
    owned: AtomicUsize,
}

impl Handle {
    /// Wake the worker if it sleeps (or is about to: it sets `sleeping`,
    /// then looks at its inbox and handoffs once more before poll; this
    /// side published its message before looking at `sleeping`).
    fn poke(&self) {
        fence(Ordering::SeqCst);
        if self.sleeping.load(Ordering::SeqCst) {
            sys::eventfd_signal(self.wake.as_raw_fd());
        }
    }

    /// Put `message` in the inbox (waiting while it is full) and wake the
    /// worker; the message comes back when the worker is gone.
    fn post(&self, message: Option<Job>) -> Result<(), Option<Job>> {
        let sent = match self.inbox.try_send(message) {
            Ok(()) => Ok(()),
            Err(TrySendError::Full(message)) => {
                sys::eventfd_signal(self.wake.as_raw_fd());
                self.inbox.send(message).map_err(|e| e.0)
            }
            Err(TrySendError::Disconnected(message)) => Err(message),
        };
        self.poke();
        sent
    }
}

/// The pool of workers.
pub(crate) struct WorkerPool {
    handles: Vec<Arc<Handle>>,
    threads: Mutex<Vec<JoinHandle<()>>>,
}

impl WorkerPool {
    /// Start `count` workers, each opening its own queue.
    pub(crate) fn start(
        target: &Arc<dyn Target>,
        count: u32,
        depth: u32,
        io_max_bytes: u32,
    ) -> Result<WorkerPool, Error> {
        let mut pool = WorkerPool {
            handles: Vec::new(),
            threads: Mutex::new(Vec::new()),
        };
        for index in 0..count {
            let (sender, inbox) = mpsc::sync_channel(depth as usize);
            let (opened_tx, opened) = mpsc::sync_channel(1);
            let handle = Arc::new(Handle {
                inbox: sender,
                wake: sys::eventfd()?,
                sleeping: AtomicBool::new(false),
                handoffs: Mutex::new(Vec::new()),
                owned: AtomicUsize::new(0),
            });
            pool.handles.push(Arc::clone(&handle));
            let target = Arc::clone(target);
            // Queues are not Send: each worker opens its own on its thread.
            let thread = std::thread::Builder::new()
                .name(format!("nbd-worker-{index}"))
                .spawn(move || match target.open_queue(depth, io_max_bytes) {
                    Ok(queue) => {
                        let _ = opened_tx.send(Ok(()));
                        Worker::new(queue, inbox, io_max_bytes).run_pool(&handle);
                    }
                    Err(e) => drop(opened_tx.send(Err(e))),
                })?;
            pool.threads.lock().expect("worker threads").push(thread);
            let opened = opened
                .recv()
                .unwrap_or_else(|_| Err(std::io::Error::other("worker died")));
            if let Err(e) = opened {
                pool.stop();
                return Err(Error::OpenQueue(e));
            }
        }
        Ok(pool)
    }

    /// Give a connection past its handshake to the worker owning the
    /// fewest.
    pub(crate) fn adopt(&self, handoff: Handoff) {
        let handle = self
            .handles
            .iter()
            .min_by_key(|h| h.owned.load(Ordering::Relaxed))
            .expect("at least one worker");
        handle.owned.fetch_add(1, Ordering::Relaxed);
        handle.handoffs.lock().expect("handoffs").push(handoff);
        handle.poke();
    }

    /// Flush through every worker's queue and wait; the first error wins.
    pub(crate) fn flush_all(&self) -> Result<(), ErrorCode> {
        let (sender, results) = mpsc::sync_channel(self.handles.len());
        let collector = Arc::new(Collector(sender));
        for handle in &self.handles {
            let job = Job {
                owner: collector.clone(),
                cookie: 0,
                work: Work::Flush,
                offset: 0,
                length: 0,
                fua: false,
                buffer: Vec::new(),
                permit_bytes: 0,
                command: nvraid_nbd::Command::Flush,
            };
            handle.post(Some(job)).map_err(|_| ErrorCode::Shutdown)?;
        }
        drop(collector);
        results.iter().take(self.handles.len()).collect()
    }

    /// Stop the workers after the jobs they hold; wait for them.
    pub(crate) fn stop(&self) {
        for handle in &self.handles {
            let _ = handle.post(None);
        }
        let threads = std::mem::take(&mut *self.threads.lock().expect("worker threads"));
        for thread in threads {
            let _ = thread.join();
        }
    }
}

struct Collector(SyncSender<Result<(), ErrorCode>>);

impl Finish for Collector {
    fn finish(&self, _job: Job, result: Result<(), ErrorCode>) {
        let _ = self.0.send(result);
    }
}

/// A job being executed.
struct Active {
    job: Job,
    /// Offset within the job of the next piece to submit.
    next_piece: u32,
    pieces_left: u32,
    outstanding: u32,
    error: Option<ErrorCode>,
}

/// One piece of a job in flight: which job, where in it, how long.
#[derive(Clone, Copy)]
pub(crate) struct Piece {
    active: usize,
    at: u32,
    len: u32,
}

/// A request of an owned connection in one slot.
#[derive(Clone, Copy)]
pub(crate) struct SlotRequest {
    /// Index of the connection in `Worker::owned`.
    pub conn: usize,
    pub request: nvraid_nbd::RequestHeader,
    pub permit_bytes: u64,
}

/// What a slot is doing.
#[derive(Clone, Copy)]
pub(crate) enum SlotUse {
    Free,
    /// A piece of a job, submitted.
    Piece(Piece),
    /// Filling with a write's payload from the socket (not submitted).
    Receiving,
    /// An owned connection's request, submitted.
    Request(SlotRequest),
    /// Holding a read's data until its reply has been sent.
    Sending,
}

pub(crate) struct Worker {
    pub(crate) queue: Box<dyn Queue>,
    inbox: Receiver<Option<Job>>,
    pub(crate) slot_bytes: u32,
    free_slots: Vec<u32>,
    pub(crate) slots: Vec<SlotUse>,
    /// Slots submitted to the queue and not yet reaped.
    io_in_flight: u32,
    actives: Vec<Option<Active>>,
    active_count: usize,
    completions: Vec<Completion>,
    /// Connections this worker reads and answers itself.
    pub(crate) owned: Vec<Option<Owned>>,
    /// Whether the inbox is still open.
    open: bool,
    /// Bytes of owned connections' requests submitted, ever (a running
    /// count that `pump` budgets against).
    pub(crate) started_bytes: u64,
    /// When the worker must look again even if nothing happens (a
    /// transfer deadline, or an unaligned write waiting for its range;
    /// see `enforce_deadlines`).
    pub(crate) wake_by: Option<std::time::Instant>,
}

impl Worker {
    fn new(queue: Box<dyn Queue>, inbox: Receiver<Option<Job>>, slot_bytes: u32) -> Worker {
        let depth = queue.depth();
        Worker {
            queue,
            inbox,
            slot_bytes,
            free_slots: (0..depth).rev().collect(),
            slots: vec![SlotUse::Free; depth as usize],
            io_in_flight: 0,
            actives: (0..depth).map(|_| None).collect(),
            active_count: 0,
            completions: Vec::with_capacity(depth as usize),
            owned: Vec::new(),
            open: true,
            started_bytes: 0,
            wake_by: None,
        }
    }

    /// A free slot, taken for `use_`.
    pub(crate) fn take_slot(&mut self, use_: SlotUse) -> Option<u32> {
        let slot = self.free_slots.pop()?;
        self.slots[slot as usize] = use_;
        Some(slot)
    }

    pub(crate) fn free_slot(&mut self, slot: u32) {
        self.slots[slot as usize] = SlotUse::Free;
        self.free_slots.push(slot);
    }

    pub(crate) fn has_free_slot(&self) -> bool {
        !self.free_slots.is_empty()
    }

    /// Whether one more job fits.
    pub(crate) fn has_free_active(&self) -> bool {
        self.active_count < self.queue.depth() as usize
    }

    /// Submit an owned connection's request that sits in `slot`.
    pub(crate) fn submit_request(
        &mut self,
        slot: u32,
        op: OpKind,
        request: SlotRequest,
    ) -> Result<(), ErrorCode> {
        let header = request.request;
        let len = if op == OpKind::Flush {
            0
        } else {
            header.length
        };
        match self
            .queue
            .submit(slot, op, header.offset, len, header.fua())
        {
            Ok(()) => {
                self.slots[slot as usize] = SlotUse::Request(request);
                self.io_in_flight += 1;
                self.started_bytes += u64::from(len.max(1));
                Ok(())
            }
            Err(error) => {
                self.free_slot(slot);
                Err(ErrorCode::from_io_error(&error))
            }
        }
    }

    /// The loop of a pool worker.
    fn run_pool(mut self, handle: &Handle) {
        loop {
            let mut progress = self.take_jobs();
            progress |= self.adopt(handle);
            progress |= self.pump_all();
            self.submit_ready();
            progress |= self.reap(false);
            progress |= self.collect_local();
            progress |= self.send_all();
            progress |= self.retire(&handle.owned);
            progress |= self.enforce_deadlines();
            if !self.open && self.active_count == 0 && self.owned.iter().all(Option::is_none) {
                break;
            }
            if !progress {
                self.sleep(handle);
            }
        }
    }

    /// Take the connections handed to this worker; true if any came.
    fn adopt(&mut self, handle: &Handle) -> bool {
        let handoffs = std::mem::take(&mut *handle.handoffs.lock().expect("handoffs"));
        let any = !handoffs.is_empty();
        for handoff in handoffs {
            self.own(handoff);
        }
        any
    }

    /// Take jobs from the inbox while there is room; true if any came.
    fn take_jobs(&mut self) -> bool {
        let mut took = false;
        while self.open && self.has_free_active() {
            match self.inbox.try_recv() {
                Ok(Some(job)) => {
                    self.start(job);
                    took = true;
                }
                Ok(None) | Err(TryRecvError::Disconnected) => {
                    self.open = false;
                    took = true;
                }
                Err(TryRecvError::Empty) => break,
            }
        }
        took
    }

    /// Nothing moved: wait for I/O, a socket, or a message.
    fn sleep(&mut self, handle: &Handle) {
        if self.io_in_flight > 0 {
            self.reap(true);
            return;
        }
        handle.sleeping.store(true, Ordering::SeqCst);
        fence(Ordering::SeqCst);
        // Whatever was posted before `sleeping` was seen is looked at now.
        let pending = self.take_jobs() || !handle.handoffs.lock().expect("handoffs").is_empty();
        if !pending {
            let wake = handle.wake.as_raw_fd();
            let mut fds = self.poll_set(wake);
            let timeout = self.wake_by.map_or(-1, |at| {
                let left = at.saturating_duration_since(std::time::Instant::now());
                // Rounded up: waking before the deadline would spin.
                left.as_micros().div_ceil(1000).min(i32::MAX as u128) as i32
            });
            sys::poll(&mut fds, timeout);
            sys::eventfd_drain(wake);
        }
        handle.sleeping.store(false, Ordering::SeqCst);
    }

    pub(crate) fn start(&mut self, job: Job) {
        let pieces_left = match job.work {
            Work::Flush => 1,
            _ => job.length.div_ceil(self.slot_bytes),
        };
        let active = Some(Active {
            job,
            next_piece: 0,
            pieces_left,
            outstanding: 0,
            error: None,
        });
        // An owned connection's long write, received after the inbox
        // filled the entries, gets one more.
        match self.actives.iter().position(Option::is_none) {
            Some(index) => self.actives[index] = active,
            None => self.actives.push(active),
        }
        self.active_count += 1;
    }

    fn submit_ready(&mut self) {
        for index in 0..self.actives.len() {
            while !self.free_slots.is_empty() && self.has_pieces(index) {
                self.submit_piece(index);
            }
        }
    }

    fn has_pieces(&self, index: usize) -> bool {
        self.actives[index]
            .as_ref()
            .is_some_and(|a| a.pieces_left > 0)
    }

    fn submit_piece(&mut self, index: usize) {
        let slot = self.free_slots.pop().expect("free slot");
        let active = self.actives[index].as_mut().expect("active job");
        let at = active.next_piece;
        let len = (active.job.length - at).min(self.slot_bytes);
        active.next_piece += len;
        active.pieces_left -= 1;
        let job = &active.job;
        let buffer = self.queue.buffer_mut(slot);
        let op = match job.work {
            Work::Read => OpKind::Read,
            Work::Write => {
                buffer[..len as usize]
                    .copy_from_slice(&job.buffer[at as usize..(at + len) as usize]);
                OpKind::Write
            }
            Work::Zero => {
                buffer[..len as usize].fill(0);
                OpKind::Write
            }
            Work::Discard => OpKind::Discard,
            Work::Flush => OpKind::Flush,
        };
        let submitted = self
            .queue
            .submit(slot, op, job.offset + u64::from(at), len, job.fua);
        match submitted {
            Ok(()) => {
                active.outstanding += 1;
                self.io_in_flight += 1;
                self.slots[slot as usize] = SlotUse::Piece(Piece {
                    active: index,
                    at,
                    len,
                });
            }
            Err(error) => {
                active.error.get_or_insert(ErrorCode::from_io_error(&error));
                self.free_slots.push(slot);
                self.finish_if_done(index);
            }
        }
    }

    /// Reap completions (waiting for one when `wait` and I/O is in
    /// flight); true if any came.
    fn reap(&mut self, wait: bool) -> bool {
        let min_complete = u32::from(wait && self.io_in_flight > 0);
        let mut completions = std::mem::take(&mut self.completions);
        let reaped = self.queue.reap(min_complete, &mut |c| completions.push(c));
        if let Err(error) = reaped {
            // A failed reap leaves the queue unusable: fail what is in flight.
            let code = ErrorCode::from_io_error(&error);
            let busy: Vec<u32> = (0..self.slots.len() as u32)
                .filter(|s| {
                    matches!(
                        self.slots[*s as usize],
                        SlotUse::Piece(_) | SlotUse::Request(_)
                    )
                })
                .collect();
            completions.extend(busy.into_iter().map(|slot| Completion {
                slot,
                result: Err(code.to_errno()),
            }));
        }
        let any = !completions.is_empty();
        for completion in completions.drain(..) {
            self.complete(completion);
        }
        self.completions = completions;
        any
    }

    fn complete(&mut self, completion: Completion) {
        match self.slots[completion.slot as usize] {
            SlotUse::Piece(piece) => {
                self.io_in_flight -= 1;
                self.complete_piece(completion, piece);
            }
            SlotUse::Request(request) => {
                self.io_in_flight -= 1;
                self.complete_request(completion, request);
            }
            _ => {}
        }
    }

    fn complete_piece(&mut self, completion: Completion, piece: Piece) {
        self.free_slot(completion.slot);
        let active = self.actives[piece.active].as_mut().expect("active job");
        active.outstanding -= 1;
        match completion.result {
            Ok(moved) if moved == piece.len => {
                if active.job.work == Work::Read {
                    let source = &self.queue.buffer(completion.slot)[..piece.len as usize];
                    let at = piece.at as usize;
                    active.job.buffer[at..at + piece.len as usize].copy_from_slice(source);
                }
            }
            Ok(_) => {
                active.error.get_or_insert(ErrorCode::Io);
            }
            Err(errno) => {
                active.error.get_or_insert(ErrorCode::from_errno(errno));
            }
        }
        self.finish_if_done(piece.active);
    }

    fn finish_if_done(&mut self, index: usize) {
        let done = self.actives[index]
            .as_ref()
            .is_some_and(|a| a.pieces_left == 0 && a.outstanding == 0);
        if !done {
            return;
        }
        let active = self.actives[index].take().expect("active job");
        self.active_count -= 1;
        let result = active.error.map_or(Ok(()), Err);
        let owner = Arc::clone(&active.job.owner);
        owner.finish(active.job, result);
    }
}
