//! The subsystem and its controllers: who is connected (host NQN, host
//! id), what each controller was granted (I/O queues), which of its queues
//! are connected, its CC/CSTS, and the rules Fabrics Connect follows.

use std::collections::BTreeMap;
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Instant;

use nvraid_io::queue::Target;
use nvraid_nvme_tcp::command::{ConnectData, Status};
use serde_json::{json, Value};

use super::options::{NvmeOptions, DISCOVERY_NQN};

/// Connect refusals: status code type 1 (command specific).
pub(crate) mod connect_status {
    pub const INCOMPATIBLE_FORMAT: u8 = 0x80;
    pub const INVALID_PARAMETERS: u8 = 0x82;
    pub const INVALID_HOST: u8 = 0x84;
}

/// Where in the Connect command (SQE) or its data a refused field is, for
/// the completion's result (IATTR bit 16: in the data).
pub(crate) mod connect_field {
    pub const QID: u64 = 42;
    pub const SQSIZE: u64 = 44;
    pub const DATA_CNTLID: u64 = (1 << 16) | 16;
    pub const DATA_SUBNQN: u64 = (1 << 16) | 256;
    pub const DATA_HOSTNQN: u64 = (1 << 16) | 512;
}

/// One NVMe subsystem with one namespace (NSID 1: the target).
pub(crate) struct Subsystem {
    pub nqn: String,
    pub hosts: Vec<String>,
    pub local: SocketAddr,
    /// The namespace's size: the served target's, looked at again by
    /// `check_size` (an array that grew while served).
    size_bytes: AtomicU64,
    watched: Option<Weak<dyn Target>>,
    pub block_bytes: u32,
    pub read_only: bool,
    pub namespace_uuid: [u8; 16],
    pub queues_max: u16,
    pub queue_depth: u16,
    pub in_capsule_bytes: u32,
    /// Most bytes one command moves (MDTS, a power of two times 4 KiB).
    pub max_command_bytes: u32,
    pub controllers: Mutex<BTreeMap<u16, Arc<Controller>>>,
    next_cntlid: Mutex<u16>,
}

/// A controller, created by a Connect on an admin queue.
pub(crate) struct Controller {
    pub cntlid: u16,
    pub discovery: bool,
    pub hostnqn: String,
    pub host_id: [u8; 16],
    pub peer: String,
    pub started: Instant,
    pub state: Mutex<ControllerState>,
    /// The admin queue ended (or missed its keep-alive): the controller is
    /// gone and its I/O queues end too.
    pub dead: AtomicBool,
}

pub(crate) struct ControllerState {
    pub cc: u32,
    pub csts: u32,
    /// Keep-alive timeout, ms (0: none).
    pub kato_ms: u32,
    /// I/O queues granted (Set Features, Number of Queues).
    pub queues_granted: u16,
    /// Connected I/O queues: their sockets, to end them with the
    /// controller.
    pub io_queues: BTreeMap<u16, TcpStream>,
    /// Asynchronous event configuration (Set Features 0x0b).
    pub async_config: u32,
    /// The namespace changed since the host last read the Changed
    /// Namespace List log page: the page lists NSID 1.
    pub ns_changed: bool,
    /// Where the Namespace Attribute Changed notice stands.
    pub ns_notice: Notice,
}

/// An asynchronous event of one type, as the specification masks it: raised,
/// reported on a held Asynchronous Event Request (and masked until the host
/// reads its log page), or none.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Notice {
    None,
    Raised,
    Reported,
}

/// Asynchronous event configuration bit: Namespace Attribute Notices.
pub(crate) const AEN_NS_ATTRIBUTE: u32 = 1 << 8;
/// The completion of an Asynchronous Event Request that reports a
/// namespace attribute change: type Notice (2), information 0 (Namespace
/// Attribute Changed), log page 04h (Changed Namespace List).
pub(crate) const AEN_NS_CHANGED_RESULT: u64 = 0x04 << 16 | 0x02;

/// Why a Connect was refused: its status and the result (which field).
pub(crate) struct Refusal {
    pub status: Status,
    pub field: u64,
    pub reason: String,
}

fn refuse(code: u8, field: u64, reason: String) -> Refusal {
    Refusal {
        status: Status::new(1, code, true),
        field,
        reason,
    }
}

