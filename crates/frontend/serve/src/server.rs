//! The server: listeners, the accept loop, the worker pool, and the
//! orderly stop (stop accepting, stop reading, let in-flight requests
//! finish, flush every worker's queue, return).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use nvraid_io::queue::Target;
use nvraid_nbd::consts::transmission_flags as tf;
use nvraid_nbd::{BlockSizes, ExportInfo, ServerConfig, TlsPolicy};

use crate::client;
use crate::control;
use crate::error::Error;
use crate::options::{ListenAddress, ServeOptions, TlsMode, UblkStop};
use crate::shared::Shared;
use crate::shutdown::ShutdownHandle;
use crate::stats::{Counters, RateMeter};
use crate::stream::Listener;
use crate::ublk;
use crate::unaligned::RangeLocks;
use crate::worker::WorkerPool;

/// A running server.
pub struct Server {
    shared: Arc<Shared>,
    shutdown: ShutdownHandle,
    listeners: Vec<Arc<Listener>>,
    threads: Vec<JoinHandle<()>>,
    control: Option<control::ControlServer>,
}

/// Facts about a running server.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServerInfo {
    /// Addresses actually bound (TCP port 0 resolved).
    pub listening: Vec<ListenAddress>,
    pub size_bytes: u64,
    pub block_sizes: BlockSizes,
    pub transmission_flags: u16,
    /// `--nvme-tcp`: the address bound (port 0 resolved).
    pub nvme_listening: Option<std::net::SocketAddr>,
}

/// Serve `target` until `shutdown` fires, then finish in-flight requests,
/// flush, and return. The caller then closes (marks clean) the array.
pub fn serve(
    target: Arc<dyn Target>,
    options: ServeOptions,
    shutdown: ShutdownHandle,
) -> Result<(), Error> {
    start(target, options, shutdown)?.wait()
}

/// Check what `start` would refuse, without binding or changing anything:
/// the options, the TLS files (read and parsed), and that each Unix listen
/// path and the control path is free or a socket left by a server that
/// died. `nvraid serve` calls it before it assembles the array, so that a
/// bad flag changes no byte on any member. `start` checks again.
pub fn preflight(options: &ServeOptions) -> Result<(), Error> {
    options.validate().map_err(Error::Options)?;
    if let Some(ublk) = &options.ublk {
        ublk::preflight(ublk)?;
    }
    if let (TlsMode::On | TlsMode::Require, Some(files)) = (&options.tls, &options.tls_files) {
        crate::transport::tls_config(files)?;
    }
    for address in &options.listen {
        if let ListenAddress::Unix(path) = address {
            control::check_path(path, "--listen", false).map_err(Error::Options)?;
        }
    }
    if let Some(path) = &options.control_socket {
        control::check_path(path, "--control", false).map_err(Error::Control)?;
    }
    Ok(())
}

/// The server's listening sockets (`--listen` and `--nvme-tcp`), bound
/// before there is anything to serve: `nvraid serve` binds them before it
/// assembles the array, so that an address in use is refused before any
/// member changes, and hands them to `start_bound`.
pub struct Bound {
    listeners: Vec<Arc<Listener>>,
    nvme: Option<std::net::TcpListener>,
}

/// Bind every listening socket `options` names (its options checked
/// first); nothing else starts.
pub fn bind(options: &ServeOptions) -> Result<Bound, Error> {
    options.validate().map_err(Error::Options)?;
    let listeners = bind_all(&options.listen)?;
    let nvme = match &options.nvme {
        Some(nvme) => Some(crate::nvme::NvmeTarget::listen(nvme)?),
        None => None,
    };
    Ok(Bound { listeners, nvme })
}

/// Start serving in background threads.
pub fn start(
    target: Arc<dyn Target>,
    options: ServeOptions,
    shutdown: ShutdownHandle,
) -> Result<Server, Error> {
    let bound = bind(&options)?;
    start_bound(target, options, bound, shutdown)
}

