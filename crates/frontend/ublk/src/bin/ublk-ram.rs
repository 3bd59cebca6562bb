//! ublk-ram: a RAM disk served through ublk, to exercise nvraid-ublk on a
//! real kernel. Its bytes live in a file (on tmpfs, e.g. /dev/shm), so a
//! second process can take the device over after the first was killed.
//!
//! ```text
//! ublk-ram --file PATH [--size BYTES[K|M|G]] [--id N] [--queues N] [--depth N]
//!          [--max-io BYTES] [--recovery]
//! ublk-ram --recover ID --file PATH
//! ublk-ram --delete ID
//! ```
//!
//! One thread per queue, each sleeping in poll(2) on its queue's ring;
//! the main thread does the control commands and waits for SIGTERM or
//! SIGINT, then stops and deletes the device and prints what it served.
//! `--recovery` adds the device with user recovery (I/O the dead server
//! held is issued again); `--recover ID` re-attaches to such a device
//! after its server was killed; `--delete ID` deletes a device whose
//! server is gone (a dead one keeps its id until then).

use std::fs::File;
use std::os::fd::AsRawFd;
use std::os::unix::fs::FileExt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use nvraid_ublk::uapi::{self, DevInfo, Params};
use nvraid_ublk::{sys, CharDev, Control, DeviceSpec, IoDesc, Op, Queue, TagBuffers};

const USAGE: &str = "usage: ublk-ram --file PATH [--size BYTES[K|M|G]] [--id N] [--queues N] \
[--depth N] [--max-io BYTES] [--recovery]\n       ublk-ram --recover ID --file PATH\n       ublk-ram --delete ID";

struct Args {
    file: String,
    size: Option<u64>,
    id: Option<u32>,
    queues: u16,
    depth: u16,
    max_io: u32,
    recovery: bool,
    recover: Option<u32>,
    delete: Option<u32>,
}

fn parse_size(s: &str) -> Option<u64> {
    let (digits, unit) = match s.char_indices().last()? {
        (i, 'K' | 'k') => (&s[..i], 1 << 10),
        (i, 'M' | 'm') => (&s[..i], 1 << 20),
        (i, 'G' | 'g') => (&s[..i], 1 << 30),
        _ => (s, 1),
    };
    digits.parse::<u64>().ok()?.checked_mul(unit)
}

fn parse_args() -> Result<Args, String> {
    let mut args = Args {
        file: String::new(),
        size: None,
        id: None,
        queues: 1,
        depth: 64,
        max_io: 512 << 10,
        recovery: false,
        recover: None,
        delete: None,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = |name: &str| it.next().ok_or(format!("{name} needs a value"));
        let bad = |name: &str, v: &str| format!("{name}: not a valid value: {v}");
        match flag.as_str() {
            "--file" => args.file = value("--file")?,
            "--size" => {
                let v = value("--size")?;
                args.size = Some(parse_size(&v).ok_or(bad("--size", &v))?);
            }
            "--id" => {
                let v = value("--id")?;
                args.id = Some(v.parse().map_err(|_| bad("--id", &v))?);
            }
            "--queues" => {
                let v = value("--queues")?;
                args.queues = v.parse().map_err(|_| bad("--queues", &v))?;
            }
            "--depth" => {
                let v = value("--depth")?;
                args.depth = v.parse().map_err(|_| bad("--depth", &v))?;
            }
            "--max-io" => {
                let v = value("--max-io")?;
                args.max_io = parse_size(&v)
                    .and_then(|n| u32::try_from(n).ok())
                    .ok_or(bad("--max-io", &v))?;
            }
            "--recovery" => args.recovery = true,
            "--recover" => {
                let v = value("--recover")?;
                args.recover = Some(v.parse().map_err(|_| bad("--recover", &v))?);
            }
            "--delete" => {
                let v = value("--delete")?;
                args.delete = Some(v.parse().map_err(|_| bad("--delete", &v))?);
            }
            "-h" | "--help" => return Err(USAGE.into()),
            other => return Err(format!("unknown argument {other}\n{USAGE}")),
        }
    }
    if args.file.is_empty() && args.delete.is_none() {
        return Err(format!("--file is required\n{USAGE}"));
    }
    Ok(args)
}

