//! `nvraid serve` and `nvraid status`: export an array over NBD, and ask a
//! running server how it is doing.

use anyhow::{Context, Result};
use clap::Args;
use nvraid_array::recovery::online::{background_resync, Log, Online, ResyncState};
use nvraid_array::reshape::{assemble_serving, resumed_line, LiveGrow, ResumeOptions};
use nvraid_array::{info, Array, AssembleOptions};
use nvraid_bench::cli::Engine;
use nvraid_cache::journal::JournalLog;
use nvraid_io::queue::Target;
use nvraid_serve::cli::ServeArgs;
use nvraid_serve::{ServeOptions, ShutdownHandle};
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::Arc;

mod cache;
use cache::CacheChoice;

#[derive(Args, Debug)]
pub struct ServeCmd {
    #[command(flatten)]
    serve: ServeArgs,
    /// I/O engine for the workers (auto: psync for RAM-backed members,
    /// io_uring otherwise).
    #[arg(long, value_enum, default_value = "auto")]
    engine: Engine,
    /// Resync speed limit in MB/s (md's speed_limit_max) for an array that
    /// comes up dirty and is resynced in the background while served.
    /// Default: unlimited (the resync still holds only one 4 MiB region at
    /// a time against client writes).
    #[arg(long, value_name = "MB/s")]
    resync_speed: Option<u64>,
    /// Rebuild speed limits in MB/s, md-style `MIN:MAX` (or `MAX`), for a
    /// member rebuilt while serving (added or re-added through the control
    /// socket, or a hot spare taking over): never faster than MAX, and no
    /// faster than MIN while clients are doing I/O. Default: 50:unlimited.
    #[arg(long, value_name = "MIN:MAX", value_parser = crate::cmd::manage::parse_speed)]
    rebuild_speed: Option<(u64, u64)>,
    /// Speed limits in MB/s, md-style `MIN:MAX` (or `MAX`), of a grow run
    /// through the control socket (`nvraid grow --socket`), or resumed
    /// at assembly (the members record one, stopped cleanly), paced as
    /// the rebuild is: never faster than MAX, and no faster than MIN while
    /// clients are doing I/O (sampled every 100 ms; MIN 0: no rows move
    /// while they are). A bare MAX keeps the default MIN (50, or MAX if
    /// lower). Default: 50:unlimited.
    #[arg(long, value_name = "MIN:MAX", value_parser = parse_reshape_speed)]
    reshape_speed: Option<(Option<u64>, u64)>,
    /// Write cache: none (a write is acknowledged once on the members),
    /// writeback (in RAM: acknowledged writes not yet flushed are LOST if
    /// nvraid dies or power fails; FLUSH and FUA still wait for the
    /// members), journal (acknowledged once durable in --journal, written
    /// to the members later, replayed after a crash). docs/serve.md.
    #[arg(long, value_enum, default_value = "none")]
    cache: CacheChoice,
    /// --cache journal: the member holding the journal (a fast device or
    /// file, not a member of the array). RAID 4/5/6: md's write journal,
    /// added to the array the first time (see add-journal); RAID 0/1/10:
    /// nvraid's own journal, at least 16 MiB.
    #[arg(long, value_name = "MEMBER")]
    journal: Option<String>,
    /// --cache writeback|journal: the most written data held in RAM and
    /// not yet on the members; writers wait above it (default 1G with
    /// writeback, 64M with journal).
    #[arg(long, value_name = "SIZE", value_parser = crate::cmd::size_arg)]
    cache_dirty_max: Option<u64>,
    /// --cache journal on md's write journal (RAID 4/5/6): the most stripes
    /// (4 KiB rows of the members) the cache keeps in the log as data-only
    /// units, as md's own write-back cache keeps at most its stripe cache.
    /// After a crash the kernel's md loads all of them into memory before
    /// writing any out (about members x 4 KiB each, doubled as it grows):
    /// raise it only where the machine that may assemble the array has the
    /// memory (default 4096; md allows at most 32768).
    #[arg(long, value_name = "STRIPES", value_parser = clap::value_parser!(u32).range(16..=32768))]
    cache_stripes_max: Option<u32>,
    /// --journal: use a member that carries a filesystem or another array
    /// anyway (its contents are destroyed).
    #[arg(long)]
    force: bool,
    #[command(flatten)]
    monitor: nvraid_monitor::MonitorArgs,
    /// Re-add the members given that assembly set aside as stale or
    /// faulty (a disk that was missing or failed while the array ran
    /// without it) to their roles once the server runs, each recovering
    /// by the write-intent bitmap what it missed (a full rebuild where the
    /// bitmap cannot tell); md's incremental assembly does the same.
    /// `nvraid run` (the boot service) passes it. Each re-add is logged;
    /// one that is refused leaves the array serving degraded.
    #[arg(long)]
    re_add: bool,
    /// Members of the array to serve, in any order. An array its members
    /// record mid-reshape (a RAID 4/5/6 or RAID 10 near gaining members or
    /// restriped, a RAID 4/5/6 shrunk) needs every member of both shapes:
    /// stopped cleanly, it is served in its old shape (a shrink at its new,
    /// smaller size) while the reshape goes on; not (the server was
    /// killed), the reshape is finished first, then the array served and
    /// resynced.
    #[arg(required = true)]
    members: Vec<String>,
}

