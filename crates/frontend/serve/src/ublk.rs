//! `--ublk`: the target as a block device, `/dev/ublkbN`, through Linux's
//! ublk driver (nvraid-ublk), beside or instead of the NBD listeners.
//!
//! One ublk queue per worker (the first `queues` workers), served on the
//! worker's thread: the worker polls the queue's ring beside its sockets,
//! and each tag's buffer *is* one of the worker's slots (reserved for that
//! tag), so a write's data goes from the kernel into the slot and from the
//! slot to the members, and a read's the other way, without a copy. A
//! request becomes the same target operation an NBD request does
//! (`Work::of`, `Work::op`): WRITE_ZEROES a zero-filled write, DISCARD a
//! discard, FLUSH a flush of every member, FUA the write's own flag.
//!
//! The device is added with user recovery (requests the dead server held
//! are issued again): after `kill -9` it stays, quiesced, and a new
//! `nvraid serve --ublk ID` takes it over (`Device::prepare`). A clean stop
//! (`Device::stop`) stops the device, which completes every request in
//! flight first, then deletes it once every queue is closed.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use nvraid_nbd::Command;
use nvraid_ublk::uapi::{self, DevInfo, Params};
use nvraid_ublk::{CharDev, Control, DeviceSpec, IoDesc, Op, Queue, TagBuffers};
use serde_json::{json, Value};

use crate::error::Error;
use crate::job::Work;
use crate::options::{ServeOptions, UblkOptions};
use crate::slots::Slots;
use crate::stats::Counters;

/// How long a control command that waits for the queues may take.
const COMMAND_LIMIT: Duration = Duration::from_secs(30);

/// How long the workers may take to finish the requests they hold when
/// the device is left to the next server.
pub(crate) const HANDOVER_LIMIT: Duration = Duration::from_secs(30);

/// How long a killed server's device may take to become quiesced.
const QUIESCE_LIMIT: Duration = Duration::from_secs(10);

fn ublk_error(e: nvraid_ublk::Error) -> Error {
    match e {
        nvraid_ublk::Error::NoDriver => Error::Ublk(format!(
            "{e}; without it, serve the array over NBD (--listen) instead"
        )),
        e => Error::Ublk(e.to_string()),
    }
}

fn open_control() -> Result<Control, Error> {
    Control::open().map_err(ublk_error)
}

/// The device `id`, if it exists.
fn existing(ctl: &mut Control, id: u32) -> Result<Option<DevInfo>, Error> {
    match ctl.info(id) {
        Ok(info) => Ok(Some(info)),
        Err(nvraid_ublk::Error::Command { errno, .. }) if errno == libc::ENODEV => Ok(None),
        Err(e) => Err(ublk_error(e)),
    }
}

fn process_alive(pid: i32) -> bool {
    pid > 0 && std::path::Path::new(&format!("/proc/{pid}")).exists()
}

/// What to do with an existing device `info`: take it over (true), or a
/// refusal naming it.
fn may_recover(info: &DevInfo) -> Result<(), Error> {
    let id = info.dev_id;
    let state = info.state;
    let live_server = state == uapi::S_DEV_LIVE && process_alive(info.ublksrv_pid);
    if live_server {
        return Err(Error::Ublk(format!(
            "ublk device {id} (/dev/ublkb{id}) is in use, served by process {}; give --ublk \
             another number or `auto`, or stop that server",
            info.ublksrv_pid
        )));
    }
    // LIVE with its server gone: the kernel is quiescing it (START_USER_RECOVERY
    // answers EBUSY until it has).
    if state != uapi::S_DEV_QUIESCED && state != uapi::S_DEV_LIVE {
        return Err(Error::Ublk(format!(
            "ublk device {id} exists with no server and cannot be taken over (state {}); \
             it keeps its number until deleted (nvraid ublk delete {id}): give --ublk another \
             number or `auto`",
            state_name(state)
        )));
    }
    if info.flags & uapi::F_USER_RECOVERY == 0 {
        return Err(Error::Ublk(format!(
            "ublk device {id} was added without user recovery (by another program, or by \
             nvraid serve --ublk-recovery off), so it cannot be taken over; delete it \
             (nvraid ublk delete {id}) or give --ublk another number or `auto`"
        )));
    }
    Ok(())
}