/// Start serving in background threads on the sockets `bind` bound for
/// the same options.
pub fn start_bound(
    target: Arc<dyn Target>,
    options: ServeOptions,
    bound: Bound,
    shutdown: ShutdownHandle,
) -> Result<Server, Error> {
    options.validate().map_err(Error::Options)?;
    let tls = match (&options.tls, &options.tls_files) {
        (TlsMode::Off, _) | (_, None) => None,
        (_, Some(files)) => Some(crate::transport::tls_config(files)?),
    };
    let Bound {
        listeners,
        nvme: nvme_listener,
    } = bound;
    let listening = listeners.iter().map(|l| l.local()).collect();
    let read_only = options.read_only || !target.writable();
    let nvme = match (&options.nvme, nvme_listener) {
        (Some(nvme), Some(listener)) => Some(crate::nvme::NvmeTarget::new(
            listener,
            nvme,
            Some(Arc::downgrade(&target)),
            target.size_bytes(),
            target.sector_bytes().max(512),
            read_only,
            options.io_max_bytes,
        )?),
        (None, None) => None,
        _ => {
            return Err(Error::Options(
                "--nvme-tcp: the sockets were bound for other options".into(),
            ))
        }
    };
    let block_sizes = block_sizes(target.as_ref(), &options)?;
    let handshake = Arc::new(handshake_config(
        target.as_ref(),
        &options,
        block_sizes,
        read_only,
    ));
    let mut device = ublk::prepare_device(
        &options,
        target.size_bytes(),
        target.sector_bytes(),
        read_only,
    )?;
    // The device's number is known (added or taken over): recorded before
    // the device starts, so that udev, when the disk appears, finds its name.
    if let (Some(d), Some(path)) = (device.as_ref(), ublk_record(&options)) {
        if let Err(e) = write_record(path, d.id()) {
            abandon(device, &options);
            return Err(e);
        }
    }
    let plan = device.as_ref().map(|d| d.plan(read_only));
    let (count, depth, io_max_bytes) = worker_shape(&options, device.as_ref());
    let workers = match WorkerPool::start(&target, count, depth, io_max_bytes, plan.as_ref()) {
        Ok(workers) => workers,
        Err(e) => {
            drop(plan);
            abandon(device, &options);
            return Err(e);
        }
    };
    drop(plan);
    if let Some(d) = device.as_mut() {
        if let Err(e) = d.start() {
            workers.stop();
            abandon(device, &options);
            return Err(e);
        }
        log_ublk(&options, d);
    }
    let ublk_counters = device.as_ref().map(|d| Arc::clone(&d.counters));
    let shared = Arc::new(Shared {
        handshake,
        watched: Arc::downgrade(&target),
        tls,
        size_bytes: target.size_bytes(),
        block_sizes,
        workers,
        target_description: target.describe(),
        read_only,
        started: Instant::now(),
        listening,
        rates: RateMeter::new(),
        unaligned_ranges: Arc::new(RangeLocks::default()),
        shutdown: shutdown.clone(),
        connections: Mutex::new(BTreeMap::new()),
        active: Mutex::new(0),
        active_changed: Condvar::new(),
        closed_totals: Counters::default(),
        next_id: AtomicU64::new(1),
        ublk: Mutex::new(device),
        ublk_counters,
        nvme: nvme.as_ref().map(|n| Arc::clone(&n.subsystem)),
        nvme_counters: Arc::new(Counters::default()),
        options,
    });
    if let Some(probe) = &shared.options.totals {
        let weak = Arc::downgrade(&shared);
        let source: std::sync::Weak<dyn crate::stats::TotalsSource> = weak;
        probe.attach(source);
    }
    let control = match &shared.options.control_socket {
        Some(path) => Some(control::ControlServer::start(path, Arc::clone(&shared))?),
        None => None,
    };
    let mut server = Server {
        shared,
        shutdown,
        listeners,
        threads: Vec::new(),
        control,
    };
    server.spawn_threads()?;
    if let Some(nvme) = nvme {
        let local = nvme.local();
        let nqn = nvme.subsystem.nqn.clone();
        server.threads.push(nvme.spawn(Arc::clone(&server.shared))?);
        server.shared.log(&format!(
            "event=listening-nvme-tcp address={local} nqn={nqn}"
        ));
    }
    log_listening(&server.shared);
    Ok(server)
}