#[derive(Default)]
struct Stats {
    reads: AtomicU64,
    writes: AtomicU64,
    fua: AtomicU64,
    flushes: AtomicU64,
    discards: AtomicU64,
    write_zeroes: AtomicU64,
    errors: AtomicU64,
}

/// Serve one request from the backing file: bytes done, or a negative errno.
fn serve(file: &File, size: u64, stats: &Stats, desc: &IoDesc, buf: &mut [u8]) -> i32 {
    let offset = desc.offset();
    let outside = offset.checked_add(desc.len()).is_none_or(|end| end > size);
    if desc.op != Op::Flush && outside {
        stats.errors.fetch_add(1, Ordering::Relaxed);
        return -libc::EIO;
    }
    let done = match desc.op {
        Op::Read => {
            stats.reads.fetch_add(1, Ordering::Relaxed);
            file.read_exact_at(buf, offset).map(|_| buf.len() as i32)
        }
        Op::Write => {
            stats.writes.fetch_add(1, Ordering::Relaxed);
            let mut done = file.write_all_at(buf, offset);
            if desc.fua() && done.is_ok() {
                stats.fua.fetch_add(1, Ordering::Relaxed);
                done = file.sync_data();
            }
            done.map(|_| buf.len() as i32)
        }
        Op::Flush => {
            stats.flushes.fetch_add(1, Ordering::Relaxed);
            file.sync_data().map(|_| 0)
        }
        Op::Discard | Op::WriteZeroes => {
            let counter = if desc.op == Op::Discard {
                &stats.discards
            } else {
                &stats.write_zeroes
            };
            counter.fetch_add(1, Ordering::Relaxed);
            sys::punch_hole(file.as_raw_fd(), offset, desc.len()).map(|_| 0)
        }
        Op::WriteSame | Op::Other(_) => return -libc::EOPNOTSUPP,
    };
    done.unwrap_or_else(|e| {
        stats.errors.fetch_add(1, Ordering::Relaxed);
        -e.raw_os_error().unwrap_or(libc::EIO)
    })
}

/// A queue's thread: open and fetch (then say so on `fetched`), serve
/// until the kernel has aborted every tag.
fn run_queue(
    chardev: Arc<CharDev>,
    q_id: u16,
    file: Arc<File>,
    stats: Arc<Stats>,
    fetched: mpsc::Sender<Result<u16, String>>,
) -> Result<(), String> {
    let info = *chardev.info();
    let size = file.metadata().map_err(|e| e.to_string())?.len();
    let buffers = TagBuffers::allocate(info.queue_depth, info.max_io_buf_bytes as usize);
    let mut queue = match Queue::open(&chardev, q_id, buffers).and_then(|mut q| {
        q.fetch_all()?;
        Ok(q)
    }) {
        Ok(q) => q,
        Err(e) => {
            let _ = fetched.send(Err(e.to_string()));
            return Err(e.to_string());
        }
    };
    let _ = fetched.send(Ok(q_id));
    while !queue.finished() {
        let mut fds = [libc::pollfd {
            fd: queue.fd(),
            events: libc::POLLIN,
            revents: 0,
        }];
        sys::poll(&mut fds, 1000);
        queue
            .reap(|_tag, desc, buf| Some(serve(&file, size, &stats, desc, buf)))
            .map_err(|e| e.to_string())?;
    }
    Ok(())
}

fn main() {
    let args = match parse_args() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("{e}");
            std::process::exit(2);
        }
    };
    if let Err(e) = run(args) {
        eprintln!("ublk-ram: {e}");
        std::process::exit(1);
    }
}