fn state_name(state: u16) -> &'static str {
    match state {
        uapi::S_DEV_DEAD => "dead",
        uapi::S_DEV_LIVE => "live",
        uapi::S_DEV_QUIESCED => "quiesced",
        uapi::S_DEV_FAIL_IO => "failing I/O",
        _ => "unknown",
    }
}

/// `--ublk` checked before the array is assembled: the driver is there,
/// and a named device is free or left by a killed server.
pub(crate) fn preflight(options: &UblkOptions) -> Result<(), Error> {
    let mut ctl = open_control()?;
    if let Some(id) = options.id {
        if let Some(info) = existing(&mut ctl, id)? {
            may_recover(&info)?;
        }
    }
    Ok(())
}

/// The queues and slots the workers need for the device.
#[derive(Clone)]
pub(crate) struct WorkerUblkPlan {
    pub chardev: Arc<CharDev>,
    pub counters: Arc<Counters>,
    /// The device's size as the kernel has it (`Device::follow_size`).
    pub size_bytes: Arc<AtomicU64>,
    pub read_only: bool,
    pub handover: Arc<Handover>,
}

/// A stop that leaves the device to the next server (see
/// [`Device::hand_over`]): asked of the workers, and how many of their
/// queues are still open.
#[derive(Default)]
pub(crate) struct Handover {
    asked: std::sync::atomic::AtomicBool,
    open: std::sync::atomic::AtomicUsize,
}

impl Handover {
    fn asked(&self) -> bool {
        self.asked.load(std::sync::atomic::Ordering::Acquire)
    }

    fn open_queues(&self) -> usize {
        self.open.load(std::sync::atomic::Ordering::Acquire)
    }
}

/// The device, as the server holds it.
pub(crate) struct Device {
    ctl: Control,
    pub info: DevInfo,
    chardev: Option<Arc<CharDev>>,
    /// Taken over from a killed server (user recovery) rather than added.
    pub recovered: bool,
    pub counters: Arc<Counters>,
    started: bool,
    handover: Arc<Handover>,
    /// The device's size as the kernel has it: requests past it are
    /// refused, and an array larger than it (grown while served) is
    /// followed when the driver can (`follow_size`).
    size_bytes: Arc<AtomicU64>,
    /// The driver takes UPDATE_SIZE (Linux 6.16 on).
    can_resize: bool,
    /// An array size already said to be out of reach (logged once).
    size_kept: Option<u64>,
}