#[derive(Args, Debug)]
pub struct StatusArgs {
    /// The server's control socket (default: the listen socket with .ctl).
    #[arg(long)]
    socket: PathBuf,
    /// Print the raw JSON.
    #[arg(long)]
    json: bool,
}

pub fn serve(args: &ServeCmd, direct: bool) -> Result<u8> {
    let mut options = args.serve.to_options().map_err(anyhow::Error::msg)?;
    // The TLS files, the listen and control paths: checked before the
    // array is assembled (or md's journal added), so that a bad flag
    // changes no byte on any member.
    nvraid_serve::preflight(&options)?;
    let writable = !options.read_only;
    // Every check of the cache's flags and the journal member comes before
    // the array is assembled for writing (or md's journal added to it).
    check_cache_flags(args, writable)?;
    // --metrics is bound here, before the array is assembled.
    let monitor = args.monitor.prepare().map_err(anyhow::Error::msg)?;
    // So are the listening sockets (--listen, --nvme-tcp): an address in
    // use is refused before any member changes.
    let bound = nvraid_serve::bind(&options)?;
    let (members, journal) = settle_md_journal(args, direct)?;
    let md_journal = args.cache == CacheChoice::Journal && cache::has_md_journal(&members, direct);
    let journal_member =
        check_cache_journal(args, &members, journal.as_deref(), md_journal, direct)?;
    // An array its members record mid-grow is assembled in its old shape
    // and the grow goes on from the recorded position while it is served
    // (a dirty one is finished offline first, then resynced as usual):
    // nvraid_array::reshape::resume.
    let reshape_pace = reshape_pace(args.reshape_speed);
    let resume = ResumeOptions {
        step_bytes: RESHAPE_STEP_BYTES,
        min_bytes_per_sec: reshape_pace.0,
        max_bytes_per_sec: reshape_pace.1,
    };
    let (array, recorded) = waiting_for_probes(|| {
        assemble_serving(
            &members,
            AssembleOptions {
                writable,
                direct,
                allow_degraded: true,
            },
            resume,
            &assembly_log,
        )
    })?;
    let array = Arc::new(array);
    let resumed = match recorded {
        Some(recorded) => {
            let (grow, thread) = LiveGrow::resume(&array, recorded, resume)?;
            eprintln!("{}", resumed_line(&grow.status()));
            Some((grow, thread))
        }
        None => None,
    };
    let resync = Arc::new(std::sync::Mutex::new(ResyncState::default()));
    let pace = match args.rebuild_speed {
        Some((min, max)) => (Some(min * 1_000_000), Some(max * 1_000_000)),
        None => (Some(DEFAULT_REBUILD_MIN), None),
    };
    let log: Log = Arc::new(|line: &str| eprintln!("{line}"));
    let online = Online::new(array.clone(), pace, direct, log.clone());
    let reshaping = Arc::new(crate::cmd::grow_online::Reshaping::new(
        array.clone(),
        online.clone(),
        direct,
        reshape_pace,
        resync.clone(),
    ));
    if let Some((grow, thread)) = resumed {
        reshaping.resumed(grow, thread);
    }
    configure(&mut options, &array, &resync, &online, &reshaping);
    let monitor = monitor.start(&array, &online, &resync, &mut options);
    let (target, cache) = serving_target(args, journal_member, &array, &mut options)?;
    let shutdown = ShutdownHandle::new();
    watch_signals(shutdown.clone())?;
    eprintln!(
        "nvraid: serving {} ({} bytes) until SIGINT/SIGTERM",
        target.describe(),
        target.size_bytes(),
    );
    let helpers = Helpers {
        array: &array,
        online: &online,
        resync: &resync,
        log: &log,
    };
    let served = serve_with_helpers(args, helpers, writable, target, bound, options, shutdown);
    monitor.stop();
    // Cached writes go to the members (and the journal is emptied) before
    // the array can be marked clean.
    if let Some(cache) = cache {
        cache
            .close()
            .context("writing the cache back; the array is left dirty")?;
    }
    // The server has stopped, finished in-flight requests and flushed; only
    // then is the array marked clean.
    // The grow's thread stops after its step (the position it recorded
    // stays) before the array is closed.
    reshaping.stop();
    drop(reshaping);
    served.context("the NBD server failed; the array is left as it is")?;
    drop(online);
    let array = Arc::try_unwrap(array)
        .map_err(|_| anyhow::anyhow!("array still in use after the server stopped"))?;
    array.close()?;
    eprintln!("nvraid: stopped; array flushed and closed");
    Ok(0)
}