fn run(args: Args) -> Result<(), String> {
    let began = Instant::now();
    if let Some(id) = args.delete {
        let ctl = Control::open().map_err(|e| e.to_string())?;
        return ctl
            .delete(id)
            .and_then(|p| p.wait(Duration::from_secs(30)))
            .map_err(|e| e.to_string());
    }
    // Blocked before any thread starts, so that only the signalfd sees them.
    let signals = sys::signal_fd(&[libc::SIGTERM, libc::SIGINT]).map_err(|e| e.to_string())?;
    let (file, size) = open_backing(&args)?;
    let mut ctl = Control::open().map_err(|e| e.to_string())?;
    let info = add_or_recover(&mut ctl, &args, size)?;
    let id = info.dev_id;
    let stats = Arc::new(Stats::default());
    let chardev = CharDev::open(&info).map_err(|e| e.to_string())?;
    let threads = start_queues(&info, &chardev, &file, &stats)?;
    // The queues have fetched every tag: the answer can come, and the
    // queue threads serve the reads START_DEV makes.
    let pid = std::process::id();
    let answer = if args.recover.is_some() {
        ctl.end_recovery(id, pid)
    } else {
        ctl.start(id, pid)
    };
    answer
        .and_then(|p| p.wait(Duration::from_secs(30)))
        .map_err(|e| e.to_string())?;
    eprintln!(
        "ublk-ram: /dev/ublkb{id} {} after {} ms ({} queues of {} tags, {} bytes per request, recovery {})",
        if args.recover.is_some() { "re-attached" } else { "ready" },
        began.elapsed().as_millis(),
        info.nr_hw_queues,
        info.queue_depth,
        info.max_io_buf_bytes,
        if ctl.info(id).map(|i| i.flags & uapi::F_USER_RECOVERY != 0).unwrap_or(false) {
            "on"
        } else {
            "off"
        }
    );
    wait_for_stop(&signals, id, &threads);
    // The queues hold /dev/ublkcN now; DEL_DEV waits for their close.
    drop(chardev);
    let failed = stop_and_delete(&ctl, id, threads);
    report(&stats);
    match failed {
        Some(e) => Err(e),
        None => {
            eprintln!("ublk-ram: /dev/ublkb{id} deleted");
            Ok(())
        }
    }
}

/// The file that holds the disk's bytes (created, and sized with
/// `--size`, unless a device is being recovered), and its size.
fn open_backing(args: &Args) -> Result<(Arc<std::fs::File>, u64), String> {
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(args.recover.is_none())
        .truncate(false)
        .open(&args.file)
        .map_err(|e| format!("{}: {e}", args.file))?;
    if let Some(size) = args.size {
        file.set_len(size)
            .map_err(|e| format!("{}: {e}", args.file))?;
    }
    let size = file.metadata().map_err(|e| e.to_string())?.len();
    Ok((Arc::new(file), size))
}

/// A new device with the disk's parameters, or (`--recover ID`) the
/// quiesced device ID taken over.
fn add_or_recover(ctl: &mut Control, args: &Args, size: u64) -> Result<DevInfo, String> {
    if let Some(id) = args.recover {
        let info = ctl.info(id).map_err(|e| e.to_string())?;
        if info.flags & uapi::F_USER_RECOVERY == 0 {
            return Err(format!(
                "device {id} was not added with user recovery (--recovery)"
            ));
        }
        ctl.start_recovery_within(id, Duration::from_secs(10))
            .map_err(|e| e.to_string())?;
        return Ok(info);
    }
    if size < 4096 || !size.is_multiple_of(4096) {
        return Err(format!(
            "{}: size {size} is not a positive multiple of 4 KiB (--size)",
            args.file
        ));
    }
    let flags = if args.recovery {
        uapi::F_USER_RECOVERY | uapi::F_USER_RECOVERY_REISSUE
    } else {
        0
    };
    let info = ctl
        .add(&DeviceSpec {
            id: args.id,
            queues: args.queues,
            depth: args.depth,
            max_io_buf_bytes: args.max_io,
            flags,
        })
        .map_err(|e| e.to_string())?;
    if let Err(e) = ctl.set_params(info.dev_id, &params(&info, size)) {
        let _ = ctl
            .delete(info.dev_id)
            .map(|p| p.wait(Duration::from_secs(10)));
        return Err(e.to_string());
    }
    Ok(info)
}

