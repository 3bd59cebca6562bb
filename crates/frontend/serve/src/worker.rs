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
//! With `--ublk`, a worker also serves one queue of the block device (see
//! `ublk`): it takes the kernel's requests from the queue's ring, submits
//! each in the slot that is its tag's buffer, and answers it when it
//! completes.
//!
//! A worker with nothing to do sleeps in poll(2) on its connections'
//! sockets, its ublk queue's ring and an eventfd that whoever hands it a job or a connection
//! signals (only when it sleeps), until the next transfer deadline of its
//! connections at the latest. While its queue has I/O in flight it
//! waits in the queue's reap instead, and looks at its sockets after each
//! completion.

use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::atomic::{fence, AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc::{self, Receiver, SyncSender, TryRecvError, TrySendError};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use nvraid_io::queue::{Queue, Target};
use nvraid_io::sys;
use nvraid_nbd::ErrorCode;

use crate::error::Error;
use crate::job::{Finish, Job, Work};
use crate::nvme::queue::NvmeQueue;
use crate::reactor::{Handoff, Owned};
use crate::slots::Slots;
use crate::stats::{Latencies, LatencyShard};
use crate::ublk::{WorkerUblk, WorkerUblkPlan};

/// What the pool knows of one worker.
struct Handle {
    inbox: SyncSender<Option<Job>>,
    /// Signalled to wake the worker from poll(2), when `sleeping`.
    wake: OwnedFd,
    sleeping: AtomicBool,
    handoffs: Mutex<Vec<Handoff>>,
    /// NVMe/TCP I/O queues handed to it (see `nvme`).
    nvme_handoffs: Mutex<Vec<NvmeQueue>>,
    /// Connections it owns (to hand a new one to the least loaded).
    owned: AtomicUsize,
    /// Its requests' latencies (written by the worker only).
    latency: Arc<LatencyShard>,
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
    ///
    /// With `ublk`, the first `ublk.queues` workers each open one queue of
    /// the device with its own slots beyond `depth` as the tags' buffers,
    /// and fetch every tag before this returns.
    pub(crate) fn start(
        target: &Arc<dyn Target>,
        count: u32,
        depth: u32,
        io_max_bytes: u32,
        ublk: Option<&WorkerUblkPlan>,
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
                nvme_handoffs: Mutex::new(Vec::new()),
                owned: AtomicUsize::new(0),
                latency: Arc::new(LatencyShard::default()),
            });
            pool.handles.push(Arc::clone(&handle));
            let target = Arc::clone(target);
            let ublk = ublk
                .filter(|plan| index < u32::from(plan.chardev.info().nr_hw_queues))
                .cloned();
            let tags = ublk
                .as_ref()
                .map_or(0, |plan| u32::from(plan.chardev.info().queue_depth));
            // Queues are not Send: each worker opens its own on its thread.
            let thread = std::thread::Builder::new()
                .name(format!("nbd-worker-{index}"))
                .spawn(move || {
                    let mut worker = match target.open_queue(depth + tags, io_max_bytes) {
                        Ok(queue) => {
                            Worker::new(queue, inbox, io_max_bytes, Arc::clone(&handle.latency))
                        }
                        Err(e) => return drop(opened_tx.send(Err(Error::OpenQueue(e)))),
                    };
                    if let Some(plan) = ublk {
                        match WorkerUblk::open(&plan, index as u16, &mut worker.slots) {
                            Ok(queue) => worker.ublk = Some(queue),
                            Err(e) => return drop(opened_tx.send(Err(e))),
                        }
                    }
                    let _ = opened_tx.send(Ok(()));
                    worker.run_pool(&handle);
                })?;
            pool.threads.lock().expect("worker threads").push(thread);
            let opened = opened
                .recv()
                .unwrap_or_else(|_| Err(Error::OpenQueue(std::io::Error::other("worker died"))));
            if let Err(e) = opened {
                pool.stop();
                return Err(e);
            }
        }
        Ok(pool)
    }

    /// Every worker's request latencies, summed.
    pub(crate) fn latencies(&self) -> Latencies {
        Latencies::sum(self.handles.iter().map(|h| &*h.latency))
    }

    /// Wake every worker that sleeps.
    pub(crate) fn poke_all(&self) {
        self.handles.iter().for_each(|h| h.poke());
    }

    /// Give a connection past its handshake to the worker owning the
    /// fewest.
    pub(crate) fn adopt(&self, handoff: Handoff) {
        let handle = self
            .handles
            .iter()
            .min_by_key(|h| h.owned.load(Ordering::Relaxed));
        let Some(handle) = handle else {
            panic!("invariant: a worker pool has at least one worker");
        };
        handle.owned.fetch_add(1, Ordering::Relaxed);
        handle.handoffs.lock().expect("handoffs").push(handoff);
        handle.poke();
    }

    /// Give a connected NVMe/TCP I/O queue to the worker owning the
    /// fewest connections.
    pub(crate) fn adopt_nvme(&self, queue: NvmeQueue) {
        let handle = self
            .handles
            .iter()
            .min_by_key(|h| h.owned.load(Ordering::Relaxed));
        let Some(handle) = handle else {
            panic!("invariant: a worker pool has at least one worker");
        };
        handle.owned.fetch_add(1, Ordering::Relaxed);
        handle.nvme_handoffs.lock().expect("handoffs").push(queue);
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
                timed: None,
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

pub(crate) struct Worker {
    /// Its queue of the ublk device, if any: declared (so dropped) before
    /// `slots`, whose buffers are its tags' buffers.
    ublk: Option<WorkerUblk>,
    /// Its queue, its slots and the jobs running through them.
    slots: Slots,
    inbox: Receiver<Option<Job>>,
    /// Connections this worker reads and answers itself.
    owned: Vec<Option<Owned>>,
    /// NVMe/TCP I/O queues it reads and answers itself.
    nvme: Vec<Option<NvmeQueue>>,
    /// Whether the inbox is still open.
    open: bool,
    /// Its ublk queue was left to the next server (`leave_ublk`): the
    /// slots' buffers are never freed, for the kernel may still copy a
    /// request's data into a tag's buffer until this thread has exited.
    left_ublk: bool,
    /// When the worker must look again even if nothing happens (a
    /// transfer deadline, or an unaligned write waiting for its range;
    /// see `enforce_deadlines`).
    wake_by: Option<std::time::Instant>,
}

impl Worker {
    fn new(
        queue: Box<dyn Queue>,
        inbox: Receiver<Option<Job>>,
        slot_bytes: u32,
        latency: Arc<LatencyShard>,
    ) -> Worker {
        Worker {
            ublk: None,
            slots: Slots::new(queue, slot_bytes, latency),
            inbox,
            owned: Vec::new(),
            nvme: Vec::new(),
            open: true,
            left_ublk: false,
            wake_by: None,
        }
    }

    /// The loop of a pool worker.
    fn run_pool(mut self, handle: &Handle) {
        loop {
            // One clock read per round stamps what the round submits.
            self.slots.tick();
            let mut progress = self.take_jobs();
            progress |= self.adopt(handle);
            progress |= self.pump_all();
            progress |= self.serve_nvme(handle);
            self.slots.submit_ready();
            progress |= self.reap(false);
            progress |= self.serve_ublk();
            progress |= self.collect_local();
            progress |= self.send_all();
            progress |= self.retire(&handle.owned);
            progress |= self.enforce_deadlines();
            if !self.open {
                // Stopping: a ublk queue still open belongs to a device
                // never started (the server's start failed).
                self.close_ublk();
            }
            if !self.open
                && self.slots.active_count == 0
                && self.owned.iter().all(Option::is_none)
                && self.nvme.iter().all(Option::is_none)
                && self.ublk.is_none()
            {
                break;
            }
            if !progress {
                self.sleep(handle);
            }
        }
        if self.left_ublk {
            self.slots.queue.leak_buffers();
        }
    }

    /// Answer the ublk requests that completed, take the ones that came,
    /// and close the queue once the device has stopped (every tag
    /// aborted); true if anything moved. A queue that fails is closed
    /// (the kernel then fails or, with recovery, holds its requests).
    fn serve_ublk(&mut self) -> bool {
        let Some(ublk) = self.ublk.as_mut() else {
            return false;
        };
        if ublk.handing_over() {
            // Answer what finished, take nothing new; leave the queue once
            // no request of it is left in a slot.
            let answered = ublk.answer(&mut self.slots);
            if let Err(e) = &answered {
                eprintln!("nvraid-serve: event=ublk-queue-failed error=\"{e}\"");
            }
            self.leave_ublk();
            return answered.map_or(true, |any| any || self.ublk.is_none());
        }
        let served = ublk
            .answer(&mut self.slots)
            .and_then(|answered| Ok(ublk.pump(&mut self.slots)? | answered));
        match served {
            Ok(progress) if !ublk.finished() => progress,
            Ok(_) => {
                self.close_ublk();
                true
            }
            Err(e) => {
                eprintln!("nvraid-serve: event=ublk-queue-failed error=\"{e}\"");
                self.close_ublk();
                true
            }
        }
    }

    /// Leave the ublk queue to the next server, once none of its requests
    /// is in a slot: not closed here, but when the process exits (see
    /// [`WorkerUblk::leave`]); the slots' buffers, which its tags name,
    /// are never freed.
    fn leave_ublk(&mut self) {
        if !self.ublk_in_slots() {
            if let Some(ublk) = self.ublk.take() {
                ublk.leave();
                self.left_ublk = true;
            }
        }
    }

    fn ublk_in_slots(&self) -> bool {
        self.slots
            .uses
            .iter()
            .any(|u| matches!(u, crate::slots::SlotUse::Ublk(_)))
    }

    /// Close the ublk queue, once none of its requests is in a slot.
    fn close_ublk(&mut self) {
        if !self.ublk_in_slots() {
            self.ublk = None;
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

    /// Start serving a handed-over connection.
    fn own(&mut self, handoff: Handoff) {
        let owned = Owned::new(handoff);
        match self.owned.iter().position(Option::is_none) {
            Some(index) => self.owned[index] = Some(owned),
            None => self.owned.push(Some(owned)),
        }
    }

    /// Take jobs from the inbox while there is room; true if any came.
    fn take_jobs(&mut self) -> bool {
        let mut took = false;
        while self.open && self.slots.has_free_active() {
            match self.inbox.try_recv() {
                Ok(Some(job)) => {
                    self.slots.start(job);
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
        if self.slots.io_in_flight > 0 {
            self.reap(true);
            return;
        }
        handle.sleeping.store(true, Ordering::SeqCst);
        fence(Ordering::SeqCst);
        // Whatever was posted before `sleeping` was seen is looked at now.
        let pending = self.take_jobs()
            || !handle.handoffs.lock().expect("handoffs").is_empty()
            || !handle.nvme_handoffs.lock().expect("handoffs").is_empty();
        if !pending {
            let wake = handle.wake.as_raw_fd();
            let mut fds = self.poll_set(wake);
            // NVMe/TCP queues look at their deadlines and the shutdown
            // every 200 ms.
            let nvme_tick = self
                .nvme
                .iter()
                .any(Option::is_some)
                .then(|| std::time::Instant::now() + std::time::Duration::from_millis(200));
            let wake_by = match (self.wake_by, nvme_tick) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, b) => a.or(b),
            };
            let timeout = wake_by.map_or(-1, |at| {
                let left = at.saturating_duration_since(std::time::Instant::now());
                // Rounded up: waking before the deadline would spin.
                left.as_micros().div_ceil(1000).min(i32::MAX as u128) as i32
            });
            sys::poll(&mut fds, timeout);
            sys::eventfd_drain(wake);
        }
        handle.sleeping.store(false, Ordering::SeqCst);
    }

    /// Reap completions (waiting for one when `wait` and I/O is in
    /// flight): jobs' pieces finish in the slots, a connection's request
    /// goes to the connection. True if any came.
    fn reap(&mut self, wait: bool) -> bool {
        let owned = &mut self.owned;
        self.slots.reap(
            wait,
            &mut |slots, completion, request| match owned[request.conn].as_mut() {
                Some(conn) => conn.complete_request(slots, completion, request),
                None => slots.free_slot(completion.slot),
            },
        )
    }

    /// Read and start what every owned connection sent; true if anything
    /// moved.
    fn pump_all(&mut self) -> bool {
        let mut progress = false;
        for (index, conn) in self.owned.iter_mut().enumerate() {
            if let Some(conn) = conn {
                progress |= conn.pump(&mut self.slots, index);
            }
        }
        progress
    }

    /// Take the NVMe/TCP queues handed over, read and answer each, and
    /// let go of those that ended with nothing in flight; true if
    /// anything moved.
    fn serve_nvme(&mut self, handle: &Handle) -> bool {
        let handed = std::mem::take(&mut *handle.nvme_handoffs.lock().expect("handoffs"));
        let mut progress = !handed.is_empty();
        for queue in handed {
            match self.nvme.iter().position(Option::is_none) {
                Some(index) => self.nvme[index] = Some(queue),
                None => self.nvme.push(Some(queue)),
            }
        }
        for entry in self.nvme.iter_mut() {
            let Some(queue) = entry.as_mut() else {
                continue;
            };
            progress |= queue.pump(&mut self.slots);
            if queue.has_ended() {
                if let Some(queue) = entry.take() {
                    queue.close();
                }
                let before = handle.owned.fetch_sub(1, Ordering::Relaxed);
                assert!(before > 0, "invariant: the owned count counts this queue");
                progress = true;
            }
        }
        progress
    }

    /// Replies for the jobs of owned connections that finished.
    fn collect_local(&mut self) -> bool {
        let mut any = false;
        for conn in self.owned.iter_mut().flatten() {
            any |= conn.collect(&mut self.slots);
        }
        any
    }

    /// Send what every owned connection has waiting; true if anything
    /// moved.
    fn send_all(&mut self) -> bool {
        let mut progress = false;
        for conn in self.owned.iter_mut().flatten() {
            progress |= conn.send(&mut self.slots);
        }
        progress
    }

    /// Let go of connections that ended and have nothing in flight; true if
    /// any did.
    fn retire(&mut self, owned_count: &AtomicUsize) -> bool {
        let mut any = false;
        for entry in self.owned.iter_mut() {
            if !entry.as_ref().is_some_and(Owned::has_ended) {
                continue;
            }
            let Some(conn) = entry.take() else {
                panic!("invariant: the entry was checked to hold an ended connection");
            };
            let before = owned_count.fetch_sub(1, Ordering::Relaxed);
            assert!(
                before > 0,
                "invariant: the owned count counts this connection"
            );
            conn.close();
            any = true;
        }
        any
    }

    /// End the connections that missed the transfer deadline (see
    /// `Owned::enforce_deadlines`); true if any was. Leaves in `wake_by`
    /// when the worker must look again.
    fn enforce_deadlines(&mut self) -> bool {
        let mut now = None;
        let mut ended = false;
        let mut wake_by = None;
        for conn in self.owned.iter_mut().flatten() {
            ended |= conn.enforce_deadlines(&mut self.slots, &mut now, &mut wake_by);
        }
        self.wake_by = wake_by;
        ended
    }

    /// The poll(2) set for a sleeping worker: its wake-up eventfd, then
    /// every owned connection that can take requests (readable) or has
    /// replies waiting (writable).
    fn poll_set(&self, wake: i32) -> Vec<libc::pollfd> {
        let mut fds = vec![libc::pollfd {
            fd: wake,
            events: libc::POLLIN,
            revents: 0,
        }];
        fds.extend(self.ublk.as_ref().map(WorkerUblk::poll_fd));
        fds.extend(self.owned.iter().flatten().filter_map(Owned::poll_fd));
        fds.extend(self.nvme.iter().flatten().filter_map(NvmeQueue::poll_fd));
        fds
    }
}