/// The write cache `serve --cache` puts in front of the array.
type Cache = Arc<nvraid_cache::CachedTarget>;

/// What the server serves: the array's fast path, or the cache `--cache`
/// asks for over it (then also returned, to be closed after the server).
fn serving_target(
    args: &ServeCmd,
    journal_member: Option<cache::JournalMember>,
    array: &Arc<Array>,
    options: &mut ServeOptions,
) -> Result<(Arc<dyn Target>, Option<Cache>)> {
    let target: Arc<dyn Target> = nvraid_bench::array_target(array.clone(), args.engine);
    let cache = start_cache(args, journal_member, array, target.clone())?;
    // (The array's own target is dropped here when a cache wraps it: the
    // array must be free again once the cache is closed.)
    let target: Arc<dyn Target> = match &cache {
        Some(cache) => {
            drop(target);
            report_cache(options, cache.clone());
            cache.clone()
        }
        None => target,
    };
    Ok((target, cache))
}

/// `--journal` and `--cache-dirty-max` checked against `--cache` and the
/// export's mode.
fn check_cache_flags(args: &ServeCmd, writable: bool) -> Result<()> {
    match (args.cache, &args.journal) {
        (CacheChoice::None | CacheChoice::Writeback, Some(_)) => {
            anyhow::bail!("--journal is only for --cache journal")
        }
        (CacheChoice::Writeback | CacheChoice::Journal, _) if !writable => {
            anyhow::bail!(
                "--cache {} caches writes; a read-only export has none",
                format!("{:?}", args.cache).to_lowercase()
            )
        }
        _ => {}
    }
    if args.cache_dirty_max.is_some_and(|max| max < 1 << 20) {
        anyhow::bail!(
            "--cache-dirty-max {}: at least 1 MiB",
            args.cache_dirty_max.unwrap_or(0)
        );
    }
    Ok(())
}

/// On RAID 4/5/6 the journal is md's: added to the array (its
/// superblocks) the first time, named with the members after that. The
/// members to assemble, and the journal left for the cache's own format
/// (None when md's took it).
fn settle_md_journal(args: &ServeCmd, direct: bool) -> Result<(Vec<String>, Option<String>)> {
    let mut members = args.members.clone();
    let Some(spec) = args.journal.as_deref() else {
        return Ok((members, None));
    };
    let Some(add) = cache::md_journal_plan(spec, &members, direct) else {
        return Ok((members, Some(spec.to_string())));
    };
    if add {
        let added = nvraid_array::add_journal(
            &members,
            spec,
            nvraid_array::AddJournalOptions {
                direct,
                force: args.force,
            },
        )?;
        crate::cmd::manage::print_journal_added(&added);
    }
    if !members.iter().any(|m| m == spec) {
        members.push(spec.to_string());
    }
    Ok((members, None))
}

/// `--cache journal`'s log: md's write journal of the array (`md_journal`),
/// or the `--journal` member, opened and checked; refused on a degraded
/// array with md's journal. Decided from the superblocks, before anything
/// is written.
fn check_cache_journal(
    args: &ServeCmd,
    members: &[String],
    journal: Option<&str>,
    md_journal: bool,
    direct: bool,
) -> Result<Option<cache::JournalMember>> {
    match (args.cache, journal) {
        (CacheChoice::Journal, None) if !md_journal => anyhow::bail!(
            "--cache journal needs --journal MEMBER (or an array created with --write-journal, \
             whose journal it then uses)"
        ),
        (CacheChoice::Journal, Some(journal)) if md_journal => anyhow::bail!(
            "the array keeps md's write journal on another member (create --write-journal or \
             add-journal): --cache journal logs there, so --journal {journal} is not used; name \
             the array's journal with the members instead"
        ),
        _ => {}
    }
    let journal_member = match journal {
        Some(spec) => Some(cache::check_journal(spec, members, args.force, direct)?),
        None => None,
    };
    if md_journal && cache::would_be_degraded(members, direct)? {
        // md turns its write-back mode off on a degraded array; so does
        // nvraid, before it starts.
        anyhow::bail!(
            "--cache journal on md's write journal needs every member, and the array is \
             degraded: serve it without --cache (md's journal then logs every write with \
             its parity), or rebuild it first"
        );
    }
    Ok(journal_member)
}