impl Subsystem {
    pub(crate) fn new(
        options: &NvmeOptions,
        local: SocketAddr,
        watched: Option<Weak<dyn Target>>,
        size_bytes: u64,
        block_bytes: u32,
        read_only: bool,
        io_max_bytes: u32,
    ) -> Subsystem {
        // MDTS: at most 512 KiB (bounds a queue's memory: depth x MDTS),
        // at most the worker's largest I/O, at least 4 KiB.
        let max_command_bytes = io_max_bytes.clamp(4096, 512 << 10).next_power_of_two();
        Subsystem {
            nqn: options.subsystem_nqn(),
            hosts: options.hosts.clone(),
            local,
            size_bytes: AtomicU64::new(size_bytes),
            watched,
            block_bytes,
            read_only,
            namespace_uuid: options.namespace_uuid,
            queues_max: options.queues_max,
            queue_depth: options.queue_depth,
            in_capsule_bytes: options.in_capsule_bytes,
            max_command_bytes,
            controllers: Mutex::new(BTreeMap::new()),
            next_cntlid: Mutex::new(1),
        }
    }

    /// Blocks in the namespace.
    pub(crate) fn blocks(&self) -> u64 {
        self.size_bytes() / u64::from(self.block_bytes)
    }

    pub(crate) fn size_bytes(&self) -> u64 {
        self.size_bytes.load(Ordering::Acquire)
    }

    /// Look at the served target's size again: when it changed, the
    /// namespace takes the new size and every I/O controller gets a
    /// Namespace Attribute Changed notice, sent by its admin queue on a
    /// held Asynchronous Event Request (`Queue::raise_events`). The old
    /// and new sizes, when they differ.
    pub(crate) fn check_size(&self) -> Option<(u64, u64)> {
        let now = self.watched.as_ref()?.upgrade()?.size_bytes();
        let old = self.size_bytes.swap(now, Ordering::AcqRel);
        if old == now {
            return None;
        }
        let controllers = self.controllers.lock().expect("controllers");
        for controller in controllers.values().filter(|c| !c.discovery) {
            let mut state = controller.state.lock().expect("controller state");
            state.ns_changed = true;
            if state.ns_notice == Notice::None {
                state.ns_notice = Notice::Raised;
            }
        }
        Some((old, now))
    }

    /// A Connect on an admin queue: a new controller, or why not.
    pub(crate) fn connect_admin(
        &self,
        data: &ConnectData,
        sqsize: u16,
        kato_ms: u32,
        peer: &str,
    ) -> Result<Arc<Controller>, Refusal> {
        let discovery = self.check_subsystem_and_host(data)?;
        if sqsize == 0 || sqsize >= self.queue_depth {
            return Err(refuse(
                connect_status::INVALID_PARAMETERS,
                connect_field::SQSIZE,
                format!(
                    "admin queue size {} not within 2..={}",
                    u32::from(sqsize) + 1,
                    self.queue_depth
                ),
            ));
        }
        if data.cntlid != 0xffff {
            return Err(refuse(
                connect_status::INVALID_PARAMETERS,
                connect_field::DATA_CNTLID,
                format!(
                    "controller id {:#x} asked for on an admin queue (only the dynamic 0xffff)",
                    data.cntlid
                ),
            ));
        }
        let mut controllers = self.controllers.lock().expect("controllers");
        let mut next = self.next_cntlid.lock().expect("next cntlid");
        // Dynamic ids 1..=0xffef, the next one free.
        let mut cntlid = *next;
        for _ in 0..0xffef {
            if !controllers.contains_key(&cntlid) {
                break;
            }
            cntlid = if cntlid >= 0xffef { 1 } else { cntlid + 1 };
        }
        if controllers.contains_key(&cntlid) {
            return Err(refuse(0x81, 0, "every controller id is in use".into()));
        }
        *next = if cntlid >= 0xffef { 1 } else { cntlid + 1 };
        let controller = Arc::new(Controller {
            cntlid,
            discovery,
            hostnqn: data.hostnqn.clone(),
            host_id: data.host_id,
            peer: peer.to_string(),
            started: Instant::now(),
            state: Mutex::new(ControllerState {
                cc: 0,
                csts: 0,
                kato_ms,
                queues_granted: if discovery { 0 } else { self.queues_max },
                io_queues: BTreeMap::new(),
                async_config: 0,
                ns_changed: false,
                ns_notice: Notice::None,
            }),
            dead: AtomicBool::new(false),
        });
        controllers.insert(cntlid, Arc::clone(&controller));
        Ok(controller)
    }