impl Device {
    /// Add the device, or take over the quiesced one `options.id` names;
    /// `workers` queues asked for (the kernel may grant fewer).
    pub(crate) fn prepare(
        options: &UblkOptions,
        size_bytes: u64,
        sector_bytes: u32,
        read_only: bool,
        workers: u32,
    ) -> Result<Device, Error> {
        let mut ctl = open_control()?;
        // A driver without GET_FEATURES (before Linux 6.5) has no
        // UPDATE_SIZE either.
        let can_resize = ctl.features().is_ok_and(|f| f & uapi::F_UPDATE_SIZE != 0);
        let found = match options.id {
            Some(id) => existing(&mut ctl, id)?,
            None => None,
        };
        let (info, recovered, device_bytes) = match found {
            Some(info) => {
                may_recover(&info)?;
                let device_bytes = check_same_device(&mut ctl, &info, size_bytes, sector_bytes)?;
                ctl.start_recovery_within(info.dev_id, QUIESCE_LIMIT)
                    .map_err(ublk_error)?;
                (
                    ctl.info(info.dev_id).map_err(ublk_error)?,
                    true,
                    device_bytes,
                )
            }
            None => {
                let spec = DeviceSpec {
                    id: options.id,
                    queues: workers.clamp(1, u32::from(uapi::MAX_QUEUES)) as u16,
                    depth: options.depth,
                    max_io_buf_bytes: options.max_io_bytes,
                    flags: if options.recovery {
                        uapi::F_USER_RECOVERY | uapi::F_USER_RECOVERY_REISSUE
                    } else {
                        0
                    },
                };
                let info = ctl.add(&spec).map_err(ublk_error)?;
                let params = params(options, &info, size_bytes, sector_bytes, read_only);
                if let Err(e) = ctl.set_params(info.dev_id, &params) {
                    let _ = ctl.delete(info.dev_id).map(|p| p.wait(COMMAND_LIMIT));
                    return Err(ublk_error(e));
                }
                (info, false, params.basic.dev_sectors << 9)
            }
        };
        let chardev = match CharDev::open(&info) {
            Ok(c) => c,
            Err(e) => {
                if !recovered {
                    let _ = ctl.delete(info.dev_id).map(|p| p.wait(COMMAND_LIMIT));
                }
                return Err(ublk_error(e));
            }
        };
        Ok(Device {
            ctl,
            info,
            chardev: Some(chardev),
            recovered,
            counters: Arc::new(Counters::default()),
            started: false,
            handover: Arc::default(),
            size_bytes: Arc::new(AtomicU64::new(device_bytes)),
            can_resize,
            size_kept: None,
        })
    }

    pub(crate) fn id(&self) -> u32 {
        self.info.dev_id
    }

    pub(crate) fn plan(&self, read_only: bool) -> WorkerUblkPlan {
        WorkerUblkPlan {
            chardev: Arc::clone(self.chardev.as_ref().expect("the device is open")),
            counters: Arc::clone(&self.counters),
            size_bytes: Arc::clone(&self.size_bytes),
            read_only,
            handover: Arc::clone(&self.handover),
        }
    }

    /// Start it (or hand it to this server, after a recovery): every
    /// queue has fetched its tags, and the workers serve what the kernel
    /// reads at start.
    pub(crate) fn start(&mut self) -> Result<(), Error> {
        let pid = std::process::id();
        let pending = if self.recovered {
            self.ctl.end_recovery(self.id(), pid)
        } else {
            self.ctl.start(self.id(), pid)
        };
        pending
            .and_then(|p| p.wait(COMMAND_LIMIT))
            .map_err(ublk_error)?;
        self.started = true;
        Ok(())
    }

    /// Stop the device (the kernel completes the requests in flight, then
    /// aborts every queue's tags, which the workers see and close their
    /// queues) and delete it. Called while the workers still run.
    pub(crate) fn stop(&mut self) -> Result<(), Error> {
        let id = self.id();
        let stopped = self
            .ctl
            .stop(id)
            .and_then(|p| p.wait(COMMAND_LIMIT))
            .map_err(ublk_error);
        // DEL_DEV completes once every holder of /dev/ublkcN is gone.
        self.chardev = None;
        let deleted = self
            .ctl
            .delete(id)
            .and_then(|p| p.wait(COMMAND_LIMIT))
            .map_err(ublk_error);
        self.started = false;
        stopped.and(deleted)
    }

