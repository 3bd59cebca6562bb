//! One NVMe/TCP namespace as a member: its controller (the admin queue,
//! kept alive with Keep Alive and brought back when it is lost), what
//! Identify said, the I/O queue ids in use, and new I/O queues, each
//! proving the member's identity before it is used.

use super::setup::{self, Conn, NvmeError};
use super::uri::NvmeUri;
use crate::channel::RemoteOptions;
use crate::identity::Identity;
use nvraid_nvme_tcp::command::{property, ConnectData, Sqe};
use nvraid_nvme_tcp::identify::{Controller, Namespace, IDENTIFY_BYTES};
use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

/// The controller's keep-alive timeout nvraid asks for, and how often it
/// sends Keep Alive at most (more often with a request timeout under
/// 10 s: every half of it, each answer due within the same).
pub(crate) const KATO: Duration = Duration::from_secs(15);
const KEEP_ALIVE_EVERY: Duration = Duration::from_secs(5);
/// Admin queue entries (0's based): the transport's minimum admin depth.
const ADMIN_SQSIZE: u16 = 31;
/// The admin queue takes at least 8 KiB of in-capsule data.
const ADMIN_IN_CAPSULE: u32 = 8192;
/// Most commands in flight on one I/O queue.
pub(crate) const MAX_QUEUE_DEPTH: u16 = 128;
/// Most bytes one command moves (a larger operation is cut).
const MAX_COMMAND_BYTES: u64 = 1 << 20;
/// I/O queues asked for (the target may grant fewer).
const IO_QUEUES_WANTED: u16 = 256;

/// What the namespace and its controller offer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NvmeInfo {
    pub size_bytes: u64,
    pub block_bytes: u32,
    /// Preferred write granularity, bytes.
    pub preferred_bytes: u32,
    /// Most bytes one command moves (MDTS, capped).
    pub max_command_bytes: u32,
    /// I/O commands' in-capsule data limit, bytes.
    pub in_capsule_bytes: u32,
    pub write_zeroes: bool,
    pub deallocate: bool,
    pub volatile_cache: bool,
    /// Commands in flight per I/O queue (the queue's size less one).
    pub queue_depth: u16,
    pub model: String,
    pub serial: String,
}

#[derive(Debug)]
struct Admin {
    conn: Conn,
    cntlid: u16,
    /// Which admin queue of the process this is (a controller id may come
    /// back after a target restart; this does not).
    serial: u64,
}

static ADMIN_SERIAL: AtomicU64 = AtomicU64::new(1);

/// A namespace's controller, shared by the export and its channels.
#[derive(Debug)]
pub(crate) struct Target {
    pub uri: NvmeUri,
    pub options: RemoteOptions,
    pub hostnqn: String,
    pub host_id: [u8; 16],
    pub info: NvmeInfo,
    pub identity: Arc<Identity>,
    /// The admin queue's connection, for Keep Alive (taken out while one
    /// is in flight, so that nothing waits on the network for this lock).
    admin: Mutex<Option<Admin>>,
    /// The live controller's id (None: a new admin queue is needed). Held
    /// while a new admin queue connects, so that only one does.
    cntlid: Mutex<Option<(u16, u64)>>,
    /// Bumped when the controller is found gone (Keep Alive unanswered):
    /// every I/O queue connected before ends, with `gone_reason`.
    generation: AtomicU64,
    gone_reason: Mutex<String>,
    /// I/O queue ids free to use, the longest free first (a queue the
    /// target is still tearing down is not asked for again at once).
    free_qids: Mutex<VecDeque<u16>>,
}

