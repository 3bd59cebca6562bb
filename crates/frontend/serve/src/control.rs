//! The control socket: a Unix socket beside the export. A client sends one
//! JSON line (`{"command":"status"}`) and reads one JSON line back.

use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use serde_json::{json, Value};

use crate::server::Shared;
use crate::Error;

/// Longest request line accepted.
const REQUEST_MAX_BYTES: u64 = 4096;

pub(crate) struct ControlServer {
    path: PathBuf,
    /// The listening socket, shut down to wake the thread at stop (the
    /// path may be gone by then: its directory removed under the server).
    fd: std::os::fd::RawFd,
    thread: JoinHandle<()>,
    stop: Arc<std::sync::atomic::AtomicBool>,
}

impl ControlServer {
    pub(crate) fn start(path: &Path, shared: Arc<Shared>) -> Result<ControlServer, Error> {
        let _ = std::fs::remove_file(path);
        let listener = UnixListener::bind(path)
            .map_err(|e| Error::Control(format!("{}: {e}", path.display())))?;
        let fd = std::os::fd::AsRawFd::as_raw_fd(&listener);
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let stop_flag = Arc::clone(&stop);
        let thread = std::thread::Builder::new()
            .name("nbd-control".into())
            .spawn(move || {
                for stream in listener.incoming() {
                    if stop_flag.load(std::sync::atomic::Ordering::SeqCst) {
                        break;
                    }
                    if let Ok(stream) = stream {
                        let _ = answer(&shared, stream);
                    }
                }
            })?;
        Ok(ControlServer {
            path: path.to_path_buf(),
            fd,
            thread,
            stop,
        })
    }

    pub(crate) fn stop(self) {
        self.stop.store(true, std::sync::atomic::Ordering::SeqCst);
        // The thread owns the listener until it ends, so `fd` is still it.
        nvraid_io::sys::shutdown_socket(self.fd);
        let _ = self.thread.join();
        let _ = std::fs::remove_file(&self.path);
    }
}

fn answer(shared: &Shared, stream: UnixStream) -> std::io::Result<()> {
    stream.set_read_timeout(Some(Duration::from_secs(5)))?;
    let mut line = String::new();
    BufReader::new((&stream).take(REQUEST_MAX_BYTES)).read_line(&mut line)?;
    let reply = match serde_json::from_str::<Value>(&line) {
        Ok(request) if request["command"] == "status" => status(shared),
        Ok(request) => match &shared.options.command_hook {
            Some(hook) => hook(&request),
            None => json!({"error": format!("unknown command {}", request["command"])}),
        },
        Err(e) => json!({"error": format!("bad request: {e}")}),
    };
    let mut out = serde_json::to_vec(&reply).map_err(std::io::Error::other)?;
    out.push(b'\n');
    (&stream).write_all(&out)
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
            "target": shared.target_description,
            "size_bytes": shared.size_bytes,
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
    let mut line = String::new();
    BufReader::new(&stream).read_line(&mut line).map_err(fail)?;
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
    if !status["array"].is_null() {
        out += &format!("array: {}\n", status["array"]);
    }
    out
}
