//! `--metrics ADDR`: the array's state and counters in Prometheus' text
//! format (OpenMetrics, written by the `prometheus-client` crate) on
//! `GET /metrics`. Each scrape is built from a fresh snapshot; nothing is
//! kept between scrapes. docs/monitor.md lists every metric.
//!
//! The listener is bound before the array is assembled ([`bind`]), so an
//! address in use is refused before any byte of a member changes. Each
//! connection is served on a short-lived thread of its own under a
//! deadline (a slow client is cut off, and cannot hold the others up); at
//! most [`CONNECTIONS_MAX`] at once.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream, ToSocketAddrs};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use nvraid_serve::stats::{CountersSnapshot, Export, ExportTotals, Histogram, LatencyOp};
use prometheus_client::encoding::text::encode;
use prometheus_client::encoding::{EncodeMetric, MetricEncoder};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::Registry;

use crate::event::{Progress, Snapshot};

/// A request must be read and its reply written within this time.
pub const DEADLINE: Duration = Duration::from_secs(5);
/// Connections served at once; more are closed at once.
pub const CONNECTIONS_MAX: usize = 8;
/// The most bytes of a request's head read.
const HEAD_MAX: usize = 8192;

/// What a scrape shows: the array, and the export's request counters when
/// the server runs.
pub type Scrape = Arc<dyn Fn() -> (Snapshot, Option<ExportTotals>) + Send + Sync>;

/// The member states a member's `nvraid_member_state` lists (1 for the
/// one it is in).
pub const MEMBER_STATES: [&str; 10] = [
    "active",
    "rebuilding",
    "faulty",
    "left",
    "missing",
    "spare",
    "stale",
    "journal",
    "replacement",
    "unreadable",
];

/// A bound metrics listener, not yet serving.
pub struct Bound {
    listener: TcpListener,
    address: String,
}

/// Binds `address` (`HOST:PORT`; `:PORT` or `PORT` for 127.0.0.1). An
/// address in use, or one that does not resolve, is an error naming it.
pub fn bind(address: &str) -> Result<Bound, String> {
    let spec = if address.parse::<u16>().is_ok() {
        format!("127.0.0.1:{address}")
    } else if let Some(port) = address.strip_prefix(':') {
        format!("127.0.0.1:{port}")
    } else {
        address.to_string()
    };
    let addrs: Vec<_> = spec
        .to_socket_addrs()
        .map_err(|e| format!("--metrics {address}: not a HOST:PORT address ({e})"))?
        .collect();
    let listener = TcpListener::bind(&addrs[..]).map_err(|e| {
        if e.kind() == std::io::ErrorKind::AddrInUse {
            format!("--metrics {address}: the address is in use (another process listens there)")
        } else {
            format!("--metrics {address}: cannot listen there: {e}")
        }
    })?;
    listener
        .set_nonblocking(true)
        .map_err(|e| format!("--metrics {address}: {e}"))?;
    Ok(Bound {
        listener,
        address: address.to_string(),
    })
}

impl Bound {
    /// Where it listens (the port resolved).
    pub fn local_address(&self) -> String {
        self.listener
            .local_addr()
            .map_or_else(|_| self.address.clone(), |a| a.to_string())
    }

    /// Serves scrapes until the returned endpoint is stopped.
    pub fn start(self, scrape: Scrape) -> Endpoint {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let thread = std::thread::Builder::new()
            .name("nvraid-metrics".into())
            .spawn(move || accept_loop(self.listener, scrape, &flag))
            .expect("spawn the metrics thread");
        Endpoint {
            stop,
            thread: Some(thread),
        }
    }
}

/// The running endpoint; stopped (and its scrape source let go) on
/// [`Endpoint::stop`] or drop.
pub struct Endpoint {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Endpoint {
    pub fn stop(mut self) {
        self.finish();
    }

