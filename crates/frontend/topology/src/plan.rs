//! The ceiling of a proposed array, and which link (or drive) sets it.
//!
//! Striping splits sequential I/O evenly over the members, so every member moves the same
//! number of bytes per second: the array runs at `members × the slowest member's pace`. A
//! member's pace is the lowest of
//!
//! * its own link ceiling (the narrowest link on its path),
//! * its share of a shared uplink: `uplink ceiling / array members behind that uplink`,
//! * its rated (SEEDS.md) or measured drive speed, when known.
//!
//! Reads of RAID 1 and RAID 10 are balanced over every copy, so they scale like RAID 0. A write
//! goes to every copy: RAID 1 writes at one member's pace, RAID 10 at `members / copies`
//! (`members / 2` for the default near-2).

use std::collections::BTreeMap;

use serde::Serialize;

use crate::error::Error;
use crate::model::{DriveRating, RatingSource};
use crate::scan::Topology;

pub use nvraid_layout::Level;

/// How a level is named in plans and advice: "RAID 0", "RAID 5", ...
pub fn level_label(level: Level) -> String {
    format!("RAID {}", &level.md_name()["raid".len()..])
}

/// Plans record the level as md names it (`raid0`, `raid5`, ...).
fn serialize_level<S: serde::Serializer>(level: &Level, out: S) -> Result<S::Ok, S::Error> {
    out.serialize_str(level.md_name())
}

/// The command line's `--level`: 0, 1, 10, 4, 5 or 6.
pub fn parse_level(text: &str) -> Result<Level, String> {
    Level::parse(text)
}

fn check_member_count(level: Level, count: usize) -> Result<(), Error> {
    // md's near-2 RAID 10 (what nvraid creates) takes 2 or more members,
    // odd counts included.
    if count >= level.members_min() as usize {
        return Ok(());
    }
    Err(Error::Usage(format!(
        "{} cannot be built from {count} device(s)",
        level_label(level)
    )))
}

/// How many members' worth of pace the array delivers in each direction:
/// reads come from every member holding data (a dedicated RAID 4 parity
/// member holds none; RAID 5/6 parity rotates, so each member's share of
/// a sequential read is its data chunks), so `members - parity chunks`;
/// writes reach every copy (RAID 1 writes at one member's pace, RAID 10 at
/// `members / copies`), and a full-stripe parity write carries data on all
/// but the parity chunks.
fn scale(level: Level, members: usize, direction: Direction) -> f64 {
    let data = members as f64 - f64::from(level.parity_chunks());
    match direction {
        Direction::Read => data,
        Direction::Write => {
            data / f64::from(level.copies(u32::try_from(members).unwrap_or(u32::MAX)))
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Direction {
    Read,
    Write,
}

/// A shared link some members sit behind.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct SharedUplink {
    pub id: String,
    pub label: String,
    pub ceiling_bytes_per_sec: f64,
}

/// What the planner needs to know about one member.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct MemberInput {
    pub name: String,
    pub link_ceiling_bytes_per_sec: Option<f64>,
    pub limiting_link: Option<String>,
    pub uplink: Option<SharedUplink>,
    pub rating: Option<DriveRating>,
}

/// What sets a ceiling.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Limit {
    /// A member's own link (e.g. a slot trained at x2).
    Link { device: String, link: String },
    /// A link several members share (DMI, a chipset uplink, a switch uplink).
    SharedUplink {
        uplink: String,
        label: String,
        members: usize,
    },
    /// The drive itself.
    Device {
        device: String,
        source: RatingSource,
    },
    /// A member with nothing to bound it (no link, no rating).
    Unknown { device: String },
}

/// One direction's ceiling.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Ceiling {
    pub bytes_per_sec: Option<f64>,
    /// The pace every member runs at.
    pub per_member_bytes_per_sec: Option<f64>,
    pub limited_by: Limit,
}

/// The planner's answer for one array.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Plan {
    #[serde(serialize_with = "serialize_level")]
    pub level: Level,
    pub members: Vec<MemberInput>,
    pub read: Ceiling,
    pub write: Ceiling,
    /// False when some member's write speed is unknown: then the write ceiling is the links'.
    pub write_rating_known: bool,
}

/// Plan an array of `names` found in `topology`; `ratings` (e.g. measured) override the
/// SEEDS.md table.
pub fn plan(
    topology: &Topology,
    names: &[String],
    level: Level,
    ratings: &BTreeMap<String, DriveRating>,
) -> Result<Plan, Error> {
    let members = members_from_topology(topology, names, ratings)?;
    plan_members(level, members)
}

