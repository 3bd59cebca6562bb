//! What `detail` and `examine` report, as plain serialisable data. The JSON
//! field names are a stable interface (docs/cli.md).

use crate::array::Array;
use crate::assemble::{level_of, member_data_bytes};
use crate::members::SetAsideMember;
use crate::parity::journal::MdJournal;
use crate::slot::Slot;
use nvraid_metadata::features;
use nvraid_metadata::{format_uuid, Role, Superblock};
use serde::Serialize;

/// One member in `detail`.
#[derive(Clone, Debug, Serialize)]
pub struct MemberDetail {
    /// The member's spec; `null` for a missing role.
    pub path: Option<String>,
    /// The role (slot in the layout); `null` for a member set aside.
    pub role: Option<u32>,
    /// `active`, `rebuilding` (in its role, in sync only below
    /// `in_sync_bytes`; md's `spare rebuilding`), `missing`, or why the
    /// member is set aside: `stale`, `faulty`, `spare`, `journal`,
    /// `replacement`, `unreadable`, `invalid`.
    pub state: &'static str,
    /// Why a member is set aside, in words.
    pub reason: Option<String>,
    /// A member being recovered: in sync below this many data bytes.
    pub in_sync_bytes: Option<u64>,
    /// Ranges of the member's bad-block log (bytes from its data start).
    pub bad_ranges: Vec<(u64, u64)>,
    pub events: Option<u64>,
    pub device_uuid: Option<String>,
    pub size_bytes: Option<u64>,
    pub direct_io: Option<bool>,
}

/// The assembled array, as `detail` shows it.
#[derive(Clone, Debug, Serialize)]
pub struct ArrayDetail {
    pub uuid: String,
    pub name: String,
    /// 0, 1 or 10.
    pub level: u32,
    /// `near=2` for raid10, `null` otherwise.
    pub layout: Option<String>,
    /// `null` for raid1, which has no chunks.
    pub chunk_bytes: Option<u64>,
    pub size_bytes: u64,
    pub sector_bytes: u32,
    pub raid_disks: u32,
    /// `clean` or `active` (dirty), with `, degraded` when a role is missing.
    pub state: String,
    pub events: u64,
    pub creation_time: u64,
    pub update_time: u64,
    pub data_offset_bytes: u64,
    pub members: Vec<MemberDetail>,
    /// An array that came up dirty: the array byte its resync resumes at
    /// (md's resync_offset); `null` when the copies are in sync.
    pub resync_from_bytes: Option<u64>,
    /// md's write-intent bitmap: chunk, bits, bits set; `null` without one.
    pub bitmap: Option<crate::BitmapInfo>,
    /// md's consistency policy: `ppl` (partial parity log), `bitmap`, or
    /// `resync` (neither).
    pub consistency_policy: &'static str,
}

impl ArrayDetail {
    /// `raid0`, `raid1` or `raid10`.
    pub fn level_name(&self) -> String {
        format!("raid{}", self.level)
    }
}

/// Build the `detail` report of an assembled array.
pub fn detail(array: &Array) -> ArrayDetail {
    let sb = array.superblock();
    let geometry = array.geometry();
    let mut members: Vec<MemberDetail> = array
        .slots()
        .iter()
        .enumerate()
        .map(|(role, slot)| match slot {
            Some(slot) => placed_detail(array, role, slot),
            None => missing_detail(role),
        })
        .collect();
    members.extend(array.md_journal().map(journal_detail));
    members.extend(array.set_aside_now().map(set_aside_detail));
    ArrayDetail {
        uuid: format_uuid(&sb.set_uuid),
        name: sb.name(),
        level: geometry.level().number(),
        layout: geometry.level().layout_name(),
        chunk_bytes: geometry.chunk_bytes(),
        size_bytes: array.size_bytes(),
        sector_bytes: array.sector_bytes(),
        raid_disks: geometry.members(),
        state: array_state(array),
        events: array.events(),
        creation_time: sb.ctime.seconds,
        update_time: array
            .slots()
            .iter()
            .flatten()
            .map(|s| s.superblock.utime.seconds)
            .max()
            .unwrap_or(0),
        data_offset_bytes: sb.data_offset_sectors * 512,
        members,
        resync_from_bytes: array.resync_from(),
        bitmap: array.bitmap_info(),
        consistency_policy: consistency_policy(array),
    }
}

