//! Worker threads. Each owns one [`Queue`] on the target (queues are never
//! shared) and serves jobs from any connection, so one connection's
//! requests run concurrently on several workers and complete out of order.
//!
//! A job longer than a slot buffer is split into slot-sized pieces; its
//! reply is sent when its last piece completes. Every channel is bounded:
//! a worker takes at most `depth` jobs at once and its inbox holds `depth`.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::{self, Receiver, SyncSender, TryRecvError};
use std::sync::Arc;
use std::thread::JoinHandle;

use nvraid_io::queue::{Completion, OpKind, Queue, Target};
use nvraid_nbd::ErrorCode;

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
    /// The job is done; its reply may be buffered until `flush_replies`.
    fn finish(&self, job: Job, result: Result<(), ErrorCode>);
    /// Send the replies `finish` buffered (a worker calls it once per
    /// batch of completions, so that replies share system calls).
    fn flush_replies(&self) {}
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

/// The pool of workers.
pub(crate) struct WorkerPool {
    inboxes: Vec<SyncSender<Option<Job>>>,
    threads: std::sync::Mutex<Vec<JoinHandle<()>>>,
    next: AtomicUsize,
}

impl WorkerPool {
    /// Start `count` workers, each opening its own queue.
    pub(crate) fn start(
        target: &Arc<dyn Target>,
        count: u32,
        depth: u32,
        io_max_bytes: u32,
    ) -> Result<WorkerPool, Error> {
        let mut inboxes = Vec::new();
        let mut threads = Vec::new();
        for index in 0..count {
            let (sender, inbox) = mpsc::sync_channel(depth as usize);
            let (opened_tx, opened) = mpsc::sync_channel(1);
            let target = Arc::clone(target);
            // Queues are not Send: each worker opens its own on its thread.
            let thread = std::thread::Builder::new()
                .name(format!("nbd-worker-{index}"))
                .spawn(move || match target.open_queue(depth, io_max_bytes) {
                    Ok(queue) => {
                        let _ = opened_tx.send(Ok(()));
                        Worker::new(queue, inbox, io_max_bytes).run();
                    }
                    Err(e) => drop(opened_tx.send(Err(e))),
                })?;
            inboxes.push(sender);
            threads.push(thread);
            let opened = opened
                .recv()
                .unwrap_or_else(|_| Err(std::io::Error::other("worker died")));
            if let Err(e) = opened {
                let pool = WorkerPool {
                    inboxes,
                    threads: std::sync::Mutex::new(threads),
                    next: AtomicUsize::new(0),
                };
                pool.stop();
                return Err(Error::OpenQueue(e));
            }
        }
        Ok(WorkerPool {
            inboxes,
            threads: std::sync::Mutex::new(threads),
            next: AtomicUsize::new(0),
        })
    }

    /// Hand a job to the next worker (blocks while its inbox is full).
    pub(crate) fn dispatch(&self, job: Job) {
        let index = self.next.fetch_add(1, Ordering::Relaxed) % self.inboxes.len();
        if let Err(mpsc::SendError(Some(job))) = self.inboxes[index].send(Some(job)) {
            let owner = Arc::clone(&job.owner);
            owner.finish(job, Err(ErrorCode::Shutdown));
            owner.flush_replies();
        }
    }

    /// Flush through every worker's queue and wait; the first error wins.
    pub(crate) fn flush_all(&self) -> Result<(), ErrorCode> {
        let (sender, results) = mpsc::sync_channel(self.inboxes.len());
        let collector = Arc::new(Collector(sender));
        for inbox in &self.inboxes {
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
            inbox.send(Some(job)).map_err(|_| ErrorCode::Shutdown)?;
        }
        drop(collector);
        results.iter().take(self.inboxes.len()).collect()
    }

    /// Stop the workers after the jobs they hold; wait for them.
    pub(crate) fn stop(&self) {
        for inbox in &self.inboxes {
            let _ = inbox.send(None);
        }
        let threads = std::mem::take(&mut *self.threads.lock().expect("worker threads"));
        for thread in threads {
            let _ = thread.join();
        }
    }
}

/// Runs a connection's large requests on the connection's own reader
/// thread, for targets whose queues complete I/O inside `submit` (psync over
/// RAM-backed members). Handing such a request to a pool worker buys no
/// concurrency and costs two thread wake-ups; here it costs none. A request
/// run here finishes before the next one is read.
pub(crate) struct InlineRunner {
    worker: Worker,
}

