//! Advice in plain words, derived from a topology and (optionally) a plan.

use std::collections::BTreeSet;

use crate::model::{format_rate, RatingSource};
use crate::plan::{Limit, Plan};
use crate::scan::{BlockDevice, DeviceKind, Link, Topology, UplinkGroup};

/// Advice about the machine as a whole: degraded links, crowded uplinks, VMD.
pub fn topology_advice(topology: &Topology) -> Vec<String> {
    let mut lines = Vec::new();
    let mut seen = BTreeSet::new();
    for device in &topology.devices {
        lines.extend(degraded_link_lines(device, &mut seen));
    }
    for group in topology.uplinks.iter().filter(|g| g.shared) {
        lines.extend(crowded_uplink_line(topology, group));
    }
    lines.extend(vmd_lines(topology));
    lines
}

/// Advice about a planned array.
pub fn plan_advice(topology: &Topology, plan: &Plan) -> Vec<String> {
    let members: Vec<&BlockDevice> = plan
        .members
        .iter()
        .filter_map(|m| topology.devices.iter().find(|d| d.name == m.name))
        .collect();
    let mut lines = Vec::new();
    let mut seen = BTreeSet::new();
    for device in &members {
        lines.extend(degraded_link_lines(device, &mut seen));
    }
    lines.extend(limit_line(plan));
    lines.extend(pace_mismatch_line(plan));
    lines.extend(numa_line(&members));
    lines.extend(workers_line(&members, topology.cpus_online));
    lines
}

/// The name people know a device's link by: the NVMe controller, else the block device.
fn link_owner(device: &BlockDevice) -> &str {
    device.controller.as_deref().unwrap_or(&device.name)
}

/// "nvme1 runs at x2 of x4: check the slot's lane sharing", once per link.
fn degraded_link_lines(device: &BlockDevice, seen: &mut BTreeSet<String>) -> Vec<String> {
    let own = device.pci_path.last().map(|f| f.address.clone());
    let mut lines = Vec::new();
    for function in &device.pci_path {
        let Some(link) = function.link.as_ref() else {
            continue;
        };
        if !(link.below_max_width || link.below_max_speed) || !seen.insert(function.address.clone())
        {
            continue;
        }
        let who = if Some(&function.address) == own.as_ref() {
            link_owner(device).to_string()
        } else {
            format!(
                "the link above {} (on {}'s path)",
                function.address, device.name
            )
        };
        lines.push(format!("{who} runs at {}", degraded_link_text(link)));
    }
    lines
}

fn degraded_link_text(link: &Link) -> String {
    let gen = |g: Option<crate::model::PcieGen>| g.map_or(0, |g| g.number());
    let (cur_w, max_w) = (
        link.current_width_lanes.unwrap_or(0),
        link.max_width_lanes.unwrap_or(0),
    );
    let (cur_g, max_g) = (gen(link.current_gen), gen(link.max_gen));
    match (link.below_max_speed, link.below_max_width) {
        (false, true) => format!("x{cur_w} of x{max_w}: check the slot's lane sharing"),
        (true, false) => format!(
            "Gen{cur_g} of Gen{max_g}: check the BIOS link-speed setting, risers and the slot"
        ),
        _ => format!(
            "Gen{cur_g} x{cur_w} of Gen{max_g} x{max_w}: check the slot's lane sharing and the BIOS link-speed setting"
        ),
    }
}

/// Two or more NVMe drives whose links together exceed the uplink they share.
fn crowded_uplink_line(topology: &Topology, group: &UplinkGroup) -> Option<String> {
    let ceiling = group.ceiling_bytes_per_sec?;
    let drives: Vec<&BlockDevice> = topology
        .devices
        .iter()
        .filter(|d| d.uplink == group.id && d.kind == DeviceKind::Nvme)
        .collect();
    let links_sum: f64 = drives
        .iter()
        .filter_map(|d| d.link_ceiling_bytes_per_sec)
        .sum();
    if drives.len() < 2 || links_sum <= ceiling {
        return None;
    }
    let names: Vec<&str> = drives.iter().map(|d| d.name.as_str()).collect();
    Some(format!(
        "{} share {} ({}): together they cannot exceed it",
        join_names(&names),
        group.label,
        format_rate(ceiling)
    ))
}

/// One line per VMD controller, naming the devices remapped behind it.
fn vmd_lines(topology: &Topology) -> Vec<String> {
    let vmds: BTreeSet<&str> = topology
        .devices
        .iter()
        .filter_map(|d| d.vmd.as_deref())
        .collect();
    vmds.into_iter()
        .map(|vmd| {
            let names: Vec<&str> = topology
                .devices
                .iter()
                .filter(|d| d.vmd.as_deref() == Some(vmd))
                .map(|d| d.name.as_str())
                .collect();
            let verb = if names.len() == 1 { "sits" } else { "sit" };
            format!(
                "{} {verb} behind Intel VMD ({vmd}): the vmd driver must be loaded and interrupts are remapped through it; if latency matters, check the BIOS VMD/RST setting",
                join_names(&names)
            )
        })
        .collect()
}

