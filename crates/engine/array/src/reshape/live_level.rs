//! md's takeovers that move no byte, made on a served array (`nvraid grow
//! --socket CTL --level N`): RAID 4 <-> RAID 5 parity-last, RAID 1 of two
//! <-> RAID 5 of two, RAID 6 -> RAID 5 when Q is on the last member, a
//! RAID 4 whose parity member is missing -> RAID 0 of the others, and RAID
//! 0 of N <-> RAID 10 near=2 of 2N.
//!
//! A takeover is also the first half of a served RAID 1 of two becoming a
//! RAID 5 of N (`--level 5 -n N --add NEW...`): [`check_raid5_grown`]
//! makes the takeover's and the grow's checks on the RAID 5 of two the
//! takeover would make, before either writes; the server then takes the
//! array over and starts the grow in the same request. The second half
//! of a served RAID 5 becoming a RAID 1 (`--level 1 --array-size`): the
//! server starts the shrink to two and makes the takeover when it ends.
//!
//! The last two renumber the roles (`renumber`): RAID 0 role k becomes
//! RAID 10 role 2k, the odd roles (the second copies) missing, to be added
//! and rebuilt by the server's online recovery; a RAID 10 keeps, as mdadm
//! does, the first working copy of each pair (roles 2i, 2i+1) as RAID 0
//! role i, and its other copies leave as a RAID 6's Q member does. The
//! record's role table and [`ReshapeRecord::role_written`] give the
//! superblock writes the new numbers; the swap gives each new role the
//! member the renumbering names (`Members::adopt_shape`). Until then the
//! served map (the RAID 0's; the RAID 10's without the leaving copies)
//! puts every byte where the new level puts it on the kept members.
//!
//! What changes is what the members record and which members the array
//! uses; once every kept member records the new level, the served array
//! takes it (`Array::swap_shape`: the new level's geometry and family,
//! the fast path, another reshape free to start). [`LiveLevel`] is both
//! the array's reshape record and, until then, its route:
//!
//! - **The switch.** The route is set (`Array::start_live_route`, which
//!   waits for every request the fast-path queues had in flight; from then
//!   on each request runs through the route), then its gate closes (it
//!   waits for the routed requests running; new ones wait there), so no
//!   client request is in flight while the superblocks change. The gate
//!   is open while the route is set: a routed request runs on its
//!   worker's thread, and one held at a closed gate then would keep that
//!   queue's earlier requests unreaped, which the route's start waits for
//!   (the server hung so under clients 16 deep). A RAID 6's
//!   Q member then leaves the running array (no longer read, written or
//!   flushed, and not written by any superblock update: it keeps its old
//!   superblock, one event behind, as the offline takeover leaves it); a
//!   RAID 4's missing parity role leaves too. A role that left is no
//!   failure: the array is not degraded by it (`Members::has_left`).
//!   Every other member's superblock is written with the new level,
//!   events + 1, exactly as `grow --level` offline writes it
//!   ([`Takeover::record`], `record_raid0_of_raid4`), the leaving role's
//!   table entry a spare's. Then the gate opens.
//! - **After it.** Every superblock update of the running array (dirty
//!   mark, a member failing, the clean close) records the new level
//!   ([`ReshapeRecord::apply`]). Client requests go through the route to
//!   the array's own simple path: each takeover is one that puts every
//!   byte, copy and parity where the old shape had them, on the members
//!   it keeps (checked before anything is written: [`same_places`]), so
//!   the old map over the kept members is the new level's map. A RAID 6
//!   without its Q member writes P and no Q: md's RAID 5 of the others.
//!
//! A crash between two members' superblock writes leaves what the offline
//! takeover leaves when it is cut short there (some members one event
//! ahead with the new level): `grow --level` again finishes it (a
//! renumbering one too: `level::finish_renumbered`). The failpoint
//! `reshape-superblock` is passed before each member's superblock after
//! the first written, and once after all of them.
//!
//! Refused with nothing written: a second reshape on the same server run,
//! an array served read-only, with md's partial parity log or write
//! journal (md refuses to take those over), being recovered or awaiting a
//! resync, degraded (but for a RAID 4's missing parity going to RAID 0,
//! and a RAID 10 with a working copy of each pair), a RAID 4 without its
//! parity or a RAID 0 or 10 keeping a write-intent bitmap (md's RAID 0
//! keeps none), a RAID 10 far/offset, of three copies or an odd count, a
//! RAID 0 of several zones, a run without room for twice the roles, and
//! every takeover md does not make without moving data (named by
//! `plan_takeover`).

