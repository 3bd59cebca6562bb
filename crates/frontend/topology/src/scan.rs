//! The sysfs walker: from `/sys/block/X` to the PCIe root port, and the grouping of devices
//! by the uplink they share.
//!
//! Fault model: any file may be missing or unreadable, a link speed may read "Unknown", a
//! `block/X` symlink may dangle (device removed during the walk), and the root may not be a sysfs
//! tree at all. Only the last is an error; everything else becomes a line in the device's
//! `problems` and the walk goes on with what it could read.

use std::collections::BTreeMap;
use std::fs;
use std::path::{Component, Path, PathBuf};

use serde::Serialize;

use crate::error::Error;
use crate::model::{self, PcieGen};
use crate::pci_ids::{self, PchFamily};
use crate::sysfs::{self, SpeedText};

/// Everything `scan` found under one sysfs root.
#[derive(Debug, Clone, Serialize)]
pub struct Topology {
    pub sysfs_root: String,
    pub cpus_online: Option<u32>,
    pub devices: Vec<BlockDevice>,
    /// Devices grouped by the link they share, shared uplinks first.
    pub uplinks: Vec<UplinkGroup>,
    /// Loop, zram and nbd devices with size 0 (not set up), left out of `devices`.
    pub idle_devices: Vec<String>,
}

/// What kind of block device this is, from its name and its sysfs path.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum DeviceKind {
    Nvme,
    Sata,
    Virtio,
    Scsi,
    Loop,
    Zram,
    Md,
    DeviceMapper,
    Nbd,
    Other,
}

/// Where a device's data enters the CPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Attachment {
    /// On a CPU root port (possibly through a PCIe switch).
    CpuLanes,
    /// Behind the chipset: Intel PCH (DMI) or AMD chipset uplink.
    Chipset,
    /// A function on a root bus with no PCIe link (virtio in a VM, SoC-integrated controllers).
    Integrated,
    /// No PCI device at all (loop, zram, md, dm, nbd).
    Virtual,
    /// The walk could not tell.
    Unknown,
}

/// What a PCI function is in the path from the root complex to the device.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum PciRole {
    RootPort,
    IntegratedEndpoint,
    Vmd,
    SwitchUpstream,
    SwitchDownstream,
    Endpoint,
}

/// A PCIe link, as seen from the function below it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Link {
    pub current_speed_gts: Option<f64>,
    pub current_gen: Option<PcieGen>,
    pub current_width_lanes: Option<u32>,
    /// The lower of the two ends' maximum speeds.
    pub max_speed_gts: Option<f64>,
    pub max_gen: Option<PcieGen>,
    /// The lower of the two ends' maximum widths.
    pub max_width_lanes: Option<u32>,
    pub below_max_speed: bool,
    pub below_max_width: bool,
    pub ceiling_bytes_per_sec: Option<f64>,
    pub max_ceiling_bytes_per_sec: Option<f64>,
}

/// One PCI function on the way from the root complex to the block device.
#[derive(Debug, Clone, Serialize)]
pub struct PciFunction {
    pub address: String,
    pub vendor_id: Option<u16>,
    pub device_id: Option<u16>,
    pub class_code: Option<u32>,
    pub role: PciRole,
    pub numa_node: Option<i32>,
    /// The link to the function above (none for root ports and integrated functions).
    pub link: Option<Link>,
}

/// One block device and the path its data takes to the CPU.
#[derive(Debug, Clone, Serialize)]
pub struct BlockDevice {
    pub name: String,
    pub kind: DeviceKind,
    pub model: Option<String>,
    /// The NVMe controller ("nvme0") the namespace belongs to.
    pub controller: Option<String>,
    pub size_bytes: Option<u64>,
    pub logical_block_size_bytes: Option<u32>,
    pub physical_block_size_bytes: Option<u32>,
    /// blk-mq hardware queues; none for bio-based devices.
    pub hw_queues: Option<u32>,
    pub numa_node: Option<i32>,
    /// The resolved sysfs directory, relative to the sysfs root.
    pub sysfs_path: Option<String>,
    pub root_complex: Option<String>,
    pub root_port: Option<String>,
    /// The Intel VMD function the device is remapped behind.
    pub vmd: Option<String>,
    pub attachment: Attachment,
    /// Chipset name when `attachment` is `chipset`.
    pub chipset: Option<String>,
    /// From the root complex down to the device's own function.
    pub pci_path: Vec<PciFunction>,
    pub sata_speed_gbps: Option<f64>,
    /// The lowest link ceiling on the device's own path (not counting shared uplinks).
    pub link_ceiling_bytes_per_sec: Option<f64>,
    /// Which link sets `link_ceiling_bytes_per_sec`, e.g. "0000:03:00.0 Gen3 x2".
    pub limiting_link: Option<String>,
    /// Id of the `UplinkGroup` this device belongs to.
    pub uplink: String,
    pub problems: Vec<String>,
}

