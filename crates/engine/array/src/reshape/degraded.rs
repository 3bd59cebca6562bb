//! A grow with members failed: md's rule kept (a member that fails is
//! recorded failed on every other member before the reshape goes on).
//!
//! The failed members are kept by role in [`Failed`]. A step reads around
//! them and writes nothing to them (`step::move_rows`); a member whose
//! I/O fails in a step or while a superblock is written is recorded
//! failed (its slot in every other member's role table becomes md's
//! faulty mark, events + 1) and the step is redone from the recorded
//! position, whose bytes are all still where the record says. When the
//! members left no longer hold every byte of both shapes (a RAID 5 losing
//! a second member, a RAID 0 losing any), nothing more is written: the
//! reshape stops at the position last recorded, which the kernel's md or
//! `grow --continue` resumes once the member is back.

use super::grow::{write_superblocks, Placed};
use super::step::MemberFailure;
use crate::error::{Error, Result};
use crate::intent::MemberBitmap;
use nvraid_layout::Reshape;
use nvraid_member::{Member, OpenOptions};
use nvraid_metadata::{Role, Superblock, Timestamp};

/// The roles whose members failed (or are missing), in the larger shape;
/// the roles no member was given for (a stand-in holds them); the roles
/// whose member holds nothing of the old shape (a RAID 0 grow's new
/// member in the old parity's role).
#[derive(Clone, Debug)]
pub(super) struct Failed(pub(super) Vec<bool>, Vec<bool>, Vec<bool>);

impl Failed {
    pub(super) fn none(roles: usize) -> Failed {
        Failed(vec![false; roles], vec![false; roles], vec![false; roles])
    }

    /// Role `role`'s member holds nothing of the old shape.
    pub(super) fn absent_from_old(&mut self, role: usize) {
        self.2[role] = true;
    }

    /// Role `role` has no member (a stand-in holds it).
    pub(super) fn missing(&mut self, role: usize) {
        self.0[role] = true;
        self.1[role] = true;
    }

    /// What a step must not read, old shape and new.
    pub(super) fn unreadable(&self) -> (Vec<bool>, &[bool]) {
        let old = self.0.iter().zip(&self.2).map(|(f, a)| *f || *a).collect();
        (old, &self.0)
    }

    /// Whether the members not failed hold every byte of both shapes.
    pub(super) fn has_every_byte(&self, reshape: &Reshape) -> bool {
        let (old_unreadable, _) = self.unreadable();
        let present_old: Vec<bool> = old_unreadable.iter().map(|f| !f).collect();
        let present: Vec<bool> = self.0.iter().map(|f| !f).collect();
        let old = reshape.old().members() as usize;
        let new = reshape.new_shape().members() as usize;
        reshape.old().has_every_byte(&present_old[..old])
            && reshape.new_shape().has_every_byte(&present[..new])
    }

    /// Whether role `role` failed (or is missing).
    pub(super) fn is_failed(&self, role: usize) -> bool {
        self.0.get(role).copied().unwrap_or(false)
    }

    /// The roles not failed.
    pub(super) fn surviving(&self) -> Vec<usize> {
        (0..self.0.len()).filter(|&r| !self.0[r]).collect()
    }

    /// The failed members' names (a missing one: `missing (role N)`).
    pub(super) fn specs(&self, placed: &[Placed]) -> Vec<String> {
        (0..self.0.len().min(placed.len()))
            .filter(|&r| self.0[r])
            .map(|r| match self.1.get(r) {
                Some(true) => format!("role {r} (missing)"),
                _ => placed[r].member.spec().to_string(),
            })
            .collect()
    }
}