type QueueThread = std::thread::JoinHandle<Result<(), String>>;

/// One thread per queue, each serving its queue once it has fetched every
/// tag (returns when all have).
fn start_queues(
    info: &DevInfo,
    chardev: &Arc<CharDev>,
    file: &Arc<std::fs::File>,
    stats: &Arc<Stats>,
) -> Result<Vec<QueueThread>, String> {
    let (fetched_tx, fetched_rx) = mpsc::channel();
    let threads: Vec<_> = (0..info.nr_hw_queues)
        .map(|q| {
            let (file, stats, tx) = (file.clone(), stats.clone(), fetched_tx.clone());
            let chardev = chardev.clone();
            std::thread::Builder::new()
                .name(format!("ublk-q{q}"))
                .spawn(move || run_queue(chardev, q, file, stats, tx))
                .expect("spawn a queue thread")
        })
        .collect();
    for _ in 0..info.nr_hw_queues {
        match fetched_rx.recv_timeout(Duration::from_secs(10)) {
            Ok(Ok(_)) => {}
            Ok(Err(e)) => return Err(e),
            Err(_) => return Err("a queue did not fetch its tags within 10 s".into()),
        }
    }
    Ok(threads)
}

/// Until SIGTERM/SIGINT, or a queue thread ends on its own.
fn wait_for_stop(signals: &impl AsRawFd, id: u32, threads: &[QueueThread]) {
    loop {
        let mut fds = [libc::pollfd {
            fd: signals.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        }];
        sys::poll(&mut fds, 500);
        if let Some(sig) = sys::read_signal(signals.as_raw_fd()) {
            eprintln!("ublk-ram: signal {sig}: stopping /dev/ublkb{id}");
            return;
        }
        if threads.iter().any(|t| t.is_finished()) {
            eprintln!("ublk-ram: a queue thread ended: stopping /dev/ublkb{id}");
            return;
        }
    }
}

/// Stop the device, join its queues, delete it: the first failure.
fn stop_and_delete(ctl: &Control, id: u32, threads: Vec<QueueThread>) -> Option<String> {
    let stopped = ctl.stop(id).and_then(|p| p.wait(Duration::from_secs(30)));
    let mut failed = stopped.as_ref().err().map(|e| e.to_string());
    for t in threads {
        if let Err(e) = t.join().expect("a queue thread panicked") {
            failed.get_or_insert(e);
        }
    }
    if let Err(e) = ctl.delete(id).and_then(|p| p.wait(Duration::from_secs(30))) {
        failed.get_or_insert(e.to_string());
    }
    failed
}

fn report(s: &Stats) {
    let n = |c: &AtomicU64| c.load(Ordering::Relaxed);
    eprintln!(
        "ublk-ram: served reads={} writes={} fua={} flushes={} discards={} write_zeroes={} errors={}",
        n(&s.reads),
        n(&s.writes),
        n(&s.fua),
        n(&s.flushes),
        n(&s.discards),
        n(&s.write_zeroes),
        n(&s.errors)
    );
}

/// A 4 KiB-sector RAM disk of `size` bytes with a volatile cache (so the
/// kernel sends FLUSH), FUA, and discard / write-zeroes by 4 KiB.
fn params(info: &DevInfo, size: u64) -> Params {
    let mut p = Params {
        types: uapi::PARAM_TYPE_BASIC | uapi::PARAM_TYPE_DISCARD,
        ..Params::default()
    };
    p.basic.attrs = uapi::ATTR_VOLATILE_CACHE | uapi::ATTR_FUA;
    p.basic.logical_bs_shift = 9;
    p.basic.physical_bs_shift = 12;
    p.basic.io_min_shift = 12;
    p.basic.io_opt_shift = 12;
    p.basic.max_sectors = info.max_io_buf_bytes >> 9;
    p.basic.dev_sectors = size >> 9;
    p.discard.discard_granularity = 4096;
    p.discard.max_discard_sectors = u32::MAX >> 9;
    p.discard.max_write_zeroes_sectors = u32::MAX >> 9;
    p.discard.max_discard_segments = 1;
    p
}
