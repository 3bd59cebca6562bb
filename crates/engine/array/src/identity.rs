//! What a member reached over a network must prove on every new
//! connection: its superblock, read on that connection before any other
//! request, must still name this array (set UUID), this member (device
//! UUID) and the role it holds, with an events count no older than the
//! last superblock this array wrote to it and saw complete. A server
//! restarted with a blank export, a member of another array, or an older
//! copy of this member at the same address is refused, and the member
//! fails with that reason, before any of its data is read or written.

use nvraid_io::remote::IdentityCheck;
use nvraid_metadata::{format_uuid, Role, Superblock, SUPER_OFFSET_BYTES};
use std::sync::atomic::{AtomicU64, Ordering};

/// The identity of one member of the running array.
#[derive(Debug)]
pub struct MemberIdentity {
    set_uuid: [u8; 16],
    device_uuid: [u8; 16],
    role: Role,
    /// The events of the newest superblock this array wrote to the member
    /// and saw complete; a later write may be found too (events only grow
    /// while the array runs).
    min_events: AtomicU64,
}

impl MemberIdentity {
    /// The identity `sb` (the member's superblock as the array holds it)
    /// gives.
    pub fn of(sb: &Superblock) -> MemberIdentity {
        MemberIdentity {
            set_uuid: sb.set_uuid,
            device_uuid: sb.device_uuid,
            role: sb.role(),
            min_events: AtomicU64::new(sb.events),
        }
    }

    /// A superblock with `events` reached the member (written and flushed).
    pub fn written(&self, events: u64) {
        self.min_events.fetch_max(events, Ordering::AcqRel);
    }

    /// The check of a superblock read from whatever answered.
    pub fn check(&self, found: &Superblock) -> Result<(), String> {
        if found.set_uuid != self.set_uuid {
            return Err(format!(
                "array UUID differs (expected {}, found {}): a member of another array answered in this member's place",
                format_uuid(&self.set_uuid),
                format_uuid(&found.set_uuid)
            ));
        }
        if found.device_uuid != self.device_uuid {
            return Err(format!(
                "device UUID differs (expected {}, found {}): a different device answered in this member's place",
                format_uuid(&self.device_uuid),
                format_uuid(&found.device_uuid)
            ));
        }
        if found.role() != self.role {
            return Err(format!(
                "role differs (expected {:?}, found {:?}): the device no longer holds this member's place",
                self.role,
                found.role()
            ));
        }
        let min = self.min_events.load(Ordering::Acquire);
        if found.events < min {
            return Err(format!(
                "events {} older than the array's {min}: an older copy of this member answered",
                found.events
            ));
        }
        Ok(())
    }
}

impl IdentityCheck for MemberIdentity {
    fn probe(&self) -> (u64, usize) {
        (SUPER_OFFSET_BYTES, 4096)
    }

    fn verify(&self, bytes: &[u8]) -> Result<(), String> {
        let found = Superblock::decode(bytes).map_err(|e| {
            format!("no md superblock of this array ({e}): a different device answered in this member's place")
        })?;
        self.check(&found)
    }
}