/// `grow --continue` with roles missing (`None` in `by_role`): allowed,
/// as md continues a degraded reshape, when the members given hold every
/// byte of both shapes. A missing role gets a stand-in that is never
/// read or written (it is failed), and its slot in `reference`'s role
/// table md's faulty mark. Returns every role's member and the failed.
pub(super) fn fill_missing(
    by_role: Vec<Option<Placed>>,
    reference: &mut Superblock,
) -> Result<(Vec<Placed>, Failed)> {
    let missing_roles: Vec<bool> = by_role.iter().map(Option::is_none).collect();
    let failed = Failed(
        missing_roles.clone(),
        missing_roles.clone(),
        vec![false; missing_roles.len()],
    );
    let missing: Vec<usize> = (0..failed.0.len()).filter(|&r| failed.0[r]).collect();
    if missing.is_empty() {
        return Ok((
            by_role.into_iter().map(|p| p.expect("present")).collect(),
            failed,
        ));
    }
    let spec = by_role
        .iter()
        .flatten()
        .next()
        .map(|p| p.member.spec().to_string())
        .unwrap_or_default();
    let reshape = super::record::reshape_of(reference, &spec, &[])?;
    if !failed.has_every_byte(&reshape) {
        return Err(Error::NotStartable(format!(
            "role(s) {missing:?} missing; without them the members given do not hold every byte of the {} of {} members nor of the {} of {}: nvraid continues a reshape with every member, or degraded where the parity or a copy covers the missing",
            reshape.old().level(),
            reshape.old().members(),
            reshape.new_shape().level(),
            reshape.new_shape().members(),
        )));
    }
    let mut placed = Vec::with_capacity(by_role.len());
    for (role, p) in by_role.into_iter().enumerate() {
        if let Some(p) = p {
            placed.push(p);
            continue;
        }
        let dev = reference
            .roles_raw
            .iter()
            .position(|&raw| Role::from_raw(raw) == Role::Active(role as u16));
        let mut sb = reference.clone();
        if let Some(dev) = dev {
            reference.roles_raw[dev] = Role::Faulty.to_raw();
            sb.dev_number = dev as u32;
        }
        placed.push(Placed {
            member: stand_in()?,
            sb,
        });
    }

    Ok((placed, failed))
}

/// Record `failure`'s member failed on every other member (events + 1),
/// md's rule, before anything else is written. Refused, with nothing more
/// written, when the members left lack bytes of either shape: the reshape
/// then stands at its last recorded position.
pub(super) fn record_failure(
    placed: &mut [Placed],
    failed: &mut Failed,
    reshape: &Reshape,
    failure: MemberFailure,
    bitmap: Option<&mut MemberBitmap>,
) -> Result<()> {
    let mut failure = failure;
    let mut bitmap = bitmap;
    loop {
        let role = failure.role as usize;
        failed.0[role] = true;
        if !failed.has_every_byte(reshape) {
            // The members after the failed one get the superblock the
            // members before it got (as md writes every member's): one
            // record on every member left, the failed one not recorded
            // faulty (the level cannot lose it). A second failure here
            // changes nothing of that answer.
            let _ = write_surviving(placed, failed, bitmap.as_deref_mut());
            return Err(Error::NotStartable(format!(
                "{} failed during the reshape ({}); without it the members left do not hold every byte of a {} of {} members: the reshape stopped at the position last recorded, {} bytes, with nothing written past it; bring the member back and run `nvraid grow --continue` (or `mdadm --assemble`)",
                placed[role].member.spec(),
                failure.error,
                reshape.new_shape().level(),
                reshape.new_shape().members(),
                reshape.position(),
            )));
        }
        let dev = placed[role].sb.dev_number as usize;
        for p in placed.iter_mut() {
            if let Some(slot) = p.sb.roles_raw.get_mut(dev) {
                *slot = Role::Faulty.to_raw();
            }
            p.sb.events += 1;
            p.sb.utime = Timestamp::now();
        }
        match write_surviving(placed, failed, bitmap.as_deref_mut()) {
            Ok(()) => return Ok(()),
            Err(next) => failure = next,
        }
    }
}

/// Write (and flush) the superblock of every member not failed; the first
/// member whose write fails is returned, the rest not written.
fn write_surviving(
    placed: &[Placed],
    failed: &Failed,
    mut bitmap: Option<&mut MemberBitmap>,
) -> std::result::Result<(), MemberFailure> {
    for i in failed.surviving() {
        write_superblocks(placed, &[i], bitmap.as_deref_mut()).map_err(|error| MemberFailure {
            role: i as u32,
            error,
        })?;
    }
    Ok(())
}

/// Write every surviving member's superblock (a checkpoint or the end);
/// a member failing on the way is recorded failed on the others first
/// ([`record_failure`]), then the superblocks are written again.
pub(super) fn checkpoint(
    placed: &mut [Placed],
    failed: &mut Failed,
    reshape: &Reshape,
    mut bitmap: Option<&mut MemberBitmap>,
) -> Result<()> {
    match write_surviving(placed, failed, bitmap.as_deref_mut()) {
        Ok(()) => Ok(()),
        Err(failure) => record_failure(placed, failed, reshape, failure, bitmap),
    }
}

/// A stand-in for a role without a member: never read or written (the
/// role is failed), it only fills the role's place.
pub(super) fn stand_in() -> Result<Member> {
    Ok(Member::open(
        &format!("null:{}", 1u64 << 20),
        OpenOptions {
            write: false,
            create_bytes: None,
            ..Default::default()
        },
    )?)
}