/// What kind of link a group of devices shares.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum UplinkKind {
    IntelDmi,
    AmdChipset,
    PcieSwitch,
    CpuRootPort,
    Integrated,
    Virtual,
}

/// Devices that share one link towards the CPU.
#[derive(Debug, Clone, Serialize)]
pub struct UplinkGroup {
    pub id: String,
    pub kind: UplinkKind,
    /// True when every device in the group shares the link's bandwidth.
    pub shared: bool,
    pub description: String,
    /// The short name advice uses ("DMI 3.0").
    pub label: String,
    pub ceiling_bytes_per_sec: Option<f64>,
    /// True when the link's version or width comes from a table guess, not from sysfs.
    pub assumed: bool,
    pub devices: Vec<String>,
}

/// Walk every block device under `sysfs_root`.
pub fn scan(sysfs_root: &Path) -> Result<Topology, Error> {
    let root = fs::canonicalize(sysfs_root).map_err(|e| Error::NotSysfs {
        root: sysfs_root.to_path_buf(),
        reason: e.to_string(),
    })?;
    let names = list_block_names(&root, sysfs_root)?;
    let mut devices = Vec::new();
    let mut idle_devices = Vec::new();
    for name in names {
        let walked = walk_device(&root, &name);
        if is_idle(&walked.device) {
            idle_devices.push(name);
        } else {
            devices.push(walked);
        }
    }
    let uplinks = group_uplinks(&devices);
    let cpus_online = sysfs::read_attr(&root, "devices/system/cpu/online")
        .ok()
        .flatten()
        .and_then(|t| sysfs::count_cpu_list(&t));
    Ok(Topology {
        sysfs_root: sysfs_root.display().to_string(),
        cpus_online,
        devices: devices.into_iter().map(|w| w.device).collect(),
        uplinks,
        idle_devices,
    })
}

fn list_block_names(root: &Path, shown: &Path) -> Result<Vec<String>, Error> {
    let entries = fs::read_dir(root.join("block")).map_err(|e| Error::NotSysfs {
        root: shown.to_path_buf(),
        reason: format!("cannot list block/: {e}"),
    })?;
    let mut names: Vec<String> = entries
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    Ok(names)
}

fn is_idle(device: &BlockDevice) -> bool {
    let unbacked = matches!(
        device.kind,
        DeviceKind::Loop | DeviceKind::Zram | DeviceKind::Nbd
    );
    unbacked && device.size_bytes == Some(0) && device.problems.is_empty()
}

/// A device with the facts grouping needs but the report does not show.
struct Walked {
    device: BlockDevice,
    group: GroupKey,
}

#[derive(Debug, Clone)]
enum GroupKey {
    Dmi { host: String, family: PchFamily },
    AmdChipset { usp: PciFunction, name: String },
    Switch { usp: PciFunction },
    RootPort { port: String },
    Integrated { host: String },
    Virtual,
}