/// What runs beside the server of an array.
struct Helpers<'a> {
    array: &'a Arc<Array>,
    online: &'a Arc<Online>,
    resync: &'a Arc<std::sync::Mutex<ResyncState>>,
    log: &'a Log,
}

/// Serves `target` until `shutdown`, with the array's helper threads
/// beside the server: the background resync of an array that came up
/// dirty, md's bitmap daemon, the recovery thread. Each is stopped once
/// the server has.
fn serve_with_helpers(
    args: &ServeCmd,
    helpers: Helpers<'_>,
    writable: bool,
    target: Arc<dyn Target>,
    bound: nvraid_serve::Bound,
    options: ServeOptions,
    shutdown: ShutdownHandle,
) -> Result<(), nvraid_serve::Error> {
    let Helpers {
        array,
        online,
        resync,
        log,
    } = helpers;
    // An array that came up dirty is resynced beside the clients (md's
    // rule), one region at a time held against their writes.
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let resync_thread = (writable && array.resync_from().is_some()).then(|| {
        let (array, stop, state) = (array.clone(), stop.clone(), resync.clone());
        let max_rate = args.resync_speed.map(|mb| mb * 1_000_000);
        let log = log.clone();
        std::thread::spawn(move || background_resync(&array, max_rate, &stop, &state, &*log))
    });
    // md's bitmap daemon: clears write-intent bits of regions left idle.
    let bitmap_daemon = nvraid_array::BitmapDaemon::start(array);
    // Rebuilds beside the clients, hot spares taking over.
    let recovery_thread = online.start();
    let re_adding = (args.re_add && writable).then(|| {
        let (array, online, log, shutdown) =
            (array.clone(), online.clone(), log.clone(), shutdown.clone());
        std::thread::spawn(move || re_add_set_aside(&array, &online, &log, &shutdown))
    });
    let served =
        nvraid_serve::start_bound(target, options, bound, shutdown.clone()).and_then(|server| {
            tell_systemd(&server, &shutdown);
            server.wait()
        });
    if let Some(thread) = re_adding {
        let _ = thread.join();
    }
    online.stop();
    if let Some(thread) = recovery_thread {
        let _ = thread.join();
    }
    drop(bitmap_daemon);
    stop.store(true, Ordering::Release);
    if let Some(thread) = resync_thread {
        let _ = thread.join();
    }
    served
}

/// How long a server starting waits for udev's probe of a member (udev
/// holds a shared lock on a block device while it probes it, as it does
/// right after the previous server closed the members at a restart).
const PROBE_WAIT: std::time::Duration = std::time::Duration::from_secs(30);

/// `assemble` tried again while a member is being probed by udev (refused
/// as `Probing`, nothing changed), for up to [`PROBE_WAIT`].
fn waiting_for_probes<T>(
    mut assemble: impl FnMut() -> nvraid_array::Result<T>,
) -> nvraid_array::Result<T> {
    let until = std::time::Instant::now() + PROBE_WAIT;
    let mut told = false;
    loop {
        match assemble() {
            Err(nvraid_array::Error::Member(e @ nvraid_member::MemberError::Probing { .. }))
                if std::time::Instant::now() < until =>
            {
                if !told {
                    eprintln!("nvraid: {e}: waiting for it");
                    told = true;
                }
                std::thread::sleep(std::time::Duration::from_millis(100));
            }
            other => return other,
        }
    }
}

/// How often, and how far apart, a re-add refused because something else
/// holds the member for writing is tried again: udev probes a disk as it
/// appears (its worker holds the device for that moment) just when the
/// array starts at boot.
const RE_ADD_TRIES: u32 = 30;

/// `--re-add` (on its own thread, beside the server): every member given
/// that assembly set aside as stale or faulty goes back to its role through
/// the running array's recovery (re-added by the bitmap, or refused with
/// the reason), logged either way. A member held by another process is
/// tried again for up to [`RE_ADD_TRIES`] seconds; the shutdown ends it.
fn re_add_set_aside(array: &Array, online: &Arc<Online>, log: &Log, shutdown: &ShutdownHandle) {
    let candidates: Vec<String> = array
        .set_aside()
        .iter()
        .filter(|m| {
            matches!(
                m.reason,
                nvraid_array::SetAside::Stale { .. } | nvraid_array::SetAside::Faulty
            )
        })
        .map(|m| m.spec.clone())
        .collect();
    for spec in candidates {
        let waiting = |e: &str| {
            log(&format!(
                "nvraid: event=re-add-waiting member={spec} reason=\"{e}\""
            ))
        };
        let stopped = || shutdown.is_triggered();
        let Some(outcome) = crate::cmd::online::add_retrying_while_busy(
            online,
            &spec,
            false,
            RE_ADD_TRIES,
            &stopped,
            &waiting,
        ) else {
            return;
        };
        log(&crate::cmd::online::re_add_line(&spec, &outcome));
        online.wake();
    }
}