use super::level::{plan_takeover, record_raid0_of_raid4, Takeover};
use super::live::LiveGrowStatus;
use super::live_copy::LiveReshape;
use crate::array::{Array, LiveRoute};
use crate::error::{Error, Result};
use crate::members::{Companion, ReshapeRecord};
use nvraid_io::queue::OpKind;
use nvraid_layout::parity::ParityLayout;
use nvraid_layout::{Geometry, Level};
use nvraid_metadata::{Role, Superblock};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, RwLock};

/// The level change a served array takes.
#[derive(Clone, Copy, Debug)]
enum Change {
    /// One of `change_level`'s takeovers of a whole array.
    Whole(Takeover),
    /// A RAID 4 of `members` without its parity member -> RAID 0.
    Raid0OfRaid4 { members: u32 },
    /// A RAID 0 of `members` (one zone, `member_rows` bytes of each) ->
    /// md's RAID 10 near=2 of twice as many, role k becoming 2k, the odd
    /// roles (the second copies) missing.
    Raid10OfRaid0 { members: u32, member_rows: u64 },
}

/// What the served array reports of its level change (also the
/// control socket's answer).
#[derive(Clone, Debug, serde::Serialize)]
pub struct LevelSwitched {
    pub md_level_before: i32,
    pub level_before: String,
    pub md_level: i32,
    pub level: String,
    pub raid_disks_before: u32,
    pub raid_disks: u32,
    pub size_bytes: u64,
    /// The events every kept member records now.
    pub events: u64,
    /// The member that left (a RAID 6's Q member): blank it before using
    /// it elsewhere, once the server has stopped.
    pub released: Vec<String>,
}