/// Member inputs for `names`, which may carry a "/dev/" prefix.
pub fn members_from_topology(
    topology: &Topology,
    names: &[String],
    ratings: &BTreeMap<String, DriveRating>,
) -> Result<Vec<MemberInput>, Error> {
    names
        .iter()
        .map(|raw| {
            let name = raw.strip_prefix("/dev/").unwrap_or(raw);
            let device = topology
                .devices
                .iter()
                .find(|d| d.name == name)
                .ok_or_else(|| Error::UnknownDevice(raw.clone()))?;
            let uplink = topology
                .uplinks
                .iter()
                .find(|g| g.id == device.uplink && g.shared)
                .and_then(|g| {
                    Some(SharedUplink {
                        id: g.id.clone(),
                        label: g.label.clone(),
                        ceiling_bytes_per_sec: g.ceiling_bytes_per_sec?,
                    })
                });
            let rating = ratings.get(name).copied().or_else(|| {
                device
                    .model
                    .as_deref()
                    .and_then(crate::model::known_drive_rating)
            });
            Ok(MemberInput {
                name: name.to_string(),
                link_ceiling_bytes_per_sec: device.link_ceiling_bytes_per_sec,
                limiting_link: device.limiting_link.clone(),
                uplink,
                rating,
            })
        })
        .collect()
}

/// Plan an array from member descriptions (pure).
pub fn plan_members(level: Level, members: Vec<MemberInput>) -> Result<Plan, Error> {
    check_member_count(level, members.len())?;
    let read = array_ceiling(level, &members, Direction::Read);
    let write = array_ceiling(level, &members, Direction::Write);
    let write_rating_known = members
        .iter()
        .all(|m| m.rating.is_some_and(|r| r.write_bytes_per_sec.is_some()));
    Ok(Plan {
        level,
        members,
        read,
        write,
        write_rating_known,
    })
}

fn array_ceiling(level: Level, members: &[MemberInput], direction: Direction) -> Ceiling {
    let mut slowest: Option<(f64, Limit)> = None;
    for member in members {
        let Some((pace, limit)) = member_pace(member, members, direction) else {
            return Ceiling {
                bytes_per_sec: None,
                per_member_bytes_per_sec: None,
                limited_by: Limit::Unknown {
                    device: member.name.clone(),
                },
            };
        };
        if slowest.as_ref().is_none_or(|(s, _)| pace < *s) {
            slowest = Some((pace, limit));
        }
    }
    let (pace, limit) = slowest.expect("check_member_count guarantees one member");
    Ceiling {
        bytes_per_sec: Some(pace * scale(level, members.len(), direction)),
        per_member_bytes_per_sec: Some(pace),
        limited_by: limit,
    }
}

