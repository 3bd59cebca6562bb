//! [`MidReshape`]: an array part-way through a reshape, opened read-only.
//!
//! Every request is split at the recorded position; each piece is read
//! from the shape the position puts it in, at that shape's data offset on
//! the member (nvraid-layout's `Reshape`). Only an array with every member
//! is read: a missing member's bytes would have to be rebuilt from the
//! parity of whichever shape holds them, which nvraid does not do yet.

use super::backup::{Backup, Saved};
use super::degraded::Failed;
use super::grow::Placed;
use super::record::{is_reshaping, reshape_of};
use super::step::read_through;
use crate::decision::{decide_reshaping, SetAside};
use crate::error::{Error, Result};
use crate::slot::read_superblock;
use nvraid_layout::{Direction, Geometry, Reshape, Shape};
use nvraid_member::{Member, OpenOptions};
use nvraid_metadata::{format_uuid, Superblock};
use serde::Serialize;

/// A reshaping array, read-only.
pub struct MidReshape {
    reshape: Reshape,
    /// By role (the larger shape's member count).
    members: Vec<Member>,
    superblocks: Vec<Superblock>,
    /// Members given that take no part, with why.
    set_aside: Vec<(String, SetAside)>,
    sector_bytes: u32,
    /// A grow in place left inside a step of its critical section: the old
    /// rows the step was overwriting, from its backup, read in their place.
    kept: Option<Saved>,
    /// A grow in place inside its critical section with no backup area of
    /// nvraid's (its section kept only in mdadm's backup file): the array
    /// bytes from the position to the section's end, which the old rows
    /// may no longer hold, and the file's copy of them when given.
    unkept: Option<(u64, u64)>,
    file: Option<super::backup_file::Checked>,
}

/// One shape of the reshape in `detail`.
#[derive(Clone, Debug, Serialize)]
pub struct ShapeDetail {
    /// md's level name: `raid0`, `raid10`, `raid4`, `raid5`, `raid6`.
    pub level: String,
    /// md's layout name (`left-symmetric`, `near=2`); `null` for RAID 0.
    pub layout: Option<String>,
    pub chunk_bytes: Option<u64>,
    pub raid_disks: u32,
    /// The array's size in this shape.
    pub size_bytes: u64,
}

/// One member in a reshaping array's `detail`.
#[derive(Clone, Debug, Serialize)]
pub struct ReshapeMember {
    pub path: String,
    /// The role; `null` for a member set aside.
    pub role: Option<u32>,
    /// `active`, or why the member is set aside.
    pub state: &'static str,
    pub events: u64,
    /// Where the old shape's data starts on it (bytes); `null` for a
    /// member the old shape does not have.
    pub data_offset_bytes: Option<u64>,
    /// Where the new shape's data starts on it (bytes).
    pub new_data_offset_bytes: Option<u64>,
}

/// `detail` of a reshaping array.
#[derive(Clone, Debug, Serialize)]
pub struct ReshapeDetail {
    pub uuid: String,
    pub name: String,
    /// Always `reshaping`.
    pub state: &'static str,
    pub events: u64,
    /// The size md gives the array while it reshapes (the smaller shape).
    pub size_bytes: u64,
    pub sector_bytes: u32,
    /// The recorded position: array bytes (see `direction`) in the new shape.
    pub position_bytes: u64,
    /// `forwards` (the bytes below the position are in the new shape) or
    /// `backwards` (those from the position on are).
    pub direction: &'static str,
    /// How far the reshape has come, 0 to 100 (a grow counts to the end of
    /// the larger new shape, as md's progress does).
    pub percent_done: f64,
    pub old: ShapeDetail,
    pub new: ShapeDetail,
    pub members: Vec<ReshapeMember>,
}

fn shape_detail(g: &Geometry) -> ShapeDetail {
    ShapeDetail {
        level: g.level().md_name().into(),
        layout: g.level().layout_name(),
        chunk_bytes: g.chunk_bytes(),
        raid_disks: g.members(),
        size_bytes: g.array_bytes(),
    }
}

impl MidReshape {
    /// Open `specs` read-only when their superblocks record a reshape in
    /// progress; `Ok(None)` (every member closed again) when none does, or
    /// when a member cannot be opened or its superblock read, so the caller
    /// assembles the array as usual (and assembly names the trouble). The members are placed by
    /// md's assembly rules (`decision`), the reshape's fields checked the
    /// same on all of them; a missing role is refused.
    pub fn open(specs: &[String], direct: bool) -> Result<Option<MidReshape>> {
        Self::open_inner(specs, direct, None)
    }

