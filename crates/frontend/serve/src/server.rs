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
use crate::options::{ListenAddress, ServeOptions, TlsMode};
use crate::shared::Shared;
use crate::shutdown::ShutdownHandle;
use crate::stats::{Counters, RateMeter};
use crate::stream::Listener;
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

/// Start serving in background threads.
pub fn start(
    target: Arc<dyn Target>,
    options: ServeOptions,
    shutdown: ShutdownHandle,
) -> Result<Server, Error> {
    options.validate().map_err(Error::Options)?;
    let tls = match (&options.tls, &options.tls_files) {
        (TlsMode::Off, _) | (_, None) => None,
        (_, Some(files)) => Some(crate::transport::tls_config(files)?),
    };
    let listeners = bind_all(&options.listen)?;
    let listening = listeners.iter().map(|l| l.local()).collect();
    let read_only = options.read_only || !target.writable();
    let block_sizes = block_sizes(target.as_ref(), &options)?;
    let handshake = Arc::new(handshake_config(
        target.as_ref(),
        &options,
        block_sizes,
        read_only,
    ));
    let workers = WorkerPool::start(
        &target,
        options.workers,
        options.queue_depth,
        options.io_max_bytes,
    )?;
    let shared = Arc::new(Shared {
        handshake,
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
        options,
    });
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
    log_listening(&server.shared);
    Ok(server)
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
        }
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
        Ok(())
    }

    /// Block until shutdown is triggered, then stop in order. Returns an
    /// error if the final flush failed (the array must not be marked clean).
    pub fn wait(mut self) -> Result<(), Error> {
        self.shutdown.wait();
        let shared = Arc::clone(&self.shared);
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