    /// Whether something holds the block device: a mounted filesystem,
    /// device-mapper, or any opener with O_EXCL (an exclusive open of our
    /// own is refused with EBUSY then), or a holder listed in sysfs.
    pub(crate) fn in_use(&self) -> bool {
        use std::os::unix::fs::OpenOptionsExt;
        let id = self.id();
        let holders = std::fs::read_dir(format!("/sys/block/ublkb{id}/holders"))
            .map(|mut d| d.next().is_some())
            .unwrap_or(false);
        let exclusive = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_EXCL | libc::O_NONBLOCK)
            .open(format!("/dev/ublkb{id}"));
        holders || matches!(exclusive, Err(e) if e.raw_os_error() == Some(libc::EBUSY))
    }

    /// Leave the device to the next server instead of deleting it (a
    /// restart under a mounted filesystem): the workers stop taking
    /// requests, finish and answer the ones they hold, and leave their
    /// queues (`WorkerUblk::leave`); then the device is let go as a killed
    /// server would leave it
    /// (quiesced: the kernel holds new requests, and issues the ones taken
    /// but never started again to the next server), but with nothing of
    /// the array half-written. `poke` wakes the workers. Err if a queue
    /// is still open after `limit` (its target I/O has not finished).
    pub(crate) fn hand_over(mut self, poke: impl Fn(), limit: Duration) -> Result<(), Error> {
        self.handover
            .asked
            .store(true, std::sync::atomic::Ordering::Release);
        let until = std::time::Instant::now() + limit;
        while self.handover.open_queues() > 0 {
            if std::time::Instant::now() >= until {
                return Err(Error::Ublk(format!(
                    "{} ublk queue(s) still busy after {} s: the device is left to the \
                     kernel as a killed server would leave it",
                    self.handover.open_queues(),
                    limit.as_secs()
                )));
            }
            poke();
            std::thread::sleep(Duration::from_millis(5));
        }
        // The queues' threads exiting cancels their commands, which
        // quiesces the device; the next server may take it over once this
        // process (the last holder of /dev/ublkcN) is gone.
        self.chardev = None;
        self.started = false;
        Ok(())
    }

    /// The served array is now `array_bytes` (a reshape's end swapped
    /// its shape in): a started device takes that size where the driver
    /// can change it (UPDATE_SIZE; the disk then tells udev, and a
    /// filesystem may grow into it), or keeps its own. Requests are
    /// accepted up to the larger size before the kernel hears of a
    /// growth, and only up to the smaller one from before it hears of a
    /// shrink. The line to log, when something changed or could not.
    pub(crate) fn follow_size(&mut self, array_bytes: u64) -> Option<String> {
        let id = self.id();
        let want = array_bytes >> 9 << 9;
        let now = self.size_bytes.load(Ordering::Acquire);
        if !self.started || want == now || self.size_kept == Some(want) {
            return None;
        }
        if !self.can_resize {
            self.size_kept = Some(want);
            return Some(format!(
                "event=ublk-size-kept device=/dev/ublkb{id} bytes={now} array_bytes={want} \
                 reason=\"this kernel's ublk driver cannot change a started device's size \
                 (UPDATE_SIZE came with Linux 6.16): the device keeps {now} bytes until the \
                 server starts it again; new NBD and NVMe/TCP connections see the new size\""
            ));
        }
        if want > now {
            self.size_bytes.store(want, Ordering::Release);
        }
        match self.ctl.update_size(id, want >> 9) {
            Ok(()) => {
                self.size_bytes.store(want, Ordering::Release);
                Some(format!(
                    "event=ublk-resized device=/dev/ublkb{id} old_bytes={now} new_bytes={want}"
                ))
            }
            Err(e) => {
                self.size_bytes.store(now, Ordering::Release);
                self.size_kept = Some(want);
                Some(format!(
                    "event=ublk-size-kept device=/dev/ublkb{id} bytes={now} array_bytes={want} \
                     reason=\"{e}\""
                ))
            }
        }
    }

    /// What the control socket's status shows.
    pub(crate) fn status(&self) -> Value {
        let id = self.id();
        json!({
            "id": id,
            "path": format!("/dev/ublkb{id}"),
            "char_path": format!("/dev/ublkc{id}"),
            "queues": self.info.nr_hw_queues,
            "depth": self.info.queue_depth,
            "max_io_bytes": self.info.max_io_buf_bytes,
            "recovered": self.recovered,
            "size_bytes": self.size_bytes.load(Ordering::Acquire),
            "counters": self.counters.snapshot(),
        })
    }
}