/// Under systemd (`Type=notify`, `NOTIFY_SOCKET` set): READY=1 once the
/// ublk device is started and every listener is up (`start` returned),
/// with a STATUS line saying what is served; STOPPING=1 when the shutdown
/// begins. A failure to tell systemd is logged, never fatal.
fn tell_systemd(server: &nvraid_serve::Server, shutdown: &ShutdownHandle) {
    if std::env::var_os("NOTIFY_SOCKET").is_none() {
        return;
    }
    let mut what: Vec<String> = server
        .ublk_id()
        .map(|id| format!("/dev/ublkb{id}"))
        .into_iter()
        .collect();
    what.extend(server.info().listening.iter().map(|a| a.to_string()));
    let state = format!("READY=1\nSTATUS=serving {}", what.join(" "));
    if let Err(e) = nvraid_service::notify::notify(&state) {
        eprintln!("nvraid: cannot tell systemd the array is ready: {e}");
    }
    let shutdown = shutdown.clone();
    let _ = std::thread::Builder::new()
        .name("sd-notify".into())
        .spawn(move || {
            shutdown.wait();
            if let Err(e) = nvraid_service::notify::notify("STOPPING=1") {
                eprintln!("nvraid: cannot tell systemd the array is stopping: {e}");
            }
        });
}

/// The cache `--cache` asks for over `target`, the journal replayed or
/// formatted first.
fn start_cache(
    args: &ServeCmd,
    journal_member: Option<cache::JournalMember>,
    array: &Arc<Array>,
    target: Arc<dyn Target>,
) -> Result<Option<Arc<nvraid_cache::CachedTarget>>> {
    use nvraid_cache::{CacheMode, CacheOptions, CachedTarget};
    let log: Arc<dyn Fn(&str) + Send + Sync> = Arc::new(|line: &str| eprintln!("{line}"));
    let (mode, journal) = match (args.cache, journal_member) {
        (CacheChoice::None, _) => return Ok(None),
        (CacheChoice::Writeback, _) => {
            eprintln!("{}", cache::WRITEBACK_WARNING);
            (CacheMode::WriteBack, None)
        }
        (CacheChoice::Journal, Some(member)) => (
            CacheMode::Journal,
            Some(Box::new(cache::start_journal(member, array)?) as Box<dyn JournalLog>),
        ),
        // md's write journal: the assembly has replayed it already.
        (CacheChoice::Journal, None) if array.md_journal().is_some() => (
            CacheMode::Journal,
            Some(Box::new(nvraid_cache::journal::md::MdCacheLog::new(
                array.clone(),
                args.cache_stripes_max,
            )) as Box<dyn JournalLog>),
        ),
        (CacheChoice::Journal, None) => anyhow::bail!("--cache journal needs --journal MEMBER"),
    };
    let mut options = CacheOptions::for_mode(mode);
    if let Some(max) = args.cache_dirty_max {
        options = options.with_dirty_max(max);
    }
    let cache = CachedTarget::new(target, mode, journal, options, log)?;
    Ok(Some(Arc::new(cache)))
}

/// Adds the cache's state to the control socket's `status`.
fn report_cache(options: &mut ServeOptions, cache: Arc<nvraid_cache::CachedTarget>) {
    let inner = options.status_hook.take();
    options.status_hook = Some(Arc::new(move || {
        let mut value = inner.as_ref().map(|hook| hook()).unwrap_or_default();
        let stats = cache.stats();
        value["cache"] = serde_json::json!({
            "describe": cache.describe(),
            "dirty_bytes": stats.dirty_bytes,
            "cached_bytes": stats.cached_bytes,
            "journal_used_bytes": stats.journal_used_bytes,
            "journal_ring_bytes": stats.journal_ring_bytes,
            "failure": stats.failure,
        });
        value
    }));
}

