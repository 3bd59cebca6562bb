//! One NVMe/TCP queue (a controller's admin queue or one of its I/O
//! queues) past ICReq/ICResp: the PDU loop, the commands and the writer.
//! It knows the server only through its record (`record.rs`: log,
//! shutdown, deadlines, counters, admission slot), which the setup side
//! (`setup.rs`) builds; it imports neither `Shared` nor the worker pool.
//!
//! On its connection's thread (`serve`, within the handshake deadline
//! until Fabrics Connect, whose data may come in the capsule or by R2T)
//! it reads PDUs through the codec's `PduReader`, which bounds and checks
//! every header and data PDU. On an admin queue it goes on doing so and
//! answers admin commands; a writer thread alone sends on the socket:
//! responses, C2HData (Identify, log pages), R2Ts and the TermReq that
//! ends a connection whose host broke the protocol. An I/O queue, once
//! connected, becomes an [`NvmeQueue`] that a worker owns: the writer
//! ends after the Connect response, the socket turns non-blocking, and
//! the worker's `pump` reads, runs the same steps, starts the commands'
//! jobs in its slots and writes the encoded answers (reads' data in
//! C2HData) as the socket takes them.
//!
//! Writes whose data does not come in the capsule get an R2T for all of
//! it once their command is checked (a refused command moves no data);
//! the data of writes waiting for theirs is bounded per connection, and
//! the R2Ts of further writes wait until it is free again. Read data and
//! write data in the worker are bounded by the queue's entries times MDTS
//! (128 x 512 KiB by default).