/// "a, b and c".
fn join_names(names: &[&str]) -> String {
    match names {
        [] => String::new(),
        [one] => one.to_string(),
        [init @ .., last] => format!("{} and {last}", init.join(", ")),
    }
}

/// What limits reads, in words.
fn limit_line(plan: &Plan) -> Option<String> {
    let level = crate::plan::level_label(plan.level);
    let read = &plan.read;
    let cap = read.bytes_per_sec.map(format_rate);
    match &read.limited_by {
        Limit::SharedUplink { label, members, .. } => {
            let who = if *members == 2 && plan.members.len() == 2 {
                "both drives".to_string()
            } else if *members == plan.members.len() {
                format!("all {members} drives")
            } else {
                format!("{members} of the {} drives", plan.members.len())
            };
            let cap = cap.unwrap_or_default();
            Some(format!(
                "{who} sit behind {label}: {level} reads cap at {cap}; move one to a CPU slot"
            ))
        }
        Limit::Device { device, source } => {
            let each = read
                .per_member_bytes_per_sec
                .map(format_rate)
                .unwrap_or_default();
            let how = match source {
                RatingSource::Seeds => "rated",
                RatingSource::Measured => "measured",
            };
            Some(format!(
                "the drives, not the links, limit {level} reads ({each} per drive, {how} on {device})"
            ))
        }
        Limit::Link { device, link } => {
            let each = read
                .per_member_bytes_per_sec
                .map(format_rate)
                .unwrap_or_default();
            Some(format!(
                "{device}'s link ({link}) sets the pace at {each} per drive: {level} reads cap at {}",
                cap.unwrap_or_default()
            ))
        }
        Limit::Unknown { device } => Some(format!(
            "{device} has no PCIe link to model: run with --measure for a real figure"
        )),
    }
}

/// One member far slower than another: striping makes the fast ones wait.
fn pace_mismatch_line(plan: &Plan) -> Option<String> {
    let pace = plan.read.per_member_bytes_per_sec?;
    let fastest = plan
        .members
        .iter()
        .filter_map(|m| crate::plan::member_pace(m, &plan.members, crate::plan::Direction::Read))
        .map(|(p, _)| p)
        .fold(0.0_f64, f64::max);
    let slow = match &plan.read.limited_by {
        Limit::Link { device, .. } | Limit::Device { device, .. } => device,
        _ => return None,
    };
    if fastest < pace * 1.2 {
        return None;
    }
    Some(format!(
        "{slow} sets the pace at {} while another member could do {}: striping splits I/O evenly, so the faster drives wait",
        format_rate(pace),
        format_rate(fastest)
    ))
}

fn numa_line(members: &[&BlockDevice]) -> Option<String> {
    let nodes: BTreeSet<i32> = members.iter().filter_map(|d| d.numa_node).collect();
    if nodes.len() < 2 {
        return None;
    }
    let list: Vec<String> = nodes.iter().map(|n| n.to_string()).collect();
    let list: Vec<&str> = list.iter().map(String::as_str).collect();
    Some(format!(
        "the drives span NUMA nodes {}: give each node's drives workers on that node's CPUs, or cross-socket traffic will cost bandwidth",
        join_names(&list)
    ))
}

/// "use at least N workers: the drives expose M queues each".
fn workers_line(members: &[&BlockDevice], cpus_online: Option<u32>) -> Option<String> {
    let queues: Vec<u32> = members.iter().filter_map(|d| d.hw_queues).collect();
    let fewest = *queues.iter().min()?;
    let most = *queues.iter().max()?;
    if queues.len() != members.len() || fewest < 2 {
        return None;
    }
    let workers = cpus_online.map_or(fewest, |c| c.min(fewest)).max(1);
    let exposed = if fewest == most {
        format!("{fewest}")
    } else {
        format!("{fewest} to {most}")
    };
    Some(format!(
        "use at least {workers} workers: the drives expose {exposed} queues each"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_join_in_english() {
        assert_eq!(join_names(&["a"]), "a");
        assert_eq!(join_names(&["a", "b"]), "a and b");
        assert_eq!(join_names(&["a", "b", "c"]), "a, b and c");
    }

    #[test]
    fn degraded_width_and_speed_have_their_own_words() {
        let width = crate::scan::build_link(Some(8.0), Some(2), Some(8.0), Some(4));
        assert_eq!(
            degraded_link_text(&width),
            "x2 of x4: check the slot's lane sharing"
        );
        let speed = crate::scan::build_link(Some(2.5), Some(4), Some(8.0), Some(4));
        assert!(degraded_link_text(&speed).starts_with("Gen1 of Gen3"));
        let both = crate::scan::build_link(Some(5.0), Some(1), Some(8.0), Some(4));
        assert!(degraded_link_text(&both).starts_with("Gen2 x1 of Gen3 x4"));
    }
}