    /// A Connect on I/O queue `qid`: the controller it joins, or why not.
    /// `socket` is kept to end the queue with its controller.
    pub(crate) fn connect_io(
        &self,
        data: &ConnectData,
        qid: u16,
        sqsize: u16,
        socket: &TcpStream,
    ) -> Result<Arc<Controller>, Refusal> {
        let discovery = self.check_subsystem_and_host(data)?;
        if discovery {
            return Err(refuse(
                connect_status::INVALID_PARAMETERS,
                connect_field::QID,
                "a discovery controller has no I/O queues".into(),
            ));
        }
        if sqsize == 0 || sqsize >= self.queue_depth {
            return Err(refuse(
                connect_status::INVALID_PARAMETERS,
                connect_field::SQSIZE,
                format!(
                    "I/O queue size {} not within 2..={}",
                    u32::from(sqsize) + 1,
                    self.queue_depth
                ),
            ));
        }
        let controller = self
            .controllers
            .lock()
            .expect("controllers")
            .get(&data.cntlid)
            .cloned()
            .filter(|c| !c.dead.load(Ordering::Acquire) && !c.discovery);
        let Some(controller) = controller else {
            return Err(refuse(
                connect_status::INVALID_PARAMETERS,
                connect_field::DATA_CNTLID,
                format!(
                    "no controller {} (connect the admin queue first)",
                    data.cntlid
                ),
            ));
        };
        if controller.hostnqn != data.hostnqn || controller.host_id != data.host_id {
            return Err(refuse(
                connect_status::INVALID_PARAMETERS,
                connect_field::DATA_HOSTNQN,
                format!(
                    "controller {} belongs to another host ({:?})",
                    data.cntlid, controller.hostnqn
                ),
            ));
        }
        let mut state = controller.state.lock().expect("controller state");
        if state.csts & 1 == 0 {
            return Err(refuse(
                connect_status::INVALID_PARAMETERS,
                connect_field::DATA_CNTLID,
                format!("controller {} is not enabled (CC.EN)", data.cntlid),
            ));
        }
        if qid > state.queues_granted {
            return Err(refuse(
                connect_status::INVALID_PARAMETERS,
                connect_field::QID,
                format!(
                    "I/O queue {qid} beyond the {} granted to controller {}",
                    state.queues_granted, data.cntlid
                ),
            ));
        }
        if state.io_queues.contains_key(&qid) {
            return Err(refuse(
                connect_status::INVALID_PARAMETERS,
                connect_field::QID,
                format!(
                    "I/O queue {qid} of controller {} is connected already",
                    data.cntlid
                ),
            ));
        }
        let clone = socket.try_clone().map_err(|e| {
            refuse(
                connect_status::INVALID_PARAMETERS,
                0,
                format!("cannot keep the queue's socket: {e}"),
            )
        })?;
        state.io_queues.insert(qid, clone);
        drop(state);
        Ok(controller)
    }

    /// The subsystem NQN is this subsystem's or the discovery one
    /// (true), and the host is allowed.
    fn check_subsystem_and_host(&self, data: &ConnectData) -> Result<bool, Refusal> {
        let discovery = data.subnqn == DISCOVERY_NQN;
        if !discovery && data.subnqn != self.nqn {
            return Err(refuse(
                connect_status::INVALID_PARAMETERS,
                connect_field::DATA_SUBNQN,
                format!(
                    "no subsystem {:?} here (this is {:?})",
                    data.subnqn, self.nqn
                ),
            ));
        }
        if !self.hosts.is_empty() && !self.hosts.contains(&data.hostnqn) {
            return Err(refuse(
                connect_status::INVALID_HOST,
                connect_field::DATA_HOSTNQN,
                format!("host {:?} is not in --nvme-host", data.hostnqn),
            ));
        }
        Ok(discovery)
    }

    /// The admin queue of `controller` ended: the controller goes, and its
    /// I/O queues are disconnected.
    pub(crate) fn remove(&self, controller: &Controller) {
        controller.dead.store(true, Ordering::Release);
        self.controllers
            .lock()
            .expect("controllers")
            .remove(&controller.cntlid);
        let state = controller.state.lock().expect("controller state");
        for socket in state.io_queues.values() {
            let _ = socket.shutdown(Shutdown::Both);
        }
    }

    pub(crate) fn controllers_status(&self) -> Vec<Value> {
        let controllers = self.controllers.lock().expect("controllers");
        controllers
            .values()
            .map(|c| {
                let state = c.state.lock().expect("controller state");
                json!({
                    "cntlid": c.cntlid,
                    "hostnqn": c.hostnqn,
                    "address": c.peer,
                    "discovery": c.discovery,
                    "enabled": state.csts & 1 != 0,
                    "io_queues": state.io_queues.keys().collect::<Vec<_>>(),
                    "queues_granted": state.queues_granted,
                    "kato_ms": state.kato_ms,
                    "connected_s": c.started.elapsed().as_secs_f64(),
                })
            })
            .collect()
    }
}

impl Controller {
    /// I/O queue `qid` ended.
    pub(crate) fn io_queue_gone(&self, qid: u16) {
        self.state
            .lock()
            .expect("controller state")
            .io_queues
            .remove(&qid);
    }
}