fn walk_device(root: &Path, name: &str) -> Walked {
    let mut device = empty_device(name);
    let link_path = root.join("block").join(name);
    let resolved = match fs::canonicalize(&link_path) {
        Ok(p) => p,
        Err(e) => {
            device.attachment = Attachment::Unknown;
            device.uplink = "unknown".into();
            device.problems.push(format!(
                "block/{name} does not resolve ({e}): device removed or dangling link"
            ));
            return Walked {
                device,
                group: GroupKey::Virtual,
            };
        }
    };
    device.sysfs_path = Some(relative_to(&resolved, root));
    device.kind = device_kind(name, &resolved);
    read_block_attrs(&resolved, &mut device);
    let pci_dir = pci_device_dir(&resolved, &device);
    let chain = read_pci_chain(&pci_dir, &mut device.problems);
    device.numa_node = chain.functions.last().and_then(|f| f.numa_node);
    if device.kind == DeviceKind::Sata {
        device.sata_speed_gbps = read_sata_speed_gbps(&resolved);
    }
    let group = place_device(&chain, &mut device);
    device.uplink = group_id(&group);
    device.pci_path = chain.functions;
    set_link_ceiling(&mut device);
    Walked { device, group }
}

fn empty_device(name: &str) -> BlockDevice {
    BlockDevice {
        name: name.to_string(),
        kind: device_kind(name, Path::new("")),
        model: None,
        controller: None,
        size_bytes: None,
        logical_block_size_bytes: None,
        physical_block_size_bytes: None,
        hw_queues: None,
        numa_node: None,
        sysfs_path: None,
        root_complex: None,
        root_port: None,
        vmd: None,
        attachment: Attachment::Virtual,
        chipset: None,
        pci_path: Vec::new(),
        sata_speed_gbps: None,
        link_ceiling_bytes_per_sec: None,
        limiting_link: None,
        uplink: "virtual".into(),
        problems: Vec::new(),
    }
}

fn relative_to(path: &Path, root: &Path) -> String {
    path.strip_prefix(root)
        .unwrap_or(path)
        .display()
        .to_string()
}

fn component_names(path: &Path) -> impl Iterator<Item = String> + '_ {
    path.components().filter_map(|c| match c {
        Component::Normal(s) => Some(s.to_string_lossy().into_owned()),
        _ => None,
    })
}

fn device_kind(name: &str, resolved: &Path) -> DeviceKind {
    let prefixes = [
        ("nvme", DeviceKind::Nvme),
        ("loop", DeviceKind::Loop),
        ("zram", DeviceKind::Zram),
        ("md", DeviceKind::Md),
        ("dm-", DeviceKind::DeviceMapper),
        ("nbd", DeviceKind::Nbd),
    ];
    if let Some((_, kind)) = prefixes.iter().find(|(p, _)| name.starts_with(p)) {
        return *kind;
    }
    let names: Vec<String> = component_names(resolved).collect();
    if names.iter().any(|c| c.starts_with("virtio")) {
        DeviceKind::Virtio
    } else if names.iter().any(|c| is_ata_port(c)) {
        DeviceKind::Sata
    } else if name.starts_with("sd") || name.starts_with("sr") {
        DeviceKind::Scsi
    } else {
        DeviceKind::Other
    }
}

fn is_ata_port(name: &str) -> bool {
    name.strip_prefix("ata")
        .is_some_and(|n| !n.is_empty() && n.chars().all(|c| c.is_ascii_digit()))
}

fn read_block_attrs(dir: &Path, device: &mut BlockDevice) {
    let problems = &mut device.problems;
    device.size_bytes = sysfs::attr(dir, "size", problems)
        .and_then(|s| s.parse::<u64>().ok())
        .map(|sectors| sectors * 512);
    device.logical_block_size_bytes = required_number(dir, "queue/logical_block_size", problems);
    device.physical_block_size_bytes = required_number(dir, "queue/physical_block_size", problems);
    device.model = sysfs::attr(dir, "device/model", problems).filter(|m| !m.is_empty());
    device.hw_queues = count_hw_queues(&dir.join("mq"));
    if device.kind == DeviceKind::Nvme {
        device.controller = nvme_controller_name(dir);
        if device.hw_queues.is_none() {
            device.hw_queues = multipath_hw_queues(dir);
        }
    }
}

fn required_number(dir: &Path, name: &str, problems: &mut Vec<String>) -> Option<u32> {
    let text = sysfs::attr(dir, name, problems);
    let value = text.as_deref().and_then(|t| t.parse::<u32>().ok());
    if value.is_none() {
        let what = if text.is_some() {
            "unparsable"
        } else {
            "missing"
        };
        problems.push(format!("{what} {name}"));
    }
    value
}