    fn finish(&mut self) {
        self.stop.store(true, Ordering::Release);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

impl Drop for Endpoint {
    fn drop(&mut self) {
        self.finish();
    }
}

fn accept_loop(listener: TcpListener, scrape: Scrape, stop: &AtomicBool) {
    let busy = Arc::new(AtomicUsize::new(0));
    let mut threads: Vec<JoinHandle<()>> = Vec::new();
    while !stop.load(Ordering::Acquire) {
        threads.retain(|t| !t.is_finished());
        match listener.accept() {
            Ok((stream, _)) => {
                if busy.load(Ordering::Acquire) >= CONNECTIONS_MAX {
                    drop(stream);
                    continue;
                }
                busy.fetch_add(1, Ordering::AcqRel);
                let (scrape, held) = (scrape.clone(), busy.clone());
                let spawned = std::thread::Builder::new()
                    .name("nvraid-scrape".into())
                    .spawn(move || {
                        let _ = answer(stream, &scrape);
                        held.fetch_sub(1, Ordering::AcqRel);
                    });
                match spawned {
                    Ok(thread) => threads.push(thread),
                    Err(_) => {
                        busy.fetch_sub(1, Ordering::AcqRel);
                    }
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                std::thread::sleep(Duration::from_millis(50))
            }
            Err(_) => std::thread::sleep(Duration::from_millis(50)),
        }
    }
    // Each is bounded by its deadline.
    for thread in threads {
        let _ = thread.join();
    }
}

/// Reads one request's head within the deadline and answers it.
fn answer(mut stream: TcpStream, scrape: &Scrape) -> std::io::Result<()> {
    let deadline = Instant::now() + DEADLINE;
    stream.set_nonblocking(false)?;
    let mut head = Vec::new();
    let mut buf = [0u8; 1024];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") && !head.windows(2).any(|w| w == b"\n\n") {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() || head.len() > HEAD_MAX {
            return Ok(());
        }
        stream.set_read_timeout(Some(left))?;
        let n = stream.read(&mut buf)?;
        if n == 0 {
            break;
        }
        head.extend_from_slice(&buf[..n]);
    }
    let line = String::from_utf8_lossy(&head);
    let mut words = line.lines().next().unwrap_or("").split_whitespace();
    let (method, target) = (words.next().unwrap_or(""), words.next().unwrap_or(""));
    let path = target.split('?').next().unwrap_or("");
    let (status, kind, body) = if method == "GET" && path == "/metrics" {
        let (snapshot, totals) = scrape();
        (
            "200 OK",
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
            render(&snapshot, totals.as_ref()),
        )
    } else {
        (
            "404 Not Found",
            "text/plain; charset=utf-8",
            "nvraid serves only GET /metrics here\n".to_string(),
        )
    };
    let reply = format!(
        "HTTP/1.1 {status}\r\nContent-Type: {kind}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    let left = deadline.saturating_duration_since(Instant::now());
    if left.is_zero() {
        return Ok(());
    }
    stream.set_write_timeout(Some(left))?;
    stream.write_all(reply.as_bytes())
}

type Labels = Vec<(String, String)>;

fn labels(pairs: &[(&str, &str)]) -> Labels {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// A family of gauges registered under `name`.
fn gauges(registry: &mut Registry, name: &str, help: &str) -> Family<Labels, Gauge> {
    let family = Family::<Labels, Gauge>::default();
    registry.register(name, help, family.clone());
    family
}

fn ratios(
    registry: &mut Registry,
    name: &str,
    help: &str,
) -> Family<Labels, Gauge<f64, AtomicU64>> {
    let family = Family::<Labels, Gauge<f64, AtomicU64>>::default();
    registry.register(name, help, family.clone());
    family
}

/// A family of counters (the exposition adds `_total` to `name`).
fn counters(registry: &mut Registry, name: &str, help: &str) -> Family<Labels, Counter> {
    let family = Family::<Labels, Counter>::default();
    registry.register(name, help, family.clone());
    family
}

/// Histograms counted elsewhere (the serve workers' latency shards),
/// exposed as they are at the scrape.
#[derive(Debug, Default)]
struct Histograms(Vec<(Labels, Histogram)>);

impl EncodeMetric for Histograms {
    fn encode(&self, mut encoder: MetricEncoder) -> Result<(), std::fmt::Error> {
        for (labels, h) in &self.0 {
            let sum_s = h.sum_ns as f64 / 1e9;
            encoder.encode_family(labels)?.encode_histogram::<Labels>(
                sum_s,
                h.count(),
                &h.buckets(),
                None,
            )?;
        }
        Ok(())
    }

    fn metric_type(&self) -> MetricType {
        MetricType::Histogram
    }
}

fn int(value: u64) -> i64 {
    i64::try_from(value).unwrap_or(i64::MAX)
}

/// The exposition of one scrape.
pub fn render(s: &Snapshot, totals: Option<&ExportTotals>) -> String {
    let mut registry = Registry::default();
    let array = labels(&[("array", &s.name), ("uuid", &s.uuid)]);
    let with = |extra: &[(&str, &str)]| {
        let mut l = array.clone();
        l.extend(labels(extra));
        l
    };

    let info = gauges(
        &mut registry,
        "nvraid_array_info",
        "The served array: always 1; its level and state in labels",
    );
    info.get_or_create(&with(&[
        ("level", &format!("raid{}", s.level)),
        ("state", &s.state),
    ]))
    .set(1);
    let degraded = gauges(
        &mut registry,
        "nvraid_array_degraded",
        "1 when a role has no member in sync (missing, faulty or rebuilding)",
    );
    degraded.get_or_create(&array).set(i64::from(s.degraded));
    let dirty = gauges(
        &mut registry,
        "nvraid_array_dirty",
        "1 while the array is marked active (dirty) on its members",
    );
    dirty
        .get_or_create(&array)
        .set(i64::from(s.state.starts_with("active")));
    let size = gauges(
        &mut registry,
        "nvraid_array_size_bytes",
        "Usable size of the array",
    );
    size.get_or_create(&array).set(int(s.size_bytes));
    let disks = gauges(
        &mut registry,
        "nvraid_array_raid_disks",
        "Roles of the array (md's raid_disks)",
    );
    disks.get_or_create(&array).set(i64::from(s.raid_disks));
    let members = gauges(
        &mut registry,
        "nvraid_array_members",
        "Members of the array by state (roles and members set aside)",
    );
    for state in MEMBER_STATES {
        let n = s.members.iter().filter(|m| m.state == state).count();
        members
            .get_or_create(&with(&[("state", state)]))
            .set(n as i64);
    }

    let ratio = ratios(
        &mut registry,
        "nvraid_array_progress_ratio",
        "How far the rebuild, resync or check/repair got, 0 to 1 (1 once finished)",
    );
    let position = gauges(
        &mut registry,
        "nvraid_array_progress_bytes",
        "Bytes done by the rebuild, resync or check/repair",
    );
    let running = gauges(
        &mut registry,
        "nvraid_array_progress_running",
        "1 while the rebuild, resync or check/repair runs",
    );
    let progress = |what: &str, p: Option<&Progress>| {
        let l = with(&[("operation", what)]);
        running
            .get_or_create(&l)
            .set(i64::from(p.is_some_and(Progress::running)));
        let p = p.cloned().unwrap_or_default();
        ratio.get_or_create(&l).set(p.ratio());
        position.get_or_create(&l).set(int(p.done_bytes));
    };
    progress("rebuild", s.rebuild.as_ref());
    progress("resync", s.resync.as_ref());
    progress("scrub", s.scrub.as_ref().map(|c| &c.progress));
    let mismatches = gauges(
        &mut registry,
        "nvraid_array_mismatch_sectors",
        "512-byte sectors found to differ by the last finished check or repair",
    );
    mismatches.get_or_create(&array).set(int(s
        .scrub
        .as_ref()
        .and_then(|c| c.mismatch_sectors)
        .unwrap_or(0)));

    let state = gauges(
        &mut registry,
        "nvraid_member_state",
        "1 for the state the member is in, 0 for the others",
    );
    let role = gauges(
        &mut registry,
        "nvraid_member_role",
        "The member's role (slot) in the array; -1 for a member set aside",
    );
    let ops = counters(
        &mut registry,
        "nvraid_member_ops",
        "Member operations done for served I/O (reads and writes)",
    );
    let bytes = counters(
        &mut registry,
        "nvraid_member_bytes",
        "Bytes read and written on the member for served I/O",
    );
    let errors = counters(
        &mut registry,
        "nvraid_member_errors",
        "Failed member operations",
    );
    for m in &s.members {
        let name = m
            .path
            .clone()
            .unwrap_or_else(|| format!("(missing role {})", m.role.unwrap_or_default()));
        let role_text = m.role.map_or_else(|| "-".to_string(), |r| r.to_string());
        let l = with(&[("member", &name), ("role", &role_text)]);
        for st in MEMBER_STATES {
            let mut sl = l.clone();
            sl.extend(labels(&[("state", st)]));
            state.get_or_create(&sl).set(i64::from(m.state == st));
        }
        role.get_or_create(&l).set(m.role.map_or(-1, i64::from));
        ops.get_or_create(&l).inc_by(m.ops);
        bytes.get_or_create(&l).inc_by(m.bytes);
        errors.get_or_create(&l).inc_by(m.errors);
    }

    if let Some(totals) = totals {
        let requests = counters(
            &mut registry,
            "nvraid_export_requests",
            "Requests answered by the export (NBD or the ublk device), by operation",
        );
        let read = counters(
            &mut registry,
            "nvraid_export_read_bytes",
            "Bytes read by clients of the export",
        );
        let written = counters(
            &mut registry,
            "nvraid_export_written_bytes",
            "Bytes written by clients of the export",
        );
        let failed = counters(
            &mut registry,
            "nvraid_export_errors",
            "Requests of the export answered with an error",
        );
        let export = |frontend: &str, c: &CountersSnapshot| {
            for (op, n) in [
                ("read", c.reads),
                ("write", c.writes),
                ("flush", c.flushes),
                ("trim", c.trims),
                ("write_zeroes", c.zeroes),
                ("other", c.other),
            ] {
                requests
                    .get_or_create(&with(&[("export", frontend), ("op", op)]))
                    .inc_by(n);
            }
            let l = with(&[("export", frontend)]);
            read.get_or_create(&l).inc_by(c.read_bytes);
            written.get_or_create(&l).inc_by(c.written_bytes);
            failed.get_or_create(&l).inc_by(c.errors);
        };
        export("nbd", &totals.nbd);
        if let Some(ublk) = &totals.ublk {
            export("ublk", ublk);
        }
        if let Some(nvme) = &totals.nvme {
            export("nvme", nvme);
        }
        let mut latency = Histograms::default();
        for kind in Export::ALL {
            let present = match kind {
                Export::Nbd => true,
                Export::Ublk => totals.ublk.is_some(),
                Export::Nvme => totals.nvme.is_some(),
            };
            for op in LatencyOp::ALL.into_iter().filter(|_| present) {
                let l = with(&[("export", kind.name()), ("op", op.name())]);
                latency.0.push((l, *totals.latency.get(kind, op)));
            }
        }
        registry.register_with_unit(
            "nvraid_export_request_duration",
            "Time from a request's submission to the array (a write's payload received) until \
             the array answered it, by export and operation (other: flush, trim, write zeroes)",
            prometheus_client::registry::Unit::Seconds,
            latency,
        );
    }

    let mut out = String::new();
    encode(&mut out, &registry).expect("writing to a String cannot fail");
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::event::MemberSnapshot;

    fn snapshot() -> Snapshot {
        Snapshot {
            name: "a".into(),
            uuid: "u".into(),
            level: 1,
            state: "clean, degraded".into(),
            degraded: true,
            size_bytes: 1 << 20,
            raid_disks: 2,
            members: vec![
                MemberSnapshot {
                    role: Some(0),
                    path: Some("/m0".into()),
                    state: "active".into(),
                    ops: 7,
                    bytes: 4096,
                    errors: 0,
                    in_sync_bytes: None,
                },
                MemberSnapshot {
                    role: Some(1),
                    path: Some("/m1".into()),
                    state: "faulty".into(),
                    errors: 2,
                    ..MemberSnapshot::default()
                },
            ],
            rebuild: Some(Progress {
                role: Some(1),
                member: Some("/m1".into()),
                done_bytes: 256,
                total_bytes: 1024,
                ..Progress::default()
            }),
            ..Snapshot::default()
        }
    }

    /// Three NBD reads: 5 µs, 1 ms and 20 s.
    fn latencies() -> nvraid_serve::stats::Latencies {
        let mut l = nvraid_serve::stats::Latencies::default();
        let read = &mut l.0[Export::Nbd as usize][LatencyOp::Read as usize];
        read.counts[0] = 1;
        read.counts[6] = 1;
        read.counts[19] = 1;
        read.sum_ns = 20_001_005_000;
        l
    }

    #[test]
    fn the_exposition_names_the_array_its_members_and_their_states() {
        let totals = ExportTotals {
            nbd: CountersSnapshot {
                reads: 3,
                read_bytes: 12288,
                ..CountersSnapshot::default()
            },
            ublk: None,
            nvme: None,
            latency: latencies(),
        };
        let text = render(&snapshot(), Some(&totals));
        for line in [
            "nvraid_array_degraded{array=\"a\",uuid=\"u\"} 1",
            "nvraid_array_size_bytes{array=\"a\",uuid=\"u\"} 1048576",
            "nvraid_array_members{array=\"a\",uuid=\"u\",state=\"faulty\"} 1",
            "nvraid_array_members{array=\"a\",uuid=\"u\",state=\"active\"} 1",
            "nvraid_member_state{array=\"a\",uuid=\"u\",member=\"/m1\",role=\"1\",state=\"faulty\"} 1",
            "nvraid_member_state{array=\"a\",uuid=\"u\",member=\"/m1\",role=\"1\",state=\"active\"} 0",
            "nvraid_member_ops_total{array=\"a\",uuid=\"u\",member=\"/m0\",role=\"0\"} 7",
            "nvraid_member_errors_total{array=\"a\",uuid=\"u\",member=\"/m1\",role=\"1\"} 2",
            "nvraid_array_progress_ratio{array=\"a\",uuid=\"u\",operation=\"rebuild\"} 0.25",
            "nvraid_export_requests_total{array=\"a\",uuid=\"u\",export=\"nbd\",op=\"read\"} 3",
            "nvraid_export_read_bytes_total{array=\"a\",uuid=\"u\",export=\"nbd\"} 12288",
            "# TYPE nvraid_export_request_duration_seconds histogram",
            "nvraid_export_request_duration_seconds_bucket{le=\"0.00001\",array=\"a\",uuid=\"u\",export=\"nbd\",op=\"read\"} 1",
            "nvraid_export_request_duration_seconds_bucket{le=\"0.001\",array=\"a\",uuid=\"u\",export=\"nbd\",op=\"read\"} 2",
            "nvraid_export_request_duration_seconds_bucket{le=\"+Inf\",array=\"a\",uuid=\"u\",export=\"nbd\",op=\"read\"} 3",
            "nvraid_export_request_duration_seconds_count{array=\"a\",uuid=\"u\",export=\"nbd\",op=\"read\"} 3",
            "nvraid_export_request_duration_seconds_sum{array=\"a\",uuid=\"u\",export=\"nbd\",op=\"read\"} 20.001005",
        ] {
            assert!(text.lines().any(|l| l == line), "{line} missing from\n{text}");
        }
        assert!(text.ends_with("# EOF\n"));
    }

    fn get(address: &str, request: &str) -> String {
        let mut stream = TcpStream::connect(address).unwrap();
        stream.write_all(request.as_bytes()).unwrap();
        let mut reply = String::new();
        stream.read_to_string(&mut reply).unwrap();
        reply
    }

    #[test]
    fn get_metrics_answers_anything_else_is_404_and_a_slow_client_holds_nothing() {
        let bound = bind("127.0.0.1:0").unwrap();
        let address = bound.local_address();
        let endpoint = bound.start(Arc::new(|| (snapshot(), None)));
        // A client that sends nothing does not hold up the next.
        let _idle = TcpStream::connect(&address).unwrap();
        let reply = get(&address, "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n");
        assert!(reply.starts_with("HTTP/1.1 200 OK\r\n"), "{reply}");
        assert!(reply.contains("nvraid_array_degraded"), "{reply}");
        let reply = get(&address, "GET /other HTTP/1.1\r\n\r\n");
        assert!(reply.starts_with("HTTP/1.1 404"), "{reply}");
        let reply = get(&address, "POST /metrics HTTP/1.1\r\n\r\n");
        assert!(reply.starts_with("HTTP/1.1 404"), "{reply}");
        endpoint.stop();
    }

    #[test]
    fn an_address_in_use_is_refused_by_name() {
        let taken = TcpListener::bind("127.0.0.1:0").unwrap();
        let address = taken.local_addr().unwrap().to_string();
        let e = bind(&address).err().unwrap();
        assert!(e.contains(&address) && e.contains("in use"), "{e}");
        let e = bind("no-such-host.invalid:9").err().unwrap();
        assert!(e.contains("no-such-host.invalid:9"), "{e}");
    }
}
