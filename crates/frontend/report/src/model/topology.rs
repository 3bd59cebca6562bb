//! `nvraid-topology/1`: the PCIe report of `nvraid topology --json`, with
//! the array plan of `--plan` and the results of `--measure` when present.

use crate::error::ReportError;
use crate::json::Node;

/// One block device.
#[derive(Debug, Clone)]
pub(crate) struct Device {
    pub name: String,
    pub kind: String,
    pub model: Option<String>,
    /// `cpu_lanes`, `chipset`, `integrated`, `virtual`, `unknown`.
    pub attachment: String,
    pub chipset: Option<String>,
    /// Lowest link ceiling on the device's own path, bytes per second.
    pub link_ceiling: Option<f64>,
    pub limiting_link: Option<String>,
    /// Id of the device's group in `uplinks`.
    pub uplink: String,
    pub problems: Vec<String>,
}

/// A group of devices behind one link.
#[derive(Debug, Clone)]
pub(crate) struct Uplink {
    /// What devices' `uplink` refers to.
    pub id: String,
    pub kind: String,
    pub shared: bool,
    pub label: String,
    pub description: String,
    /// Bytes per second; known for shared links only.
    pub ceiling: Option<f64>,
    /// Width or version taken from a table default.
    pub assumed: bool,
    pub devices: Vec<String>,
}

/// One direction's predicted ceiling of a planned array.
#[derive(Debug, Clone)]
pub(crate) struct Ceiling {
    pub bytes_per_sec: Option<f64>,
    pub per_member: Option<f64>,
    /// What sets it, in words.
    pub limited_by: String,
}

/// The planner's answer for a proposed array.
#[derive(Debug, Clone)]
pub(crate) struct Plan {
    /// `raid0`, `raid1`, `raid10`.
    pub level: String,
    pub members: Vec<String>,
    pub read: Ceiling,
    pub write: Ceiling,
    /// False when the write ceiling is the links' alone.
    pub write_rating_known: bool,
}

/// One `--measure` result beside its prediction.
#[derive(Debug, Clone)]
pub(crate) struct Measurement {
    pub device: String,
    pub predicted: Option<f64>,
    pub measured: Option<f64>,
    /// `link_limited`, `device_limited`, `cpu_limited`.
    pub bottleneck: Option<String>,
    pub error: Option<String>,
}

/// A whole `nvraid topology` result.
#[derive(Debug, Clone)]
pub(crate) struct Topology {
    pub sysfs_root: String,
    pub cpus_online: Option<u64>,
    pub devices: Vec<Device>,
    pub uplinks: Vec<Uplink>,
    pub idle_devices: Vec<String>,
    pub plan: Option<Plan>,
    pub measurements: Vec<Measurement>,
    pub advice: Vec<String>,
}

impl Device {
    fn read(node: Node<'_>) -> Result<Device, ReportError> {
        Ok(Device {
            name: node.get("name", |n| n.str())?,
            kind: node.get("kind", |n| n.str())?,
            model: node.opt("model", |n| n.str())?,
            attachment: node.get("attachment", |n| n.str())?,
            chipset: node.opt("chipset", |n| n.str())?,
            link_ceiling: node.opt("link_ceiling_bytes_per_sec", |n| n.f64())?,
            limiting_link: node.opt("limiting_link", |n| n.str())?,
            uplink: node.get("uplink", |n| n.str())?,
            problems: node.opt("problems", |n| n.strings())?.unwrap_or_default(),
        })
    }
}

impl Uplink {
    fn read(node: Node<'_>) -> Result<Uplink, ReportError> {
        Ok(Uplink {
            id: node.get("id", |n| n.str())?,
            kind: node.get("kind", |n| n.str())?,
            shared: node.get("shared", |n| n.bool())?,
            label: node.get("label", |n| n.str())?,
            description: node.get("description", |n| n.str())?,
            ceiling: node.opt("ceiling_bytes_per_sec", |n| n.f64())?,
            assumed: node.opt("assumed", |n| n.bool())?.unwrap_or(false),
            devices: node.get("devices", |n| n.strings())?,
        })
    }
}

/// A plan's `limited_by`, an object tagged by `kind`, in words.
fn describe_limit(node: Node<'_>) -> Result<String, ReportError> {
    let text = |key: &str| node.get(key, |n| n.str());
    let kind = text("kind")?;
    Ok(match kind.as_str() {
        "link" => format!("the link of {} ({})", text("device")?, text("link")?),
        "shared_uplink" => format!(
            "{}, shared by {} members",
            text("label")?,
            node.get("members", |n| n.u64())?
        ),
        "device" => format!(
            "the drive {} itself ({} rating)",
            text("device")?,
            text("source")?
        ),
        "unknown" => format!(
            "unknown: {} has no modelled link; measure it",
            text("device")?
        ),
        other => {
            return Err(node.error(format!(
                "has kind \"{other}\"; expected link, shared_uplink, device or unknown"
            )))
        }
    })
}

impl Ceiling {
    fn read(node: Node<'_>) -> Result<Ceiling, ReportError> {
        Ok(Ceiling {
            bytes_per_sec: node.opt("bytes_per_sec", |n| n.f64())?,
            per_member: node.opt("per_member_bytes_per_sec", |n| n.f64())?,
            limited_by: node.get("limited_by", describe_limit)?,
        })
    }
}

impl Plan {
    fn read(node: Node<'_>) -> Result<Plan, ReportError> {
        Ok(Plan {
            level: node.get("level", |n| n.str())?,
            members: node.get("members", |list| {
                list.items(|member| member.get("name", |n| n.str()))
            })?,
            read: node.get("read", Ceiling::read)?,
            write: node.get("write", Ceiling::read)?,
            write_rating_known: node.get("write_rating_known", |n| n.bool())?,
        })
    }
}

impl Measurement {
    fn read(node: Node<'_>) -> Result<Measurement, ReportError> {
        Ok(Measurement {
            device: node.get("device", |n| n.str())?,
            predicted: node.opt("predicted_ceiling_bytes_per_sec", |n| n.f64())?,
            measured: node.opt("measured", |m| m.get("bytes_per_sec", |n| n.f64()))?,
            bottleneck: node.opt("bottleneck", |n| n.str())?,
            error: node.opt("error", |n| n.str())?,
        })
    }
}

impl Topology {
    /// Reads a topology result whose schema has been checked.
    pub(crate) fn read(root: Node<'_>) -> Result<Topology, ReportError> {
        let (sysfs_root, cpus_online, devices, uplinks, idle_devices) =
            root.get("topology", |topology| {
                Ok((
                    topology.get("sysfs_root", |n| n.str())?,
                    topology.opt("cpus_online", |n| n.u64())?,
                    topology.get("devices", |list| list.items(Device::read))?,
                    topology.get("uplinks", |list| list.items(Uplink::read))?,
                    topology
                        .opt("idle_devices", |n| n.strings())?
                        .unwrap_or_default(),
                ))
            })?;
        Ok(Topology {
            sysfs_root,
            cpus_online,
            devices,
            uplinks,
            idle_devices,
            plan: root.opt("plan", Plan::read)?,
            measurements: root
                .opt("measurements", |list| list.items(Measurement::read))?
                .unwrap_or_default(),
            advice: root.opt("advice", |n| n.strings())?.unwrap_or_default(),
        })
    }
}