/// The ublk device follows the served array's size (looked at every 200
/// ms, as the NVMe/TCP listener looks): a reshape's end that swapped a
/// larger shape in grows the device where the driver can
/// (`ublk::Device::follow_size`).
fn follow_ublk_size(shared: &Shared, shutdown: &crate::shutdown::ShutdownHandle) {
    while !shutdown.wait_timeout(Duration::from_millis(200)) {
        let Some(target) = shared.watched.upgrade() else {
            return;
        };
        let bytes = target.size_bytes();
        drop(target);
        let line = match shared.ublk.lock().expect("ublk device").as_mut() {
            Some(device) => device.follow_size(bytes),
            None => return,
        };
        if let Some(line) = line {
            shared.log(&line);
        }
    }
}

/// Workers, slots per worker for NBD, and the slots' size: with `--ublk`
/// at least one worker per queue of the device, slots as large as its
/// requests (a power of two), and only a few slots for NBD (its final
/// flush) when nothing listens.
fn worker_shape(options: &ServeOptions, device: Option<&ublk::Device>) -> (u32, u32, u32) {
    let Some(device) = device else {
        return (options.workers, options.queue_depth, options.io_max_bytes);
    };
    let queues = u32::from(device.info.nr_hw_queues);
    let depth = if options.listen.is_empty() {
        2
    } else {
        options.queue_depth
    };
    let io = options
        .io_max_bytes
        .max(device.info.max_io_buf_bytes.next_power_of_two());
    (options.workers.max(queues), depth, io)
}

/// A device added for a server that could not start is deleted (one
/// taken over is left as it was: quiesced, for the next server).
fn abandon(device: Option<ublk::Device>, options: &ServeOptions) {
    if let Some(mut device) = device.filter(|d| !d.recovered) {
        if device.stop().is_ok() {
            remove_record(options);
        }
    }
}

/// `--ublk-record FILE`.
fn ublk_record(options: &ServeOptions) -> Option<&std::path::Path> {
    options.ublk.as_ref()?.record.as_deref()
}

/// The device's number written to `path` whole: a temporary file beside
/// it, renamed over it.
fn write_record(path: &std::path::Path, id: u32) -> Result<(), Error> {
    let failed = |e: std::io::Error| {
        Error::Ublk(format!(
            "--ublk-record {}: cannot write the device number: {e}",
            path.display()
        ))
    };
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).map_err(failed)?;
    }
    let name = path.file_name().unwrap_or_default().to_string_lossy();
    let temp = path.with_file_name(format!(".{name}.{}", std::process::id()));
    std::fs::write(&temp, format!("{id}\n"))
        .and_then(|()| std::fs::rename(&temp, path))
        .map_err(|e| {
            let _ = std::fs::remove_file(&temp);
            failed(e)
        })
}

/// The device is deleted: its record goes.
fn remove_record(options: &ServeOptions) {
    if let Some(path) = ublk_record(options) {
        let _ = std::fs::remove_file(path);
    }
}

fn log_ublk(options: &ServeOptions, device: &ublk::Device) {
    let id = device.id();
    (options.log)(&format!(
        "nvraid-serve: event={} device=/dev/ublkb{id} queues={} depth={} max_io_bytes={}{}",
        if device.recovered {
            "ublk-reattached"
        } else {
            "ublk-added"
        },
        device.info.nr_hw_queues,
        device.info.queue_depth,
        device.info.max_io_buf_bytes,
        if device.recovered {
            " (the device a killed server left; requests it held are issued again)"
        } else {
            ""
        }
    ));
}

/// The log line that says the server is up: where, what and how.
fn log_listening(shared: &Shared) {
    shared.log(&format!(
        "event=listening addresses={:?} size_bytes={} read_only={} target=\"{}\"",
        shared
            .listening
            .iter()
            .map(|a| a.to_string())
            .collect::<Vec<_>>(),
        shared.size_bytes,
        shared.read_only,
        shared.target_description
    ));
}

