//! The control socket: a Unix socket beside the export. A client sends one
//! JSON line (`{"command":"status"}`) and reads one JSON line back.
//!
//! Each client is answered on a thread of its own, and must send its whole
//! request within [`REQUEST_DEADLINE`] (a deadline for the request, not a
//! timeout per read: a client trickling a byte at a time is cut off when it
//! passes), so that one slow client never holds up `status`, `fail` or
//! `add` from another. Commands that change the array take turns; `status`
//! does not wait for them.
//!
//! The socket's path is taken only when nothing is there, or when a socket
//! is there that nobody answers on (left by a server that died); a file of
//! any other kind, or a socket a running server answers on, is refused by
//! name and left as it is.

use std::io::{Read, Write};
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::error::Error;
use crate::shared::Shared;

/// Longest request line accepted.
const REQUEST_MAX_BYTES: usize = 4096;

/// A client must have sent its whole request line within this time.
pub(crate) const REQUEST_DEADLINE: Duration = Duration::from_secs(5);

/// Longest a reply may take to be written to a client that does not read.
const REPLY_DEADLINE: Duration = Duration::from_secs(5);

/// Longest reply a client reads.
const REPLY_MAX_BYTES: u64 = 64 << 20;

/// Clients answered at once; more are told the server is busy.
const CLIENTS_MAX: usize = 32;

/// One client being answered: its socket (shut down at stop) and thread.
type Client = (UnixStream, JoinHandle<()>);

pub(crate) struct ControlServer {
    path: PathBuf,
    /// The socket's (device, inode) once bound: at stop the path is
    /// removed only while it is still this socket.
    identity: Option<(u64, u64)>,
    /// The listening socket, shut down to wake the thread at stop (the
    /// path may be gone by then: its directory removed under the server).
    fd: std::os::fd::RawFd,
    thread: JoinHandle<()>,
    stop: Arc<AtomicBool>,
    clients: Arc<Mutex<Vec<Client>>>,
}

/// Whether `path` may become a socket (control or listen): free (nothing there), or a
/// socket left by a server that died, which `remove` then deletes.
/// Anything else is refused with its name and what it is.
/// `flag` names the option that gave the path, for the message.
pub(crate) fn check_path(path: &Path, flag: &str, remove: bool) -> Result<(), String> {
    let shown = path.display();
    let meta = match std::fs::symlink_metadata(path) {
        Ok(meta) => meta,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(format!("{shown}: {e}")),
    };
    let kind = meta.file_type();
    if !kind.is_socket() {
        let what = if kind.is_file() {
            "a regular file"
        } else if kind.is_dir() {
            "a directory"
        } else if kind.is_symlink() {
            "a symbolic link"
        } else {
            "a device or pipe"
        };
        return Err(format!(
            "{shown}: already exists and is {what}, not a socket; nvraid replaces only a socket \
             left by a server that died: give {flag} another path (nothing was changed)"
        ));
    }
    match UnixStream::connect(path) {
        Ok(_) => Err(format!(
            "{shown}: a running server answers on this socket (another nvraid serve?); give \
             {flag} another path, or stop that server first"
        )),
        Err(e) if e.kind() == std::io::ErrorKind::ConnectionRefused => {
            if remove {
                std::fs::remove_file(path).map_err(|e| format!("{shown}: a dead socket: {e}"))?;
            }
            Ok(())
        }
        Err(e) => Err(format!(
            "{shown}: a socket that cannot be checked ({e}); it was left alone"
        )),
    }
}

impl ControlServer {
    pub(crate) fn start(path: &Path, shared: Arc<Shared>) -> Result<ControlServer, Error> {
        check_path(path, "--control", true).map_err(Error::Control)?;
        let listener = crate::stream::bind_unix(path)
            .map_err(|e| Error::Control(format!("{}: {e}", path.display())))?;
        let identity = std::fs::symlink_metadata(path)
            .ok()
            .map(|m| (m.dev(), m.ino()));
        let fd = std::os::fd::AsRawFd::as_raw_fd(&listener);
        let stop = Arc::new(AtomicBool::new(false));
        let clients: Arc<Mutex<Vec<Client>>> = Arc::default();
        let (stop_flag, list) = (Arc::clone(&stop), Arc::clone(&clients));
        // Commands other than `status` take turns, as they did when one
        // thread answered every client.
        let turns = Arc::new(Mutex::new(()));
        let thread = std::thread::Builder::new()
            .name("nbd-control".into())
            .spawn(move || {
                for stream in listener.incoming() {
                    if stop_flag.load(Ordering::SeqCst) {
                        break;
                    }
                    let Ok(stream) = stream else { continue };
                    let mut clients = list.lock().unwrap_or_else(|p| p.into_inner());
                    reap(&mut clients);
                    if clients.len() >= CLIENTS_MAX {
                        drop(clients);
                        busy(&stream);
                        continue;
                    }
                    let Ok(kept) = stream.try_clone() else {
                        continue;
                    };
                    let (shared, turns) = (Arc::clone(&shared), Arc::clone(&turns));
                    let spawned = std::thread::Builder::new()
                        .name("nbd-control-client".into())
                        .spawn(move || {
                            let _ = answer(&shared, &turns, &stream);
                            // The list keeps a clone of the socket until
                            // it is reaped: the client sees the end now.
                            let _ = stream.shutdown(std::net::Shutdown::Both);
                        });
                    if let Ok(thread) = spawned {
                        clients.push((kept, thread));
                    }
                }
            })?;
        Ok(ControlServer {
            path: path.to_path_buf(),
            identity,
            fd,
            thread,
            stop,
            clients,
        })
    }