use std::collections::{HashMap, HashSet, VecDeque};
use std::io::{self, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use nvraid_nbd::ErrorCode;
use nvraid_nvme_tcp::command::{
    fctype, opcode, property, sgl, ConnectData, Cqe, Sqe, Status, CONNECT_DATA_BYTES,
    DSM_MAX_RANGES, DSM_RANGE_BYTES,
};
use nvraid_nvme_tcp::error::fes;
use nvraid_nvme_tcp::pdu::{
    data_digest_trailer, encode_c2h_data, encode_capsule_resp, encode_r2t, encode_term_req,
    DataHeader, Digests, Header, IcReq,
};
use nvraid_nvme_tcp::reader::{Event, Expect, PduReader, Role, Want};

use super::controller::{Controller, Notice, Subsystem, AEN_NS_ATTRIBUTE, AEN_NS_CHANGED_RESULT};
use super::data;
use super::record::QueueRecord;
use crate::job::{Finish, Job, Work};
use crate::slots::Slots;
use crate::stats::{Counters, Export};

/// Most data one H2CData PDU carries (ICResp's MAXH2CDATA).
pub(super) const MAX_H2C_DATA: u32 = 128 << 10;
/// Most data one C2HData PDU carries.
const C2H_CHUNK: usize = 128 << 10;
/// Bytes read from the socket at once.
const RX_BYTES: usize = 64 << 10;
/// How often a reader with nothing to read looks at its deadlines.
const TICK: Duration = Duration::from_millis(200);
/// Write data waiting for its H2CData (R2Ts sent, data not all there),
/// per connection; further R2Ts wait.
const R2T_BYTES_MAX: u64 = 8 << 20;
/// Grace past the keep-alive timeout (scheduling on either side).
const KEEP_ALIVE_GRACE: Duration = Duration::from_secs(1);
/// Most log page bytes one Get Log Page returns.
const LOG_PAGE_MAX: u64 = 64 << 10;

/// Status codes (generic, type 0).
mod sc {
    pub const INVALID_OPCODE: u8 = 0x01;
    pub const INVALID_FIELD: u8 = 0x02;
    pub const INTERNAL: u8 = 0x06;
    pub const INVALID_NAMESPACE: u8 = 0x0b;
    pub const COMMAND_SEQUENCE: u8 = 0x0c;
    pub const SGL_LENGTH_INVALID: u8 = 0x0f;
    pub const SGL_TYPE_INVALID: u8 = 0x11;
    pub const LBA_OUT_OF_RANGE: u8 = 0x80;
    pub const WRITE_PROTECTED: u8 = 0x20;
}

fn generic(code: u8) -> Status {
    Status::new(0, code, true)
}

/// What goes out, in order, through the writer.
enum Out {
    Resp(Cqe),
    /// C2HData for `data`, then the response.
    Data {
        data: Vec<u8>,
        len: usize,
        cqe: Cqe,
    },
    R2T {
        cid: u16,
        len: u32,
    },
    Term {
        fes: u16,
        fei: u32,
        quote: Vec<u8>,
    },
}

/// The queue's commands taken and not yet answered, and the bytes those
/// handed to the workers hold.
#[derive(Default)]
struct Inflight {
    state: Mutex<(HashSet<u16>, u64)>,
    changed: Condvar,
}

impl Inflight {
    fn contains(&self, cid: u16) -> bool {
        self.state.lock().expect("inflight").0.contains(&cid)
    }
    fn count(&self) -> usize {
        self.state.lock().expect("inflight").0.len()
    }
    fn take(&self, cid: u16) {
        self.state.lock().expect("inflight").0.insert(cid);
    }
    /// `cid` is answered (its bytes, if any, given back).
    fn answered(&self, cid: u16, bytes: u64) {
        let mut state = self.state.lock().expect("inflight");
        state.0.remove(&cid);
        state.1 -= bytes;
        self.changed.notify_all();
    }
    /// Count the bytes of commands handed to the worker (bounded by the
    /// queue's entries times MDTS).
    fn add(&self, bytes: u64) {
        self.state.lock().expect("inflight").1 += bytes;
    }
    fn wait_empty(&self) {
        let mut state = self.state.lock().expect("inflight");
        while !state.0.is_empty() {
            state = self.changed.wait(state).expect("inflight");
        }
    }
}

/// A command's data arriving: in the capsule, or by H2CData after an R2T.
struct Incoming {
    sqe: Sqe,
    buf: Vec<u8>,
    got: u32,
    capsule: bool,
    since: Instant,
}

/// Why the connection ended, and the TermReq to send first, if any.
pub(super) struct Ending {
    pub reason: String,
    pub term: Option<u16>,
}

impl Ending {
    pub(super) fn quiet(reason: impl Into<String>) -> Ending {
        Ending {
            reason: reason.into(),
            term: None,
        }
    }
    fn fatal(fes: u16, reason: impl Into<String>) -> Ending {
        Ending {
            reason: reason.into(),
            term: Some(fes),
        }
    }
}

/// An I/O queue a worker owns (see `worker.rs`): read, answered and
/// written without blocking, its commands' jobs run in that worker's
/// slots.
pub(crate) struct NvmeQueue(pub(super) Queue);

/// A worker's queue: what is to be sent, written as the socket takes it.
struct OwnedIo {
    rx: Receiver<Out>,
    out: Vec<u8>,
    sent: usize,
    /// Jobs for the worker's slots.
    jobs: Vec<Job>,
    /// Since when answers have waited and the host has taken none.
    out_since: Option<Instant>,
    reading: bool,
    broken: bool,
}

pub(super) struct Queue {
    record: Arc<QueueRecord>,
    subsystem: Arc<Subsystem>,
    stream: TcpStream,
    client: String,
    local: SocketAddr,
    tx: Option<Sender<Out>>,
    writer: Option<std::thread::JoinHandle<()>>,
    inflight: Arc<Inflight>,
    reader: PduReader,
    digests: Digests,
    hpda: u8,
    /// Owned by a worker (I/O queues after Connect); `None`: on this
    /// connection's threads.
    owned: Option<OwnedIo>,
    rx: Box<[u8]>,
    rx_start: usize,
    rx_end: usize,
    incoming: HashMap<u16, Incoming>,
    /// Writes checked and waiting for their R2T (the R2T budget is spent).
    waiting_r2t: VecDeque<Sqe>,
    r2t_bytes: u64,
    /// Asynchronous Event Requests held, answered when an event is
    /// raised (`raise_events`: the namespace changed size).
    held_aers: Vec<u16>,
    setup_deadline: Instant,
    qid: u16,
    /// Queue entries (SQSIZE + 1), once connected.
    entries: u32,
    sq_head: u16,
    controller: Option<Arc<Controller>>,
    /// The last command on the admin queue (keep-alive).
    last_admin: Instant,
    /// Since when a PDU has been half read.
    pdu_since: Option<Instant>,
}

impl Queue {
    /// A queue on a connection past ICReq/ICResp (the host asked for
    /// `req`'s digests and alignment); its Connect is due by `deadline`.
    /// The writer starts.
    pub(super) fn start(
        record: Arc<QueueRecord>,
        subsystem: &Arc<Subsystem>,
        stream: TcpStream,
        client: &str,
        local: SocketAddr,
        req: &IcReq,
        deadline: Instant,
    ) -> Result<Queue, Ending> {
        let _ = stream.set_read_timeout(Some(TICK));
        let (tx, rx) = mpsc::channel();
        let inflight = Arc::new(Inflight::default());
        let writer_stream = stream
            .try_clone()
            .map_err(|e| Ending::quiet(format!("cannot clone the socket: {e}")))?;
        let writer_inflight = Arc::clone(&inflight);
        let digests = req.digests;
        let hpda = req.hpda;
        let writer = std::thread::Builder::new()
            .name("nvme-writer".into())
            .spawn(move || writer(writer_stream, rx, digests, hpda, &writer_inflight))
            .map_err(|e| Ending::quiet(format!("cannot start the writer: {e}")))?;
        Ok(Queue {
            record,
            subsystem: Arc::clone(subsystem),
            stream,
            client: client.to_string(),
            local,
            tx: Some(tx),
            writer: Some(writer),
            inflight,
            // Before Connect, the admin queue's 8 KiB of in-capsule data
            // (Connect's own data is 1 KiB).
            reader: PduReader::new(
                Role::Controller,
                digests,
                MAX_H2C_DATA,
                subsystem.in_capsule_bytes.max(8192),
            ),
            digests,
            hpda,
            owned: None,
            rx: vec![0u8; RX_BYTES].into_boxed_slice(),
            rx_start: 0,
            rx_end: 0,
            incoming: HashMap::new(),
            waiting_r2t: VecDeque::new(),
            r2t_bytes: 0,
            held_aers: Vec::new(),
            setup_deadline: deadline,
            qid: 0,
            entries: 0,
            sq_head: 0,
            controller: None,
            last_admin: Instant::now(),
            pdu_since: None,
        })
    }

    fn log(&self, event: &str) {
        self.record.log(&format!("client={} {event}", self.client));
    }

    fn send(&self, out: Out) {
        if let Some(tx) = &self.tx {
            let _ = tx.send(out);
        }
    }

    /// Read and run PDUs until the connection ends, or (`None`) until
    /// an I/O queue is connected and goes to a worker.
    pub(super) fn serve(&mut self) -> Option<Ending> {
        loop {
            if let Some(ending) = self.check_time() {
                return Some(ending);
            }
            self.raise_events();
            if self.rx_start == self.rx_end {
                self.rx_start = 0;
                self.rx_end = 0;
                match self.stream.read(&mut self.rx) {
                    Ok(0) => return Some(Ending::quiet("the host closed the connection")),
                    Ok(n) => self.rx_end = n,
                    Err(e)
                        if matches!(
                            e.kind(),
                            io::ErrorKind::WouldBlock
                                | io::ErrorKind::TimedOut
                                | io::ErrorKind::Interrupted
                        ) =>
                    {
                        continue
                    }
                    Err(e) => return Some(Ending::quiet(format!("reading failed: {e}"))),
                }
            }
            while self.rx_start < self.rx_end {
                if let Err(ending) = self.step() {
                    return Some(ending);
                }
                if self.qid > 0 && self.controller.is_some() {
                    return None;
                }
            }
        }
    }

    /// From this connection's threads to a worker: the writer sends the
    /// Connect response and ends; the socket turns non-blocking. Bytes
    /// the host sent after Connect stay in the receive buffer.
    pub(super) fn prepare_for_worker(&mut self) -> Result<(), Ending> {
        self.stream
            .set_nonblocking(true)
            .map_err(|e| Ending::quiet(format!("cannot make the socket non-blocking: {e}")))?;
        self.tx = None;
        if let Some(writer) = self.writer.take() {
            let _ = writer.join();
        }
        let (tx, rx) = mpsc::channel();
        self.tx = Some(tx);
        self.owned = Some(OwnedIo {
            rx,
            out: Vec::new(),
            sent: 0,
            jobs: Vec::new(),
            out_since: None,
            reading: true,
            broken: false,
        });
        Ok(())
    }

    /// On the admin queue: an event its controller has raised and the host
    /// asked to hear of (Namespace Attribute Notices) completes the oldest
    /// held Asynchronous Event Request; the event is then masked until the
    /// host reads the Changed Namespace List.
    fn raise_events(&mut self) {
        if self.qid != 0 || self.held_aers.is_empty() {
            return;
        }
        let Some(controller) = &self.controller else {
            return;
        };
        let mut state = controller.state.lock().expect("controller state");
        if state.ns_notice != Notice::Raised || state.async_config & AEN_NS_ATTRIBUTE == 0 {
            return;
        }
        state.ns_notice = Notice::Reported;
        drop(state);
        let cid = self.held_aers.remove(0);
        self.send(Out::Resp(Cqe {
            result: AEN_NS_CHANGED_RESULT,
            sq_head: self.sq_head,
            sq_id: 0,
            cid,
            status: Status::SUCCESS,
        }));
    }

    /// The Changed Namespace List log page (4 KiB: NSID 1 when the
    /// namespace changed since the host last read it); reading it clears
    /// the list and unmasks the notice, unless the host asks to retain the
    /// event (RAE, bit 15 of CDW10).
    fn changed_namespaces(&self, controller: &Controller, sqe: &Sqe) -> Vec<u8> {
        let mut page = vec![0u8; 4096];
        let mut state = controller.state.lock().expect("controller state");
        if state.ns_changed {
            page[..4].copy_from_slice(&1u32.to_le_bytes());
        }
        if sqe.cdw(10) & (1 << 15) == 0 {
            state.ns_changed = false;
            state.ns_notice = Notice::None;
        }
        page
    }

    /// The deadlines: setup, a half-read PDU or write data, keep-alive;
    /// and the server's shutdown, the controller's end.
    fn check_time(&mut self) -> Option<Ending> {
        let now = Instant::now();
        if self.record.shutdown.is_triggered() {
            return Some(Ending::quiet("the server is stopping"));
        }
        let Some(controller) = &self.controller else {
            if now >= self.setup_deadline {
                return Some(Ending::quiet(format!(
                    "no Connect within the handshake time ({} s)",
                    self.record.handshake_timeout.as_secs()
                )));
            }
            return None;
        };
        if controller.dead.load(Ordering::Acquire) {
            return Some(Ending::quiet(format!(
                "controller {} ended",
                controller.cntlid
            )));
        }
        let transfer = self.record.transfer_timeout;
        let oldest_data = self.incoming.values().map(|i| i.since).min();
        let stuck = [self.pdu_since, oldest_data]
            .into_iter()
            .flatten()
            .any(|since| now.duration_since(since) > transfer);
        if stuck {
            return Some(Ending::fatal(
                fes::PDU_SEQUENCE_ERROR,
                format!(
                    "a PDU or a write's data not complete within the transfer time ({} s)",
                    transfer.as_secs()
                ),
            ));
        }
        if self.qid == 0 {
            let kato = controller.state.lock().expect("controller state").kato_ms;
            let limit = if kato > 0 {
                Some(Duration::from_millis(u64::from(kato)) + KEEP_ALIVE_GRACE)
            } else {
                self.record.idle_timeout
            };
            if let Some(limit) = limit {
                if now.duration_since(self.last_admin) > limit {
                    return Some(Ending::quiet(format!(
                        "no command on the admin queue within its keep-alive timeout ({} ms)",
                        limit.as_millis()
                    )));
                }
            }
        }
        None
    }

    /// Move buffered bytes into the PDU reader (or a command's data) and
    /// act on what it produced.
    fn step(&mut self) -> Result<(), Ending> {
        let avail = self.rx_end - self.rx_start;
        let incoming = &self.incoming;
        let lookup = |cid: u16| {
            incoming.get(&cid).filter(|i| !i.capsule).map(|i| Expect {
                limit: i.buf.len() as u32,
                next: i.got,
                to_host: false,
                ttag: cid,
            })
        };
        let event = match self.reader.want() {
            Want::Bytes(n) => {
                let k = n.min(avail);
                self.reader.buffer()[..k]
                    .copy_from_slice(&self.rx[self.rx_start..self.rx_start + k]);
                self.rx_start += k;
                self.reader.filled(k, &lookup)
            }
            Want::Data { cid, offset, len } => {
                let k = (len as usize).min(avail);
                let Some(entry) = self.incoming.get_mut(&cid) else {
                    panic!("invariant: data is read only for a command whose data is expected");
                };
                let at = offset as usize;
                entry.buf[at..at + k].copy_from_slice(&self.rx[self.rx_start..self.rx_start + k]);
                self.rx_start += k;
                self.reader.data_moved(&entry.buf[at..at + k])
            }
        };
        let event = event.map_err(|e| Ending::fatal(e.fes(), format!("protocol error: {e}")))?;
        if self.reader.idle() {
            self.pdu_since = None;
        } else if self.pdu_since.is_none() {
            self.pdu_since = Some(Instant::now());
        }
        match event {
            None => Ok(()),
            Some(Event::Header(Header::CapsuleCmd { sqe })) => self.command_header(sqe),
            Some(Event::Header(_)) => Ok(()),
            Some(Event::DataDone { cid, len, .. }) => self.data_done(cid, len),
            Some(Event::Term(term)) => Err(Ending::quiet(format!(
                "the host ended the connection: {term}"
            ))),
        }
    }

    /// A command capsule arrived (its in-capsule data, if any, follows).
    fn command_header(&mut self, sqe: Sqe) -> Result<(), Ending> {
        let cid = sqe.cid();
        if self.inflight.contains(cid) || self.held_aers.contains(&cid) {
            return Err(Ending::fatal(
                fes::PDU_SEQUENCE_ERROR,
                format!("command id {cid} sent again while it is in flight"),
            ));
        }
        if self.entries > 0 && self.inflight.count() + self.held_aers.len() >= self.entries as usize
        {
            return Err(Ending::fatal(
                fes::PDU_SEQUENCE_ERROR,
                format!(
                    "more commands in flight than the queue's {} entries",
                    self.entries
                ),
            ));
        }
        self.inflight.take(cid);
        if self.entries > 0 {
            self.sq_head = ((u32::from(self.sq_head) + 1) % self.entries) as u16;
        }
        if !self.reader.idle() {
            // In-capsule data follows (the reader checked it matches the
            // SGL and the in-capsule limit).
            let (len, _) = sqe.sgl();
            self.incoming.insert(
                cid,
                Incoming {
                    sqe,
                    buf: vec![0u8; len as usize],
                    got: 0,
                    capsule: true,
                    since: Instant::now(),
                },
            );
            return Ok(());
        }
        let (len, kind) = sqe.sgl();
        if to_controller(&sqe) && len > 0 {
            if kind == sgl::IN_CAPSULE {
                self.answer(&sqe, generic(sc::SGL_LENGTH_INVALID), 0);
                return Ok(());
            }
            if kind != sgl::TRANSPORT {
                self.answer(&sqe, generic(sc::SGL_TYPE_INVALID), 0);
                return Ok(());
            }
            return self.ask_for_data(sqe);
        }
        self.command(sqe, None)
    }

    /// A command whose data the host sends after an R2T: checked first
    /// (a refused command moves no data), then the R2T, or a wait for the
    /// budget.
    fn ask_for_data(&mut self, sqe: Sqe) -> Result<(), Ending> {
        let (len, _) = sqe.sgl();
        if let Err(status) = self.check_before_data(&sqe, len) {
            self.answer(&sqe, status, 0);
            return Ok(());
        }
        self.waiting_r2t.push_back(sqe);
        self.send_r2ts();
        Ok(())
    }

    /// R2Ts for the waiting writes, while the budget allows (one always
    /// goes when none is outstanding).
    fn send_r2ts(&mut self) {
        while let Some(sqe) = self.waiting_r2t.front() {
            let (len, _) = sqe.sgl();
            if self.r2t_bytes > 0 && self.r2t_bytes + u64::from(len) > R2T_BYTES_MAX {
                return;
            }
            let Some(sqe) = self.waiting_r2t.pop_front() else {
                return;
            };
            self.r2t_bytes += u64::from(len);
            self.incoming.insert(
                sqe.cid(),
                Incoming {
                    sqe,
                    buf: vec![0u8; len as usize],
                    got: 0,
                    capsule: false,
                    since: Instant::now(),
                },
            );
            self.send(Out::R2T {
                cid: sqe.cid(),
                len,
            });
        }
    }

    /// Data of command `cid` arrived: once all of it has, run it.
    fn data_done(&mut self, cid: u16, len: u32) -> Result<(), Ending> {
        let Some(entry) = self.incoming.get_mut(&cid) else {
            panic!("invariant: data is done only for a command whose data is expected");
        };
        entry.got += len;
        if (entry.got as usize) < entry.buf.len() {
            return Ok(());
        }
        let Some(entry) = self.incoming.remove(&cid) else {
            panic!("invariant: the entry was just seen");
        };
        if !entry.capsule {
            self.r2t_bytes -= entry.buf.len() as u64;
            self.send_r2ts();
        }
        self.command(entry.sqe, Some(entry.buf))
    }

    fn cqe(&self, sqe: &Sqe, status: Status, result: u64) -> Cqe {
        Cqe {
            result,
            sq_head: self.sq_head,
            sq_id: self.qid,
            cid: sqe.cid(),
            status,
        }
    }

    fn answer(&self, sqe: &Sqe, status: Status, result: u64) {
        self.send(Out::Resp(self.cqe(sqe, status, result)));
    }

    /// Answer with data to the host (at most the command's SGL length).
    fn answer_data(&self, sqe: &Sqe, mut bytes: Vec<u8>) {
        let (len, kind) = sqe.sgl();
        if kind != sgl::TRANSPORT || len == 0 {
            return self.answer(sqe, generic(sc::SGL_TYPE_INVALID), 0);
        }
        bytes.resize(len as usize, 0);
        let cqe = self.cqe(sqe, Status::SUCCESS, 0);
        self.send(Out::Data {
            len: bytes.len(),
            data: bytes,
            cqe,
        });
    }

    /// Run a command (its data, for one that carries some, in `data`).
    fn command(&mut self, sqe: Sqe, data: Option<Vec<u8>>) -> Result<(), Ending> {
        if self.controller.is_none() {
            if sqe.opcode() == opcode::FABRICS && sqe.fctype() == fctype::CONNECT {
                return self.connect(&sqe, data);
            }
            // Never answered: it leaves the in-flight set here.
            self.inflight.answered(sqe.cid(), 0);
            return Err(Ending::fatal(
                fes::PDU_SEQUENCE_ERROR,
                format!("command {:#04x} before Fabrics Connect", sqe.opcode()),
            ));
        }
        if self.qid == 0 {
            self.last_admin = Instant::now();
        }
        if sqe.opcode() == opcode::FABRICS {
            return self.fabrics(&sqe);
        }
        if self.qid == 0 {
            self.admin(&sqe);
            Ok(())
        } else {
            self.io(&sqe, data);
            Ok(())
        }
    }

    /// Fabrics Connect: the first command of every queue.
    fn connect(&mut self, sqe: &Sqe, data: Option<Vec<u8>>) -> Result<(), Ending> {
        let data = match data {
            Some(d) if d.len() == CONNECT_DATA_BYTES => d,
            _ => {
                self.answer(sqe, generic(sc::SGL_LENGTH_INVALID), 0);
                return Err(Ending::quiet("Connect without its 1 KiB of data"));
            }
        };
        let recfmt = sqe.cdw(10) & 0xffff;
        let qid = (sqe.cdw(10) >> 16) as u16;
        let sqsize = (sqe.cdw(11) & 0xffff) as u16;
        let kato = sqe.cdw(12);
        let refused = |queue: &Queue, status: Status, result: u64, reason: String| {
            queue.answer(sqe, status, result);
            Ending::quiet(format!("Connect refused: {reason}"))
        };
        if recfmt != 0 {
            return Err(refused(
                self,
                Status::new(
                    1,
                    super::controller::connect_status::INCOMPATIBLE_FORMAT,
                    true,
                ),
                0,
                format!("record format {recfmt}"),
            ));
        }
        let connect = match ConnectData::parse(&data) {
            Ok(c) => c,
            Err(e) => {
                return Err(refused(
                    self,
                    Status::new(
                        1,
                        super::controller::connect_status::INVALID_PARAMETERS,
                        true,
                    ),
                    super::controller::connect_field::DATA_SUBNQN,
                    format!("bad Connect data: {e}"),
                ))
            }
        };
        let result = if qid == 0 {
            self.subsystem
                .connect_admin(&connect, sqsize, kato, &self.client)
        } else {
            self.subsystem
                .connect_io(&connect, qid, sqsize, &self.stream)
        };
        let controller = match result {
            Ok(c) => c,
            Err(refusal) => {
                return Err(refused(self, refusal.status, refusal.field, refusal.reason));
            }
        };
        self.qid = qid;
        self.entries = u32::from(sqsize) + 1;
        self.last_admin = Instant::now();
        let cntlid = controller.cntlid;
        self.log(&format!(
            "event=nvme-connected host={:?} controller={cntlid} queue={qid} entries={}{}",
            connect.hostnqn,
            self.entries,
            if controller.discovery {
                " discovery=true"
            } else {
                ""
            }
        ));
        self.controller = Some(controller);
        if qid > 0 {
            // I/O queues: the I/O commands' in-capsule limit.
            let reader = PduReader::new(
                Role::Controller,
                self.reader_digests(),
                MAX_H2C_DATA,
                self.subsystem.in_capsule_bytes,
            );
            if self.reader.idle() {
                self.reader = reader;
            }
        }
        self.answer(sqe, Status::SUCCESS, u64::from(cntlid));
        Ok(())
    }

    fn reader_digests(&self) -> Digests {
        self.digests
    }

    /// Property Get/Set (admin queue), Disconnect (I/O queue); a second
    /// Connect is a sequence error.
    fn fabrics(&mut self, sqe: &Sqe) -> Result<(), Ending> {
        let Some(controller) = self.controller.clone() else {
            panic!("invariant: fabrics() runs after Connect");
        };
        match sqe.fctype() {
            fctype::CONNECT => self.answer(sqe, generic(sc::COMMAND_SEQUENCE), 0),
            fctype::PROPERTY_GET if self.qid == 0 => {
                let offset = sqe.cdw(11);
                let eight = sqe.0[40] & 7 == 1;
                let state = controller.state.lock().expect("controller state");
                let value = match (offset, eight) {
                    (property::CAP, true) => Some(data::cap(&self.subsystem)),
                    (property::VS, false) => Some(u64::from(data::VERSION)),
                    (property::CC, false) => Some(u64::from(state.cc)),
                    (property::CSTS, false) => Some(u64::from(state.csts)),
                    _ => None,
                };
                drop(state);
                match value {
                    Some(v) => self.answer(sqe, Status::SUCCESS, v),
                    None => self.answer(sqe, generic(sc::INVALID_FIELD), 0),
                }
            }
            fctype::PROPERTY_SET if self.qid == 0 => {
                let offset = sqe.cdw(11);
                let value = u32::from_le_bytes([sqe.0[48], sqe.0[49], sqe.0[50], sqe.0[51]]);
                if offset != property::CC || sqe.0[40] & 7 != 0 {
                    self.answer(sqe, generic(sc::INVALID_FIELD), 0);
                    return Ok(());
                }
                let mut state = controller.state.lock().expect("controller state");
                let was_enabled = state.cc & property::CC_EN != 0;
                let enable = value & property::CC_EN != 0;
                let entry_sizes_ok =
                    controller.discovery || (value >> 16 & 0xf == 6 && value >> 20 & 0xf == 4);
                if enable && !was_enabled && !entry_sizes_ok {
                    drop(state);
                    self.answer(sqe, generic(sc::INVALID_FIELD), 0);
                    return Ok(());
                }
                state.cc = value;
                let shutdown = (value >> 14) & 3 != 0;
                let mut csts = u32::from(enable);
                if shutdown {
                    // Shutdown processing complete at once: the server
                    // flushes when it stops, and writes are not held here.
                    csts |= 2 << 2;
                }
                state.csts = csts;
                drop(state);
                if enable != was_enabled || shutdown {
                    self.log(&format!(
                        "event=nvme-controller controller={} enabled={enable} shutdown={shutdown}",
                        controller.cntlid
                    ));
                }
                self.answer(sqe, Status::SUCCESS, 0);
            }
            fctype::DISCONNECT if self.qid > 0 => {
                self.answer(sqe, Status::SUCCESS, 0);
                return Err(Ending::quiet("the host disconnected the queue"));
            }
            _ => self.answer(sqe, generic(sc::INVALID_FIELD), 0),
        }
        Ok(())
    }

    /// An admin command.
    fn admin(&mut self, sqe: &Sqe) {
        let Some(controller) = self.controller.clone() else {
            panic!("invariant: admin() runs after Connect");
        };
        let subsystem = Arc::clone(&self.subsystem);
        match sqe.opcode() {
            opcode::IDENTIFY => {
                let cns = sqe.cdw(10) & 0xff;
                let nsid = sqe.nsid();
                let bytes = match (cns, controller.discovery) {
                    (1, discovery) => Some(data::identify_controller(
                        &subsystem,
                        controller.cntlid,
                        discovery,
                    )),
                    (0, false) if nsid == 1 => Some(data::identify_namespace(&subsystem)),
                    (3, false) if nsid == 1 => Some(data::namespace_descriptors(&subsystem)),
                    (0 | 3, false) => {
                        return self.answer(sqe, generic(sc::INVALID_NAMESPACE), 0);
                    }
                    (2, false) => Some(data::active_namespaces(nsid)),
                    _ => None,
                };
                match bytes {
                    Some(b) if sqe.sgl().0 as usize <= b.len() => self.answer_data(sqe, b),
                    _ => self.answer(sqe, generic(sc::INVALID_FIELD), 0),
                }
            }
            opcode::GET_LOG_PAGE => {
                let lid = (sqe.cdw(10) & 0xff) as u8;
                let numd =
                    ((u64::from(sqe.cdw(11)) & 0xffff) << 16 | u64::from(sqe.cdw(10) >> 16)) + 1;
                let len = numd * 4;
                let offset = u64::from(sqe.cdw(12)) | u64::from(sqe.cdw(13)) << 32;
                if len > LOG_PAGE_MAX || u64::from(sqe.sgl().0) != len {
                    return self.answer(sqe, generic(sc::INVALID_FIELD), 0);
                }
                let page = if lid == 0x04 && !controller.discovery {
                    Some(self.changed_namespaces(&controller, sqe))
                } else {
                    data::log_page(&subsystem, lid, controller.discovery, self.local)
                };
                match page {
                    Some(page) => {
                        let start = offset.min(page.len() as u64) as usize;
                        let end = (offset.saturating_add(len)).min(page.len() as u64) as usize;
                        let mut out = page[start..end].to_vec();
                        out.resize(len as usize, 0);
                        self.answer_data(sqe, out);
                    }
                    // Invalid Log Page.
                    None => self.answer(sqe, Status::new(1, 0x09, true), 0),
                }
            }
            opcode::SET_FEATURES => {
                let fid = sqe.cdw(10) & 0xff;
                let value = sqe.cdw(11);
                let mut state = controller.state.lock().expect("controller state");
                let result = match fid {
                    0x07 if !controller.discovery => {
                        let nsqr = value & 0xffff;
                        let ncqr = value >> 16;
                        if nsqr == 0xffff || ncqr == 0xffff {
                            None
                        } else {
                            let asked = nsqr.max(ncqr) + 1;
                            let granted = asked.min(u32::from(subsystem.queues_max)) as u16;
                            state.queues_granted = granted;
                            let n = u64::from(granted - 1);
                            Some(n | n << 16)
                        }
                    }
                    0x0b => {
                        state.async_config = value;
                        Some(0)
                    }
                    0x0f => {
                        state.kato_ms = value;
                        Some(0)
                    }
                    _ => None,
                };
                drop(state);
                match result {
                    Some(r) => self.answer(sqe, Status::SUCCESS, r),
                    None => self.answer(sqe, generic(sc::INVALID_FIELD), 0),
                }
            }
            opcode::GET_FEATURES => {
                let fid = sqe.cdw(10) & 0xff;
                let state = controller.state.lock().expect("controller state");
                let result = match fid {
                    0x07 if !controller.discovery => {
                        let n = u64::from(state.queues_granted.max(1) - 1);
                        Some(n | n << 16)
                    }
                    0x06 if !controller.discovery => Some(1),
                    0x0b => Some(u64::from(state.async_config)),
                    0x0f => Some(u64::from(state.kato_ms)),
                    _ => None,
                };
                drop(state);
                match result {
                    Some(r) => self.answer(sqe, Status::SUCCESS, r),
                    None => self.answer(sqe, generic(sc::INVALID_FIELD), 0),
                }
            }
            opcode::ASYNC_EVENT => {
                if self.held_aers.len() >= data::AER_MAX {
                    // Asynchronous Event Request Limit Exceeded.
                    return self.answer(sqe, Status::new(1, 0x05, true), 0);
                }
                // Held: not in flight for the drain at the end.
                self.held_aers.push(sqe.cid());
                self.inflight.answered(sqe.cid(), 0);
                self.raise_events();
            }
            opcode::KEEP_ALIVE => self.answer(sqe, Status::SUCCESS, 0),
            // Abort: the command is not aborted (result bit 0).
            0x08 => self.answer(sqe, Status::SUCCESS, 1),
            _ => self.answer(sqe, generic(sc::INVALID_OPCODE), 0),
        }
    }

    /// What must hold before a write's data is asked for.
    fn check_before_data(&self, sqe: &Sqe, len: u32) -> Result<(), Status> {
        if self.controller.is_none() {
            // Connect's data.
            if sqe.opcode() == opcode::FABRICS
                && sqe.fctype() == fctype::CONNECT
                && len as usize == CONNECT_DATA_BYTES
            {
                return Ok(());
            }
            return Err(generic(sc::COMMAND_SEQUENCE));
        }
        if self.qid == 0 {
            // No admin command here takes data from the host.
            return Err(generic(sc::INVALID_OPCODE));
        }
        match sqe.opcode() {
            opcode::WRITE => self.check_rw(sqe, true).map(|_| ()),
            opcode::DSM => self.check_dsm(sqe, len),
            _ => Err(generic(sc::INVALID_OPCODE)),
        }
    }

    /// A Read or Write: namespace, range, length; its byte offset and
    /// length.
    fn check_rw(&self, sqe: &Sqe, write: bool) -> Result<(u64, u32), Status> {
        let s = &self.subsystem;
        if sqe.nsid() != 1 {
            return Err(generic(sc::INVALID_NAMESPACE));
        }
        if write && s.read_only {
            return Err(generic(sc::WRITE_PROTECTED));
        }
        let (slba, blocks) = sqe.lba_range();
        if slba
            .checked_add(u64::from(blocks))
            .is_none_or(|end| end > s.blocks())
        {
            return Err(generic(sc::LBA_OUT_OF_RANGE));
        }
        let bytes = u64::from(blocks) * u64::from(s.block_bytes);
        if bytes > u64::from(s.max_command_bytes) {
            return Err(generic(sc::INVALID_FIELD));
        }
        if u64::from(sqe.sgl().0) != bytes {
            return Err(generic(sc::SGL_LENGTH_INVALID));
        }
        Ok((slba * u64::from(s.block_bytes), bytes as u32))
    }

    fn check_dsm(&self, sqe: &Sqe, len: u32) -> Result<(), Status> {
        if sqe.nsid() != 1 {
            return Err(generic(sc::INVALID_NAMESPACE));
        }
        if self.subsystem.read_only {
            return Err(generic(sc::WRITE_PROTECTED));
        }
        // The data holds at least the command's ranges; Linux always
        // sends room for all 256 (4 KiB), whatever NR says. More than 256
        // ranges' worth is refused.
        let ranges = (sqe.cdw(10) & 0xff) as usize + 1;
        let len = len as usize;
        if len < ranges * DSM_RANGE_BYTES || len > DSM_MAX_RANGES * DSM_RANGE_BYTES {
            return Err(generic(sc::SGL_LENGTH_INVALID));
        }
        Ok(())
    }

    /// An I/O command: checked, then jobs for the workers.
    fn io(&mut self, sqe: &Sqe, data: Option<Vec<u8>>) {
        let s = Arc::clone(&self.subsystem);
        let bb = u64::from(s.block_bytes);
        let record = Arc::clone(&self.record);
        let counters = &record.counters;
        let fua = sqe.cdw(12) & (1 << 30) != 0;
        match sqe.opcode() {
            opcode::READ => match self.check_rw(sqe, false) {
                Err(status) => self.answer(sqe, status, 0),
                Ok((offset, len)) => {
                    if sqe.sgl().1 != sgl::TRANSPORT {
                        return self.answer(sqe, generic(sc::SGL_TYPE_INVALID), 0);
                    }
                    counters.reads.fetch_add(1, Ordering::Relaxed);
                    counters
                        .read_bytes
                        .fetch_add(u64::from(len), Ordering::Relaxed);
                    let buffer = vec![0u8; len as usize];
                    self.submit(sqe, vec![(Work::Read, offset, len, fua, buffer)], true);
                }
            },
            opcode::WRITE => match (self.check_rw(sqe, true), data) {
                (Err(status), _) => self.answer(sqe, status, 0),
                (Ok(_), None) => self.answer(sqe, generic(sc::SGL_LENGTH_INVALID), 0),
                (Ok((offset, len)), Some(buffer)) => {
                    counters.writes.fetch_add(1, Ordering::Relaxed);
                    counters
                        .written_bytes
                        .fetch_add(u64::from(len), Ordering::Relaxed);
                    self.submit(sqe, vec![(Work::Write, offset, len, fua, buffer)], false);
                }
            },
            opcode::FLUSH => {
                if sqe.nsid() != 1 && sqe.nsid() != 0xffff_ffff {
                    return self.answer(sqe, generic(sc::INVALID_NAMESPACE), 0);
                }
                counters.flushes.fetch_add(1, Ordering::Relaxed);
                self.submit(sqe, vec![(Work::Flush, 0, 0, false, Vec::new())], false);
            }
            opcode::WRITE_ZEROES => {
                if sqe.nsid() != 1 {
                    return self.answer(sqe, generic(sc::INVALID_NAMESPACE), 0);
                }
                if s.read_only {
                    return self.answer(sqe, generic(sc::WRITE_PROTECTED), 0);
                }
                let (slba, blocks) = sqe.lba_range();
                if slba
                    .checked_add(u64::from(blocks))
                    .is_none_or(|end| end > s.blocks())
                {
                    return self.answer(sqe, generic(sc::LBA_OUT_OF_RANGE), 0);
                }
                counters.zeroes.fetch_add(1, Ordering::Relaxed);
                let jobs = split(slba * bb, u64::from(blocks) * bb)
                    .map(|(at, len)| (Work::Zero, at, len, fua, Vec::new()))
                    .collect();
                self.submit(sqe, jobs, false);
            }
            opcode::DSM => {
                let len = sqe.sgl().0;
                if let Err(status) = self.check_dsm(sqe, len) {
                    return self.answer(sqe, status, 0);
                }
                let Some(ranges) = data else {
                    return self.answer(sqe, generic(sc::SGL_LENGTH_INVALID), 0);
                };
                // Only deallocate does anything (the other attributes are
                // hints).
                if sqe.cdw(11) & (1 << 2) == 0 {
                    return self.answer(sqe, Status::SUCCESS, 0);
                }
                let count = (sqe.cdw(10) & 0xff) as usize + 1;
                let mut jobs = Vec::new();
                for range in ranges.chunks_exact(DSM_RANGE_BYTES).take(count) {
                    let blocks = u32::from_le_bytes([range[4], range[5], range[6], range[7]]);
                    let mut slba_bytes = [0u8; 8];
                    slba_bytes.copy_from_slice(&range[8..16]);
                    let slba = u64::from_le_bytes(slba_bytes);
                    if slba
                        .checked_add(u64::from(blocks))
                        .is_none_or(|end| end > s.blocks())
                    {
                        // Nothing is discarded when any range is bad.
                        return self.answer(sqe, generic(sc::LBA_OUT_OF_RANGE), 0);
                    }
                    jobs.extend(
                        split(slba * bb, u64::from(blocks) * bb)
                            .map(|(at, len)| (Work::Discard, at, len, false, Vec::new())),
                    );
                }
                counters.trims.fetch_add(1, Ordering::Relaxed);
                if jobs.is_empty() {
                    return self.answer(sqe, Status::SUCCESS, 0);
                }
                self.submit(sqe, jobs, false);
            }
            _ => self.answer(sqe, generic(sc::INVALID_OPCODE), 0),
        }
    }

    /// Hand a command's jobs to the workers (round robin); the last to
    /// finish answers it.
    fn submit(&mut self, sqe: &Sqe, jobs: Vec<(Work, u64, u32, bool, Vec<u8>)>, read: bool) {
        // I/O commands run only on queues a worker owns (an I/O queue goes
        // to its worker right after Connect).
        let (Some(tx), true) = (self.tx.clone(), self.owned.is_some()) else {
            return self.answer(sqe, Status::new(0, sc::INTERNAL, false), 0);
        };
        let bytes: u64 = jobs
            .iter()
            .filter(|j| matches!(j.0, Work::Read | Work::Write))
            .map(|j| u64::from(j.2))
            .sum();
        self.inflight.add(bytes);
        let done = Arc::new(Done {
            tx: Mutex::new(tx),
            cqe: self.cqe(sqe, Status::SUCCESS, 0),
            read,
            write: sqe.opcode() == opcode::WRITE,
            bytes,
            remaining: AtomicU32::new(jobs.len() as u32),
            error: Mutex::new(None),
            inflight: Arc::clone(&self.inflight),
            counters: Arc::clone(&self.record.counters),
        });
        // A command of one job is timed (its latency is the job's); one of
        // several (a DSM of many ranges) is not.
        let timed = (jobs.len() == 1).then_some(Export::Nvme);
        for (work, offset, length, fua, buffer) in jobs {
            let job = Job {
                owner: done.clone(),
                cookie: u64::from(sqe.cid()),
                work,
                offset,
                length,
                fua,
                buffer,
                permit_bytes: 0,
                command: work.command(),
                timed,
            };
            if let Some(owned) = self.owned.as_mut() {
                owned.jobs.push(job);
            }
        }
    }

    /// Stop: send the TermReq if any, let every command taken be answered,
    /// close; the controller goes with its admin queue.
    pub(super) fn finish(&mut self, ending: Ending) {
        let quote = Vec::new();
        if let Some(fes) = ending.term {
            self.send(Out::Term { fes, fei: 0, quote });
        }
        self.log(&format!(
            "event=nvme-disconnected queue={} reason=\"{}\"",
            self.qid, ending.reason
        ));
        let _ = self.stream.shutdown(Shutdown::Read);
        // Commands whose data never came are answered by nobody: they
        // leave the in-flight set here.
        for cid in self.incoming.keys().copied().collect::<Vec<_>>() {
            self.inflight.answered(cid, 0);
        }
        for sqe in std::mem::take(&mut self.waiting_r2t) {
            self.inflight.answered(sqe.cid(), 0);
        }
        self.incoming.clear();
        self.inflight.wait_empty();
        self.tx = None;
        if let Some(writer) = self.writer.take() {
            let _ = writer.join();
        }
        let _ = self.stream.shutdown(Shutdown::Both);
        if let Some(controller) = self.controller.take() {
            if self.qid == 0 {
                self.subsystem.remove(&controller);
            } else {
                controller.io_queue_gone(self.qid);
            }
        }
    }
}

impl Queue {
    /// A worker's queue stops reading: the TermReq (if any) goes after
    /// what is queued, every command taken is still answered.
    fn end_owned(&mut self, ending: Ending) {
        if let Some(fes) = ending.term {
            self.send(Out::Term {
                fes,
                fei: 0,
                quote: Vec::new(),
            });
        }
        self.log(&format!(
            "event=nvme-disconnected queue={} reason=\"{}\"",
            self.qid, ending.reason
        ));
        if let Some(owned) = self.owned.as_mut() {
            owned.reading = false;
        }
        let _ = self.stream.shutdown(Shutdown::Read);
        for cid in self.incoming.keys().copied().collect::<Vec<_>>() {
            self.inflight.answered(cid, 0);
        }
        for sqe in std::mem::take(&mut self.waiting_r2t) {
            self.inflight.answered(sqe.cid(), 0);
        }
        self.incoming.clear();
    }

    /// Encode what was answered, and write what the socket takes.
    fn flush_owned(&mut self) -> bool {
        let mut progress = false;
        let transfer = self.record.transfer_timeout;
        let Some(owned) = self.owned.as_mut() else {
            return false;
        };
        while let Ok(out) = owned.rx.try_recv() {
            encode(&mut owned.out, out, self.digests, self.hpda, &self.inflight);
            progress = true;
        }
        let mut failed = None;
        while owned.sent < owned.out.len() && !owned.broken {
            match (&self.stream).write(&owned.out[owned.sent..]) {
                Ok(n) => {
                    owned.sent += n;
                    owned.out_since = Some(Instant::now());
                    progress = true;
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    owned.out_since.get_or_insert_with(Instant::now);
                    break;
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => {
                    owned.broken = true;
                    failed = Some(format!("sending failed: {e}"));
                }
            }
        }
        if owned.sent == owned.out.len() || owned.broken {
            owned.out.clear();
            owned.sent = 0;
            owned.out_since = None;
        } else if owned
            .out_since
            .is_some_and(|since| since.elapsed() > transfer)
        {
            owned.broken = true;
            failed = Some(format!(
                "the host took none of its answers within the transfer time ({} s)",
                transfer.as_secs()
            ));
        }
        if let Some(reason) = failed {
            let _ = self.stream.shutdown(Shutdown::Both);
            if self.owned.as_ref().is_some_and(|o| o.reading) {
                self.end_owned(Ending::quiet(reason));
            }
            progress = true;
        }
        progress
    }
}

impl NvmeQueue {
    /// Read and run what the host sent, hand the jobs to `slots`, send
    /// the answers; true if anything moved.
    pub(crate) fn pump(&mut self, slots: &mut Slots) -> bool {
        let q = &mut self.0;
        let mut progress = false;
        if q.owned.as_ref().is_some_and(|o| o.reading) {
            if let Some(ending) = q.check_time() {
                q.end_owned(ending);
                progress = true;
            }
        }
        // A bounded number of reads per turn: the worker's other
        // connections get theirs.
        for _ in 0..8 {
            if !q.owned.as_ref().is_some_and(|o| o.reading) {
                break;
            }
            if q.rx_start == q.rx_end {
                q.rx_start = 0;
                q.rx_end = 0;
                match q.stream.read(&mut q.rx) {
                    Ok(0) => {
                        q.end_owned(Ending::quiet("the host closed the connection"));
                        progress = true;
                        break;
                    }
                    Ok(n) => {
                        q.rx_end = n;
                        progress = true;
                    }
                    Err(e)
                        if matches!(
                            e.kind(),
                            io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted
                        ) =>
                    {
                        break
                    }
                    Err(e) => {
                        q.end_owned(Ending::quiet(format!("reading failed: {e}")));
                        progress = true;
                        break;
                    }
                }
            }
            while q.rx_start < q.rx_end && q.owned.as_ref().is_some_and(|o| o.reading) {
                if let Err(ending) = q.step() {
                    q.end_owned(ending);
                }
            }
        }
        if let Some(owned) = q.owned.as_mut() {
            for job in owned.jobs.drain(..) {
                slots.start(job);
                progress = true;
            }
        }
        progress | q.flush_owned()
    }

    /// What the worker's poll(2) waits for on this queue's socket.
    pub(crate) fn poll_fd(&self) -> Option<libc::pollfd> {
        use std::os::fd::AsRawFd;
        let owned = self.0.owned.as_ref()?;
        let mut events = 0;
        if owned.reading {
            events |= libc::POLLIN;
        }
        if owned.sent < owned.out.len() && !owned.broken {
            events |= libc::POLLOUT;
        }
        (events != 0).then(|| libc::pollfd {
            fd: self.0.stream.as_raw_fd(),
            events,
            revents: 0,
        })
    }

    /// Reading stopped, every command answered and its answer sent (or
    /// the socket broken).
    pub(crate) fn has_ended(&mut self) -> bool {
        self.0.flush_owned();
        let Some(owned) = self.0.owned.as_ref() else {
            return true;
        };
        !owned.reading && self.0.inflight.count() == 0 && owned.out.is_empty()
    }

    /// Close the socket, leave the controller, give the admission slot
    /// back.
    pub(crate) fn close(mut self) {
        let q = &mut self.0;
        let _ = q.stream.shutdown(Shutdown::Both);
        if let Some(controller) = q.controller.take() {
            controller.io_queue_gone(q.qid);
        }
        q.record.release_slot();
    }
}

/// A command moves data from the host to the controller.
fn to_controller(sqe: &Sqe) -> bool {
    if sqe.opcode() == opcode::FABRICS {
        sqe.fctype() & 3 == 1
    } else {
        sqe.opcode() & 3 == 1
    }
}

/// `len` bytes from `at`, in jobs of at most 1 GiB (a job's length is 32
/// bits).
fn split(at: u64, len: u64) -> impl Iterator<Item = (u64, u32)> {
    const JOB_MAX: u64 = 1 << 30;
    (0..len.div_ceil(JOB_MAX)).map(move |i| {
        let start = i * JOB_MAX;
        (at + start, (len - start).min(JOB_MAX) as u32)
    })
}

/// A command's jobs finish here; the last sends the answer.
struct Done {
    tx: Mutex<Sender<Out>>,
    cqe: Cqe,
    read: bool,
    write: bool,
    bytes: u64,
    remaining: AtomicU32,
    error: Mutex<Option<ErrorCode>>,
    inflight: Arc<Inflight>,
    /// The NVMe counters (a failed command counts as an error).
    counters: Arc<Counters>,
}

impl Finish for Done {
    fn finish(&self, job: Job, result: Result<(), ErrorCode>) {
        if let Err(code) = result {
            self.error.lock().expect("error").get_or_insert(code);
        }
        if self.remaining.fetch_sub(1, Ordering::AcqRel) != 1 {
            return;
        }
        let error = *self.error.lock().expect("error");
        let mut cqe = self.cqe;
        if let Some(code) = error {
            self.counters.errors.fetch_add(1, Ordering::Relaxed);
            cqe.status = status_of(code, self.read, self.write);
        }
        // The command leaves the in-flight set before its answer is on
        // the wire, so that the host may reuse its id at once.
        self.inflight.answered(cqe.cid, self.bytes);
        let out = if self.read && error.is_none() {
            Out::Data {
                len: job.buffer.len(),
                data: job.buffer,
                cqe,
            }
        } else {
            Out::Resp(cqe)
        };
        let _ = self.tx.lock().expect("sender").send(out);
    }
}

/// The NVMe status of a failed job.
fn status_of(code: ErrorCode, read: bool, write: bool) -> Status {
    match code {
        ErrorCode::Io if read => Status::new(2, 0x81, false), // unrecovered read error
        ErrorCode::Io if write => Status::new(2, 0x80, false), // write fault
        ErrorCode::NotPermitted => generic(sc::WRITE_PROTECTED),
        ErrorCode::NoSpace => generic(sc::LBA_OUT_OF_RANGE),
        ErrorCode::Invalid => generic(sc::INVALID_FIELD),
        _ => Status::new(0, sc::INTERNAL, false),
    }
}

/// The writer: sends what the reader and the jobs queue, in order, many
/// at once; after a failed send it drops the rest (the reader sees the
/// socket end). The cids of answered admin commands leave the in-flight
/// set here (the jobs' answers left it in `Done`).
fn writer(
    mut stream: TcpStream,
    rx: Receiver<Out>,
    digests: Digests,
    hpda: u8,
    inflight: &Inflight,
) {
    let mut broken = false;
    let mut buf = Vec::with_capacity(256 << 10);
    while let Ok(first) = rx.recv() {
        buf.clear();
        let mut next = Some(first);
        while let Some(out) = next.take() {
            encode(&mut buf, out, digests, hpda, inflight);
            if buf.len() < (1 << 20) {
                next = rx.try_recv().ok();
            }
        }
        if broken {
            continue;
        }
        if let Err(_e) = stream.write_all(&buf) {
            broken = true;
            let _ = stream.shutdown(Shutdown::Both);
        }
    }
}

fn encode(buf: &mut Vec<u8>, out: Out, digests: Digests, hpda: u8, inflight: &Inflight) {
    match out {
        Out::Resp(cqe) => {
            // Answers that did not come from jobs leave the in-flight set
            // here (answered() twice for a job's cid is harmless: gone).
            release(inflight, cqe.cid);
            encode_capsule_resp(buf, &cqe, digests);
        }
        Out::Data { data, len, cqe } => {
            release(inflight, cqe.cid);
            let mut at = 0;
            while at < len {
                let n = (len - at).min(C2H_CHUNK);
                let header = DataHeader {
                    cid: cqe.cid,
                    ttag: 0,
                    offset: at as u32,
                    length: n as u32,
                };
                encode_c2h_data(buf, &header, at + n == len, false, digests, hpda);
                let piece = &data[at..at + n];
                buf.extend_from_slice(piece);
                if digests.data {
                    buf.extend_from_slice(&data_digest_trailer(&[piece]));
                }
                at += n;
            }
            encode_capsule_resp(buf, &cqe, digests);
        }
        Out::R2T { cid, len } => {
            let header = DataHeader {
                cid,
                ttag: cid,
                offset: 0,
                length: len,
            };
            encode_r2t(buf, &header, digests);
        }
        Out::Term { fes, fei, quote } => encode_term_req(buf, false, fes, fei, &quote),
    }
}

/// `cid` leaves the in-flight set, if it is there (without bytes).
fn release(inflight: &Inflight, cid: u16) {
    let mut state = inflight.state.lock().expect("inflight");
    if state.0.remove(&cid) {
        inflight.changed.notify_all();
    }
}
