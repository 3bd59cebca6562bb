//! `assemble --scan`: find md members among files, devices and directories,
//! group them by array UUID and say whether each array can start.

use crate::assemble::{geometry_of, has_every_byte, missing_roles};
use crate::decision::decide;
use crate::error::Error;
use crate::slot::read_superblock;
use nvraid_member::{Member, OpenOptions};
use nvraid_metadata::{format_uuid, DecodeError, Role, Superblock};
use serde::Serialize;
use std::path::Path;

/// One member found by the scan.
#[derive(Clone, Debug, Serialize)]
pub struct ScannedMember {
    pub path: String,
    /// The recorded active role, if any.
    pub role: Option<u16>,
    pub events: u64,
    /// `active`, `journal` (the array's write journal), or why it is set
    /// aside: `stale` (events behind the freshest member), `faulty`,
    /// `spare`, `journal` (one the array does not use), `replacement`; or
    /// `refused` when the array as a whole cannot be assembled (the array's
    /// `reason` says why).
    pub state: &'static str,
}

/// One array found by the scan.
#[derive(Clone, Debug, Serialize)]
pub struct ScannedArray {
    pub uuid: String,
    pub name: String,
    pub level: i32,
    pub raid_disks: u32,
    pub events: u64,
    /// `complete`, `degraded` or `not startable`.
    pub status: &'static str,
    /// Why the array is degraded or cannot start.
    pub reason: Option<String>,
    pub members: Vec<ScannedMember>,
}

/// Everything the scan found.
#[derive(Clone, Debug, Default, Serialize)]
pub struct ScanReport {
    pub arrays: Vec<ScannedArray>,
    /// Paths that hold no usable superblock, with the reason.
    pub ignored: Vec<Ignored>,
}

/// A path the scan looked at and left out.
#[derive(Clone, Debug, Serialize)]
pub struct Ignored {
    pub path: String,
    pub reason: String,
}

/// Scan `paths`: files and block devices directly, directories one level
/// deep (sorted by name).
pub fn scan(paths: &[String]) -> ScanReport {
    let mut report = ScanReport::default();
    let mut found: Vec<(String, Superblock)> = Vec::new();
    for candidate in expand(paths, &mut report.ignored) {
        match probe(&candidate) {
            Ok(sb) => found.push((candidate, sb)),
            Err(reason) => report.ignored.push(Ignored {
                path: candidate,
                reason,
            }),
        }
    }
    let mut uuids: Vec<[u8; 16]> = Vec::new();
    for (_, sb) in &found {
        if !uuids.contains(&sb.set_uuid) {
            uuids.push(sb.set_uuid);
        }
    }
    for uuid in uuids {
        let group: Vec<&(String, Superblock)> =
            found.iter().filter(|(_, sb)| sb.set_uuid == uuid).collect();
        report.arrays.push(judge(&group));
    }
    report
}

fn expand(paths: &[String], ignored: &mut Vec<Ignored>) -> Vec<String> {
    let mut out = Vec::new();
    for path in paths {
        let p = Path::new(path);
        if !p.is_dir() {
            out.push(path.clone());
            continue;
        }
        match std::fs::read_dir(p) {
            Ok(entries) => {
                let mut names: Vec<String> = entries
                    .flatten()
                    .filter(|e| e.file_type().is_ok_and(|t| !t.is_dir()))
                    .map(|e| e.path().display().to_string())
                    .collect();
                names.sort();
                out.extend(names);
            }
            Err(e) => ignored.push(Ignored {
                path: path.clone(),
                reason: e.to_string(),
            }),
        }
    }
    out
}

fn probe(path: &str) -> Result<Superblock, String> {
    let member = Member::open(
        path,
        OpenOptions {
            write: false,
            create_bytes: None,
            direct: false,
            ..Default::default()
        },
    )
    .map_err(|e| e.to_string())?;
    match read_superblock(&member) {
        Ok(sb) => Ok(sb),
        Err(Error::Superblock {
            source: DecodeError::BadMagic { .. },
            ..
        }) => Err("no md superblock".into()),
        Err(Error::Superblock { source, .. }) => Err(source.to_string()),
        Err(e) => Err(e.to_string()),
    }
}

