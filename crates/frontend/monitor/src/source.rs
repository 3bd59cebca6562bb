//! The [`Snapshot`] of a served array, read from the array itself (its
//! members' states and counters, as `detail` and `status` show them), its
//! recovery service (rebuild, check/repair) and the background resync.

use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

use nvraid_array::recovery::online::{Online, ResyncState};
use nvraid_array::Array;

use crate::event::{MemberSnapshot, Progress, ScrubSnapshot, Snapshot};

/// Where snapshots come from.
pub struct ArraySource {
    array: Arc<Array>,
    online: Arc<Online>,
    resync: Arc<Mutex<ResyncState>>,
}

impl ArraySource {
    pub fn new(
        array: Arc<Array>,
        online: Arc<Online>,
        resync: Arc<Mutex<ResyncState>>,
    ) -> ArraySource {
        ArraySource {
            array,
            online,
            resync,
        }
    }

    /// The array now; `scrub_runs` is the count of checks and repairs
    /// started (the monitor keeps it).
    pub fn snapshot(&self, scrub_runs: u64) -> Snapshot {
        let array = &self.array;
        let members = members(array);
        let online = self.online.status();
        let rebuild = online.rebuild.map(|r| Progress {
            role: Some(r.role),
            member: Some(r.member),
            done_bytes: r.done_bytes,
            total_bytes: r.total_bytes,
            finished: r.finished,
            error: r.error,
        });
        let scrub = online.scrub.map(|s| ScrubSnapshot {
            run: scrub_runs,
            mode: s.mode.to_string(),
            mismatch_sectors: s.result.as_ref().map(|r| r.mismatch_sectors),
            progress: Progress {
                done_bytes: s.done_bytes,
                total_bytes: s.total_bytes,
                finished: s.finished,
                error: s.error,
                ..Progress::default()
            },
        });
        let resync = {
            let s = self.resync.lock().unwrap_or_else(|p| p.into_inner());
            (s.total_bytes > 0 || s.error.is_some()).then(|| Progress {
                done_bytes: s.done_bytes,
                total_bytes: s.total_bytes,
                finished: s.finished,
                error: s.error.clone(),
                ..Progress::default()
            })
        };
        let sb = array.superblock();
        let geometry = array.geometry();
        let mut state = if array.is_dirty() { "active" } else { "clean" }.to_string();
        if array.is_degraded() {
            state.push_str(", degraded");
        }
        Snapshot {
            name: sb.name(),
            uuid: nvraid_metadata::format_uuid(&sb.set_uuid),
            level: geometry.level().number(),
            state,
            degraded: array.is_degraded(),
            size_bytes: geometry.array_bytes(),
            raid_disks: geometry.members(),
            members,
            rebuild,
            resync,
            scrub,
        }
    }
}

/// Each role's member (or its absence), md's journal, the members set
/// aside: their states as `detail` names them, read from the array's
/// memory only (`info::detail` also scans md's journal log on its member,
/// which a look every second must not do).
fn members(array: &Array) -> Vec<MemberSnapshot> {
    let counters = array.member_counters();
    let mut members: Vec<MemberSnapshot> = array
        .slots()
        .iter()
        .enumerate()
        .map(|(role, slot)| {
            let Some(slot) = slot else {
                return MemberSnapshot {
                    role: Some(role as u32),
                    state: "missing".into(),
                    ..MemberSnapshot::default()
                };
            };
            let state = if array.has_left(role) {
                // Taken out by a level change (a RAID 6's Q member as
                // the array became a RAID 5), not failed.
                "left"
            } else if array.is_faulty(role) {
                "faulty"
            } else if array.in_sync_bytes(role).is_some() {
                "rebuilding"
            } else {
                "active"
            };
            let count =
                |f: fn(&nvraid_array::MemberCounters) -> u64| counters.get(role).map_or(0, f);
            MemberSnapshot {
                role: Some(role as u32),
                path: Some(slot.member.spec().to_string()),
                state: state.into(),
                in_sync_bytes: array.in_sync_bytes(role),
                ops: count(|c| c.ops.load(Ordering::Relaxed)),
                bytes: count(|c| c.bytes.load(Ordering::Relaxed)),
                errors: count(|c| c.errors.load(Ordering::Relaxed)),
            }
        })
        .collect();
    members.extend(array.md_journal().map(|journal| {
        MemberSnapshot {
            path: Some(journal.spec().to_string()),
            state: if journal.failure().is_some() {
                "faulty"
            } else {
                "journal"
            }
            .into(),
            ..MemberSnapshot::default()
        }
    }));
    members.extend(array.set_aside_now().map(|m| MemberSnapshot {
        path: Some(m.spec.clone()),
        state: m.reason.state().into(),
        ..MemberSnapshot::default()
    }));
    members
}