/// A served array's level change (see the module's text).
#[derive(Debug)]
pub struct LiveLevel {
    change: Change,
    /// The device-table entry (md's `dev_roles` index) that becomes a
    /// spare's: the leaving Q member's, a missing parity member's.
    leaving_dev: Option<usize>,
    /// Old role -> new role where the change renumbers the roles (RAID 0
    /// <-> RAID 10 near=2); `None` in it: the role leaves (a RAID 10's
    /// copy not kept). Empty: every role keeps its number.
    renumber: Vec<Option<usize>>,
    /// The superblocks are being written for the switch (the failpoint
    /// counts then only).
    switching: AtomicBool,
    /// Members written so far in the switch.
    switch_writes: AtomicUsize,
    /// The route's gate: held (read) by each routed request while it
    /// runs, and (write) while the switch writes the superblocks.
    gate: RwLock<()>,
    outcome: Mutex<(&'static str, Option<String>)>,
    switched: Mutex<LevelSwitched>,
}

/// md's name of level `md_level` over `geometry` (`raid4` for md's 4).
fn level_name(md_level: i32, geometry: &Geometry) -> String {
    if md_level == 4 {
        "raid4".into()
    } else {
        geometry.level().to_string()
    }
}

/// Where the byte at `offset` of `g` lives with what covers it: every
/// copy's place, or its data's place and its stripe's parity (P, Q) at the
/// same row; (role, member offset), sorted.
fn places(g: &Geometry, offset: u64) -> Vec<(u32, u64)> {
    let mut out: Vec<(u32, u64)> = match g.level() {
        Level::Raid5 { .. } | Level::Raid6 { .. } => {
            let at = g.locate(offset, 0);
            let chunk = g.chunk_bytes().expect("parity levels have chunks");
            let map = g.level().stripe_map(g.members()).expect("a parity level");
            let (p, q) = map.parity_members(at.member_offset / chunk);
            std::iter::once(at.member)
                .chain(std::iter::once(p))
                .chain(q)
                .map(|m| (m, at.member_offset))
                .collect()
        }
        _ => (0..g.copies())
            .map(|c| {
                let at = g.locate(offset, c);
                (at.member, at.member_offset)
            })
            .collect(),
    };
    out.sort_unstable();
    out
}

/// Whether `new` puts every array byte (its copies, its parity) where
/// `old` does on the roles the new level keeps, numbered by `role` (old
/// role -> new role, `None`: not kept): every old place on a kept role is,
/// renumbered, one of the new level's, and every new place on a role some
/// old role becomes is one of those (the new level's other roles, a RAID
/// 10's missing second copies, hold nothing yet). Sampled at every 4 KiB
/// of the first stripes of both shapes, twice over, and of the array's
/// last stripes. The served route relies on it: the old map over the kept
/// members is then the new one.
fn same_places(old: &Geometry, new: &Geometry, role: &dyn Fn(u32) -> Option<u32>) -> bool {
    let targets: Vec<u32> = (0..old.members()).filter_map(role).collect();
    if old.array_bytes() != new.array_bytes() {
        return false;
    }
    let stripe = |g: &Geometry| g.chunk_bytes().unwrap_or(4096) * u64::from(g.members());
    let span = (2 * stripe(old).max(stripe(new))).min(old.array_bytes());
    let end = old.array_bytes();
    let offsets = (0..span)
        .step_by(4096)
        .chain((end.saturating_sub(span)..end).step_by(4096));
    for offset in offsets {
        let mut was: Vec<(u32, u64)> = places(old, offset)
            .into_iter()
            .filter_map(|(m, at)| role(m).map(|m| (m, at)))
            .collect();
        was.sort_unstable();
        let now: Vec<(u32, u64)> = places(new, offset)
            .into_iter()
            .filter(|(m, _)| targets.contains(m))
            .collect();
        if was.is_empty() || was != now {
            return false;
        }
    }
    true
}

impl LiveLevel {
    /// Take the served `array` over as md level `to` (see the module's
    /// text); returns once every kept member records it. Refused, nothing
    /// written, as the module's text lists.
    pub fn start(array: &Arc<Array>, to: i32) -> Result<Arc<LiveLevel>> {
        let spec0 = check_level_changeable(array)?;
        let refuse = |what: String| Error::Unsupported {
            spec: spec0.clone(),
            what,
        };
        let old = array.geometry().clone();
        let n = old.members();
        let reference = array.superblock().clone();
        let from = reference.level;
        let unusable: Vec<usize> = (0..array.roles())
            .filter(|&r| !array.is_usable(r))
            .collect();
        let parity_last =
            from == 4 || (from == 5 && reference.layout == ParityLayout::ParityLast.to_md());
        let last_dev = |role: u32| {
            let raw = Role::Active(role as u16).to_raw();
            reference.roles_raw.iter().position(|&r| r == raw)
        };
        let mut renumber = Vec::new();
        let (change, leaving_dev, leaves) = if to == 0 && parity_last && !unusable.is_empty() {
            if unusable != [n as usize - 1] {
                return Err(refuse(format!(
                    "a RAID 4 without role(s) {unusable:?} as a RAID 0: md takes a RAID 4 over as RAID 0 only when its parity member (role {}) is the one missing",
                    n - 1
                )));
            }
            if array.intent().is_some() {
                return Err(refuse(
                    "a RAID 4 with a write-intent bitmap as a RAID 0 (md's RAID 0 keeps none; md refuses too)".into(),
                ));
            }
            (
                Change::Raid0OfRaid4 { members: n },
                last_dev(n - 1),
                vec![n as usize - 1],
            )
        } else if (from, to) == (0, 10) {
            // A RAID 0 is never degraded while served (it has no copy).
            if array.intent().is_some() {
                return Err(refuse(
                    "a RAID 0 keeping a write-intent bitmap as a RAID 10 (md's RAID 0 keeps none and md takes over none that does): remove it first (`nvraid grow --bitmap none`, offline)".into(),
                ));
            }
            // One zone only (md refuses the others): every member holds
            // the same rows, the RAID 10's.
            let rows = old.member_used_bytes();
            let chunk = old.chunk_bytes().expect("RAID 0 has chunks");
            for slot in (0..array.roles()).filter_map(|r| array.slot(r)) {
                let held = slot.superblock.data_size_sectors * 512 / chunk * chunk;
                if held != rows {
                    return Err(Error::Unsupported {
                        spec: slot.member.spec().into(),
                        what: format!(
                            "a RAID 0 of several zones as a RAID 10 (this member holds {held} bytes of data, another {rows}): md takes only a RAID 0 of one zone over"
                        ),
                    });
                }
            }
            let (room, joins) = array.room();
            if 2 * n as usize > room || (n as usize) > joins {
                return Err(refuse(format!(
                    "a served RAID 0 of {n} as a RAID 10 of {}: this server run has room for {room} roles and {joins} more members; restart `serve` first, or take it over offline (`nvraid grow --level 10 -n {} --add NEW...`)",
                    2 * n,
                    2 * n
                )));
            }
            renumber = (0..n as usize).map(|k| Some(2 * k)).collect();
            (
                Change::Raid10OfRaid0 {
                    members: n,
                    member_rows: old.member_used_bytes(),
                },
                None,
                Vec::new(),
            )
        } else if (from, to) == (10, 0) {
            // far/offset, three copies, an odd count: refused by name.
            let plan = plan_takeover(&reference, to, &spec0)?;
            if array.intent().is_some() {
                return Err(refuse(
                    "a RAID 10 keeping a write-intent bitmap as a RAID 0 (md's RAID 0 keeps none; md refuses too): remove it first (`nvraid grow --bitmap none`, offline)".into(),
                ));
            }
            // mdadm's way: the first working copy of each pair is kept, the
            // others failed and removed (md then requires exactly one copy
            // of each pair missing); kept role 2i or 2i+1 becomes role i.
            renumber = vec![None; n as usize];
            let mut leaving = Vec::new();
            for pair in 0..n as usize / 2 {
                let copies = [2 * pair, 2 * pair + 1];
                let Some(&keep) = copies.iter().find(|&&r| array.is_usable(r)) else {
                    return Err(Error::NotStartable(format!(
                        "roles {} and {} (a pair of copies) both missing or failed: md takes a RAID 10 over as RAID 0 keeping one working copy of each pair, and this pair has none",
                        copies[0], copies[1]
                    )));
                };
                renumber[keep] = Some(pair);
                leaving.extend(copies.iter().filter(|&&r| r != keep && array.is_usable(r)));
            }
            (Change::Whole(plan), None, leaving)
        } else {
            if !unusable.is_empty() {
                return Err(Error::NotStartable(format!(
                    "the array is degraded (role(s) {unusable:?} missing or failed); md takes over only a whole array (but a RAID 4 without its parity, as RAID 0; a RAID 10 near=2 keeping one copy of each pair, as RAID 0): rebuild it first"
                )));
            }
            let plan = plan_takeover(&reference, to, &spec0)?;
            let leaves: Vec<usize> = plan
                .drop_last
                .then_some(n as usize - 1)
                .into_iter()
                .collect();
            (
                Change::Whole(plan),
                if plan.drop_last {
                    last_dev(n - 1)
                } else {
                    None
                },
                leaves,
            )
        };
        // The new level's shape, from a superblock as it will be written.
        let mut after = reference.clone();
        record_change(&change, &mut after);
        let new = crate::assemble::geometry_of(&after, &spec0)?;
        let kept_as = |r: u32| -> Option<u32> {
            if renumber.is_empty() {
                (r < new.members()).then_some(r)
            } else {
                renumber[r as usize].map(|j| j as u32)
            }
        };
        if !same_places(&old, &new, &kept_as) {
            return Err(refuse(format!(
                "a served {} as a {}: the new level does not keep every byte where the served one has it, so nvraid takes it over only offline (`nvraid grow --level {to}`)",
                old.level(),
                new.level()
            )));
        }
        let released: Vec<String> = leaves
            .iter()
            .filter(|&&r| array.is_usable(r))
            .filter_map(|&r| array.slot(r))
            .map(|s| s.member.spec().to_string())
            .collect();
        let live = Arc::new(LiveLevel {
            change,
            leaving_dev,
            renumber,
            switching: AtomicBool::new(true),
            switch_writes: AtomicUsize::new(0),
            gate: RwLock::new(()),
            outcome: Mutex::new(("running", None)),
            switched: Mutex::new(LevelSwitched {
                md_level_before: from,
                level_before: level_name(from, &old),
                md_level: after.level,
                level: level_name(after.level, &new),
                raid_disks_before: n,
                raid_disks: new.members(),
                size_bytes: new.array_bytes(),
                events: 0,
                released,
            }),
        });
        // Every fast-path request goes through the route from here on (the
        // queues' own requests drained), the gate open meanwhile.
        if !array.start_live_route(live.clone()) {
            return Err(refuse(
                "a level change while another reshape runs on this served array".into(),
            ));
        }
        // Then the gate closes: it waits for the routed requests running
        // (the simple path's, which need no worker to finish) and holds
        // new ones while the superblocks change.
        let closed = live.gate.write().unwrap_or_else(|p| p.into_inner());
        let switched = (|| {
            // The leaving role (a RAID 6's Q member; a RAID 4's missing
            // parity) is out of the array, not failed: not degraded by it.
            for &role in &leaves {
                array.leave_role(
                    role,
                    format!(
                        "left the array: its {} taken over as {} (this role held {})",
                        old.level(),
                        new.level(),
                        if from == 10 {
                            "a second copy"
                        } else {
                            "Q or the parity"
                        }
                    ),
                );
            }
            if !array.set_reshape_record(live.clone()) {
                return Err(refuse(
                    "a level change while another reshape runs on this served array".into(),
                ));
            }
            array.rewrite_superblocks()
        })();
        live.switching.store(false, Ordering::SeqCst);
        if switched.is_ok() {
            crate::failpoint::hit("reshape-superblock");
        }
        {
            let mut outcome = live.outcome.lock().unwrap_or_else(|p| p.into_inner());
            *outcome = match &switched {
                Ok(()) => ("finished", None),
                Err(e) => ("failed", Some(e.to_string())),
            };
            live.switched
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .events = array.events();
        }
        // The route is right either way (the old map is the new one); a
        // superblock write that failed leaves members recording either
        // level, as a crash would, and the next update records the new.
        drop(closed);
        switched?;
        // The served array takes the new level (requests held for it):
        // the fast path serves it, `status` and `detail` show it, and
        // another reshape may start.
        if let Err(e) = live.adopt(array, &new) {
            let mut outcome = live.outcome.lock().unwrap_or_else(|p| p.into_inner());
            *outcome = ("failed", Some(e.to_string()));
            return Err(e);
        }
        Ok(live)
    }

