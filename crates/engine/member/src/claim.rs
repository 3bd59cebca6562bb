//! Exclusive claims: a member written by one nvraid process is not written
//! by another, as md claims its devices.
//!
//! A writable open takes an exclusive `flock` on the member (files and block
//! devices), held until the member is closed. A second writer is refused
//! with the process that holds the claim, found in `/proc/locks` by the
//! file's device and inode. Readers (`examine`, `detail`, `read`) take no
//! claim and are never refused. The lock is advisory: it keeps nvraid
//! processes (and anything else that uses `flock`) apart; the kernel's own
//! users of a block device are kept out by md's and the filesystems' own
//! exclusive opens, not by this.

use std::fs::File;
use std::io;
use std::os::unix::fs::MetadataExt;

/// Claim `file` for writing, or say who holds it.
///
/// A claim can outlive its process by a while: the kernel closes an
/// io_uring's registered files after the process has exited, once the
/// ring's last requests are done (on a slow device, seconds); within a
/// process, a ring closed a moment ago lets go of its files the same way,
/// from a kernel work item. When no live process holds the claim (its pid
/// is gone, or no process is listed for it), the claim is retried for up to
/// five seconds; when this process holds it, for up to one second.
/// Who holds a claim that could not be taken.
pub(crate) enum Holder {
    /// This process (the member opened for writing twice).
    Me,
    /// Another process: `pid 1234 (nvraid serve ...)`.
    Other(String),
}

pub(crate) fn claim(file: &File) -> io::Result<Result<(), Holder>> {
    let me = std::process::id().to_string();
    for attempt in 0..250 {
        if nvraid_io::sys::try_lock_exclusive(file)? {
            return Ok(Ok(()));
        }
        match holder_pid(file) {
            Some(pid) if pid == me && attempt < 50 => {}
            Some(pid) if std::path::Path::new(&format!("/proc/{pid}")).exists() => break,
            _ => {}
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    if holder_pid(file).is_some_and(|pid| pid == me) {
        return Ok(Err(Holder::Me));
    }
    Ok(Err(Holder::Other(
        holder(file).unwrap_or_else(|| "another process".into()),
    )))
}

/// Whether `file` could be claimed now (claims it and lets go at once).
pub(crate) fn claimable(file: &File) -> io::Result<Result<(), Holder>> {
    let claimed = claim(file)?;
    if claimed.is_ok() {
        nvraid_io::sys::unlock(file)?;
    }
    Ok(claimed)
}

/// The pid `/proc/locks` gives for a flock on the same device and inode.
fn holder_pid(file: &File) -> Option<String> {
    let meta = file.metadata().ok()?;
    // For a block device the lock is on the device node's inode.
    let (major, minor) = nvraid_io::sys::dev_major_minor(meta.dev());
    let wanted = format!("{major:02x}:{minor:02x}:{}", meta.ino());
    let locks = std::fs::read_to_string("/proc/locks").ok()?;
    locks.lines().find_map(|line| {
        let fields: Vec<&str> = line.split_whitespace().collect();
        // id: FLOCK ADVISORY WRITE pid maj:min:inode start end
        let at = fields.iter().position(|f| *f == "FLOCK")?;
        (fields.get(at + 4) == Some(&wanted.as_str()))
            .then(|| fields.get(at + 3).map(|pid| pid.to_string()))?
    })
}

/// `pid 1234 (nvraid serve --listen ...)`: who holds the claim.
fn holder(file: &File) -> Option<String> {
    let pid = holder_pid(file)?;
    let command = std::fs::read(format!("/proc/{pid}/cmdline"))
        .map(|raw| {
            raw.split(|&b| b == 0)
                .filter(|part| !part.is_empty())
                .map(|part| String::from_utf8_lossy(part).into_owned())
                .collect::<Vec<_>>()
                .join(" ")
        })
        .unwrap_or_default();
    Some(if command.is_empty() {
        format!("pid {pid}")
    } else {
        format!("pid {pid} ({command})")
    })
}