impl InlineRunner {
    /// A runner for this thread, or `None` when the target's queues hand
    /// I/O to the kernel asynchronously (the pool's workers overlap those).
    pub(crate) fn open(target: &Arc<dyn Target>, io_max_bytes: u32) -> Option<InlineRunner> {
        let queue = target.open_queue(1, io_max_bytes).ok()?;
        if !queue.completes_inline() {
            return None;
        }
        // The runner is driven by `run`, never by an inbox.
        let (_unused, inbox) = mpsc::sync_channel(1);
        Some(InlineRunner {
            worker: Worker::new(queue, inbox, io_max_bytes),
        })
    }

    /// Execute `job` to completion; its owner is told as usual.
    pub(crate) fn run(&mut self, job: Job) {
        self.worker.start(job);
        while self.worker.active_count > 0 {
            self.worker.submit_ready();
            self.worker.reap();
        }
        self.worker.flush_touched();
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

/// One piece in flight: which job, where in it, how long.
#[derive(Clone, Copy)]
struct Piece {
    active: usize,
    at: u32,
    len: u32,
}

struct Worker {
    queue: Box<dyn Queue>,
    inbox: Receiver<Option<Job>>,
    slot_bytes: u32,
    free_slots: Vec<u32>,
    slots: Vec<Option<Piece>>,
    actives: Vec<Option<Active>>,
    active_count: usize,
    completions: Vec<Completion>,
    /// Owners whose jobs finished since the last `flush_touched`.
    touched: Vec<Arc<dyn Finish>>,
}

impl Worker {
    fn new(queue: Box<dyn Queue>, inbox: Receiver<Option<Job>>, slot_bytes: u32) -> Worker {
        let depth = queue.depth();
        Worker {
            queue,
            inbox,
            slot_bytes,
            free_slots: (0..depth).rev().collect(),
            slots: vec![None; depth as usize],
            actives: (0..depth).map(|_| None).collect(),
            active_count: 0,
            completions: Vec::with_capacity(depth as usize),
            touched: Vec::with_capacity(depth as usize),
        }
    }

    /// Send the replies of this batch, once per owner.
    fn flush_touched(&mut self) {
        for owner in self.touched.drain(..) {
            owner.flush_replies();
        }
    }

    fn run(mut self) {
        let mut open = true;
        loop {
            if self.active_count == 0 {
                if !open {
                    break;
                }
                match self.inbox.recv() {
                    Ok(Some(job)) => self.start(job),
                    _ => break,
                }
            }
            while open && self.active_count < self.actives.len() {
                match self.inbox.try_recv() {
                    Ok(Some(job)) => self.start(job),
                    Ok(None) | Err(TryRecvError::Disconnected) => open = false,
                    Err(TryRecvError::Empty) => break,
                }
            }
            self.submit_ready();
            self.reap();
            self.flush_touched();
        }
    }

    fn start(&mut self, job: Job) {
        let pieces_left = match job.work {
            Work::Flush => 1,
            _ => job.length.div_ceil(self.slot_bytes),
        };
        let index = self
            .actives
            .iter()
            .position(Option::is_none)
            .expect("free active entry");
        self.actives[index] = Some(Active {
            job,
            next_piece: 0,
            pieces_left,
            outstanding: 0,
            error: None,
        });
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
                self.slots[slot as usize] = Some(Piece {
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

    fn reap(&mut self) {
        let in_flight = self.slots.len() - self.free_slots.len();
        let min_complete = u32::from(in_flight > 0);
        let mut completions = std::mem::take(&mut self.completions);
        let reaped = self.queue.reap(min_complete, &mut |c| completions.push(c));
        if let Err(error) = reaped {
            // A failed reap leaves the queue unusable: fail what is in flight.
            let code = ErrorCode::from_io_error(&error);
            let busy: Vec<u32> = (0..self.slots.len() as u32)
                .filter(|s| self.slots[*s as usize].is_some())
                .collect();
            completions.extend(busy.into_iter().map(|slot| Completion {
                slot,
                result: Err(code.to_errno()),
            }));
        }
        for completion in completions.drain(..) {
            self.complete(completion);
        }
        self.completions = completions;
    }

    fn complete(&mut self, completion: Completion) {
        let Some(piece) = self.slots[completion.slot as usize].take() else {
            return;
        };
        self.free_slots.push(completion.slot);
        let active = self.actives[piece.active].as_mut().expect("active job");
        active.outstanding -= 1;
        match completion.result {
            Ok(moved) if moved == piece.len => {
                if active.job.work == Work::Read {
                    let source = &self.queue.buffer_mut(completion.slot)[..piece.len as usize];
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
        if !self.touched.iter().any(|t| Arc::ptr_eq(t, &owner)) {
            self.touched.push(Arc::clone(&owner));
        }
        owner.finish(active.job, result);
    }
}
