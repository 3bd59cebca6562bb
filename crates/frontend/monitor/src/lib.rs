//! nvraid-monitor: alerts and metrics of a served array (`nvraid serve
//! --alert-program/--alert-mail/--metrics`).
//!
//! A monitor thread takes a [`event::Snapshot`] of the array every second,
//! and before and after each control-socket command, compares it with
//! the last one ([`event::diff`], as mdadm's monitor compares readings of
//! /proc/mdstat) and hands each event to the sinks ([`sink`]): the log at
//! once, the program and the mail on their own thread. The metrics
//! endpoint ([`metrics`]) renders a fresh snapshot on each scrape.
//! docs/monitor.md is the user's side of it.

pub mod event;
pub mod metrics;
pub mod sink;
mod source;

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::Duration;

use nvraid_array::recovery::online::{Online, ResyncState};
use nvraid_array::Array;
use nvraid_serve::stats::TotalsProbe;
use nvraid_serve::ServeOptions;

pub use event::{diff, startup, Event, EventKind, Snapshot};
pub use source::ArraySource;

use sink::{Alert, ArrayId, Delivery, DeliveryOptions, Journal};

/// How often the monitor looks at the array.
pub const INTERVAL: Duration = Duration::from_secs(1);

/// `nvraid serve`'s flags for alerts and metrics.
#[derive(Clone, Debug, Default, clap::Args)]
pub struct MonitorArgs {
    /// Prometheus metrics on http://ADDR/metrics (HOST:PORT; a bare PORT
    /// listens on 127.0.0.1). Bound before the array is assembled: an
    /// address in use is refused with no byte of any member changed.
    /// docs/monitor.md lists the metrics.
    #[arg(long, value_name = "ADDR")]
    pub metrics: Option<String>,
    /// Run PATH for each event as `PATH EVENT ARRAY [MEMBER]` (mdadm's
    /// PROGRAM convention; also NVRAID_EVENT, NVRAID_ARRAY, NVRAID_UUID,
    /// NVRAID_MEMBER in its environment). A program that fails or is
    /// missing is logged and retried with backoff; the array never waits
    /// for it.
    #[arg(long, value_name = "PATH")]
    pub alert_program: Option<PathBuf>,
    /// Mail each event to ADDR through `/usr/sbin/sendmail -t`, retried
    /// like the program.
    #[arg(long, value_name = "ADDR")]
    pub alert_mail: Option<String>,
    /// Seconds the alert program (or sendmail) may run; then it is killed,
    /// logged, and retried.
    #[arg(long, value_name = "SECS", default_value_t = 30,
          value_parser = clap::value_parser!(u64).range(1..=3600))]
    pub alert_timeout: u64,
}

/// The flags checked and the metrics address bound: what `serve` does
/// before it assembles the array.
pub struct Prepared {
    args: MonitorArgs,
    metrics: Option<metrics::Bound>,
}

impl MonitorArgs {
    /// Binds `--metrics` (an address in use is an error naming it) and
    /// checks the other flags.
    pub fn prepare(&self) -> Result<Prepared, String> {
        if let Some(to) = &self.alert_mail {
            if to.trim().is_empty() || to.contains(['\n', '\r']) {
                return Err(format!("--alert-mail {to:?}: not a mail address"));
            }
        }
        let metrics = self.metrics.as_deref().map(metrics::bind).transpose()?;
        Ok(Prepared {
            args: self.clone(),
            metrics,
        })
    }
}