/// A device taken over must be the one this array served: the same
/// logical block, and no larger than the array (a different one behind a
/// mounted filesystem would be wrong data). An array grown while the
/// device was served (whose driver could not follow it) is larger: the
/// device is taken over at its own size, then follows the array where the
/// driver can. The device's size in bytes.
fn check_same_device(
    ctl: &mut Control,
    info: &DevInfo,
    size_bytes: u64,
    sector_bytes: u32,
) -> Result<u64, Error> {
    let p = ctl.params(info.dev_id).map_err(ublk_error)?;
    let bytes = p.basic.dev_sectors << 9;
    let lbs = 1u32 << p.basic.logical_bs_shift;
    if bytes > size_bytes || lbs != sector_bytes {
        let id = info.dev_id;
        return Err(Error::Ublk(format!(
            "ublk device {id} is {bytes} bytes with {lbs}-byte blocks, this array {size_bytes} \
             bytes with {sector_bytes}-byte blocks: it is not the device this array served, \
             and is not taken over; give --ublk another number or `auto`"
        )));
    }
    Ok(bytes)
}

fn shift(bytes: u32) -> u8 {
    bytes.trailing_zeros() as u8
}

/// The device's parameters: what the array is.
pub(crate) fn params(
    options: &UblkOptions,
    info: &DevInfo,
    size_bytes: u64,
    sector_bytes: u32,
    read_only: bool,
) -> Params {
    let mut p = Params {
        types: uapi::PARAM_TYPE_BASIC,
        ..Params::default()
    };
    p.basic.attrs = uapi::ATTR_VOLATILE_CACHE | uapi::ATTR_FUA;
    if read_only {
        p.basic.attrs |= uapi::ATTR_READ_ONLY;
    }
    let physical = options.physical_block_bytes.max(sector_bytes);
    p.basic.logical_bs_shift = shift(sector_bytes);
    p.basic.physical_bs_shift = shift(physical);
    p.basic.io_min_shift = shift(options.io_min_bytes.max(physical));
    // 0 (1 << 0) is the kernel's "no hint" as far as ublk can say it.
    p.basic.io_opt_shift = if options.io_opt_bytes.is_power_of_two() {
        shift(options.io_opt_bytes)
    } else {
        0
    };
    let max_sectors = info.max_io_buf_bytes >> 9;
    p.basic.max_sectors = max_sectors;
    p.basic.dev_sectors = size_bytes >> 9;
    if !read_only {
        p.types |= uapi::PARAM_TYPE_DISCARD;
        p.discard.discard_granularity = options.discard_granularity.max(sector_bytes);
        // One slot each, as an NBD trim or zeroing of that size is.
        p.discard.max_discard_sectors = max_sectors;
        p.discard.max_write_zeroes_sectors = max_sectors;
        p.discard.max_discard_segments = 1;
    }
    p
}

/// The ublk queue a worker serves, its tags in slots `first_slot..`.
pub(crate) struct WorkerUblk {
    queue: Queue,
    ctx: Context,
    handover: Arc<Handover>,
}

impl Drop for WorkerUblk {
    fn drop(&mut self) {
        self.handover
            .open
            .fetch_sub(1, std::sync::atomic::Ordering::AcqRel);
    }
}

struct Context {
    first_slot: u32,
    size_bytes: Arc<AtomicU64>,
    read_only: bool,
    counters: Arc<Counters>,
}