/// `--ublk`'s limits from the array's geometry: a request holds a full
/// stripe (at least 512 KiB), the physical block is at least 4 KiB (a
/// smaller write is a read-modify-write on parity arrays, and members are
/// 4K drives), io_min is the chunk, io_opt the full stripe only when it is
/// a power of two (the kernel takes no other: a RAID 5 of 4 with 64 KiB
/// chunks says nothing rather than a wrong 256 KiB), discards are by
/// chunk, and the depth grows with the members (8 tags each, 16 to 64).
pub(crate) fn ublk_geometry(ublk: &mut nvraid_serve::UblkOptions, array: &Array) {
    let g = array.geometry();
    let sector = array.sector_bytes();
    let data = (g.members().saturating_sub(g.level().parity_chunks()) / g.copies().max(1)).max(1);
    let chunk = g.chunk_bytes().and_then(|c| u32::try_from(c).ok());
    let stripe = chunk.and_then(|c| c.checked_mul(data));
    let physical = sector.max(4096);
    ublk.max_io_bytes = stripe
        .unwrap_or(0)
        .clamp(512 << 10, 32 << 20)
        .next_multiple_of(physical);
    ublk.physical_block_bytes = physical;
    ublk.io_min_bytes = chunk.filter(|c| c.is_power_of_two()).unwrap_or(0);
    ublk.io_opt_bytes = stripe
        .filter(|s| s.is_power_of_two() && *s <= ublk.max_io_bytes)
        .unwrap_or(0);
    ublk.discard_granularity = chunk.unwrap_or(physical).max(physical);
    ublk.depth = (g.members() * 8).clamp(16, 64) as u16;
}

/// How much longer systemd is asked to wait for READY=1 at each line a
/// grow finished before serving logs (one per step): the unit's start
/// timeout would otherwise end a long one part-way.
const EXTEND_START_USEC: u64 = 120_000_000;

/// What assembly logs (a grow finished before serving: its progress),
/// on stderr; under systemd each line also extends the start timeout.
fn assembly_log(line: &str) {
    eprintln!("{line}");
    if std::env::var_os("NOTIFY_SOCKET").is_some() {
        let state = format!(
            "EXTEND_TIMEOUT_USEC={EXTEND_START_USEC}\nSTATUS=finishing the recorded grow before serving"
        );
        if let Err(e) = nvraid_service::notify::notify(&state) {
            eprintln!("nvraid: cannot tell systemd the start goes on: {e}");
        }
    }
}

/// The most array bytes one step of a resumed grow moves (as a grow
/// started through the control socket moves by default).
const RESHAPE_STEP_BYTES: u64 = 16 << 20;

/// The default MIN of `--rebuild-speed`: 50 MB/s while clients are busy.
const DEFAULT_REBUILD_MIN: u64 = 50_000_000;

/// `--reshape-speed`: `MIN:MAX` as `--rebuild-speed` takes it, or a bare
/// `MAX` (its MIN then left to the default).
fn parse_reshape_speed(text: &str) -> Result<(Option<u64>, u64), String> {
    let (min, max) = crate::cmd::manage::parse_speed(text)?;
    Ok((text.contains(':').then_some(min), max))
}

/// The grow's (MIN, MAX) in bytes per second from `--reshape-speed`: the
/// rebuild's default MIN (no more than MAX) unless one is given, no MAX
/// unless one is given.
fn reshape_pace(speed: Option<(Option<u64>, u64)>) -> (Option<u64>, Option<u64>) {
    match speed {
        None => (Some(DEFAULT_REBUILD_MIN), None),
        Some((min, max)) => {
            let max = max * 1_000_000;
            let min = min.map_or(DEFAULT_REBUILD_MIN.min(max), |m| m * 1_000_000);
            (Some(min), Some(max))
        }
    }
}

fn configure(
    options: &mut ServeOptions,
    array: &Arc<Array>,
    resync: &Arc<std::sync::Mutex<ResyncState>>,
    online: &Arc<Online>,
    reshaping: &Arc<crate::cmd::grow_online::Reshaping>,
) {
    let chunk = array.geometry().chunk_bytes().unwrap_or(4096);
    options.preferred_block_bytes = (chunk as u32).clamp(array.sector_bytes(), 1 << 20);
    if let Some(ublk) = options.ublk.as_mut() {
        ublk_geometry(ublk, array);
    }
    if let Some(nvme) = options.nvme.as_mut() {
        // The namespace's UUID (and the default NQN) is the array's.
        nvme.namespace_uuid = array_uuid(array);
    }
    let command_array = array.clone();
    let command_online = online.clone();
    let command_reshaping = reshaping.clone();
    options.command_hook = Some(Arc::new(move |request| {
        if let Some(refused) = refuse_when_read_only(&command_array, request) {
            return refused;
        }
        if let Some(answer) = command_reshaping.command(request) {
            return answer;
        }
        crate::cmd::online::command(&command_online, request)
            .unwrap_or_else(|| control_command(&command_array, request))
    }));
    let status_array = array.clone();
    let resync = resync.clone();
    let status_online = online.clone();
    let status_reshaping = reshaping.clone();
    options.status_hook = Some(Arc::new(move || {
        let mut value = array_status(&status_array);
        value["recovery"] = crate::cmd::online::status(&status_online);
        if let Some(reshape) = status_reshaping.status() {
            value["reshape"] = reshape;
        }
        let s = resync.lock().unwrap_or_else(|e| e.into_inner());
        if s.total_bytes > 0 || s.error.is_some() {
            let rate = if s.seconds > 0.0 {
                s.done_bytes as f64 / s.seconds
            } else {
                0.0
            };
            value["resync"] = serde_json::json!({
                "done_bytes": s.done_bytes,
                "total_bytes": s.total_bytes,
                "resynced_bytes": s.resynced_bytes,
                "rate_bytes_per_second": rate as u64,
                "eta_seconds": if rate > 0.0 { (s.total_bytes - s.done_bytes) as f64 / rate } else { 0.0 },
                "finished": s.finished,
                "error": s.error,
            });
        }
        value
    }));
}