/// Counts the numbered entries of a blk-mq `mq/` directory.
fn count_hw_queues(mq_dir: &Path) -> Option<u32> {
    let entries = fs::read_dir(mq_dir).ok()?;
    let count = entries
        .filter_map(|e| e.ok())
        .filter(|e| e.file_name().to_string_lossy().parse::<u32>().is_ok())
        .count();
    u32::try_from(count).ok()
}

/// The controller a namespace belongs to: `device` points at `nvme0` (or at `nvme-subsys0`
/// under native multipath, whose first controller is then used).
fn nvme_controller_name(block_dir: &Path) -> Option<String> {
    let target = fs::canonicalize(block_dir.join("device")).ok()?;
    let name = target.file_name()?.to_string_lossy().into_owned();
    if name.starts_with("nvme-subsys") {
        return subsystem_controllers(&target)
            .into_iter()
            .next()
            .map(|(n, _)| n);
    }
    Some(name)
}

/// `nvmeN` entries of a multipath subsystem directory, resolved, sorted by name.
fn subsystem_controllers(subsys: &Path) -> Vec<(String, PathBuf)> {
    let Ok(entries) = fs::read_dir(subsys) else {
        return Vec::new();
    };
    let mut found: Vec<(String, PathBuf)> = entries
        .filter_map(|e| e.ok())
        .filter_map(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            let digits = name.strip_prefix("nvme")?;
            if digits.is_empty() || !digits.chars().all(|c| c.is_ascii_digit()) {
                return None;
            }
            fs::canonicalize(e.path()).ok().map(|p| (name, p))
        })
        .collect();
    found.sort();
    found
}

/// Under native multipath the head disk is bio-based; its path disk (`nvme0c0n1`, inside the
/// controller directory) carries the blk-mq queues.
fn multipath_hw_queues(block_dir: &Path) -> Option<u32> {
    let subsys = fs::canonicalize(block_dir.join("device")).ok()?;
    let (_, controller) = subsystem_controllers(&subsys).into_iter().next()?;
    fs::read_dir(&controller)
        .ok()?
        .filter_map(|e| e.ok())
        .filter(|e| e.file_name().to_string_lossy().contains('c'))
        .find_map(|e| count_hw_queues(&e.path().join("mq")))
}

/// The directory whose path holds the PCI chain: the block device itself, or for a multipath
/// head its first controller.
fn pci_device_dir(resolved: &Path, device: &BlockDevice) -> PathBuf {
    let has_pci = component_names(resolved).any(|c| sysfs::is_host_bridge(&c));
    if has_pci || device.kind != DeviceKind::Nvme {
        return resolved.to_path_buf();
    }
    fs::canonicalize(resolved.join("device"))
        .ok()
        .and_then(|subsys| subsystem_controllers(&subsys).into_iter().next())
        .map(|(_, path)| path)
        .unwrap_or_else(|| resolved.to_path_buf())
}

/// The PCI functions on a device's path, with the host bridges they hang from.
struct Chain {
    functions: Vec<PciFunction>,
    /// For each function, the host bridge above it.
    hosts: Vec<String>,
}

fn read_pci_chain(dir: &Path, problems: &mut Vec<String>) -> Chain {
    let mut chain = Chain {
        functions: Vec::new(),
        hosts: Vec::new(),
    };
    let mut current = PathBuf::from("/");
    let mut host: Option<String> = None;
    let mut just_after_host = false;
    let mut previous_raw: Option<RawLink> = None;
    for name in component_names(dir) {
        current.push(&name);
        if sysfs::is_host_bridge(&name) {
            host = Some(name);
            just_after_host = true;
            continue;
        }
        let Some(host_name) = host.clone() else {
            continue;
        };
        if !sysfs::is_pci_address(&name) {
            continue;
        }
        let previous_role = chain.functions.last().map(|f: &PciFunction| f.role);
        let mut function = read_function(&current, &name, problems);
        function.role = pci_role(&function, just_after_host, previous_role);
        let raw = RawLink::read(&current, &name, problems);
        if matches!(function.role, PciRole::Endpoint | PciRole::SwitchUpstream) {
            function.link = merge_link(&raw, previous_raw.as_ref(), &name, problems);
        }
        previous_raw = Some(raw);
        just_after_host = false;
        chain.functions.push(function);
        chain.hosts.push(host_name);
    }
    chain
}