impl WorkerUblk {
    /// Open queue `q_id` on this worker's thread, its tags' buffers the
    /// slots reserved for it, and fetch every tag.
    pub(crate) fn open(
        plan: &WorkerUblkPlan,
        q_id: u16,
        slots: &mut Slots,
    ) -> Result<WorkerUblk, Error> {
        let depth = plan.chardev.info().queue_depth;
        let each = plan.chardev.info().max_io_buf_bytes as usize;
        if (slots.slot_bytes as usize) < each {
            return Err(Error::Ublk(format!(
                "worker slots of {} bytes, ublk requests of {each}",
                slots.slot_bytes
            )));
        }
        let first_slot = slots.reserve_for_ublk(u32::from(depth));
        let addrs = (0..u32::from(depth))
            .map(|t| slots.queue.buffer_mut(first_slot + t).as_mut_ptr())
            .collect();
        // SAFETY: each address is a slot buffer of `slot_bytes` >= `each`
        // bytes that the worker's queue owns for its whole life; the
        // worker drops this ublk queue before its own queue (`Worker`'s
        // field order and `close_ublk`), and never touches a reserved
        // slot's buffer while the kernel holds its tag (only between
        // the tag's completion and its commit).
        let buffers = unsafe { TagBuffers::from_raw(addrs, slots.slot_bytes as usize) };
        let mut queue = Queue::open(&plan.chardev, q_id, buffers).map_err(ublk_error)?;
        queue.fetch_all().map_err(ublk_error)?;
        plan.handover
            .open
            .fetch_add(1, std::sync::atomic::Ordering::AcqRel);
        Ok(WorkerUblk {
            handover: Arc::clone(&plan.handover),
            queue,
            ctx: Context {
                first_slot,
                size_bytes: Arc::clone(&plan.size_bytes),
                read_only: plan.read_only,
                counters: Arc::clone(&plan.counters),
            },
        })
    }

    pub(crate) fn poll_fd(&self) -> libc::pollfd {
        libc::pollfd {
            fd: self.queue.fd(),
            events: libc::POLLIN,
            revents: 0,
        }
    }

    /// Every tag aborted (the device stopped): the queue may be closed.
    pub(crate) fn finished(&self) -> bool {
        self.queue.finished()
    }

    /// Leave the queue to the next server: counted closed for
    /// [`Device::hand_over`], but its ring (and the descriptors it maps)
    /// is not closed here: it closes when the process exits, after this
    /// thread has.
    ///
    /// Why: the kernel hands a request to a queue by queueing work on the
    /// thread that fetched its tag. A ring closed while that thread lives
    /// can have its commands cancelled before such work runs; the work
    /// then runs on the live thread and gives it the request as if the
    /// queue still served it, nobody answers it, and the device never
    /// becomes quiesced (Linux 6.12: the next server's START_USER_RECOVERY
    /// then waits forever on the device's lock, and so does every writer).
    /// Work for a thread that has exited puts its request back for the
    /// next server instead, as it does for a server killed with SIGKILL.
    pub(crate) fn leave(self) {
        self.handover
            .open
            .fetch_sub(1, std::sync::atomic::Ordering::AcqRel);
        // Drop would count the queue closed a second time, and close it.
        std::mem::forget(self);
    }

    /// The server hands the device over: take no more requests, answer
    /// the ones held, then close.
    pub(crate) fn handing_over(&self) -> bool {
        self.handover.asked()
    }

    /// Take the requests that arrived and submit them to the target, each
    /// in its tag's slot; answer those refused at once. True if any came.
    pub(crate) fn pump(&mut self, slots: &mut Slots) -> Result<bool, Error> {
        let ctx = &self.ctx;
        let came = self
            .queue
            .reap(|tag, desc, _buffer| ctx.start(slots, tag, desc))
            .map_err(ublk_error)?;
        Ok(came > 0)
    }

    /// Answer the requests whose target operation completed (the slots
    /// left them in `slots.ublk_answers`). True if any.
    pub(crate) fn answer(&mut self, slots: &mut Slots) -> Result<bool, Error> {
        if slots.ublk_answers.is_empty() {
            return Ok(false);
        }
        for (tag, command, len, result) in slots.ublk_answers.drain(..) {
            self.ctx.counters.record(command, len, result >= 0);
            self.queue.commit(tag, result).map_err(ublk_error)?;
        }
        self.queue.submit().map_err(ublk_error)?;
        Ok(true)
    }
}