    pub(crate) fn stop(self) {
        self.stop.store(true, Ordering::SeqCst);
        // The thread owns the listener until it ends, so `fd` is still it.
        nvraid_io::sys::shutdown_socket(self.fd);
        let _ = self.thread.join();
        // Clients still sending are cut off; a command already running
        // finishes (its reply may be lost) before the server goes on.
        let clients = std::mem::take(&mut *self.clients.lock().unwrap_or_else(|p| p.into_inner()));
        for (stream, thread) in clients {
            let _ = stream.shutdown(std::net::Shutdown::Both);
            let _ = thread.join();
        }
        let still_ours = std::fs::symlink_metadata(&self.path)
            .ok()
            .map(|m| (m.dev(), m.ino()));
        if still_ours.is_some() && still_ours == self.identity {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

/// Forget the clients whose threads have ended.
fn reap(clients: &mut Vec<Client>) {
    let mut i = 0;
    while i < clients.len() {
        if clients[i].1.is_finished() {
            let (_, thread) = clients.swap_remove(i);
            let _ = thread.join();
        } else {
            i += 1;
        }
    }
}

/// Tell a client over the limit to come back later, without waiting on it.
fn busy(stream: &UnixStream) {
    let _ = stream.set_nonblocking(true);
    let line = format!(
        "{}\n",
        json!({"error": format!("the control socket is answering {CLIENTS_MAX} clients; try again")})
    );
    let _ = (&*stream).write_all(line.as_bytes());
}

/// Read one request line before the deadline.
fn read_request(stream: &UnixStream) -> std::io::Result<Vec<u8>> {
    let deadline = Instant::now() + REQUEST_DEADLINE;
    let mut line = Vec::with_capacity(256);
    let mut buf = [0u8; 1024];
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                format!(
                    "the request was not complete within {} s",
                    REQUEST_DEADLINE.as_secs()
                ),
            ));
        }
        stream.set_read_timeout(Some(left))?;
        let n = match (&*stream).read(&mut buf) {
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                continue
            }
            Err(e) => return Err(e),
        };
        if n == 0 {
            return Ok(line);
        }
        line.extend_from_slice(&buf[..n]);
        if let Some(end) = line.iter().position(|&b| b == b'\n') {
            line.truncate(end);
            return Ok(line);
        }
        if line.len() >= REQUEST_MAX_BYTES {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                format!("a request line longer than {REQUEST_MAX_BYTES} bytes"),
            ));
        }
    }
}

fn answer(shared: &Shared, turns: &Mutex<()>, stream: &UnixStream) -> std::io::Result<()> {
    let reply = match read_request(stream) {
        Err(e) => json!({"error": format!("bad request: {e}")}),
        Ok(line) => match serde_json::from_slice::<Value>(&line) {
            Ok(request) if request["command"] == "status" => status(shared),
            Ok(request) => match &shared.options.command_hook {
                Some(hook) => {
                    let _turn = turns.lock().unwrap_or_else(|p| p.into_inner());
                    hook(&request)
                }
                None => json!({"error": format!("unknown command {}", request["command"])}),
            },
            Err(e) => json!({"error": format!("bad request: {e}")}),
        },
    };
    let mut out = serde_json::to_vec(&reply).map_err(std::io::Error::other)?;
    out.push(b'\n');
    stream.set_write_timeout(Some(REPLY_DEADLINE))?;
    (&*stream).write_all(&out)
}

/// The status document.
pub(crate) fn status(shared: &Shared) -> Value {
    let totals = shared.totals();
    let rates = shared.rates.sample(totals, 1.0);
    let connections: Vec<Value> = shared
        .connection_list()
        .iter()
        .map(|c| {
            json!({
                "id": c.id,
                "client": c.client,
                "tls": *c.tls.lock().expect("tls flag"),
                "connected_s": c.started.elapsed().as_secs_f64(),
                "counters": c.counters.snapshot(),
            })
        })
        .collect();
    let array = shared
        .options
        .status_hook
        .as_ref()
        .map_or(Value::Null, |hook| hook());
    json!({
        "export": {
            "name": shared.options.export_name,
            "target": shared.description_now(),
            "size_bytes": shared.size_now(),
            "read_only": shared.read_only,
            "block_sizes": {
                "minimum_bytes": shared.block_sizes.minimum_bytes,
                "preferred_bytes": shared.block_sizes.preferred_bytes,
                "maximum_bytes": shared.block_sizes.maximum_bytes,
            },
            "listen": shared.listening.iter().map(|a| a.to_string()).collect::<Vec<_>>(),
            "uptime_s": shared.started.elapsed().as_secs_f64(),
            "connections_max": shared.options.connections_max,
        },
        "totals": totals,
        "rates": rates,
        "connections": connections,
        "ublk": shared
            .ublk
            .lock()
            .expect("ublk device")
            .as_ref()
            .map_or(Value::Null, |d| d.status()),
        "nvme": shared
            .nvme
            .as_ref()
            .map_or(Value::Null, |n| crate::nvme::status(n)),
        "array": array,
    })
}