/// The array's UUID as 16 bytes (from `detail`'s text form).
fn array_uuid(array: &Array) -> [u8; 16] {
    let detail = serde_json::to_value(info::detail(array)).unwrap_or_default();
    let hex: Vec<u8> = detail["uuid"]
        .as_str()
        .unwrap_or_default()
        .chars()
        .filter_map(|c| c.to_digit(16))
        .map(|d| d as u8)
        .collect();
    let mut uuid = [0u8; 16];
    for (i, byte) in uuid.iter_mut().enumerate() {
        if let (Some(hi), Some(lo)) = (hex.get(2 * i), hex.get(2 * i + 1)) {
            *byte = hi << 4 | lo;
        }
    }
    uuid
}

/// A control command that would write the array (its superblocks, or a
/// repair's data), on an array served read-only: refused, naming the
/// member and why (the members are open for reading only).
fn refuse_when_read_only(array: &Array, request: &serde_json::Value) -> Option<serde_json::Value> {
    if array.is_writable() {
        return None;
    }
    let command = request["command"].as_str()?;
    let member = match command {
        "fail" | "remove" | "add" => request["member"].as_str(),
        "grow" => None,
        "replace" => request["old"].as_str(),
        "repair" => None,
        _ => return None,
    };
    let whose = member.map_or(String::new(), |m| format!("{m}: "));
    Some(serde_json::json!({"error": format!(
        "{whose}{command} refused: the server exports the array read-only (serve --read-only), \
         and {command} would write to its members; restart the server without --read-only"
    )}))
}

/// Control-socket commands beyond `status`: `fail` (mark a member faulty).
fn control_command(array: &Array, request: &serde_json::Value) -> serde_json::Value {
    match request["command"].as_str() {
        Some("fail") => {
            let Some(member) = request["member"].as_str() else {
                return serde_json::json!({"error": "fail needs \"member\""});
            };
            let role = match crate::cmd::manage::role_of(array, member) {
                Ok(role) => role,
                Err(e) => return serde_json::json!({"error": e.to_string()}),
            };
            match array.fail_member(role, &crate::cmd::manage::administrator()) {
                Ok(()) => serde_json::json!({"role": role, "events": array.events()}),
                Err(e) => serde_json::json!({"error": e.to_string()}),
            }
        }
        other => serde_json::json!({"error": format!("unknown command {other:?}")}),
    }
}

/// The array as `detail` shows it, each member with the I/O the server's
/// queues have done on it (`io`: ops, bytes, errors).
fn array_status(array: &Array) -> serde_json::Value {
    let mut value = serde_json::to_value(info::detail(array)).unwrap_or_default();
    if let Some(members) = value["members"].as_array_mut() {
        let counters = array.member_counters();
        for member in members {
            let Some(role) = member["role"].as_u64() else {
                continue;
            };
            let Some(counters) = counters.get(role as usize) else {
                continue;
            };
            member["io"] = serde_json::json!({
                "ops": counters.ops.load(Ordering::Relaxed),
                "bytes": counters.bytes.load(Ordering::Relaxed),
                "errors": counters.errors.load(Ordering::Relaxed),
            });
        }
    }
    value
}

fn watch_signals(shutdown: ShutdownHandle) -> Result<()> {
    let mut signals = signal_hook::iterator::Signals::new([
        signal_hook::consts::SIGINT,
        signal_hook::consts::SIGTERM,
    ])
    .context("cannot install signal handlers")?;
    std::thread::Builder::new()
        .name("signals".into())
        .spawn(move || {
            if let Some(signal) = signals.forever().next() {
                eprintln!("nvraid: signal {signal}: finishing in-flight requests");
                shutdown.trigger();
            }
        })?;
    Ok(())
}

pub fn status(args: &StatusArgs) -> Result<u8> {
    let status = nvraid_serve::query_status(&args.socket)?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&status)?);
        return Ok(0);
    }
    let text = nvraid_serve::format_status(&status);
    // The server's own lines, then the array as a table instead of raw JSON.
    text.lines()
        .filter(|line| !line.starts_with("array: "))
        .for_each(|line| println!("{line}"));
    print_array(&status["array"]);
    Ok(0)
}

