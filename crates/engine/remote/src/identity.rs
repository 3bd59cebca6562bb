//! A member's proof of identity on every new connection.
//!
//! The array hands each remote member an [`IdentityCheck`] (what its
//! superblock must say). Every connection made after the first one (a
//! worker's channel connecting, the simple path's connection coming back,
//! a reconnection after the server went away) reads the check's probe
//! range before any other request is sent on it; a device that answers
//! differently is refused: the connection is closed, its operations fail
//! with `ENXIO`, and the reason is kept here for the array, which marks
//! the member faulty with it.

use crate::channel::{single_op, ConnectionProof, NbdChannel, RemoteOptions};
use crate::session::{ConnectError, Session};
use crate::uri::NbdUri;
use nvraid_io::engine::MemberOpKind;
use nvraid_io::remote::IdentityCheck;
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

/// A member's identity check (once the array gave one) and the last
/// refusal, shared by its export and every channel to it.
#[derive(Debug, Default)]
pub struct Identity {
    check: RwLock<Option<Arc<dyn IdentityCheck>>>,
    refused: Mutex<Option<String>>,
}

impl Identity {
    /// Check every connection made from now on with `check`.
    pub fn set(&self, check: Arc<dyn IdentityCheck>) {
        *self.check.write().unwrap_or_else(|e| e.into_inner()) = Some(check);
    }

    /// Why the last new connection was refused as not the member (cleared
    /// when a later one passes).
    pub fn refused(&self) -> Option<String> {
        self.refused
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    pub(crate) fn current(&self) -> Option<Arc<dyn IdentityCheck>> {
        self.check.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Keep why a new connection was refused (None: one passed), for
    /// transports that run the probe themselves (NVMe/TCP).
    pub(crate) fn note(&self, refused: Option<String>) {
        *self.refused.lock().unwrap_or_else(|e| e.into_inner()) = refused;
    }
}

impl ConnectionProof for Identity {
    /// Prove that `session`, just connected to `uri`, reaches the member:
    /// read the probe on it (no other request has been sent there) and
    /// verify it, all before `deadline`. Without a check, the session
    /// passes as it is.
    fn prove(
        &self,
        uri: &NbdUri,
        session: Session,
        deadline: Instant,
    ) -> Result<Session, ConnectError> {
        let Some(check) = self.current() else {
            return Ok(session);
        };
        let result = probe(uri, session, deadline, check.as_ref());
        let mut refused = self.refused.lock().unwrap_or_else(|e| e.into_inner());
        match &result {
            Ok(_) => *refused = None,
            // The reason alone: whoever reports it names the member.
            Err(ConnectError::NotTheMember { reason, .. }) => *refused = Some(reason.clone()),
            Err(_) => {}
        }
        result
    }
}

fn probe(
    uri: &NbdUri,
    session: Session,
    deadline: Instant,
    check: &dyn IdentityCheck,
) -> Result<Session, ConnectError> {
    let (offset, len) = check.probe();
    let left = deadline
        .saturating_duration_since(Instant::now())
        .max(Duration::from_millis(1));
    if offset.saturating_add(len as u64) > session.info.size_bytes {
        return Err(ConnectError::NotTheMember {
            uri: uri.to_string(),
            reason: format!(
                "the export ({} bytes) is too small to hold the member's identity at {offset}+{len}",
                session.info.size_bytes
            ),
        });
    }
    let (buf, session) = read_on_session(uri, session, offset, len, left)?;
    check
        .verify(&buf)
        .map_err(|reason| ConnectError::NotTheMember {
            uri: uri.to_string(),
            reason,
        })?;
    Ok(session)
}

/// Reads `len` bytes at `offset` of the export over `session` within
/// `left`: one read on a channel of its own, which never reconnects; the
/// session is taken back once the reply is in.
fn read_on_session(
    uri: &NbdUri,
    session: Session,
    offset: u64,
    len: usize,
    left: Duration,
) -> Result<(Vec<u8>, Session), ConnectError> {
    let mut channel = NbdChannel::prober(
        uri.clone(),
        RemoteOptions {
            request_timeout: left,
            connect_timeout: left,
        },
        session,
    );
    let mut buf = vec![0u8; len];
    let op = single_op(MemberOpKind::Read, offset, buf.as_mut_ptr(), len, false);
    let mut result = None;
    // SAFETY: `buf` outlives the call, which waits for the read.
    let pushed = unsafe { nvraid_io::remote::Channel::push(&mut channel, &op) };
    if let Err(source) = pushed {
        return Err(ConnectError::Io {
            uri: uri.to_string(),
            source,
        });
    }
    channel.wait_all(&mut |_, r| result = Some(r));
    let unreadable = |why: String| ConnectError::Io {
        uri: uri.to_string(),
        source: std::io::Error::other(format!(
            "the member's identity could not be read on a new connection: {why}"
        )),
    };
    match result {
        Some(r) if r == len as i32 => {}
        Some(r) => {
            let why = channel.last_failure().map_or_else(
                || std::io::Error::from_raw_os_error(-r).to_string(),
                str::to_string,
            );
            return Err(unreadable(why));
        }
        None => return Err(unreadable("the read was lost".into())),
    }
    let session = channel
        .take_idle_session()
        .ok_or_else(|| unreadable("the server sent more than the reply".into()))?;
    Ok((buf, session))
}