    /// The takeover a server makes once a served shrink to two members has
    /// ended (`grow --socket CTL --level 1 --array-size SIZE` of a RAID 5):
    /// the failpoint `level-after-shrink` is passed first (the shrink ended
    /// and recorded, nothing of the takeover written), then
    /// [`LiveLevel::start`] with its checks.
    pub fn start_after_shrink(array: &Arc<Array>, to: i32) -> Result<Arc<LiveLevel>> {
        crate::failpoint::hit("level-after-shrink");
        LiveLevel::start(array, to)
    }

    /// Swap the served array's shape for `new`, the level every kept
    /// member records now: each role's template the superblock as
    /// recorded (see `Array::swap_shape`).
    fn adopt(&self, array: &Array, new: &Geometry) -> Result<()> {
        // The table as recorded: renumbered where the change renumbers.
        let table = array.role_table_now();
        let mut slots = Vec::with_capacity(new.members() as usize);
        for role in 0..new.members() as usize {
            // The old role whose member takes this one.
            let from = if self.renumber.is_empty() {
                Some(role)
            } else {
                self.renumber.iter().position(|&to| to == Some(role))
            };
            match from
                .filter(|&r| array.is_usable(r))
                .and_then(|r| array.slot(r))
            {
                Some(slot) => {
                    let mut sb = slot.superblock.clone();
                    record_change(&self.change, &mut sb);
                    slots.push(Some(crate::slot::Slot::shared(slot.member.clone(), sb)?));
                }
                None => slots.push(None),
            }
        }
        // Each member's I/O counters go with it to its new role.
        array.swap_shape_renumbered(new.clone(), slots, table, &self.renumber)
    }