    /// [`MidReshape::open`] with mdadm's backup file (`--backup-file`): a
    /// grow in place inside its critical section reads the section's bytes
    /// from the file (checked as `grow --continue` checks it, refused by
    /// name); a file the position does not need is ignored.
    pub fn open_with_backup_file(
        specs: &[String],
        direct: bool,
        backup_file: &std::path::Path,
    ) -> Result<Option<MidReshape>> {
        Self::open_inner(specs, direct, Some(backup_file))
    }

    fn open_inner(
        specs: &[String],
        direct: bool,
        backup_file: Option<&std::path::Path>,
    ) -> Result<Option<MidReshape>> {
        if specs.is_empty() {
            return Err(Error::NoMembers);
        }
        let options = OpenOptions {
            write: false,
            create_bytes: None,
            direct,
            ..Default::default()
        };
        let mut found = Vec::with_capacity(specs.len());
        for spec in specs {
            // A member that cannot be opened or whose superblock cannot be
            // used: assembly's rules decide what that means, and name it.
            let Ok(member) = Member::open(spec, options) else {
                return Ok(None);
            };
            let Ok(sb) = read_superblock(&member) else {
                return Ok(None);
            };
            found.push((member, sb));
        }
        if !found.iter().any(|(_, sb)| is_reshaping(sb)) {
            return Ok(None);
        }
        let listed: Vec<(&str, &Superblock)> = found.iter().map(|(m, sb)| (m.spec(), sb)).collect();
        let decision = decide_reshaping(&listed)?;
        let (ref_member, ref_sb) = &found[decision.reference];
        if !is_reshaping(ref_sb) {
            return Err(Error::Unsupported {
                spec: ref_member.spec().into(),
                what: "a member recording a reshape beside a fresher one that records none (the end of a reshape was cut short: `nvraid grow --continue` with every member writes it on the others)".into(),
            });
        }
        if let Some(role) = decision.roles.iter().position(Option::is_none) {
            return Err(Error::NotStartable(format!(
                "role {role} is missing while a reshape is in progress; nvraid reads a reshaping array only with every member"
            )));
        }
        let by_role: Vec<Option<&Superblock>> = decision
            .roles
            .iter()
            .map(|i| i.map(|i| &found[i].1))
            .collect();
        let reshape = reshape_of(ref_sb, ref_member.spec(), &by_role)?;
        let set_aside: Vec<(String, SetAside)> = decision
            .set_aside
            .iter()
            .map(|(i, why)| (found[*i].0.spec().to_string(), why.clone()))
            .collect();
        let order: Vec<usize> = decision.roles.iter().map(|i| i.expect("checked")).collect();
        let mut slots: Vec<Option<(Member, Superblock)>> = found.into_iter().map(Some).collect();
        let (members, superblocks): (Vec<Member>, Vec<Superblock>) = order
            .into_iter()
            .map(|i| slots[i].take().expect("one member per role"))
            .unzip();
        let sector_bytes = members
            .iter()
            .map(Member::logical_block_bytes)
            .max()
            .unwrap_or(512)
            .max(512);
        // A grow in place stopped inside a step of its critical section
        // may have overwritten old rows the recorded position still reads
        // from: those come from the step's backup.
        let placed: Vec<Placed> = members
            .into_iter()
            .zip(superblocks)
            .map(|(member, sb)| Placed { member, sb })
            .collect();
        let backup = Backup::of(&placed, &Failed::none(placed.len()), &reshape);
        let kept = match &backup {
            Some(backup) => backup.find(&placed, &reshape)?,
            None => None,
        };
        let unkept = (super::backup_file::inside_section(&reshape)
            && !backup.as_ref().is_some_and(Backup::is_held))
        .then(|| super::md_backup::section_end(&reshape))
        .flatten()
        .map(|end| (reshape.position(), end));
        let file = match (unkept, backup_file) {
            (Some(_), Some(path)) => super::backup_file::check(
                path,
                &reshape,
                &placed[0].sb.set_uuid,
                placed[0].sb.utime,
            )?,
            _ => None,
        };
        let (members, superblocks) = placed.into_iter().map(|p| (p.member, p.sb)).unzip();
        Ok(Some(MidReshape {
            reshape,
            members,
            superblocks,
            set_aside,
            sector_bytes,
            kept,
            unkept,
            file,
        }))
    }