/// A member in its role: active, rebuilding, or faulty since it failed.
fn placed_detail(array: &Array, role: usize, slot: &Slot) -> MemberDetail {
    MemberDetail {
        path: Some(slot.member.spec().to_string()),
        role: Some(role as u32),
        // md's `spare rebuilding`: a member in its role but in
        // sync only below its recovery offset is not `active` yet.
        state: if array.has_left(role) {
            "left"
        } else if array.is_faulty(role) {
            "faulty"
        } else if array.in_sync_bytes(role).is_some() {
            "rebuilding"
        } else {
            "active"
        },
        reason: array.faulty_reason(role).map(|why| {
            if array.has_left(role) {
                format!("{why}; no longer used")
            } else {
                format!("failed while the array ran ({why}); no longer used")
            }
        }),
        in_sync_bytes: array.in_sync_bytes(role),
        bad_ranges: slot.read_limit.bad_ranges(),
        events: Some(slot.superblock.events),
        device_uuid: Some(format_uuid(&slot.superblock.device_uuid)),
        size_bytes: Some(slot.member.size_bytes()),
        direct_io: Some(slot.member.is_direct()),
    }
}

/// A role no member fills.
fn missing_detail(role: usize) -> MemberDetail {
    MemberDetail {
        path: None,
        role: Some(role as u32),
        state: "missing",
        reason: None,
        in_sync_bytes: None,
        bad_ranges: Vec::new(),
        events: None,
        device_uuid: None,
        size_bytes: None,
        direct_io: None,
    }
}

/// md's write journal member: its log's size and fill, or why it failed.
fn journal_detail(journal: &MdJournal) -> MemberDetail {
    let slot = &journal.slot;
    let failure = journal.failure();
    MemberDetail {
        path: Some(journal.spec().to_string()),
        role: None,
        state: if failure.is_some() {
            "faulty"
        } else {
            "journal"
        },
        reason: Some(if let Some(why) = failure {
            format!("the array's write journal failed ({why}): the array refuses writes")
        } else {
            format!(
                "the array's write journal: a log of {} sectors, {} from its tail at sector {}",
                journal.ring_sectors(),
                match journal.units_logged() {
                    Ok(1) => "1 unit".to_string(),
                    Ok(n) => format!("{n} units"),
                    Err(e) => format!("unreadable ({e})"),
                },
                journal.tail()
            )
        }),
        in_sync_bytes: None,
        bad_ranges: Vec::new(),
        events: Some(slot.superblock.events),
        device_uuid: Some(format_uuid(&slot.superblock.device_uuid)),
        size_bytes: Some(slot.member.size_bytes()),
        direct_io: Some(slot.member.is_direct()),
    }
}

/// A member assembly set aside, with why.
fn set_aside_detail(m: &SetAsideMember) -> MemberDetail {
    MemberDetail {
        path: Some(m.spec.clone()),
        role: None,
        state: m.reason.state(),
        reason: Some(m.reason.reason()),
        in_sync_bytes: None,
        bad_ranges: Vec::new(),
        events: m.superblock.as_ref().map(|sb| sb.events),
        device_uuid: m.superblock.as_ref().map(|sb| format_uuid(&sb.device_uuid)),
        size_bytes: None,
        direct_io: None,
    }
}

/// `clean` or `active` (dirty), with `, degraded` when a role is missing.
fn array_state(array: &Array) -> String {
    let mut state = if array.is_dirty() {
        "active".to_string()
    } else {
        "clean".to_string()
    };
    if array.is_degraded() {
        state.push_str(", degraded");
    }
    state
}

