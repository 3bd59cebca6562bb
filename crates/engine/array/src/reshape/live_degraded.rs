//! A served grow going on degraded (md's rule, and the offline grow's in
//! `degraded`): [`LiveGrow`]'s member failures (an old member's recorded
//! by the array, an added member's by the grow's role-table entry), the
//! new-shape stripe read around a failed member, the steps' window and
//! their moves around the members failed. `live` calls these from its
//! route, its superblock updates and its step loop.

use super::live::LiveGrow;
use super::step::{move_rows, Unreadable};
use crate::array::Array;
use crate::error::{Error, Result};
use nvraid_io::AlignedBuf;
use nvraid_layout::Reshape;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;

/// Which of a served grow's added members failed. The array does not
/// hold them (they have no role in its old shape), so the grow keeps
/// their state: a failed one is written no more (neither rows nor
/// superblock), its entry in every role table the array writes is
/// md's faulty one, and its chunks are read through the parity.
#[derive(Debug, Default)]
pub(super) struct AddedFailures {
    /// By added member (role `old_members + k`).
    failed: Vec<AtomicBool>,
    /// Held while a failure is recorded, so that a second request that
    /// saw the same member fail returns only once the superblocks record
    /// it (as the array's `fail_member` does under its events lock).
    recording: Mutex<()>,
    /// An added member's superblock write failed inside a superblock
    /// update and it was marked failed: the update is written again,
    /// its role table now recording the member faulty.
    write_again: AtomicBool,
}

impl AddedFailures {
    pub(super) fn new(added: usize) -> AddedFailures {
        AddedFailures {
            failed: (0..added).map(|_| AtomicBool::new(false)).collect(),
            ..AddedFailures::default()
        }
    }

    /// Whether added member `k` failed.
    pub(super) fn is_failed(&self, k: usize) -> bool {
        self.failed
            .get(k)
            .is_some_and(|f| f.load(Ordering::Acquire))
    }

    /// Whether a superblock update must be written again (once).
    pub(super) fn take_write_again(&self) -> bool {
        self.write_again.swap(false, Ordering::AcqRel)
    }
}

/// A grow going on degraded (md's rule, and the offline grow's in
/// `degraded`): a member of the old shape failing while the array is
/// served is recorded faulty by the array, an added member by the grow
/// (its role-table entry faulty in every update from then on), and the
/// steps and the route's new-shape I/O read around it and write nothing
/// to it, as long as the parity covers the members failed; one more
/// stops the grow at the position recorded.
impl LiveGrow {
    /// The roles failed now, of both shapes (the old members the array
    /// recorded faulty, the added members the grow did; a shrink's
    /// leaving roles after the new shape's).
    pub(super) fn failed_roles(&self, array: &Array) -> Vec<bool> {
        let old = self.old_members as usize;
        (0..(self.reshape.new_shape().members() as usize).max(old))
            .map(|r| {
                if r < old {
                    !array.is_usable(r)
                } else {
                    self.added_failed.is_failed(r - old) || self.raid0_parity_role() == Some(r)
                }
            })
            .collect()
    }

    /// Whether the members not `failed` (by new-shape role) hold every
    /// byte of both shapes (a RAID 10's copies lie on other members in
    /// each).
    pub(super) fn holds_every_byte(&self, failed: &[bool]) -> bool {
        let usable: Vec<bool> = failed.iter().map(|f| !f).collect();
        let old = self.old_members as usize;
        let new = self.reshape.new_shape().members() as usize;
        // The old shape's roles no member of the array holds (a RAID 0's
        // parity role, `live_raid0`) are absent from it.
        let old_usable: Vec<bool> = (0..self.reshape.old().members() as usize)
            .map(|r| r < old && usable.get(r).copied().unwrap_or(false))
            .collect();
        self.reshape.old().has_every_byte(&old_usable)
            && self
                .reshape
                .new_shape()
                .has_every_byte(&usable[..new.min(usable.len())])
    }