impl Prepared {
    /// Starts monitoring `array` (served with `online`'s recovery and the
    /// background resync's `resync`): reports the state it starts in
    /// (DegradedArray...), then every change; hooks into `options` to look
    /// around each control command and to read the export's counters.
    pub fn start(
        self,
        array: &Arc<Array>,
        online: &Arc<Online>,
        resync: &Arc<Mutex<ResyncState>>,
        options: &mut ServeOptions,
    ) -> Monitor {
        let journal = Journal::from_env();
        let source = ArraySource::new(array.clone(), online.clone(), resync.clone());
        let first = source.snapshot(0);
        let id = ArrayId {
            name: first.name.clone(),
            uuid: first.uuid.clone(),
        };
        let mut alerts = Vec::new();
        if let Some(program) = &self.args.alert_program {
            if std::fs::metadata(program).is_err() {
                journal.log(
                    3,
                    &format!(
                        "nvraid: --alert-program {}: not there now; events will be retried \
                         until it is",
                        program.display()
                    ),
                    &[("NVRAID_ARRAY", &id.name), ("NVRAID_UUID", &id.uuid)],
                );
            }
            alerts.push(Alert::Program(program.clone()));
        }
        if let Some(to) = &self.args.alert_mail {
            let sendmail = std::env::var_os(sink::SENDMAIL_ENV)
                .map(PathBuf::from)
                .unwrap_or_else(|| PathBuf::from(sink::SENDMAIL));
            alerts.push(Alert::Mail {
                sendmail,
                to: to.clone(),
            });
        }
        let delivery = Delivery::start(
            id.clone(),
            alerts,
            DeliveryOptions {
                timeout: Duration::from_secs(self.args.alert_timeout),
                ..DeliveryOptions::default()
            },
            journal.clone(),
        );
        let shared = Arc::new(Shared {
            source,
            id,
            journal,
            delivery: Mutex::new(Some(delivery)),
            last: Mutex::new(first.clone()),
            runs: AtomicU64::new(0),
            stop: AtomicBool::new(false),
            wake: Condvar::new(),
        });
        shared.raise(&startup(&first));
        let probe = TotalsProbe::default();
        options.totals = Some(probe.clone());
        let endpoint = self.metrics.map(|bound| {
            shared.journal.log(
                6,
                &format!(
                    "nvraid: metrics of {} on http://{}/metrics",
                    shared.id.name,
                    bound.local_address()
                ),
                &[("NVRAID_ARRAY", &shared.id.name)],
            );
            let scrape_shared = shared.clone();
            bound.start(Arc::new(move || {
                let runs = scrape_shared.runs.load(Ordering::Acquire);
                (scrape_shared.source.snapshot(runs), probe.read())
            }))
        });
        hook_commands(&shared, options);
        let looker = shared.clone();
        let thread = std::thread::Builder::new()
            .name("nvraid-monitor".into())
            .spawn(move || looker.run())
            .expect("spawn the monitor thread");
        Monitor {
            shared,
            thread: Some(thread),
            endpoint,
        }
    }
}

/// Looks at the array before and after each control command, so that a
/// change a command makes is seen even when the next one follows within
/// the second; counts the checks and repairs started.
fn hook_commands(shared: &Arc<Shared>, options: &mut ServeOptions) {
    let inner = options.command_hook.take();
    let shared = shared.clone();
    options.command_hook = Some(Arc::new(move |request| {
        let mut last = shared.lock_last();
        shared.look(&mut last);
        let reply = match &inner {
            Some(hook) => hook(request),
            None => serde_json::json!({"error": format!("unknown command {}", request["command"])}),
        };
        let scrub = matches!(request["command"].as_str(), Some("check" | "repair"));
        if scrub && reply["started"].is_string() {
            shared.runs.fetch_add(1, Ordering::AcqRel);
        }
        shared.look(&mut last);
        reply
    }));
}

struct Shared {
    source: ArraySource,
    id: ArrayId,
    journal: Journal,
    delivery: Mutex<Option<Delivery>>,
    last: Mutex<Snapshot>,
    runs: AtomicU64,
    stop: AtomicBool,
    wake: Condvar,
}

impl Shared {
    fn lock_last(&self) -> MutexGuard<'_, Snapshot> {
        self.last.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// One look: a snapshot, compared with the last.
    fn look(&self, last: &mut Snapshot) {
        let now = self.source.snapshot(self.runs.load(Ordering::Acquire));
        let events = diff(last, &now);
        *last = now;
        self.raise(&events);
    }

    fn raise(&self, events: &[Event]) {
        let delivery = self.delivery.lock().unwrap_or_else(|p| p.into_inner());
        for event in events {
            self.journal.event(&self.id, event);
            if let Some(delivery) = delivery.as_ref() {
                delivery.send(event);
            }
        }
    }

    fn run(&self) {
        let mut last = self.lock_last();
        while !self.stop.load(Ordering::Acquire) {
            last = self
                .wake
                .wait_timeout(last, INTERVAL)
                .unwrap_or_else(|p| p.into_inner())
                .0;
            if self.stop.load(Ordering::Acquire) {
                break;
            }
            self.look(&mut last);
        }
        // A last look: what changed in the final second is reported too.
        self.look(&mut last);
    }
}

/// The running monitor; [`Monitor::stop`] (or drop) ends its threads.
pub struct Monitor {
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
    endpoint: Option<metrics::Endpoint>,
}

impl Monitor {
    /// Stops looking, stops the metrics endpoint, and delivers (or logs
    /// as not delivered) the alerts still waiting.
    pub fn stop(mut self) {
        self.finish();
    }

    fn finish(&mut self) {
        self.shared.stop.store(true, Ordering::Release);
        self.shared.wake.notify_all();
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
        if let Some(endpoint) = self.endpoint.take() {
            endpoint.stop();
        }
        let delivery = self
            .shared
            .delivery
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take();
        if let Some(delivery) = delivery {
            delivery.stop();
        }
    }
}

impl Drop for Monitor {
    fn drop(&mut self) {
        self.finish();
    }
}