/// md's consistency policy: what closes the write hole or finds the
/// stripes to resync (`ppl`, `journal`, `bitmap`, or plain `resync`).
fn consistency_policy(array: &Array) -> &'static str {
    let sb = array.superblock();
    if sb.feature_map & (features::PPL | features::MULTIPLE_PPLS) != 0 {
        "ppl"
    } else if sb.feature_map & features::JOURNAL != 0 {
        "journal"
    } else if array.bitmap_info().is_some() {
        "bitmap"
    } else {
        "resync"
    }
}

/// One member's superblock, as `examine` shows it.
#[derive(Clone, Debug, Serialize)]
pub struct Examine {
    pub path: String,
    pub version: &'static str,
    /// `Active device N`, `spare` or `faulty`.
    pub role: String,
    /// `clean` or `active`.
    pub state: &'static str,
    pub checksum: String,
    /// The array's size as this superblock describes it, if the level and
    /// layout are ones nvraid supports.
    pub array_size_bytes: Option<u64>,
    pub layout_text: Option<String>,
    pub member_data_bytes: u64,
    /// The superblock's role table: what each device number is to the
    /// array, as this member records it. md fills unused entries with the
    /// spare value, so the table ends at its last entry that is not a spare
    /// (or at this member's own entry, if later).
    pub role_table: Vec<TableEntry>,
    pub superblock: Superblock,
}

/// One entry of a superblock's role table (`examine`).
#[derive(Clone, Debug, Serialize, PartialEq, Eq)]
pub struct TableEntry {
    /// The device number (a member's `dev_number`).
    pub device: u32,
    /// `active`, `spare`, `faulty` or `journal`.
    pub role: &'static str,
    /// The role an active device holds.
    pub slot: Option<u16>,
}

/// The role table of `sb` as [`Examine::role_table`] shows it.
pub fn role_table(sb: &Superblock) -> Vec<TableEntry> {
    let last_used = sb
        .roles_raw
        .iter()
        .rposition(|&raw| Role::from_raw(raw) != Role::Spare)
        .map_or(0, |i| i + 1);
    let len = last_used
        .max(sb.dev_number as usize + 1)
        .min(sb.roles_raw.len());
    sb.roles_raw[..len]
        .iter()
        .enumerate()
        .map(|(device, &raw)| {
            let (role, slot) = match Role::from_raw(raw) {
                Role::Active(n) => ("active", Some(n)),
                Role::Spare => ("spare", None),
                Role::Faulty => ("faulty", None),
                Role::Journal => ("journal", None),
            };
            TableEntry {
                device: device as u32,
                role,
                slot,
            }
        })
        .collect()
}

/// Build the `examine` report of one member's superblock.
pub fn examine(path: &str, sb: &Superblock) -> Examine {
    let role = match sb.role() {
        Role::Active(n) => format!("Active device {n}"),
        Role::Spare => "spare".into(),
        Role::Faulty => "faulty".into(),
        Role::Journal => "journal".into(),
    };
    let geometry = crate::assemble::geometry_of(sb, path).ok();
    let mut raw = vec![0u8; 4096];
    let checksum = match sb.encode(&mut raw) {
        Ok(()) => format!(
            "{:08x}",
            u32::from_le_bytes(raw[216..220].try_into().expect("4 bytes"))
        ),
        Err(e) => format!("unencodable: {e}"),
    };
    Examine {
        path: path.to_string(),
        version: "1.2",
        role,
        state: if sb.is_clean() { "clean" } else { "active" },
        checksum,
        array_size_bytes: geometry.map(|g| g.array_bytes()),
        layout_text: level_of(sb, path)
            .ok()
            .and_then(|level| level.layout_name()),
        member_data_bytes: member_data_bytes(sb),
        role_table: role_table(sb),
        superblock: sb.clone(),
    }
}