fn read_function(dir: &Path, address: &str, problems: &mut Vec<String>) -> PciFunction {
    let mut hex = |attr: &str| {
        let value = sysfs::attr(dir, attr, problems).and_then(|t| sysfs::parse_hex(&t));
        if value.is_none() {
            problems.push(format!("{address}: missing or unparsable {attr}"));
        }
        value
    };
    let vendor_id = hex("vendor").and_then(|v| u16::try_from(v).ok());
    let device_id = hex("device").and_then(|v| u16::try_from(v).ok());
    let class_code = hex("class");
    let numa_node = sysfs::attr(dir, "numa_node", problems)
        .and_then(|t| t.parse::<i32>().ok())
        .filter(|n| *n >= 0);
    PciFunction {
        address: address.to_string(),
        vendor_id,
        device_id,
        class_code,
        role: PciRole::Endpoint,
        numa_node,
        link: None,
    }
}

fn is_bridge(function: &PciFunction) -> bool {
    function
        .class_code
        .is_some_and(|c| c >> 8 == pci_ids::CLASS_PCI_BRIDGE >> 8)
}

fn pci_role(function: &PciFunction, on_root_bus: bool, previous: Option<PciRole>) -> PciRole {
    let (vendor, device) = (
        function.vendor_id.unwrap_or(0),
        function.device_id.unwrap_or(0),
    );
    if pci_ids::is_intel_vmd(vendor, device) {
        return PciRole::Vmd;
    }
    match (on_root_bus, is_bridge(function), previous) {
        (true, true, _) => PciRole::RootPort,
        (true, false, _) => PciRole::IntegratedEndpoint,
        (false, true, Some(PciRole::SwitchUpstream)) => PciRole::SwitchDownstream,
        (false, true, _) => PciRole::SwitchUpstream,
        (false, false, _) => PciRole::Endpoint,
    }
}

/// The four link attributes of one function, as read.
#[derive(Debug, Clone, Default)]
struct RawLink {
    current_speed: Option<SpeedText>,
    current_width_lanes: Option<u32>,
    max_speed: Option<SpeedText>,
    max_width_lanes: Option<u32>,
}

impl RawLink {
    fn read(dir: &Path, address: &str, problems: &mut Vec<String>) -> RawLink {
        let mut speed = |attr: &str| {
            let text = sysfs::attr(dir, attr, problems)?;
            let parsed = sysfs::parse_link_speed(&text);
            if parsed.is_none() {
                problems.push(format!("{address}: unparsable {attr} {text:?}"));
            }
            parsed
        };
        let current_speed = speed("current_link_speed");
        let max_speed = speed("max_link_speed");
        let mut width =
            |attr: &str| sysfs::attr(dir, attr, problems).and_then(|t| t.parse::<u32>().ok());
        RawLink {
            current_speed,
            current_width_lanes: width("current_link_width"),
            max_speed,
            max_width_lanes: width("max_link_width"),
        }
    }

    fn is_empty(&self) -> bool {
        self.current_speed.is_none()
            && self.current_width_lanes.is_none()
            && self.max_speed.is_none()
            && self.max_width_lanes.is_none()
    }
}

fn known_gts(speed: Option<SpeedText>) -> Option<f64> {
    match speed {
        Some(SpeedText::Gts(gts)) => Some(gts),
        _ => None,
    }
}

fn min_known<T: PartialOrd + Copy>(a: Option<T>, b: Option<T>) -> Option<T> {
    match (a, b) {
        (Some(x), Some(y)) => Some(if y < x { y } else { x }),
        (x, None) => x,
        (None, y) => y,
    }
}

