//! The [`Snapshot`] of a served array, read from the array itself (its
//! members' states and counters, as `detail` and `status` show them), its
//! recovery service (rebuild, check/repair) and the background resync.

use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

use nvraid_array::recovery::online::{Online, ResyncState};
use nvraid_array::{info, Array};

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
        let detail = info::detail(&self.array);
        let counters = self.array.member_counters();
        let members = detail
            .members
            .iter()
            .map(|m| {
                let counted = m
                    .role
                    .filter(|_| m.path.is_some())
                    .and_then(|r| counters.get(r as usize));
                let get = |f: fn(&nvraid_array::MemberCounters) -> u64| counted.map_or(0, f);
                MemberSnapshot {
                    role: m.role,
                    path: m.path.clone(),
                    state: m.state.to_string(),
                    in_sync_bytes: m.in_sync_bytes,
                    ops: get(|c| c.ops.load(Ordering::Relaxed)),
                    bytes: get(|c| c.bytes.load(Ordering::Relaxed)),
                    errors: get(|c| c.errors.load(Ordering::Relaxed)),
                }
            })
            .collect();
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
        Snapshot {
            degraded: self.array.is_degraded(),
            name: detail.name,
            uuid: detail.uuid,
            level: detail.level,
            state: detail.state,
            size_bytes: detail.size_bytes,
            raid_disks: detail.raid_disks,
            members,
            rebuild,
            resync,
            scrub,
        }
    }
}