fn judge(group: &[&(String, Superblock)]) -> ScannedArray {
    let freshest = group.iter().map(|(_, sb)| sb.events).max().unwrap_or(0);
    let (_, head) = group
        .iter()
        .find(|(_, sb)| sb.events == freshest)
        .expect("group is non-empty");
    let listed: Vec<(&str, &Superblock)> =
        group.iter().map(|(path, sb)| (path.as_str(), sb)).collect();
    let role_of = |sb: &Superblock| match sb.role() {
        Role::Active(r) => Some(r),
        _ => None,
    };
    // An array its members record mid-reshape is judged as `serve`
    // assembles it (every role of both shapes): `serve` goes on with a
    // grow beside clients or finishes it first, and refuses by name a
    // record nvraid cannot honour.
    let reshaping = group.iter().any(|(_, sb)| crate::reshape::is_reshaping(sb));
    // A RAID 0 reshaped as md's RAID 4 never names its parity role: it is
    // not missing (`serve` asks for no member of it).
    let unnamed_parity = reshaping
        && group
            .iter()
            .filter(|(_, sb)| crate::reshape::is_reshaping(sb))
            .max_by_key(|(_, sb)| sb.events)
            .is_some_and(|(_, sb)| crate::reshape::last_role_unnamed(sb));
    let decided = if reshaping {
        crate::decision::decide_reshaping(&listed).and_then(|decision| {
            let recording = listed
                .iter()
                .filter(|(_, sb)| crate::reshape::is_reshaping(sb))
                .max_by_key(|(_, sb)| sb.events);
            match recording {
                Some(&(spec, sb)) => crate::reshape::check_servable(sb, spec).map(|()| decision),
                None => Ok(decision),
            }
        })
    } else {
        decide(&listed)
    };
    let (members, status, reason) = match decided {
        Ok(decision) => {
            let mut members: Vec<ScannedMember> = group
                .iter()
                .map(|(path, sb)| ScannedMember {
                    path: path.clone(),
                    role: role_of(sb),
                    events: sb.events,
                    state: "active",
                })
                .collect();
            for (index, why) in &decision.set_aside {
                members[*index].state = why.state();
            }
            if let Some(index) = decision.journal {
                members[index].state = "journal";
            }
            let mut present: Vec<bool> = decision.roles.iter().map(Option::is_some).collect();
            if unnamed_parity {
                if let Some(parity) = present.last_mut() {
                    *parity = true;
                }
            }
            let (status, reason) = status_of(head, &present);
            (members, status, reason)
        }
        Err(e) => {
            let members = group
                .iter()
                .map(|(path, sb)| ScannedMember {
                    path: path.clone(),
                    role: role_of(sb),
                    events: sb.events,
                    state: "refused",
                })
                .collect();
            (members, "not startable", Some(e.to_string()))
        }
    };
    ScannedArray {
        uuid: format_uuid(&head.set_uuid),
        name: head.name(),
        level: head.level,
        raid_disks: head.raid_disks,
        events: freshest,
        status,
        reason,
        members,
    }
}

fn status_of(head: &Superblock, present: &[bool]) -> (&'static str, Option<String>) {
    let geometry = match geometry_of(head, "array") {
        Ok(g) => g,
        Err(e) => return ("not startable", Some(e.to_string())),
    };
    let missing = missing_roles(present);
    if missing.is_empty() {
        ("complete", None)
    } else if has_every_byte(&geometry, present) {
        (
            "degraded",
            Some(format!("roles {} missing or set aside", missing.join(", "))),
        )
    } else {
        (
            "not startable",
            Some(format!(
                "roles {} missing or set aside and some data has no copy left",
                missing.join(", ")
            )),
        )
    }
}