impl Context {
    /// One request: submitted in its tag's slot (`None`: answered when it
    /// completes), or refused (`Some(-errno)`), or nothing to do
    /// (`Some(0)`).
    fn start(&self, slots: &mut Slots, tag: u16, desc: &IoDesc) -> Option<i32> {
        let command = match desc.op {
            Op::Read => Command::Read,
            Op::Write => Command::Write,
            Op::Flush => Command::Flush,
            Op::Discard => Command::Trim,
            Op::WriteZeroes => Command::WriteZeroes,
            Op::WriteSame | Op::Other(_) => {
                self.counters.record(Command::Unknown(0), 0, false);
                return Some(-libc::EOPNOTSUPP);
            }
        };
        let len = desc.len();
        let refuse = |errno: i32| {
            self.counters.record(command, 0, false);
            Some(-errno)
        };
        if command != Command::Flush {
            if self.read_only && command != Command::Read {
                return refuse(libc::EROFS);
            }
            let past_end = desc
                .offset()
                .checked_add(len)
                .is_none_or(|end| end > self.size_bytes.load(Ordering::Acquire));
            if past_end || len > u64::from(slots.slot_bytes) {
                return refuse(libc::EIO);
            }
            if len == 0 {
                self.counters.record(command, 0, true);
                return Some(0);
            }
        }
        let Some(work) = Work::of(command) else {
            panic!("invariant: every command above is a target operation");
        };
        let slot = self.first_slot + u32::from(tag);
        let len = len as u32;
        match slots.submit_ublk(slot, work, desc.offset(), len, desc.fua(), tag, command) {
            Ok(()) => None,
            Err(errno) => refuse(errno),
        }
    }
}

/// What `start` does with `--ublk`: the device added or taken over, and
/// the worker count it needs.
pub(crate) fn prepare_device(
    options: &ServeOptions,
    size_bytes: u64,
    sector_bytes: u32,
    read_only: bool,
) -> Result<Option<Device>, Error> {
    let Some(ublk) = &options.ublk else {
        return Ok(None);
    };
    Device::prepare(ublk, size_bytes, sector_bytes, read_only, options.workers).map(Some)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn options(io_opt: u32) -> UblkOptions {
        UblkOptions {
            id: Some(0),
            depth: 32,
            max_io_bytes: 768 << 10,
            physical_block_bytes: 4096,
            io_min_bytes: 256 << 10,
            io_opt_bytes: io_opt,
            discard_granularity: 256 << 10,
            ..UblkOptions::default()
        }
    }

    fn info() -> DevInfo {
        DevInfo {
            nr_hw_queues: 2,
            queue_depth: 32,
            max_io_buf_bytes: 768 << 10,
            ..DevInfo::default()
        }
    }

    /// A RAID 5 of 4 with 256 KiB chunks: io_min is the chunk, the 768 KiB
    /// stripe cannot be said as a power of two, so io_opt stays unset.
    #[test]
    fn params_tell_the_arrays_geometry_and_leave_a_stripe_ublk_cannot_carry() {
        let p = params(&options(768 << 10), &info(), 3 << 30, 512, false);
        assert_eq!(p.basic.logical_bs_shift, 9);
        assert_eq!(p.basic.physical_bs_shift, 12);
        assert_eq!(p.basic.io_min_shift, 18);
        assert_eq!(p.basic.io_opt_shift, 0);
        assert_eq!(p.basic.max_sectors, 1536);
        assert_eq!(p.basic.dev_sectors, (3u64 << 30) >> 9);
        assert_eq!(p.discard.discard_granularity, 256 << 10);
        assert_eq!(p.discard.max_discard_sectors, 1536);
        assert_eq!(
            p.basic.attrs,
            uapi::ATTR_VOLATILE_CACHE | uapi::ATTR_FUA,
            "a volatile cache (FLUSH) and FUA, writable"
        );
        let p = params(&options(512 << 10), &info(), 3 << 30, 4096, true);
        assert_eq!(p.basic.io_opt_shift, 19);
        assert_eq!(p.basic.logical_bs_shift, 12);
        assert_ne!(p.basic.attrs & uapi::ATTR_READ_ONLY, 0);
        assert_eq!(
            p.types & uapi::PARAM_TYPE_DISCARD,
            0,
            "no discard read-only"
        );
    }

    #[test]
    fn a_live_device_of_another_server_is_refused_by_number_and_pid() {
        let me = std::process::id() as i32;
        let info = DevInfo {
            dev_id: 3,
            state: uapi::S_DEV_LIVE,
            ublksrv_pid: me,
            flags: uapi::F_USER_RECOVERY,
            ..DevInfo::default()
        };
        let e = may_recover(&info).unwrap_err().to_string();
        assert!(
            e.contains("ublk device 3") && e.contains(&me.to_string()),
            "{e}"
        );
        let quiesced = DevInfo {
            state: uapi::S_DEV_QUIESCED,
            ..info
        };
        assert!(may_recover(&quiesced).is_ok());
        let foreign = DevInfo {
            flags: 0,
            ..quiesced
        };
        let e = may_recover(&foreign).unwrap_err().to_string();
        assert!(e.contains("without user recovery"), "{e}");
    }
}

