//! What every thread of the server shares: the options and the export's
//! facts, the worker pool, the registry of connections, and admission
//! (the connection limit, and making room by closing an idle client).

use std::collections::BTreeMap;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use nvraid_nbd::{BlockSizes, ServerConfig};

use crate::connection::Connection;
use crate::nvme::controller::Subsystem;
use crate::options::{ListenAddress, ServeOptions};
use crate::shutdown::ShutdownHandle;
use crate::stats::{Counters, CountersSnapshot, ExportTotals, RateMeter, TotalsSource};
use crate::unaligned::RangeLocks;
use crate::worker::WorkerPool;

/// State every thread of the server shares.
pub(crate) struct Shared {
    pub options: ServeOptions,
    pub handshake: Arc<ServerConfig>,
    /// The served target, whose size may change while it is served (an
    /// array grown online): each new NBD connection is told its size then
    /// ([`Shared::handshake_now`]).
    pub(crate) watched: std::sync::Weak<dyn nvraid_io::queue::Target>,
    pub tls: Option<Arc<rustls::ServerConfig>>,
    pub size_bytes: u64,
    pub block_sizes: BlockSizes,
    pub workers: WorkerPool,
    pub target_description: String,
    pub read_only: bool,
    pub started: Instant,
    pub listening: Vec<ListenAddress>,
    pub rates: RateMeter,
    /// The ranges unaligned writes' read-modify-writes hold (see
    /// `unaligned`).
    pub(crate) unaligned_ranges: Arc<RangeLocks>,
    pub(crate) shutdown: ShutdownHandle,
    pub(crate) connections: Mutex<BTreeMap<u64, Arc<Connection>>>,
    /// Connections accepted and not yet finished (registered or not).
    pub(crate) active: Mutex<u32>,
    pub(crate) active_changed: Condvar,
    pub(crate) closed_totals: Counters,
    pub(crate) next_id: AtomicU64,
    /// `--ublk`: the block device (taken out at shutdown to stop it).
    pub(crate) ublk: Mutex<Option<crate::ublk::Device>>,
    /// Its requests' counters (in the totals).
    pub(crate) ublk_counters: Option<Arc<Counters>>,
    /// `--nvme-tcp`: the subsystem (its controllers, for the status).
    pub(crate) nvme: Option<Arc<Subsystem>>,
    /// Its commands' counters (in the totals).
    pub(crate) nvme_counters: Arc<Counters>,
}

impl Shared {
    /// The handshake's settings for a new connection: the export's size
    /// the target's as it is now (an array grown online since the server
    /// started is served at its new size to connections made after; those
    /// made before keep the size they were told, and never address the
    /// grown region).
    /// The served target's size now (see `watched`).
    pub(crate) fn size_now(&self) -> u64 {
        self.watched
            .upgrade()
            .map_or(self.size_bytes, |t| t.size_bytes())
    }

    /// The served target's description now (an array's level and member
    /// count change with an online reshape).
    pub(crate) fn description_now(&self) -> String {
        self.watched
            .upgrade()
            .map_or_else(|| self.target_description.clone(), |t| t.describe())
    }

    pub(crate) fn handshake_now(&self) -> Arc<ServerConfig> {
        let Some(now) = self.watched.upgrade().map(|t| t.size_bytes()) else {
            return Arc::clone(&self.handshake);
        };
        if self
            .handshake
            .exports
            .first()
            .is_none_or(|e| e.size_bytes == now)
        {
            return Arc::clone(&self.handshake);
        }
        let mut config = (*self.handshake).clone();
        for export in &mut config.exports {
            export.size_bytes = now;
        }
        Arc::new(config)
    }
    /// Record a connection; a connection that arrives during shutdown is
    /// told to stop reading at once.
    pub(crate) fn register(&self, connection: &Arc<Connection>) {
        let mut connections = self.connections.lock().expect("registry");
        connections.insert(connection.id, Arc::clone(connection));
        if self.shutdown.is_triggered() {
            connection.stop_reading();
        }
    }

    /// The connection is done: it leaves the registry and gives back its
    /// admission slot together, under the registry lock, so that whoever
    /// sees it gone from the status can also connect in its place.
    pub(crate) fn unregister(&self, connection: &Arc<Connection>) {
        let mut connections = self.connections.lock().expect("registry");
        connections.remove(&connection.id);
        self.closed_totals
            .add_snapshot(&connection.counters.snapshot());
        self.finished();
    }

    /// Give back an admission slot (a connection that ended, or one that
    /// never started).
    pub(crate) fn finished(&self) {
        let mut active = self.active.lock().expect("active count");
        *active -= 1;
        self.active_changed.notify_all();
    }

    /// Totals over all connections, past and present.
    pub(crate) fn totals(&self) -> CountersSnapshot {
        let connections = self.connections.lock().expect("registry");
        let live = connections.values().map(|c| c.counters.snapshot());
        let ublk = self.ublk_counters.iter().map(|c| c.snapshot());
        live.chain(ublk)
            .chain(std::iter::once(self.nvme_counters.snapshot()))
            .fold(self.closed_totals.snapshot(), |sum, c| sum.plus(&c))
    }

    pub(crate) fn connection_list(&self) -> Vec<Arc<Connection>> {
        self.connections
            .lock()
            .expect("registry")
            .values()
            .cloned()
            .collect()
    }

    pub(crate) fn log(&self, line: &str) {
        (self.options.log)(&format!("nvraid-serve: {line}"));
    }

    /// Every slot is taken and `client` wants one: close the connection idle
    /// longest, if it has been idle for the idle timeout, and admit the client
    /// once its slot is free. False (nothing closed) when no connection
    /// qualifies.
    pub(crate) fn make_room(&self, client: &str) -> bool {
        let Some(limit) = self.options.idle_timeout else {
            return false;
        };
        let victim = {
            let connections = self.connections.lock().expect("registry");
            connections
                .values()
                .filter_map(|c| c.idle_for().map(|idle| (idle, Arc::clone(c))))
                .filter(|(idle, _)| *idle >= limit)
                .max_by_key(|(idle, _)| *idle)
        };
        let Some((idle, victim)) = victim else {
            return false;
        };
        victim.log(&format!(
            "event=evicted reason=\"idle for {:.1}s while the connection limit ({}) was reached; client={client} takes its slot\"",
            idle.as_secs_f64(),
            self.options.connections_max
        ));
        victim.stop_reading();
        let deadline = Instant::now() + Duration::from_secs(5);
        let mut active = self.active.lock().expect("active count");
        while *active >= self.options.connections_max {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return false;
            }
            active = self
                .active_changed
                .wait_timeout(active, left)
                .expect("active count")
                .0;
        }
        *active += 1;
        true
    }

    /// Count a new connection if the limit allows.
    pub(crate) fn admit(&self) -> bool {
        let mut active = self.active.lock().expect("active count");
        if *active >= self.options.connections_max {
            return false;
        }
        *active += 1;
        true
    }
}

impl TotalsSource for Shared {
    /// NBD's share is what is left of the totals once the ublk device's
    /// and NVMe/TCP's requests are taken out.
    fn export_totals(&self) -> ExportTotals {
        let ublk = self.ublk_counters.as_ref().map(|c| c.snapshot());
        let nvme_counts = self.nvme_counters.snapshot();
        let nbd = self
            .totals()
            .minus(&ublk.unwrap_or_default())
            .minus(&nvme_counts);
        ExportTotals {
            nbd,
            ublk,
            nvme: self.nvme.is_some().then_some(nvme_counts),
            latency: self.workers.latencies(),
        }
    }
}
