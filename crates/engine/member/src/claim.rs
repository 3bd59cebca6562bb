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
/// five seconds; when this process holds it, for up to one second. A
/// live process's lock is refused at once, a shared one too: udev holds
/// one on a block device while it probes it (systemd's block device
/// locking convention), also while it runs the programs its rules start,
/// and one of those may be nvraid handing the device to a running array:
/// waiting here would wait for ourselves. The caller that may wait (a
/// server starting, `Holder::Probing`) retries.
/// Who holds a claim that could not be taken.
pub(crate) enum Holder {
    /// This process (the member opened for writing twice).
    Me,
    /// Another process: `pid 1234 (nvraid serve ...), which claimed it
    /// for writing`.
    Other(String),
    /// Another process holding a shared lock (udev probing the device):
    /// `pid 644 ((udev-worker)), which holds a shared lock ...`.
    Probing(String),
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
    let who = holder(file).unwrap_or_else(|| "another process".into());
    Ok(Err(match holder_lock(file) {
        Some((_, Lock::Shared)) => Holder::Probing(who),
        _ => Holder::Other(who),
    }))
}

/// Whether `file` could be claimed now (claims it and lets go at once).
pub(crate) fn claimable(file: &File) -> io::Result<Result<(), Holder>> {
    let claimed = claim(file)?;
    if claimed.is_ok() {
        nvraid_io::sys::unlock(file)?;
    }
    Ok(claimed)
}

/// How a flock is held.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Lock {
    /// `LOCK_EX` (WRITE in `/proc/locks`): a writer's claim.
    Exclusive,
    /// `LOCK_SH` (READ): udev probing, or a reader that asked to keep
    /// writers out for a moment.
    Shared,
}

/// The pid `/proc/locks` gives for a flock on the same device and inode.
fn holder_pid(file: &File) -> Option<String> {
    holder_lock(file).map(|(pid, _)| pid)
}

/// The pid and kind of a flock on the same device and inode.
fn holder_lock(file: &File) -> Option<(String, Lock)> {
    let meta = file.metadata().ok()?;
    // For a block device the lock is on the device node's inode.
    let (major, minor) = nvraid_io::sys::dev_major_minor(meta.dev());
    let wanted = format!("{major:02x}:{minor:02x}:{}", meta.ino());
    let locks = std::fs::read_to_string("/proc/locks").ok()?;
    locks.lines().find_map(|line| {
        let fields: Vec<&str> = line.split_whitespace().collect();
        // id: FLOCK ADVISORY WRITE pid maj:min:inode start end
        let at = fields.iter().position(|f| *f == "FLOCK")?;
        let lock = match *fields.get(at + 2)? {
            "READ" => Lock::Shared,
            _ => Lock::Exclusive,
        };
        (fields.get(at + 4) == Some(&wanted.as_str()))
            .then(|| fields.get(at + 3).map(|pid| (pid.to_string(), lock)))?
    })
}

/// `pid 1234 (nvraid serve --listen ...), which claimed it for writing`:
/// who holds the claim, and how.
fn holder(file: &File) -> Option<String> {
    let (pid, lock) = holder_lock(file)?;
    let how = match lock {
        Lock::Exclusive => "which claimed it for writing",
        Lock::Shared => "which holds a shared lock on it (as udev does while it probes a device)",
    };
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
        format!("pid {pid}, {how}")
    } else {
        format!("pid {pid} ({command}), {how}")
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::process::{Command, Stdio};
    use std::time::{Duration, Instant};

    /// Another process holding `path` under a flock (`flock(1)`) for
    /// `seconds`; returns once the lock is held.
    fn locked_by_another_process(
        path: &std::path::Path,
        shared: bool,
        seconds: f64,
    ) -> std::process::Child {
        let child = Command::new("flock")
            .arg(if shared { "--shared" } else { "--exclusive" })
            .arg(path)
            .args(["sleep", &seconds.to_string()])
            .stdout(Stdio::null())
            .spawn()
            .expect("flock(1) (util-linux)");
        let file = File::open(path).unwrap();
        let until = Instant::now() + Duration::from_secs(10);
        while holder_lock(&file).is_none() {
            assert!(Instant::now() < until, "flock(1) took no lock");
            std::thread::sleep(Duration::from_millis(5));
        }
        child
    }

    /// udev holds a shared lock on a block device while it probes it (and
    /// while the programs its rules start run, nvraid's among them): the
    /// claim is refused at once as `Probing`, for the caller to retry, and
    /// taken once the lock is gone.
    #[test]
    fn a_shared_lock_as_udev_takes_while_probing_is_told_apart_and_then_claimed() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("m0");
        std::fs::write(&path, [0u8; 4096]).unwrap();
        let mut probe = locked_by_another_process(&path, true, 1.0);
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(&path)
            .unwrap();
        let started = Instant::now();
        match claim(&file).unwrap() {
            Err(Holder::Probing(who)) => assert!(who.contains("shared lock"), "{who}"),
            _ => panic!("a shared lock was not told apart from a writer's claim"),
        }
        assert!(
            started.elapsed() < Duration::from_secs(1),
            "{:?}",
            started.elapsed()
        );
        probe.wait().unwrap();
        assert!(
            matches!(claim(&file).unwrap(), Ok(())),
            "not claimed once the lock was gone"
        );
    }

    /// A writer's exclusive claim is refused at once, naming the process.
    #[test]
    fn an_exclusive_claim_of_another_process_is_refused_naming_it() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("m0");
        std::fs::write(&path, [0u8; 4096]).unwrap();
        let mut writer = locked_by_another_process(&path, false, 30.0);
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(&path)
            .unwrap();
        let started = Instant::now();
        match claim(&file).unwrap() {
            Err(Holder::Other(who)) => {
                assert!(
                    who.contains("flock") && who.ends_with("which claimed it for writing"),
                    "{who}"
                )
            }
            _ => panic!("an exclusive claim of another process was not refused"),
        }
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "{:?}",
            started.elapsed()
        );
        writer.kill().unwrap();
        writer.wait().unwrap();
    }
}