fn bind_all(addresses: &[ListenAddress]) -> Result<Vec<Arc<Listener>>, Error> {
    addresses
        .iter()
        .map(|a| Listener::bind(a).map(Arc::new))
        .collect()
}

fn block_sizes(target: &dyn Target, options: &ServeOptions) -> Result<BlockSizes, Error> {
    let minimum_bytes = target.sector_bytes().max(1);
    let sizes = BlockSizes {
        minimum_bytes,
        preferred_bytes: options.preferred_block_bytes.max(minimum_bytes).max(512),
        maximum_bytes: options.request_max_bytes / minimum_bytes * minimum_bytes,
    };
    if !sizes.is_valid() {
        return Err(Error::Options(format!("invalid block sizes {sizes:?}")));
    }
    Ok(sizes)
}

fn handshake_config(
    target: &dyn Target,
    options: &ServeOptions,
    block_sizes: BlockSizes,
    read_only: bool,
) -> ServerConfig {
    // CAN_MULTI_CONN is honest because every connection shares the same
    // workers and target (no per-connection cache), and a FLUSH goes to the
    // target, whose flush covers writes completed on any queue.
    let mut flags = tf::SEND_FLUSH | tf::SEND_FUA | tf::SEND_CACHE | tf::CAN_MULTI_CONN;
    if read_only {
        flags |= tf::READ_ONLY;
    } else {
        flags |= tf::SEND_TRIM | tf::SEND_WRITE_ZEROES;
    }
    let export = ExportInfo {
        name: options.export_name.clone(),
        description: if options.description.is_empty() {
            target.describe()
        } else {
            options.description.clone()
        },
        size_bytes: target.size_bytes(),
        transmission_flags: flags,
        block_sizes,
        base_allocation: true,
    };
    let mut config = ServerConfig::new(vec![export]);
    config.tls = match options.tls {
        TlsMode::Off => TlsPolicy::Off,
        TlsMode::On => TlsPolicy::Optional,
        TlsMode::Require => TlsPolicy::Required,
    };
    config
}

impl Server {
    pub fn info(&self) -> ServerInfo {
        let export = &self.shared.handshake.exports[0];
        ServerInfo {
            listening: self.shared.listening.clone(),
            size_bytes: self.shared.size_bytes,
            block_sizes: self.shared.block_sizes,
            transmission_flags: export.transmission_flags | tf::HAS_FLAGS,
            nvme_listening: self.shared.nvme.as_ref().map(|n| n.local),
        }
    }

    /// The number of the ublk device served (`--ublk`), while it is.
    pub fn ublk_id(&self) -> Option<u32> {
        let device = self.shared.ublk.lock().expect("ublk device");
        device.as_ref().map(|d| d.id())
    }

    fn spawn_threads(&mut self) -> Result<(), Error> {
        for listener in &self.listeners {
            let listener = Arc::clone(listener);
            let shared = Arc::clone(&self.shared);
            let thread = std::thread::Builder::new()
                .name("nbd-accept".into())
                .spawn(move || accept_loop(&shared, &listener))?;
            self.threads.push(thread);
        }
        let shared = Arc::clone(&self.shared);
        let shutdown = self.shutdown.clone();
        let sampler = std::thread::Builder::new()
            .name("nbd-rates".into())
            .spawn(move || {
                while !shutdown.wait_timeout(Duration::from_secs(1)) {
                    shared.rates.sample(shared.totals(), 0.5);
                }
            })?;
        self.threads.push(sampler);
        if self.shared.ublk.lock().expect("ublk device").is_some() {
            let shared = Arc::clone(&self.shared);
            let shutdown = self.shutdown.clone();
            let sizer = std::thread::Builder::new()
                .name("ublk-size".into())
                .spawn(move || follow_ublk_size(&shared, &shutdown))?;
            self.threads.push(sizer);
        }
        Ok(())
    }