    /// The reshape.
    pub fn reshape(&self) -> &Reshape {
        &self.reshape
    }

    /// The array's size while it reshapes.
    pub fn size_bytes(&self) -> u64 {
        self.reshape.array_bytes()
    }

    /// The array's sector: the largest logical block of its members.
    pub fn sector_bytes(&self) -> u32 {
        self.sector_bytes
    }

    /// Read `buf.len()` bytes at array byte `offset` (whole sectors).
    pub fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<()> {
        let len = buf.len() as u64;
        let sector = u64::from(self.sector_bytes);
        if offset
            .checked_add(len)
            .is_none_or(|end| end > self.size_bytes())
        {
            return Err(Error::OutOfRange {
                offset,
                len,
                size_bytes: self.size_bytes(),
            });
        }
        if !offset.is_multiple_of(sector) || !len.is_multiple_of(sector) {
            return Err(Error::Unaligned {
                offset,
                len,
                sector_bytes: self.sector_bytes,
            });
        }
        let members: Vec<&Member> = self.members.iter().collect();
        if let Some((from, to)) = self.unkept {
            if offset < to && offset + len > from {
                let Some(file) = &self.file else {
                    return Err(Error::NotStartable(format!(
                        "array bytes [{from}, {to}) of this grow in place, stopped inside its critical section, are kept only in mdadm's backup file (the old rows may be overwritten): give it with `--backup-file FILE`, or finish the grow with `nvraid grow --continue --backup-file FILE`"
                    )));
                };
                read_through(&self.reshape, &members, buf, offset)?;
                return file.overlay(buf, offset);
            }
        }
        let Some(kept) = &self.kept else {
            return read_through(&self.reshape, &members, buf, offset);
        };
        let mut at = 0usize;
        for piece in self.reshape.pieces(offset, len) {
            let place = self.reshape.locate(&piece, 0);
            let member = members[place.member as usize];
            let part = &mut buf[at..at + piece.len as usize];
            member
                .read_at(part, place.member_offset)
                .map_err(|e| Error::io(member.spec(), e))?;
            if piece.shape == Shape::Old {
                kept.overlay(place.member, place.member_offset, part);
            }
            at += piece.len as usize;
        }
        Ok(())
    }

    /// What `detail` shows.
    pub fn detail(&self) -> ReshapeDetail {
        let r = &self.reshape;
        let sb = &self.superblocks[0];
        let size = r.array_bytes();
        // How far the reshape has come: a grow runs on to the end of the
        // larger new shape, a shrink from the end of the smaller one.
        let (moved, span) = match r.direction() {
            Direction::Forwards => {
                let end = r.old().array_bytes().max(r.new_shape().array_bytes());
                (r.position().min(end), end)
            }
            Direction::Backwards => (size - r.position().min(size), size),
        };
        let mut members: Vec<ReshapeMember> = self
            .members
            .iter()
            .zip(&self.superblocks)
            .enumerate()
            .map(|(role, (m, sb))| ReshapeMember {
                path: m.spec().into(),
                role: Some(role as u32),
                state: "active",
                events: sb.events,
                data_offset_bytes: r.data_offset(Shape::Old, role as u32),
                new_data_offset_bytes: r.data_offset(Shape::New, role as u32),
            })
            .collect();
        for (path, why) in &self.set_aside {
            members.push(ReshapeMember {
                path: path.clone(),
                role: None,
                state: why.state(),
                events: 0,
                data_offset_bytes: None,
                new_data_offset_bytes: None,
            });
        }
        ReshapeDetail {
            uuid: format_uuid(&sb.set_uuid),
            name: sb.name(),
            state: "reshaping",
            events: self.superblocks.iter().map(|s| s.events).max().unwrap_or(0),
            size_bytes: size,
            sector_bytes: self.sector_bytes,
            position_bytes: r.position(),
            direction: match r.direction() {
                Direction::Forwards => "forwards",
                Direction::Backwards => "backwards",
            },
            percent_done: 100.0 * moved as f64 / span.max(1) as f64,
            old: shape_detail(r.old()),
            new: shape_detail(r.new_shape()),
            members,
        }
    }
}