/// The lowest bound on one member's pace, and what sets it.
pub fn member_pace(
    member: &MemberInput,
    all: &[MemberInput],
    direction: Direction,
) -> Option<(f64, Limit)> {
    let mut bounds: Vec<(f64, Limit)> = Vec::new();
    if let Some(ceiling) = member.link_ceiling_bytes_per_sec {
        let link = member.limiting_link.clone().unwrap_or_default();
        let device = member.name.clone();
        bounds.push((ceiling, Limit::Link { device, link }));
    }
    if let Some(uplink) = &member.uplink {
        let sharing = all
            .iter()
            .filter(|m| m.uplink.as_ref().is_some_and(|u| u.id == uplink.id))
            .count();
        let limit = Limit::SharedUplink {
            uplink: uplink.id.clone(),
            label: uplink.label.clone(),
            members: sharing,
        };
        bounds.push((uplink.ceiling_bytes_per_sec / sharing as f64, limit));
    }
    if let Some(rating) = member.rating {
        let rate = match direction {
            Direction::Read => Some(rating.read_bytes_per_sec),
            Direction::Write => rating.write_bytes_per_sec,
        };
        let device = member.name.clone();
        let source = rating.source;
        bounds.extend(rate.map(|r| (r, Limit::Device { device, source })));
    }
    bounds
        .into_iter()
        .reduce(|best, next| if next.0 < best.0 { next } else { best })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{link_ceiling_bytes_per_sec, PcieGen};

    fn member(name: &str, gen: PcieGen, width: u32) -> MemberInput {
        MemberInput {
            name: name.into(),
            link_ceiling_bytes_per_sec: Some(link_ceiling_bytes_per_sec(gen, width)),
            limiting_link: Some(format!("Gen{} x{width}", gen.number())),
            uplink: None,
            rating: None,
        }
    }

    fn dmi3() -> SharedUplink {
        SharedUplink {
            id: "dmi:pci0000:00".into(),
            label: "DMI 3.0".into(),
            ceiling_bytes_per_sec: link_ceiling_bytes_per_sec(PcieGen::Gen3, 4),
        }
    }

    #[test]
    fn raid0_of_equal_links_doubles_one_link() {
        let members = vec![member("a", PcieGen::Gen3, 4), member("b", PcieGen::Gen3, 4)];
        let plan = plan_members(Level::Raid0, members).unwrap();
        let one = link_ceiling_bytes_per_sec(PcieGen::Gen3, 4);
        assert_eq!(plan.read.bytes_per_sec, Some(2.0 * one));
        assert!(matches!(plan.read.limited_by, Limit::Link { .. }));
        assert!(!plan.write_rating_known);
    }

    #[test]
    fn the_slowest_member_sets_the_pace() {
        let members = vec![member("a", PcieGen::Gen3, 4), member("b", PcieGen::Gen3, 2)];
        let plan = plan_members(Level::Raid0, members).unwrap();
        let slow = link_ceiling_bytes_per_sec(PcieGen::Gen3, 2);
        assert_eq!(plan.read.bytes_per_sec, Some(2.0 * slow));
        assert_eq!(
            plan.read.limited_by,
            Limit::Link {
                device: "b".into(),
                link: "Gen3 x2".into()
            }
        );
    }

    #[test]
    fn members_behind_one_uplink_share_it() {
        let mut a = member("a", PcieGen::Gen3, 4);
        let mut b = member("b", PcieGen::Gen3, 4);
        a.uplink = Some(dmi3());
        b.uplink = Some(dmi3());
        let plan = plan_members(Level::Raid0, vec![a, b]).unwrap();
        assert_eq!(plan.read.bytes_per_sec, Some(dmi3().ceiling_bytes_per_sec));
        assert!(matches!(
            plan.read.limited_by,
            Limit::SharedUplink { members: 2, .. }
        ));
    }

    #[test]
    fn mirrors_read_from_all_copies_and_write_to_each() {
        let members = vec![member("a", PcieGen::Gen2, 4), member("b", PcieGen::Gen2, 4)];
        let plan = plan_members(Level::Raid1, members).unwrap();
        let one = link_ceiling_bytes_per_sec(PcieGen::Gen2, 4);
        assert_eq!(plan.read.bytes_per_sec, Some(2.0 * one));
        assert_eq!(plan.write.bytes_per_sec, Some(one));
        let four: Vec<_> = ["a", "b", "c", "d"]
            .iter()
            .map(|n| member(n, PcieGen::Gen2, 4))
            .collect();
        let plan = plan_members(Level::Raid10 { near: 2 }, four).unwrap();
        assert_eq!(plan.write.bytes_per_sec, Some(2.0 * one));
    }

    #[test]
    fn drive_ratings_bound_each_direction() {
        let mut a = member("a", PcieGen::Gen3, 4);
        a.rating = Some(DriveRating {
            read_bytes_per_sec: 2200e6,
            write_bytes_per_sec: Some(900e6),
            source: RatingSource::Seeds,
        });
        let plan = plan_members(Level::Raid0, vec![a]).unwrap();
        assert_eq!(plan.read.bytes_per_sec, Some(2200e6));
        assert_eq!(plan.write.bytes_per_sec, Some(900e6));
        assert!(plan.write_rating_known);
    }

    #[test]
    fn an_unbounded_member_makes_the_ceiling_unknown() {
        let mut loop0 = member("loop0", PcieGen::Gen3, 4);
        loop0.link_ceiling_bytes_per_sec = None;
        let plan = plan_members(Level::Raid0, vec![member("a", PcieGen::Gen3, 4), loop0]).unwrap();
        assert_eq!(plan.read.bytes_per_sec, None);
        assert_eq!(
            plan.read.limited_by,
            Limit::Unknown {
                device: "loop0".into()
            }
        );
    }

    #[test]
    fn levels_check_their_member_counts() {
        let one = vec![member("a", PcieGen::Gen3, 4)];
        assert!(plan_members(Level::Raid1, one.clone()).is_err());
        assert!(plan_members(Level::Raid0, one).is_ok());
        let three: Vec<_> = ["a", "b", "c"]
            .iter()
            .map(|n| member(n, PcieGen::Gen3, 4))
            .collect();
        // Three members: md's near-2 RAID 10 over an odd count; each write
        // lands on two of the three.
        let plan = plan_members(Level::Raid10 { near: 2 }, three).unwrap();
        let (read, write) = (
            plan.read.bytes_per_sec.unwrap(),
            plan.write.bytes_per_sec.unwrap(),
        );
        assert!((write / read - 0.5).abs() < 1e-9, "{read} {write}");
        let lone = vec![member("a", PcieGen::Gen3, 4)];
        assert!(plan_members(Level::Raid10 { near: 2 }, lone).is_err());
        assert!(plan_members(Level::Raid0, Vec::new()).is_err());
    }
}