    /// Block until shutdown is triggered, then stop in order. Returns an
    /// error if the final flush failed (the array must not be marked clean).
    pub fn wait(mut self) -> Result<(), Error> {
        self.shutdown.wait();
        let shared = Arc::clone(&self.shared);
        let device = shared.ublk.lock().expect("ublk device").take();
        let mut stopped = Ok(());
        let on_stop = shared.options.ublk.as_ref().map(|u| u.on_stop);
        let recovery = shared.options.ublk.as_ref().is_some_and(|u| u.recovery);
        let keep = recovery
            && device.as_ref().is_some_and(|d| match on_stop {
                Some(UblkStop::Keep) => true,
                Some(UblkStop::Auto) => d.in_use(),
                Some(UblkStop::Delete) | None => false,
            });
        let (kept, device) = if keep { (device, None) } else { (None, device) };
        if let Some(device) = kept {
            let id = device.id();
            shared.log(&format!(
                "event=shutdown phase=ublk-handover device=/dev/ublkb{id}"
            ));
            // The workers answer what they hold and close their queues;
            // the device stays, quiesced, for the next `serve --ublk {id}`.
            stopped = device.hand_over(|| shared.workers.poke_all(), ublk::HANDOVER_LIMIT);
            match &stopped {
                Ok(()) => shared.log(&format!(
                    "event=ublk-left-for-next-server device=/dev/ublkb{id}"
                )),
                Err(e) => shared.log(&format!("event=ublk-handover-failed error=\"{e}\"")),
            }
        }
        if let Some(mut device) = device {
            shared.log(&format!(
                "event=shutdown phase=ublk-stop device=/dev/ublkb{}",
                device.id()
            ));
            // The workers still serve: the kernel completes what is in
            // flight, then aborts every tag, and each queue closes.
            stopped = device.stop();
            match &stopped {
                Ok(()) => {
                    remove_record(&shared.options);
                    shared.log(&format!(
                        "event=ublk-deleted device=/dev/ublkb{}",
                        device.id()
                    ))
                }
                Err(e) => shared.log(&format!("event=ublk-stop-failed error=\"{e}\"")),
            }
        }
        shared.log("event=shutdown phase=stop-accepting");
        self.listeners.iter().for_each(|l| l.poke());
        self.threads.drain(..).for_each(|t| drop(t.join()));
        self.listeners.clear();
        if let Some(control) = self.control.take() {
            control.stop();
        }
        shared.log("event=shutdown phase=drain-connections");
        shared
            .connection_list()
            .iter()
            .for_each(|c| c.stop_reading());
        let mut active = shared.active.lock().expect("active count");
        while *active > 0 {
            active = shared.active_changed.wait(active).expect("active count");
        }
        drop(active);
        let flushed = shared.workers.flush_all();
        shared.workers.stop();
        if let (Err(e), Ok(())) = (stopped, &flushed) {
            return Err(e);
        }
        match flushed {
            Ok(()) => {
                shared.log("event=shutdown phase=done flushed=true");
                Ok(())
            }
            Err(code) => {
                shared.log(&format!(
                    "event=shutdown phase=done flushed=false error={code:?}"
                ));
                Err(Error::Flush(code))
            }
        }
    }
}

fn accept_loop(shared: &Arc<Shared>, listener: &Arc<Listener>) {
    loop {
        let id = shared.next_id.fetch_add(1, Ordering::Relaxed);
        let accepted = listener.accept(id);
        if shared.shutdown.is_triggered() {
            return;
        }
        let (stream, client) = match accepted {
            Ok(pair) => pair,
            Err(e) => {
                shared.log(&format!("event=accept-failed error=\"{e}\""));
                std::thread::sleep(Duration::from_millis(50));
                continue;
            }
        };
        if !shared.admit() && !shared.make_room(&client) {
            shared.log(&format!(
                "client={client} event=refused reason=\"connection limit ({}) reached\"",
                shared.options.connections_max
            ));
            continue;
        }
        let worker_shared = Arc::clone(shared);
        let spawned = std::thread::Builder::new()
            .name(format!("nbd-conn-{id}"))
            .spawn(move || client::run(worker_shared, stream, id, client));
        if spawned.is_err() {
            shared.finished();
        }
    }
}