    /// The member in `role` failed with `error`: when the level covers
    /// it (both shapes' bytes held by the others), an old member is failed
    /// in the array and an added member by the grow, either recorded
    /// faulty on every member still written, durably, before this
    /// returns, and the caller goes on without it; otherwise the error.
    pub(super) fn member_failed(
        &self,
        array: &Array,
        role: usize,
        error: std::io::Error,
    ) -> Result<()> {
        let spec = self.members_of(array)[role].spec().to_string();
        let old = self.old_members as usize;
        if role >= old {
            let k = role - old;
            let _recording = self
                .added_failed
                .recording
                .lock()
                .unwrap_or_else(|p| p.into_inner());
            if self.added_failed.is_failed(k) {
                return Ok(());
            }
            let mut failed = self.failed_roles(array);
            failed[role] = true;
            if !self.holds_every_byte(&failed) {
                eprintln!(
                    "nvraid: {spec}: {error}; a member the grow added, needed (more members failed than the parity covers): the request fails"
                );
                return Err(Error::io(&spec, error));
            }
            self.added_failed.failed[k].store(true, Ordering::Release);
            // Recorded before any request goes on without it: the role
            // table every update writes now holds it faulty.
            array.rewrite_superblocks()?;
            eprintln!(
                "nvraid: {spec}: {error}; a member the grow added, marked faulty (events {}), the grow goes on degraded",
                array.events()
            );
            return Ok(());
        }
        let mut failed = self.failed_roles(array);
        failed[role] = true;
        if !self.holds_every_byte(&failed) {
            return Err(Error::io(&spec, error));
        }
        array.fail_member(role, &error)?;
        Ok(())
    }