/// The link between a function and its parent, from both ends' attributes.
fn merge_link(
    own: &RawLink,
    parent: Option<&RawLink>,
    address: &str,
    problems: &mut Vec<String>,
) -> Option<Link> {
    let empty = RawLink::default();
    let parent = parent.unwrap_or(&empty);
    if own.is_empty() && parent.is_empty() {
        return None;
    }
    let current_raw = own.current_speed.or(parent.current_speed);
    if current_raw == Some(SpeedText::Unknown) {
        problems.push(format!(
            "{address}: link speed Unknown (link down or not trained)"
        ));
    }
    let current_speed_gts = known_gts(current_raw);
    let current_width_lanes = own
        .current_width_lanes
        .or(parent.current_width_lanes)
        .filter(|w| *w > 0);
    if current_width_lanes.is_none() && current_speed_gts.is_some() {
        problems.push(format!("{address}: link width missing or 0"));
    }
    let max_speed_gts = min_known(known_gts(own.max_speed), known_gts(parent.max_speed));
    let max_width_lanes = min_known(own.max_width_lanes, parent.max_width_lanes);
    Some(build_link(
        current_speed_gts,
        current_width_lanes,
        max_speed_gts,
        max_width_lanes,
    ))
}

/// A `Link` with its generation, ceilings and below-maximum flags computed.
pub fn build_link(
    current_speed_gts: Option<f64>,
    current_width_lanes: Option<u32>,
    max_speed_gts: Option<f64>,
    max_width_lanes: Option<u32>,
) -> Link {
    let current_gen = current_speed_gts.and_then(PcieGen::from_transfer_rate_gts);
    let max_gen = max_speed_gts.and_then(PcieGen::from_transfer_rate_gts);
    let ceiling = |gen: Option<PcieGen>, width: Option<u32>| {
        Some(model::link_ceiling_bytes_per_sec(gen?, width?))
    };
    Link {
        current_speed_gts,
        current_gen,
        current_width_lanes,
        max_speed_gts,
        max_gen,
        max_width_lanes,
        below_max_speed: matches!((current_gen, max_gen), (Some(c), Some(m)) if c < m),
        below_max_width: matches!(
            (current_width_lanes, max_width_lanes),
            (Some(c), Some(m)) if c < m
        ),
        ceiling_bytes_per_sec: ceiling(current_gen, current_width_lanes),
        max_ceiling_bytes_per_sec: ceiling(max_gen, max_width_lanes),
    }
}

/// "Gen3 x4", "Gen? x2" for a link with an unknown part.
pub fn link_label(gen: Option<PcieGen>, width_lanes: Option<u32>) -> String {
    let gen = gen.map_or("Gen?".to_string(), |g| format!("Gen{}", g.number()));
    let width = width_lanes.map_or("x?".to_string(), |w| format!("x{w}"));
    format!("{gen} {width}")
}

/// Sets attachment, root complex/port, VMD and chipset; returns the group key.
fn place_device(chain: &Chain, device: &mut BlockDevice) -> GroupKey {
    let functions = &chain.functions;
    let Some(top_index) = top_function_index(functions) else {
        device.attachment = Attachment::Virtual;
        return GroupKey::Virtual;
    };
    let top = &functions[top_index];
    let host = chain.hosts[top_index].clone();
    device.root_complex = Some(host.clone());
    device.vmd = functions
        .iter()
        .find(|f| f.role == PciRole::Vmd)
        .map(|f| f.address.clone());
    if top.role == PciRole::RootPort {
        device.root_port = Some(top.address.clone());
    }
    let key = group_key(
        functions,
        top_index,
        &chain.hosts[0],
        &host,
        device.vmd.is_some(),
    );
    device.attachment = match &key {
        GroupKey::Dmi { family, .. } => {
            device.chipset = Some(family.name.to_string());
            Attachment::Chipset
        }
        GroupKey::AmdChipset { name, .. } => {
            device.chipset = Some(name.clone());
            Attachment::Chipset
        }
        GroupKey::Switch { .. } | GroupKey::RootPort { .. } => Attachment::CpuLanes,
        GroupKey::Integrated { .. } => Attachment::Integrated,
        GroupKey::Virtual => Attachment::Virtual,
    };
    key
}