    /// What the switch did.
    pub fn switched(&self) -> LevelSwitched {
        self.switched
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }
}

/// What every served level change checks first, refused with nothing
/// written: no other reshape, served writable, no partial parity log or
/// journal, nothing recovering or awaiting a resync (a RAID 0 taken over
/// as RAID 10, its mirrors rebuilt, may go back to RAID 0 in the same run:
/// a rebuild that ended is settled). Returns the first present member's
/// spec, which the refusals name.
fn check_level_changeable(array: &Arc<Array>) -> Result<String> {
    let spec0 = (0..array.roles())
        .find_map(|r| array.slot(r))
        .map_or("(missing)", |s| s.member.spec())
        .to_string();
    super::live::refuse_second(array, &spec0, "level change")?;
    if !array.is_writable() {
        return Err(Error::ReadOnly);
    }
    if array.ppl.is_some() || array.md_journal.is_some() {
        return Err(Error::Unsupported {
            spec: spec0,
            what: "changing the level of an array with md's partial parity log or write journal (md refuses to take those over)".into(),
        });
    }
    super::live::check_settled(array)?;
    Ok(spec0)
}

/// `grow --socket CTL --level 5 -n N --add NEW...` on a served RAID 1 of
/// two: md's way is the takeover as a RAID 5 of two (no byte moves), then
/// that RAID 5's grow. Everything both parts check is checked here,
/// before anything is written, on the RAID 5 of two the takeover would
/// make: no other reshape, served writable, no partial parity log or
/// journal, nothing recovering or awaiting a resync, whole, a RAID 1 of
/// exactly two (or the RAID 5 of two a takeover already made), the count
/// two plus one per `--add`, a chunk md can take the RAID 1 over with,
/// one data offset, room below the data for the grow's move, and every
/// new member large enough, blank unless `force`, not a member already.
/// Returns whether the takeover is still to be made (`false`: the array
/// is that RAID 5 of two already, only the grow is left).
pub fn check_raid5_grown(array: &Arc<Array>, options: &super::LiveGrowOptions) -> Result<bool> {
    let spec0 = check_level_changeable(array)?;
    let refuse = |what: String| Error::Unsupported {
        spec: spec0.clone(),
        what,
    };
    if array.is_degraded() || (0..array.roles()).any(|r| !array.is_usable(r)) {
        return Err(Error::NotStartable(
            "the array is degraded; md takes over and nvraid grows only a whole array: rebuild it first".into(),
        ));
    }
    let reference = array.superblock().clone();
    let old = array.geometry().clone();
    let n = reference.raid_disks;
    let taken_over = reference.level == 5 && n == 2;
    if !(reference.level == 1 || taken_over) || n != 2 {
        return Err(refuse(format!(
            "a {} of {n} members as a RAID 5 with members added: md takes only a RAID 1 of exactly two members over as RAID 5 (then grows it)",
            old.level()
        )));
    }
    if options.add.is_empty() || options.raid_devices != 2 + options.add.len() as u32 {
        return Err(Error::BadOption {
            option: "--raid-devices".into(),
            why: format!(
                "{} with {} member(s) added: a RAID 1 of two becomes a RAID 5 of two, grown by one member per --add (so --raid-devices is 2 + the --add count)",
                options.raid_devices,
                options.add.len()
            ),
        });
    }
    // The RAID 5 of two as the takeover writes it (each member's
    // superblock too: the grow's room is counted on those).
    let plan = (!taken_over)
        .then(|| plan_takeover(&reference, 5, &spec0))
        .transpose()?;
    let record = |sb: &Superblock| {
        let mut sb = sb.clone();
        if let Some(plan) = &plan {
            plan.record(&mut sb);
        }
        sb
    };
    let after = record(&reference);
    let raid5 = crate::assemble::geometry_of(&after, &spec0)?;
    if old.array_bytes() != raid5.array_bytes() {
        return Err(refuse(format!(
            "a served RAID 1 of {} bytes as a RAID 5 of {} bytes: the takeover must keep the size",
            old.array_bytes(),
            raid5.array_bytes()
        )));
    }
    let data_offset = after.data_offset_sectors * 512;
    if (0..array.roles()).any(|r| {
        array
            .slot(r)
            .is_some_and(|s| s.data_offset_bytes() != data_offset)
    }) {
        return Err(refuse(
            "members with different data offsets (nvraid grows a served array whose members start their data at one offset); stop serve and use `nvraid grow --level 5 -n N --add NEW... MEMBERS`".into(),
        ));
    }
    let sbs: Vec<Superblock> = (0..array.roles())
        .map(|r| record(&array.slot(r).expect("whole").superblock))
        .collect();
    let bitmap_bytes = super::live_copy::bitmap_bytes(array, &raid5, options.raid_devices)?;
    let (moved_sectors, _) = super::grow::room_for(&sbs, &after, &raid5, bitmap_bytes)?;
    super::live::open_added(array, options, &after, &raid5)?;
    super::grow::free_dev_numbers(&after, options.add.len())?;
    // The grow's two shapes, as `LiveGrow::start` makes them.
    let chunk = raid5.chunk_bytes().expect("a RAID 5 has chunks");
    let grown = Geometry::new(
        raid5.level(),
        options.raid_devices,
        chunk,
        crate::assemble::member_data_bytes(&after),
    )?;
    let new_offset = data_offset - moved_sectors * 512;
    super::live::uniform_reshape(
        &raid5,
        &grown,
        0,
        nvraid_layout::Direction::Forwards,
        data_offset,
        new_offset,
    )?;
    Ok(!taken_over)
}

impl LiveRoute for LiveLevel {
    fn io(
        &self,
        array: &Array,
        op: OpKind,
        offset: u64,
        buf: &mut [u8],
        fua: bool,
    ) -> std::result::Result<(), i32> {
        // The array's own simple path, once the gate lets the request by.
        let _open = self.gate.read().unwrap_or_else(|p| p.into_inner());
        crate::array::SimpleRoute.io(array, op, offset, buf, fua)
    }
}

impl Companion for LiveLevel {
    fn role_table(&self, table: &mut [u16]) {
        if let Some(slot) = self.leaving_dev.and_then(|dev| table.get_mut(dev)) {
            *slot = Role::Spare.to_raw();
        }
        if self.renumber.is_empty() {
            return;
        }
        // Roles renumbered; a RAID 10's copies not kept (left, or missing
        // and so recorded faulty) are out of the array: a spare's entry,
        // as md records the devices mdadm removed for its takeover.
        let halving = matches!(self.change, Change::Whole(plan) if plan.halve);
        for entry in table.iter_mut() {
            match Role::from_raw(*entry) {
                Role::Active(r) => {
                    *entry = match self.renumber.get(usize::from(r)).copied().flatten() {
                        Some(to) => Role::Active(to as u16).to_raw(),
                        None => Role::Spare.to_raw(),
                    }
                }
                Role::Faulty if halving => *entry = Role::Spare.to_raw(),
                _ => {}
            }
        }
    }
}

/// The level change put into a kept member's superblock (level, layout,
/// chunk, size, member count); its role table, events and time aside.
fn record_change(change: &Change, sb: &mut Superblock) {
    match *change {
        Change::Whole(plan) => plan.record(sb),
        Change::Raid0OfRaid4 { members } => record_raid0_of_raid4(sb, members),
        Change::Raid10OfRaid0 {
            members,
            member_rows,
        } => {
            // As `grow --level 10` offline writes it: md's RAID 10 near=2
            // of twice the members, each member's rows the RAID 0's.
            sb.level = 10;
            sb.layout = Level::Raid10 { near: 2 }.md_layout();
            sb.raid_disks = 2 * members;
            sb.size_sectors = member_rows / 512;
            sb.data_size_sectors = member_rows / 512;
        }
    }
}

impl ReshapeRecord for LiveLevel {
    fn apply(&self, _role: usize, sb: &mut Superblock) {
        if self.switching.load(Ordering::SeqCst)
            && self.switch_writes.fetch_add(1, Ordering::SeqCst) > 0
        {
            // The members before this one are written with the new level.
            crate::failpoint::hit("reshape-superblock");
        }
        record_change(&self.change, sb);
    }

    fn role_written(&self, role: usize) -> usize {
        self.renumber.get(role).copied().flatten().unwrap_or(role)
    }
}

impl LiveReshape for LiveLevel {
    fn stop(&self) {}

    fn status(&self) -> LiveGrowStatus {
        let s = self.switched();
        let (state, error) = self
            .outcome
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        LiveGrowStatus {
            kind: "level",
            state,
            raid_disks_before: s.raid_disks_before,
            raid_disks: s.raid_disks,
            position_bytes: s.size_bytes,
            end_bytes: s.size_bytes,
            bytes_per_sec: 0,
            eta_seconds: None,
            error,
            new_size_bytes: s.size_bytes,
        }
    }
}
