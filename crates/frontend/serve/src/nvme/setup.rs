//! Setting NVMe/TCP connections up, on the server's side: the accept
//! loop (admission against the connection limit), and per connection a
//! thread that exchanges ICReq/ICResp within the handshake deadline,
//! builds the queue's record (`record.rs`) from the server's shared
//! state, and runs the queue (`queue.rs`) until its Connect. An admin
//! queue stays on that thread for its life; a connected I/O queue is
//! handed to a worker (`WorkerPool::adopt_nvme`). The only NVMe file that
//! knows the server (`Shared`).

use std::io::{self, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use nvraid_nvme_tcp::pdu::{encode_term_req, IcReq, IcResp, IC_BYTES};

use super::controller::Subsystem;
use super::queue::{Ending, NvmeQueue, Queue, MAX_H2C_DATA};
use super::record::QueueRecord;
use crate::shared::Shared;

/// Accept connections until the server stops; each admitted one gets a
/// thread of its own (`run`). Between connections (at least every 200
/// ms) the served target's size is looked at again (`check_size`).
pub(super) fn accept_loop(
    shared: &Arc<Shared>,
    subsystem: &Arc<Subsystem>,
    listener: &TcpListener,
) {
    let fd = listener.as_raw_fd();
    while !shared.shutdown.is_triggered() {
        // The served array's size, looked at again at least every 200 ms:
        // hosts hear of a change through their admin queues.
        if let Some((old, new)) = subsystem.check_size() {
            shared.log(&format!(
                "event=nvme-namespace-resized old_bytes={old} new_bytes={new}"
            ));
        }
        let mut fds = [libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        }];
        if nvraid_io::sys::poll(&mut fds, 200) == 0 {
            continue;
        }
        let (stream, peer) = match listener.accept() {
            Ok(pair) => pair,
            Err(e) => {
                shared.log(&format!("event=nvme-accept-failed error=\"{e}\""));
                std::thread::sleep(Duration::from_millis(50));
                continue;
            }
        };
        if shared.shutdown.is_triggered() {
            return;
        }
        let id = shared.next_id.fetch_add(1, Ordering::Relaxed);
        let client = format!("nvme-tcp:{peer}#{id}");
        if !shared.admit() {
            shared.log(&format!(
                "client={client} event=refused reason=\"connection limit ({}) reached\"",
                shared.options.connections_max
            ));
            continue;
        }
        let conn_shared = Arc::clone(shared);
        let conn_subsystem = Arc::clone(subsystem);
        let spawned = std::thread::Builder::new()
            .name(format!("nvme-conn-{id}"))
            .spawn(move || run(conn_shared, conn_subsystem, stream, client));
        if spawned.is_err() {
            shared.finished();
        }
    }
}

/// What a queue of this server knows of it: the log, the shutdown, the
/// deadlines, the NVMe counters, and the admission slot to give back.
fn record(shared: &Arc<Shared>) -> QueueRecord {
    let slot_of = Arc::clone(shared);
    QueueRecord {
        log: Arc::clone(&shared.options.log),
        shutdown: shared.shutdown.clone(),
        handshake_timeout: shared.options.handshake_timeout,
        transfer_timeout: shared.options.transfer_timeout,
        idle_timeout: shared.options.idle_timeout,
        counters: Arc::clone(&shared.nvme_counters),
        release: Box::new(move || slot_of.finished()),
    }
}

/// Serve one accepted connection until it ends or goes to a worker; in
/// the first case give its admission slot back (the worker gives it back
/// otherwise).
fn run(shared: Arc<Shared>, subsystem: Arc<Subsystem>, stream: TcpStream, client: String) {
    let _ = stream.set_nodelay(true);
    let local = stream.local_addr().unwrap_or(subsystem.local);
    let record = Arc::new(record(&shared));
    match open(&record, &subsystem, stream, &client, local) {
        Ok(mut queue) => match queue.serve() {
            Some(ending) => queue.finish(ending),
            // An I/O queue, connected: a worker owns it from now on, and
            // gives its admission slot back when it ends.
            None => match queue.prepare_for_worker() {
                Ok(()) => return shared.workers.adopt_nvme(NvmeQueue(queue)),
                Err(ending) => queue.finish(ending),
            },
        },
        Err(ending) => {
            record.log(&format!(
                "client={client} event=nvme-refused reason=\"{}\"",
                ending.reason
            ));
        }
    }
    record.release_slot();
}

/// ICReq/ICResp within the handshake deadline; then the queue starts,
/// its Connect due by the same deadline.
fn open(
    record: &Arc<QueueRecord>,
    subsystem: &Arc<Subsystem>,
    mut stream: TcpStream,
    client: &str,
    local: SocketAddr,
) -> Result<Queue, Ending> {
    let deadline = Instant::now() + record.handshake_timeout;
    let mut ic = [0u8; IC_BYTES];
    read_exact_by(&mut stream, &mut ic, deadline, "ICReq")?;
    let req = match IcReq::parse(&ic) {
        Ok(req) => req,
        Err(e) => {
            let mut out = Vec::new();
            encode_term_req(&mut out, false, e.fes(), 0, &ic);
            let _ = stream.write_all(&out);
            let _ = stream.shutdown(Shutdown::Both);
            return Err(Ending::quiet(format!("bad ICReq: {e}")));
        }
    };
    let resp = IcResp {
        pfv: 0,
        cpda: 0,
        digests: req.digests,
        maxh2cdata: MAX_H2C_DATA,
    };
    let _ = stream.set_write_timeout(Some(record.transfer_timeout));
    stream
        .write_all(&resp.encode())
        .map_err(|e| Ending::quiet(format!("sending ICResp: {e}")))?;
    Queue::start(
        Arc::clone(record),
        subsystem,
        stream,
        client,
        local,
        &req,
        deadline,
    )
}

/// Read `buf` whole by `deadline`.
fn read_exact_by(
    stream: &mut TcpStream,
    buf: &mut [u8],
    deadline: Instant,
    what: &str,
) -> Result<(), Ending> {
    let mut at = 0;
    while at < buf.len() {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(Ending::quiet(format!(
                "no whole {what} within the handshake time"
            )));
        }
        let _ = stream.set_read_timeout(Some(left));
        match stream.read(&mut buf[at..]) {
            Ok(0) => return Err(Ending::quiet(format!("the host closed before its {what}"))),
            Ok(n) => at += n,
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock
                        | io::ErrorKind::TimedOut
                        | io::ErrorKind::Interrupted
                ) => {}
            Err(e) => return Err(Ending::quiet(format!("reading the {what}: {e}"))),
        }
    }
    Ok(())
}