/// One ublk device as the kernel reports it (for `nvraid ublk list`).
#[derive(Clone, Debug, serde::Serialize)]
pub struct DeviceStatus {
    pub id: u32,
    pub path: String,
    /// live, quiesced, dead, failing I/O.
    pub state: &'static str,
    /// The process serving it, when one is running.
    pub server_pid: Option<i32>,
    pub queues: u16,
    pub depth: u16,
    /// Added with user recovery (by `nvraid serve --ublk`): a new server
    /// may take it over.
    pub recoverable: bool,
}

/// Every ublk device on this machine, by number.
pub fn list() -> Result<Vec<DeviceStatus>, Error> {
    let mut ctl = open_control()?;
    let mut ids: Vec<u32> = std::fs::read_dir("/dev")
        .map_err(|e| Error::Ublk(format!("/dev: {e}")))?
        .filter_map(|entry| {
            let name = entry.ok()?.file_name();
            name.to_str()?.strip_prefix("ublkc")?.parse().ok()
        })
        .collect();
    ids.sort_unstable();
    let mut devices = Vec::new();
    for id in ids {
        let Some(info) = existing(&mut ctl, id)? else {
            continue;
        };
        devices.push(DeviceStatus {
            id,
            path: format!("/dev/ublkb{id}"),
            state: state_name(info.state),
            server_pid: process_alive(info.ublksrv_pid).then_some(info.ublksrv_pid),
            queues: info.nr_hw_queues,
            depth: info.queue_depth,
            recoverable: info.flags & uapi::F_USER_RECOVERY != 0,
        });
    }
    Ok(devices)
}

/// Delete ublk device `id`, whose server is gone (killed, and its array not
/// to be served again here): the I/O the kernel holds for it fails, and
/// the number is free. Refused while a server runs it (stop that server:
/// SIGTERM deletes its device).
pub fn release(id: u32) -> Result<(), Error> {
    let mut ctl = open_control()?;
    let Some(info) = existing(&mut ctl, id)? else {
        return Err(Error::Ublk(format!("no ublk device {id} (/dev/ublkc{id})")));
    };
    if process_alive(info.ublksrv_pid) && info.state == uapi::S_DEV_LIVE {
        return Err(Error::Ublk(format!(
            "ublk device {id} (/dev/ublkb{id}) is served by process {}: stop that server \
             (SIGTERM deletes its device) instead",
            info.ublksrv_pid
        )));
    }
    // A started device is stopped first (its held requests fail); one that
    // never started has nothing to stop.
    if info.state != uapi::S_DEV_DEAD {
        ctl.stop(id)
            .and_then(|p| p.wait(COMMAND_LIMIT))
            .map_err(ublk_error)?;
    }
    ctl.delete(id)
        .and_then(|p| p.wait(COMMAND_LIMIT))
        .map_err(ublk_error)
}