    /// Read new stripe `stripe`'s data chunks into `data` (in array
    /// order), but not those `skip` names (they are overwritten whole):
    /// a chunk on a failed member is rebuilt from the stripe's others and
    /// its parity. A member whose read fails is failed and the stripe
    /// read again. The caller holds the stripe's lock.
    pub(super) fn read_stripe(
        &self,
        array: &Array,
        stripe: u64,
        data: &mut [u8],
        skip: &[bool],
    ) -> Result<()> {
        let new = self.reshape.new_shape();
        let map = new
            .level()
            .stripe_map(new.members())
            .expect("a parity level");
        let chunk = new.chunk_bytes().expect("chunks");
        let c = chunk as usize;
        let row = self.new_offset() + stripe * chunk;
        let blocks = map.stripe(stripe);
        let members = self.members_of(array);
        let raid6 = blocks.q.is_some();
        let slot = |d: usize| {
            if raid6 {
                map.q_slot(stripe, d as u32)
            } else {
                d
            }
        };
        'again: loop {
            let failed = self.failed_roles(array);
            let lost: Vec<usize> = (0..blocks.data.len())
                .filter(|&d| failed[blocks.data[d] as usize])
                .collect();
            // Every chunk when one is lost (the parity needs them all),
            // else only those not overwritten whole.
            for (d, &m) in blocks.data.iter().enumerate() {
                if failed[m as usize] || (lost.is_empty() && skip.get(d) == Some(&true)) {
                    continue;
                }
                if let Err(e) = members[m as usize].read_at(&mut data[d * c..(d + 1) * c], row) {
                    self.member_failed(array, m as usize, e)?;
                    continue 'again;
                }
            }
            if lost.is_empty() {
                return Ok(());
            }
            let mut p = AlignedBuf::zeroed(c);
            let mut q = AlignedBuf::zeroed(c);
            let mut gone: Vec<nvraid_parity::Block> = lost
                .iter()
                .map(|&d| nvraid_parity::Block::Data(slot(d)))
                .collect();
            if failed[blocks.p as usize] {
                gone.push(nvraid_parity::Block::P);
            } else if let Err(e) = members[blocks.p as usize].read_at(&mut p, row) {
                self.member_failed(array, blocks.p as usize, e)?;
                continue 'again;
            }
            if let Some(qm) = blocks.q {
                if failed[qm as usize] {
                    gone.push(nvraid_parity::Block::Q);
                } else if let Err(e) = members[qm as usize].read_at(&mut q, row) {
                    self.member_failed(array, qm as usize, e)?;
                    continue 'again;
                }
            }
            let mut ordered: Vec<Option<&mut [u8]>> =
                (0..blocks.data.len()).map(|_| None).collect();
            for (d, bytes) in data[..blocks.data.len() * c].chunks_mut(c).enumerate() {
                ordered[slot(d)] = Some(bytes);
            }
            let mut whole = nvraid_parity::Stripe {
                data: ordered
                    .into_iter()
                    .map(|d| d.expect("every slot"))
                    .collect(),
                p: &mut p,
                q: raid6.then_some(&mut q[..]),
            };
            return whole
                .recover(nvraid_parity::Kernel::best(), &gone)
                .map_err(|e| {
                    Error::NotStartable(format!(
                        "stripe {stripe} of the new shape cannot be rebuilt: {e:?}"
                    ))
                });
        }
    }

    /// The array bytes a step from `p` to `to` must have no client
    /// request in: a parity level's old stripes it reads whole (a
    /// degraded step rebuilds a failed member's chunks from their rows'
    /// others and parity, which a client's old-shape write just past `to`
    /// in the same row must not change under it); a RAID 10's new rows it
    /// writes whole (they hold chunks just below `p`, in the new shape,
    /// and just past `to`, which a client may be writing).
    pub(super) fn step_window(&self, p: u64, to: u64) -> (u64, u64) {
        let old = self.reshape.old();
        let new = self.reshape.new_shape();
        let chunk = old.chunk_bytes().expect("chunks");
        if new.level().parity_chunks() == 0 {
            // The new shape's rows, in its chunk (a restripe's differs).
            let chunk = new.chunk_bytes().expect("chunks");
            let (n, near) = (u64::from(new.members()), u64::from(new.copies()));
            let first_row = (p / chunk) * near / n;
            let end_row = (to.div_ceil(chunk) * near).div_ceil(n);
            let start = first_row * n / near * chunk;
            let end = ((end_row * n).div_ceil(near) * chunk).min(new.array_bytes());
            return (start.min(p), end.max(to));
        }
        let old_unit = chunk * u64::from(old.members() - old.level().parity_chunks());
        let end = to.next_multiple_of(old_unit).min(old.array_bytes()).max(to);
        (p, end)
    }

    /// Added member `role` (`spec`) failed with `error` as its superblock
    /// was written inside a superblock update whose role table is `table`
    /// (the array's events lock held, so nothing is written here): when
    /// the level covers it (the old roles `table` holds no member for
    /// failed too), it is marked failed and the update asked to be
    /// written again, its role table then recording it faulty and its
    /// superblock left out; the error to fail the update with otherwise.
    pub(super) fn added_superblock_failed(
        &self,
        role: usize,
        spec: &str,
        error: std::io::Error,
        table: &[u16],
    ) -> Error {
        let old = self.old_members as usize;
        let failed: Vec<bool> = (0..self.reshape.new_shape().members() as usize)
            .map(|r| {
                if r < old {
                    !table.contains(&nvraid_metadata::Role::Active(r as u16).to_raw())
                } else {
                    r == role || self.added_failed.is_failed(r - old)
                }
            })
            .collect();
        if role >= old
            && self.holds_every_byte(&failed)
            && !self.added_failed.failed[role - old].swap(true, Ordering::AcqRel)
        {
            eprintln!(
                "nvraid: {spec}: {error} while its superblock was updated; a member the grow added, marked faulty, the grow goes on degraded"
            );
            self.added_failed.write_again.store(true, Ordering::Release);
        }
        Error::io(spec, error)
    }

    /// Move the array's `[P, to)` (the step's window closed): read around
    /// the members failed and write none of them; a member failing in
    /// the step is failed in the array and the step done again.
    pub(super) fn move_degraded(
        &self,
        array: &Array,
        reshape: &Reshape,
        to: u64,
        kernel: nvraid_parity::Kernel,
    ) -> Result<()> {
        let p = reshape.position();
        loop {
            let failed = self.failed_roles(array);
            if !self.holds_every_byte(&failed) {
                return Err(Error::NotStartable(format!(
                    "more members failed than the parity covers; the grow stopped at {p} bytes, the position its superblocks record"
                )));
            }
            let members = self.members_of(array);
            // The old shape's roles the array holds no member for (a RAID
            // 0's parity role, held by the first added member in the new
            // shape) are not read in old rows.
            let old_members = self.old_members as usize;
            let old_shape = self.reshape.old().members() as usize;
            let old_unreadable: Vec<bool> = (0..failed.len())
                .map(|r| failed[r] || (old_members..old_shape).contains(&r))
                .collect();
            let unreadable = Unreadable {
                old: &old_unreadable,
                new: &failed,
            };
            let moved = move_rows(reshape, &members, unreadable, to, kernel, &|| {
                crate::failpoint::hit("reshape-write")
            });
            let Err(failure) = moved else {
                return Ok(());
            };
            let role = failure.role as usize;
            if failed[role] {
                return Err(failure.error);
            }
            let error = match failure.error {
                Error::Io { source, .. } => source,
                other => std::io::Error::other(other.to_string()),
            };
            self.member_failed(array, role, error)
                .map_err(|e| self.raid0_stopped(e, p))?;
        }
    }
}