/// The function just below the last host bridge: the root port (or integrated function).
fn top_function_index(functions: &[PciFunction]) -> Option<usize> {
    let after_vmd = functions
        .iter()
        .rposition(|f| f.role == PciRole::Vmd)
        .map_or(0, |i| i + 1);
    (after_vmd < functions.len()).then_some(after_vmd)
}

fn group_key(
    functions: &[PciFunction],
    top_index: usize,
    first_host: &str,
    host: &str,
    under_vmd: bool,
) -> GroupKey {
    let top = &functions[top_index];
    if let Some(family) = intel_pch(top, under_vmd) {
        return GroupKey::Dmi {
            host: first_host.to_string(),
            family,
        };
    }
    if top.role != PciRole::RootPort {
        return GroupKey::Integrated {
            host: host.to_string(),
        };
    }
    let below = &functions[top_index + 1..];
    if let Some((usp, name)) = amd_chipset(top, below) {
        return GroupKey::AmdChipset { usp, name };
    }
    if let Some(usp) = below.iter().find(|f| f.role == PciRole::SwitchUpstream) {
        return GroupKey::Switch { usp: usp.clone() };
    }
    GroupKey::RootPort {
        port: top.address.clone(),
    }
}

/// Is this root-bus function part of an Intel PCH? By id table first, then by position:
/// Intel puts PCH functions at device numbers 0x11–0x1f of bus 0 (root ports at 0x1b–0x1d),
/// CPU functions below that.
fn intel_pch(top: &PciFunction, under_vmd: bool) -> Option<PchFamily> {
    if top.vendor_id != Some(pci_ids::VENDOR_INTEL) {
        return None;
    }
    if let Some(family) = top.device_id.and_then(pci_ids::intel_pch_family) {
        return Some(family);
    }
    let (bus, slot) = sysfs::bus_and_slot(&top.address)?;
    let by_position = if under_vmd {
        (0x1b..=0x1d).contains(&slot)
    } else {
        top.address.starts_with("0000:") && bus == 0 && (0x11..=0x1f).contains(&slot)
    };
    by_position.then_some(pci_ids::UNKNOWN_PCH)
}

/// AMD chipsets hang below a CPU root port; the first AMD function below a (non-internal)
/// AMD root port is the chipset, and its link is the chipset uplink.
fn amd_chipset(root_port: &PciFunction, below: &[PciFunction]) -> Option<(PciFunction, String)> {
    let is_amd = |f: &PciFunction| f.vendor_id == Some(pci_ids::VENDOR_AMD);
    let internal = root_port
        .device_id
        .is_some_and(pci_ids::is_amd_internal_bridge);
    if !is_amd(root_port) || internal {
        return None;
    }
    let first = below.iter().find(|f| is_amd(f))?;
    let name = first
        .device_id
        .and_then(pci_ids::amd_chipset_name)
        .unwrap_or("AMD chipset");
    Some((first.clone(), name.to_string()))
}

/// `ataN/linkM/ata_link/linkM/sata_spd` ("6.0 Gbps") of the port a SATA disk hangs from.
fn read_sata_speed_gbps(resolved: &Path) -> Option<f64> {
    let mut port = PathBuf::from("/");
    for name in component_names(resolved) {
        port.push(&name);
        if is_ata_port(&name) {
            break;
        }
    }
    let links = fs::read_dir(&port).ok()?;
    links.filter_map(|e| e.ok()).find_map(|e| {
        let link = e.file_name().to_string_lossy().into_owned();
        let path = e.path().join("ata_link").join(&link);
        let text = sysfs::read_attr(&path, "sata_spd").ok()??;
        text.split_whitespace().next()?.parse::<f64>().ok()
    })
}

fn set_link_ceiling(device: &mut BlockDevice) {
    let mut best: Option<(f64, String)> = None;
    for function in &device.pci_path {
        let Some(link) = &function.link else { continue };
        let Some(ceiling) = link.ceiling_bytes_per_sec else {
            continue;
        };
        if best.as_ref().is_none_or(|(b, _)| ceiling < *b) {
            let label = link_label(link.current_gen, link.current_width_lanes);
            best = Some((ceiling, format!("{} {label}", function.address)));
        }
    }
    if let Some(gbps) = device.sata_speed_gbps {
        let ceiling = model::sata_ceiling_bytes_per_sec(gbps);
        if best.as_ref().is_none_or(|(b, _)| ceiling < *b) {
            best = Some((ceiling, format!("SATA {gbps:.1} Gb/s")));
        }
    }
    device.link_ceiling_bytes_per_sec = best.as_ref().map(|(c, _)| *c);
    device.limiting_link = best.map(|(_, l)| l);
}