/// Ask a running server for its status (what `nvraid status --socket`
/// prints).
pub fn query_status(path: &Path) -> Result<Value, Error> {
    request(path, &json!({"command": "status"}))
}

/// Send one command to a running server's control socket; its reply (an
/// `error` in the reply becomes an error).
pub fn request(path: &Path, command: &Value) -> Result<Value, Error> {
    let fail = |e: std::io::Error| Error::Control(format!("{}: {e}", path.display()));
    let stream = UnixStream::connect(path).map_err(fail)?;
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .map_err(fail)?;
    let mut line = serde_json::to_vec(command).map_err(|e| Error::Control(e.to_string()))?;
    line.push(b'\n');
    (&stream).write_all(&line).map_err(fail)?;
    // The reply is bounded too: whatever answers on `path` may not be a
    // server of ours.
    let mut line = String::new();
    std::io::BufRead::read_line(
        &mut std::io::BufReader::new((&stream).take(REPLY_MAX_BYTES)),
        &mut line,
    )
    .map_err(fail)?;
    let value: Value =
        serde_json::from_str(&line).map_err(|e| Error::Control(format!("bad reply: {e}")))?;
    match value.get("error") {
        Some(message) => Err(Error::Control(
            message
                .as_str()
                .map_or_else(|| message.to_string(), str::to_string),
        )),
        None => Ok(value),
    }
}

/// A human-readable rendering of a status document.
pub fn format_status(status: &Value) -> String {
    let export = &status["export"];
    let totals = &status["totals"];
    let rates = &status["rates"];
    let mut out = format!(
        "export {:?}: {} ({} bytes{})\nlisten: {}\ntotals: {} reads ({} bytes), {} writes ({} bytes), {} flushes, {} errors\nrates: {:.0} IOPS, read {:.1} MiB/s, write {:.1} MiB/s\nconnections: {}\n",
        export["name"].as_str().unwrap_or(""),
        export["target"].as_str().unwrap_or(""),
        export["size_bytes"],
        if export["read_only"] == true { ", read-only" } else { "" },
        export["listen"].as_array().map_or(String::new(), |a| a.iter().filter_map(Value::as_str).collect::<Vec<_>>().join(", ")),
        totals["reads"], totals["read_bytes"], totals["writes"], totals["written_bytes"], totals["flushes"], totals["errors"],
        rates["iops"].as_f64().unwrap_or(0.0),
        rates["read_bytes_per_second"].as_f64().unwrap_or(0.0) / 1048576.0,
        rates["write_bytes_per_second"].as_f64().unwrap_or(0.0) / 1048576.0,
        status["connections"].as_array().map_or(0, Vec::len),
    );
    for c in status["connections"].as_array().into_iter().flatten() {
        out += &format!(
            "  #{} {} tls={} reads={} writes={} errors={}\n",
            c["id"],
            c["client"].as_str().unwrap_or(""),
            c["tls"],
            c["counters"]["reads"],
            c["counters"]["writes"],
            c["counters"]["errors"]
        );
    }
    let ublk = &status["ublk"];
    if !ublk.is_null() {
        out += &format!(
            "ublk: {} (device {}, {} queues of {} tags, {} bytes per request{}) reads={} writes={} flushes={} errors={}\n",
            ublk["path"].as_str().unwrap_or("?"),
            ublk["id"],
            ublk["queues"],
            ublk["depth"],
            ublk["max_io_bytes"],
            if ublk["recovered"] == true { ", taken over from a killed server" } else { "" },
            ublk["counters"]["reads"],
            ublk["counters"]["writes"],
            ublk["counters"]["flushes"],
            ublk["counters"]["errors"],
        );
    }
    let nvme = &status["nvme"];
    if !nvme.is_null() {
        let controllers = nvme["controllers"].as_array().cloned().unwrap_or_default();
        out += &format!(
            "nvme-tcp: {} nqn {} ({} controllers)\n",
            nvme["listen"].as_str().unwrap_or("?"),
            nvme["nqn"].as_str().unwrap_or("?"),
            controllers.len()
        );
        for c in &controllers {
            out += &format!(
                "  controller {} host {} from {}{} io_queues={}\n",
                c["cntlid"],
                c["hostnqn"].as_str().unwrap_or("?"),
                c["address"].as_str().unwrap_or("?"),
                if c["discovery"] == true {
                    " (discovery)"
                } else {
                    ""
                },
                c["io_queues"].as_array().map_or(0, Vec::len),
            );
        }
    }
    if !status["array"].is_null() {
        out += &format!("array: {}\n", status["array"]);
    }
    out
}