/// The host NQN and host id nvraid connects as by default: the machine's
/// own (`/etc/nvme/hostnqn` and `/etc/nvme/hostid`, as nvme-cli keeps
/// them), else ones made from `/etc/machine-id`.
fn default_host() -> (String, [u8; 16]) {
    let read = |path: &str| {
        std::fs::read_to_string(path)
            .ok()
            .map(|t| t.trim().to_string())
            .filter(|t| !t.is_empty())
    };
    let machine = read("/etc/nvme/hostid")
        .or_else(|| read("/etc/machine-id"))
        .or_else(|| read("/proc/sys/kernel/random/boot_id"))
        .unwrap_or_default();
    let hex: String = machine
        .chars()
        .filter(|c| c.is_ascii_hexdigit())
        .take(32)
        .collect();
    let mut id = [0u8; 16];
    for (i, byte) in id.iter_mut().enumerate() {
        *byte = hex
            .get(i * 2..i * 2 + 2)
            .and_then(|h| u8::from_str_radix(h, 16).ok())
            .unwrap_or(0);
    }
    if let Some(nqn) = read("/etc/nvme/hostnqn") {
        return (nqn, id);
    }
    // A version 4 style UUID from the machine id.
    id[6] = (id[6] & 0x0f) | 0x40;
    id[8] = (id[8] & 0x3f) | 0x80;
    let u =
        |r: std::ops::Range<usize>| id[r].iter().map(|b| format!("{b:02x}")).collect::<String>();
    let uuid = format!(
        "{}-{}-{}-{}-{}",
        u(0..4),
        u(4..6),
        u(6..8),
        u(8..10),
        u(10..16)
    );
    (format!("nqn.2014-08.org.nvmexpress:uuid:{uuid}"), id)
}

impl Target {
    /// Connect the admin queue, enable the controller, identify it and
    /// the namespace, within the connect timeout.
    pub(crate) fn open(uri: NvmeUri, options: RemoteOptions) -> Result<Arc<Target>, NvmeError> {
        let (default_nqn, host_id) = default_host();
        let hostnqn = uri.hostnqn.clone().unwrap_or(default_nqn);
        let deadline = Instant::now() + options.connect_timeout;
        let (admin, info, queues) = connect_admin(&uri, &hostnqn, host_id, deadline)?;
        let target = Arc::new(Target {
            uri,
            options,
            hostnqn,
            host_id,
            info,
            identity: Arc::new(Identity::default()),
            cntlid: Mutex::new(Some((admin.cntlid, admin.serial))),
            admin: Mutex::new(Some(admin)),
            free_qids: Mutex::new((1..=queues).collect()),
            generation: AtomicU64::new(0),
            gone_reason: Mutex::new(String::new()),
        });
        let weak = Arc::downgrade(&target);
        let _ = std::thread::Builder::new()
            .name("nvme-keepalive".into())
            .spawn(move || keep_alive(weak));
        Ok(target)
    }

    /// The controller id to connect I/O queues to: the admin queue's, the
    /// admin queue connected again first when it was lost (the namespace
    /// must still be the one the member was opened on).
    fn cntlid(&self, deadline: Instant) -> Result<u16, NvmeError> {
        let mut current = self.cntlid.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((cntlid, _)) = *current {
            return Ok(cntlid);
        }
        let (fresh, info, _) = connect_admin(&self.uri, &self.hostnqn, self.host_id, deadline)?;
        let problem = if info.size_bytes < self.info.size_bytes {
            Some(format!(
                "the namespace shrank from {} to {} bytes",
                self.info.size_bytes, info.size_bytes
            ))
        } else if info.block_bytes != self.info.block_bytes {
            Some(format!(
                "the namespace's block size changed from {} to {} bytes",
                self.info.block_bytes, info.block_bytes
            ))
        } else {
            None
        };
        if let Some(reason) = problem {
            return Err(NvmeError::Unusable {
                uri: self.uri.to_string(),
                reason,
            });
        }
        let cntlid = fresh.cntlid;
        *current = Some((cntlid, fresh.serial));
        *self.admin.lock().unwrap_or_else(|e| e.into_inner()) = Some(fresh);
        Ok(cntlid)
    }

    /// The controller's generation: an I/O queue connected in an earlier
    /// one belongs to a controller found gone.
    pub(crate) fn generation(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }

    /// Why the controller was last found gone.
    pub(crate) fn gone_reason(&self) -> String {
        self.gone_reason
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    fn drop_admin(&self) {
        *self.cntlid.lock().unwrap_or_else(|e| e.into_inner()) = None;
        *self.admin.lock().unwrap_or_else(|e| e.into_inner()) = None;
    }

    pub(crate) fn release_qid(&self, qid: u16) {
        self.free_qids
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push_back(qid);
    }

    /// A new I/O queue by `deadline`: connected, and proven to reach the
    /// member when the array gave it an identity check. Its qid goes back
    /// with [`Target::release_qid`].
    pub(crate) fn connect_io(&self, deadline: Instant) -> Result<(Conn, u16), NvmeError> {
        let qid = self
            .free_qids
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .pop_front()
            .ok_or_else(|| NvmeError::Unusable {
                uri: self.uri.to_string(),
                reason: "every I/O queue the target allows is in use (more workers than queues)"
                    .into(),
            })?;
        let result = self.connect_io_as(qid, deadline);
        if result.is_err() {
            self.release_qid(qid);
        }
        result.map(|conn| (conn, qid))
    }

    fn connect_io_as(&self, qid: u16, deadline: Instant) -> Result<Conn, NvmeError> {
        let mut retried = false;
        loop {
            let cntlid = self.cntlid(deadline)?;
            let mut conn = setup::open(&self.uri, deadline)?;
            let data = ConnectData {
                host_id: self.host_id,
                cntlid,
                subnqn: self.uri.subnqn.clone(),
                hostnqn: self.hostnqn.clone(),
            };
            let data = data
                .encode()
                .map_err(|e| conn.protocol("encoding Connect", e))?;
            let cid = conn.cid();
            let sqe = Sqe::connect(cid, qid, self.info.queue_depth, 0, true);
            let cqe = conn.command(
                sqe,
                Some(&data),
                None,
                data.len() as u32,
                deadline,
                "connecting an I/O queue",
            )?;
            if cqe.status.is_success() {
                self.prove(&mut conn, deadline)?;
                return Ok(conn);
            }
            // The controller is gone (the target restarted, or it timed
            // the admin queue out): a new one, once.
            if !retried && cqe.status.code_type() == 1 && cqe.status.code() == 0x82 {
                retried = true;
                self.drop_admin();
                continue;
            }
            return Err(NvmeError::Refused {
                uri: self.uri.to_string(),
                what: format!("Connect of I/O queue {qid} (controller {cntlid})"),
                status: cqe.status,
            });
        }
    }

    /// Read the identity probe on a new I/O queue and check it.
    fn prove(&self, conn: &mut Conn, deadline: Instant) -> Result<(), NvmeError> {
        let Some(check) = self.identity.current() else {
            return Ok(());
        };
        let (offset, len) = check.probe();
        let block = u64::from(self.info.block_bytes);
        let start = offset / block * block;
        let end = (offset + len as u64).div_ceil(block) * block;
        let uri = self.uri.to_string();
        if end > self.info.size_bytes {
            let reason = format!(
                "the namespace ({} bytes) is too small to hold the member's identity at {offset}+{len}",
                self.info.size_bytes
            );
            self.identity.note(Some(reason.clone()));
            return Err(NvmeError::NotTheMember { uri, reason });
        }
        let mut buf = vec![0u8; (end - start) as usize];
        let cid = conn.cid();
        let sqe = Sqe::read(
            cid,
            self.uri.nsid,
            start / block,
            ((end - start) / block) as u32,
            buf.len() as u32,
        );
        conn.command_ok(
            sqe,
            None,
            Some(&mut buf),
            0,
            deadline,
            "reading the member's identity on a new connection",
        )?;
        let at = (offset - start) as usize;
        match check.verify(&buf[at..at + len]) {
            Ok(()) => {
                self.identity.note(None);
                Ok(())
            }
            Err(reason) => {
                self.identity.note(Some(reason.clone()));
                Err(NvmeError::NotTheMember { uri, reason })
            }
        }
    }
}

/// Connect and enable the admin queue; identify controller and namespace.
/// Returns the admin queue, what the namespace offers and how many I/O
/// queues the controller grants.
fn connect_admin(
    uri: &NvmeUri,
    hostnqn: &str,
    host_id: [u8; 16],
    deadline: Instant,
) -> Result<(Admin, NvmeInfo, u16), NvmeError> {
    let name = uri.to_string();
    let mut conn = setup::open(uri, deadline)?;
    let data = ConnectData {
        host_id,
        cntlid: 0xffff,
        subnqn: uri.subnqn.clone(),
        hostnqn: hostnqn.to_string(),
    }
    .encode()
    .map_err(|e| conn.protocol("encoding Connect", e))?;
    let cid = conn.cid();
    let sqe = Sqe::connect(cid, 0, ADMIN_SQSIZE, KATO.as_millis() as u32, true);
    let what = format!("Connect to subsystem {:?} as host {hostnqn:?}", uri.subnqn);
    let cqe = conn.command_ok(sqe, Some(&data), None, ADMIN_IN_CAPSULE, deadline, &what)?;
    let cntlid = cqe.result as u16;
    let cid = conn.cid();
    let cap = conn
        .command_ok(
            Sqe::property_get(cid, property::CAP, true),
            None,
            None,
            0,
            deadline,
            "Property Get CAP",
        )?
        .result;
    let cc = property::CC_EN | property::CC_IOSQES_64 | property::CC_IOCQES_16;
    let cid = conn.cid();
    conn.command_ok(
        Sqe::property_set(cid, property::CC, cc),
        None,
        None,
        0,
        deadline,
        "Property Set CC.EN",
    )?;
    // CSTS.RDY within CAP.TO (and the deadline).
    let ready_by = deadline
        .min(Instant::now() + Duration::from_millis(property::cap_timeout_ms(cap).max(500)));
    loop {
        let cid = conn.cid();
        let csts = conn
            .command_ok(
                Sqe::property_get(cid, property::CSTS, false),
                None,
                None,
                0,
                deadline,
                "Property Get CSTS",
            )?
            .result as u32;
        if csts & property::CSTS_CFS != 0 {
            return Err(NvmeError::Unusable {
                uri: name,
                reason: "the controller reports a fatal status (CSTS.CFS)".into(),
            });
        }
        if csts & property::CSTS_RDY != 0 {
            break;
        }
        if Instant::now() >= ready_by {
            return Err(NvmeError::Timeout {
                uri: name,
                during: "waiting for the controller to be ready (CSTS.RDY)".into(),
            });
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    let mut id = vec![0u8; IDENTIFY_BYTES];
    let cid = conn.cid();
    conn.command_ok(
        Sqe::identify(cid, 1, 0),
        None,
        Some(&mut id),
        0,
        deadline,
        "Identify Controller",
    )?;
    let ctrl =
        Controller::parse(&id).map_err(|e| conn.protocol("reading Identify Controller", e))?;
    let cid = conn.cid();
    let cqe = conn.command(
        Sqe::identify(cid, 0, uri.nsid),
        None,
        Some(&mut id),
        0,
        deadline,
        "Identify Namespace",
    )?;
    let no_namespace = || NvmeError::Unusable {
        uri: name.clone(),
        reason: format!(
            "subsystem {:?} has no namespace {} (it has {})",
            uri.subnqn, uri.nsid, ctrl.nn
        ),
    };
    // An inactive namespace identifies as all zeros.
    if !cqe.status.is_success() || id[0..8].iter().all(|&b| b == 0) {
        return Err(no_namespace());
    }
    let ns = Namespace::parse(&id).map_err(|e| conn.protocol("reading Identify Namespace", e))?;
    if ns.metadata_bytes != 0 {
        return Err(NvmeError::Unusable {
            uri: name,
            reason: format!(
                "the namespace's format carries {} bytes of metadata per block, which nvraid does not use",
                ns.metadata_bytes
            ),
        });
    }
    let size_bytes = ns.size_bytes().ok_or_else(|| NvmeError::Unusable {
        uri: name.clone(),
        reason: "the namespace's size does not fit in 64 bits".into(),
    })?;
    let cid = conn.cid();
    let queues = conn.command(
        Sqe::set_queue_count(cid, IO_QUEUES_WANTED),
        None,
        None,
        0,
        deadline,
        "Set Features (number of queues)",
    )?;
    let granted = if queues.status.is_success() {
        let sq = (queues.result as u16).saturating_add(1);
        let cq = ((queues.result >> 16) as u16).saturating_add(1);
        sq.min(cq).min(IO_QUEUES_WANTED)
    } else {
        IO_QUEUES_WANTED
    };
    let block = ns.block_bytes;
    let mdts = ctrl
        .max_transfer_bytes(property::cap_min_page_bytes(cap))
        .unwrap_or(u64::MAX);
    let max_command = mdts.min(MAX_COMMAND_BYTES).min(65536 * u64::from(block)) / u64::from(block)
        * u64::from(block);
    if max_command == 0 {
        return Err(NvmeError::Unusable {
            uri: name,
            reason: format!(
                "the controller moves at most {mdts} bytes per command, less than a block"
            ),
        });
    }
    let depth = property::cap_mqes(cap)
        .saturating_add(1)
        .clamp(2, MAX_QUEUE_DEPTH);
    let info = NvmeInfo {
        size_bytes,
        block_bytes: block,
        preferred_bytes: if ns.nsfeat & 0x10 != 0 {
            (u32::from(ns.npwg) + 1).saturating_mul(block)
        } else {
            block
        },
        max_command_bytes: max_command as u32,
        in_capsule_bytes: ctrl.in_capsule_bytes(),
        write_zeroes: ctrl.supports_write_zeroes(),
        deallocate: ctrl.supports_dsm(),
        volatile_cache: ctrl.vwc,
        queue_depth: depth - 1,
        model: ctrl.model.clone(),
        serial: ctrl.serial.clone(),
    };
    let admin = Admin {
        conn,
        cntlid,
        serial: ADMIN_SERIAL.fetch_add(1, Ordering::Relaxed),
    };
    Ok((admin, info, granted))
}

/// Send Keep Alive on the admin queue while the target lives. One not
/// answered in time (or the admin connection failing) means the
/// controller is gone: the admin queue is dropped, and every I/O queue
/// connected to it ends (the generation moves on), its reads going again
/// on a new controller.
fn keep_alive(target: Weak<Target>) {
    let tick = Duration::from_millis(50);
    let every = match target.upgrade() {
        Some(t) => KEEP_ALIVE_EVERY
            .min(t.options.request_timeout / 2)
            .max(Duration::from_millis(100)),
        None => return,
    };
    let mut next = Instant::now() + every;
    loop {
        std::thread::sleep(tick);
        let Some(target) = target.upgrade() else {
            return;
        };
        if Instant::now() < next {
            continue;
        }
        next = Instant::now() + every;
        // Out of the lock while the command is in flight.
        let taken = target
            .admin
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take();
        let Some(mut a) = taken else {
            continue;
        };
        let cid = a.conn.cid();
        let deadline = Instant::now() + every;
        let answered =
            a.conn
                .command_ok(Sqe::keep_alive(cid), None, None, 0, deadline, "Keep Alive");
        let mut current = target.cntlid.lock().unwrap_or_else(|e| e.into_inner());
        if *current != Some((a.cntlid, a.serial)) {
            // A new controller replaced this one meanwhile.
            continue;
        }
        match answered {
            Ok(_) => *target.admin.lock().unwrap_or_else(|e| e.into_inner()) = Some(a),
            Err(e) => {
                *current = None;
                *target.gone_reason.lock().unwrap_or_else(|e| e.into_inner()) = e.to_string();
                target.generation.fetch_add(1, Ordering::AcqRel);
            }
        }
    }
}