fn print_array(array: &serde_json::Value) {
    if array.is_null() {
        return;
    }
    println!(
        "array: {} raid{} {} bytes, state {}, events {}",
        array["uuid"].as_str().unwrap_or("?"),
        array["level"],
        array["size_bytes"],
        array["state"].as_str().unwrap_or("?"),
        array["events"]
    );
    let cache = &array["cache"];
    if !cache.is_null() {
        println!(
            "cache: {}, {} bytes dirty, {} cached{}{}",
            cache["describe"].as_str().unwrap_or("?"),
            cache["dirty_bytes"],
            cache["cached_bytes"],
            match cache["journal_ring_bytes"].as_u64() {
                Some(ring) if ring > 0 => format!(
                    ", journal {} of {ring} bytes used",
                    cache["journal_used_bytes"]
                ),
                _ => String::new(),
            },
            cache["failure"]
                .as_str()
                .map(|why| format!("; WRITES REFUSED: {why}"))
                .unwrap_or_default()
        );
    }
    let reshape = &array["reshape"];
    if !reshape.is_null() {
        // A served grow, restripe or mirror add (`grow --socket`).
        println!(
            "reshape: {} {}, {} of {} bytes, {} bytes/s{}{}",
            reshape["kind"].as_str().unwrap_or("?"),
            reshape["state"].as_str().unwrap_or("?"),
            reshape["position_bytes"],
            reshape["end_bytes"],
            reshape["bytes_per_sec"],
            reshape["eta_seconds"]
                .as_u64()
                .map(|s| format!(", ETA {s} s"))
                .unwrap_or_default(),
            reshape["error"]
                .as_str()
                .map(|why| format!("; {why}"))
                .unwrap_or_default()
        );
    }
    let resync = &array["resync"];
    if !resync.is_null() {
        // A dirty array's background resync, or a `--size` change's
        // resync of the new region.
        println!(
            "resync: {}, {} of {} bytes, {} bytes/s{}{}",
            if resync["finished"] == true {
                "finished"
            } else if resync["error"].is_string() {
                "failed"
            } else {
                "running"
            },
            resync["done_bytes"],
            resync["total_bytes"],
            resync["rate_bytes_per_second"],
            resync["eta_seconds"]
                .as_f64()
                .filter(|_| resync["finished"] != true)
                .map(|s| format!(", ETA {s:.0} s"))
                .unwrap_or_default(),
            resync["error"]
                .as_str()
                .map(|why| format!("; {why}"))
                .unwrap_or_default()
        );
    }
    println!(
        "  {:>4}  {:<10}  {:>12}  {:>16}  {:>6}  path",
        "role", "state", "ops", "bytes", "errors"
    );
    for m in array["members"].as_array().into_iter().flatten() {
        let io = &m["io"];
        println!(
            "  {:>4}  {:<10}  {:>12}  {:>16}  {:>6}  {}",
            m["role"].as_u64().map_or("-".into(), |r| r.to_string()),
            m["state"].as_str().unwrap_or("?"),
            io["ops"].as_u64().unwrap_or(0),
            io["bytes"].as_u64().unwrap_or(0),
            io["errors"].as_u64().unwrap_or(0),
            m["path"].as_str().unwrap_or("(missing)")
        );
    }
}

#[cfg(test)]
mod tests {
    use super::{parse_reshape_speed, reshape_pace, DEFAULT_REBUILD_MIN};

    /// `--reshape-speed`: no flag is the rebuild's 50:unlimited; a bare
    /// MAX keeps that MIN (capped at MAX); `MIN:MAX` is taken as given,
    /// `0:MAX` included.
    #[test]
    fn reshape_speed_defaults_to_the_rebuilds_minimum_and_a_bare_max_keeps_it() {
        assert_eq!(reshape_pace(None), (Some(DEFAULT_REBUILD_MIN), None));
        let bare = parse_reshape_speed("200").unwrap();
        assert_eq!(
            reshape_pace(Some(bare)),
            (Some(50_000_000), Some(200_000_000))
        );
        let low = parse_reshape_speed("10").unwrap();
        assert_eq!(
            reshape_pace(Some(low)),
            (Some(10_000_000), Some(10_000_000))
        );
        let both = parse_reshape_speed("5:300").unwrap();
        assert_eq!(
            reshape_pace(Some(both)),
            (Some(5_000_000), Some(300_000_000))
        );
        let zero = parse_reshape_speed("0:300").unwrap();
        assert_eq!(reshape_pace(Some(zero)), (Some(0), Some(300_000_000)));
        assert!(parse_reshape_speed("30:20").is_err());
    }
}