fn group_uplinks(walked: &[Walked]) -> Vec<UplinkGroup> {
    let mut groups: BTreeMap<String, UplinkGroup> = BTreeMap::new();
    for w in walked {
        let id = w.device.uplink.clone();
        groups
            .entry(id.clone())
            .or_insert_with(|| new_group(id, &w.group))
            .devices
            .push(w.device.name.clone());
    }
    let mut list: Vec<UplinkGroup> = groups.into_values().collect();
    list.sort_by_key(|g| (!g.shared, g.kind as u8, g.id.clone()));
    list
}

fn group_id(key: &GroupKey) -> String {
    match key {
        GroupKey::Dmi { host, .. } => format!("dmi:{host}"),
        GroupKey::AmdChipset { usp, .. } => format!("chipset:{}", usp.address),
        GroupKey::Switch { usp } => format!("switch:{}", usp.address),
        GroupKey::RootPort { port } => format!("port:{port}"),
        GroupKey::Integrated { host } => format!("integrated:{host}"),
        GroupKey::Virtual => "virtual".into(),
    }
}

fn new_group(id: String, key: &GroupKey) -> UplinkGroup {
    let mut group = UplinkGroup {
        id,
        kind: UplinkKind::Virtual,
        shared: false,
        description: String::new(),
        label: String::new(),
        ceiling_bytes_per_sec: None,
        assumed: false,
        devices: Vec::new(),
    };
    match key {
        GroupKey::Dmi { family, .. } => describe_dmi(&mut group, family),
        GroupKey::AmdChipset { usp, name } => {
            describe_uplink(&mut group, usp, UplinkKind::AmdChipset, name, "uplink")
        }
        GroupKey::Switch { usp } => {
            let name = format!("PCIe switch {}", usp.address);
            describe_uplink(&mut group, usp, UplinkKind::PcieSwitch, &name, "uplink")
        }
        GroupKey::RootPort { port } => {
            group.kind = UplinkKind::CpuRootPort;
            group.description = format!("CPU root port {port}");
            group.label = group.description.clone();
        }
        GroupKey::Integrated { host } => {
            group.kind = UplinkKind::Integrated;
            group.description = format!("root complex {host}: functions with no PCIe link");
            group.label = format!("root complex {host}");
        }
        GroupKey::Virtual => {
            group.description = "virtual devices: no PCI path".into();
            group.label = "virtual".into();
        }
    }
    if group.id == "unknown" {
        group.description = "devices the walk could not place".into();
        group.label = "unknown".into();
    }
    group
}

fn describe_dmi(group: &mut UplinkGroup, family: &PchFamily) {
    group.kind = UplinkKind::IntelDmi;
    group.shared = true;
    group.label = family.dmi.label().to_string();
    group.description = format!(
        "{} x{} to the {}",
        family.dmi.label(),
        family.dmi_width_lanes,
        family.name
    );
    group.ceiling_bytes_per_sec = Some(model::dmi_ceiling_bytes_per_sec(
        family.dmi,
        family.dmi_width_lanes,
    ));
    group.assumed = family.width_varies;
}

fn describe_uplink(
    group: &mut UplinkGroup,
    usp: &PciFunction,
    kind: UplinkKind,
    name: &str,
    what: &str,
) {
    group.kind = kind;
    group.shared = true;
    let link = usp.link.as_ref();
    let label = link_label(
        link.and_then(|l| l.current_gen),
        link.and_then(|l| l.current_width_lanes),
    );
    group.label = format!("the {name} {what}");
    group.description = format!("{name} {what} {label} at {}", usp.address);
    group.ceiling_bytes_per_sec = link.and_then(|l| l.ceiling_bytes_per_sec);
}
