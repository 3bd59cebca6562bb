//! The run directory (`/run/nvraid`, or `NVRAID_RUN_DIR`) and the
//! decisions of incremental assembly.
//!
//! ```text
//! /run/nvraid/incremental/<uuid>/members/<path, / as !>   one file per member udev reported (holds the path)
//! /run/nvraid/incremental/<uuid>/first-seen               when the first member came (seconds since the epoch)
//! /run/nvraid/incremental/<uuid>/degraded-ok              written by the last-resort service: start degraded
//! /run/nvraid/ublk/<name>                                 the ublk device number `nvraid serve --ublk-record` wrote
//! /run/nvraid/<name>.ctl                                  the array's control socket
//! ```
//!
//! Every file is written whole (a temporary file renamed into place), so a
//! reader never sees half of one; two members reported at once each write
//! their record before they list the records, so the later of the two
//! always sees both.

use crate::config::write_atomically;
use nvraid_array::ScannedArray;
use nvraid_metadata::format_uuid;
use std::io;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// The run directory unless `NVRAID_RUN_DIR` says otherwise.
pub const DEFAULT_RUN_DIR: &str = "/run/nvraid";

/// The run directory.
#[derive(Clone, Debug)]
pub struct RunDir {
    pub root: PathBuf,
}

impl RunDir {
    /// `NVRAID_RUN_DIR`, else `/run/nvraid`.
    pub fn from_env() -> RunDir {
        RunDir {
            root: std::env::var_os("NVRAID_RUN_DIR")
                .map(PathBuf::from)
                .unwrap_or_else(|| PathBuf::from(DEFAULT_RUN_DIR)),
        }
    }

    /// The records of one array.
    pub fn array_dir(&self, uuid: &[u8; 16]) -> PathBuf {
        self.root.join("incremental").join(format_uuid(uuid))
    }

    fn members_dir(&self, uuid: &[u8; 16]) -> PathBuf {
        self.array_dir(uuid).join("members")
    }

    /// Record that `member` (a path) belongs to the array. `Ok(false)`
    /// when it was recorded already (nothing written).
    pub fn record(&self, uuid: &[u8; 16], member: &str) -> io::Result<bool> {
        let file = self.members_dir(uuid).join(member.replace('/', "!"));
        if std::fs::read_to_string(&file).is_ok_and(|text| text == member) {
            return Ok(false);
        }
        let first = self.array_dir(uuid).join("first-seen");
        if !first.exists() {
            let now = SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .unwrap_or_default();
            write_atomically(&first, &format!("{}\n", now.as_secs()))?;
        }
        write_atomically(&file, member)?;
        Ok(true)
    }

    /// Forget that `member` belongs to the array (udev saw it go); true if
    /// it was recorded.
    pub fn forget(&self, uuid: &[u8; 16], member: &str) -> io::Result<bool> {
        let file = self.members_dir(uuid).join(member.replace('/', "!"));
        match std::fs::remove_file(file) {
            Ok(()) => Ok(true),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// The arrays (UUIDs) `member` is recorded for: a device that went
    /// away can no longer be read to learn its array.
    pub fn arrays_of(&self, member: &str) -> Vec<[u8; 16]> {
        let Ok(entries) = std::fs::read_dir(self.root.join("incremental")) else {
            return Vec::new();
        };
        entries
            .flatten()
            .filter_map(|e| crate::config::parse_uuid(&e.file_name().to_string_lossy()))
            .filter(|uuid| self.recorded(uuid).iter().any(|m| m == member))
            .collect()
    }

    /// The members recorded for the array, sorted.
    pub fn recorded(&self, uuid: &[u8; 16]) -> Vec<String> {
        let Ok(entries) = std::fs::read_dir(self.members_dir(uuid)) else {
            return Vec::new();
        };
        let mut paths: Vec<String> = entries
            .flatten()
            .filter(|e| !e.file_name().to_string_lossy().starts_with('.'))
            .filter_map(|e| std::fs::read_to_string(e.path()).ok())
            .collect();
        paths.sort();
        paths
    }

    /// When the array's first member was recorded.
    pub fn first_seen(&self, uuid: &[u8; 16]) -> Option<SystemTime> {
        let text = std::fs::read_to_string(self.array_dir(uuid).join("first-seen")).ok()?;
        let seconds = text.trim().parse::<u64>().ok()?;
        Some(UNIX_EPOCH + Duration::from_secs(seconds))
    }

    /// The last resort's permission to start the array degraded.
    pub fn degraded_ok(&self, uuid: &[u8; 16]) -> PathBuf {
        self.array_dir(uuid).join("degraded-ok")
    }

    pub fn allow_degraded(&self, uuid: &[u8; 16]) -> io::Result<()> {
        write_atomically(&self.degraded_ok(uuid), "")
    }

    pub fn degraded_allowed(&self, uuid: &[u8; 16]) -> bool {
        self.degraded_ok(uuid).exists()
    }

    /// The file `nvraid serve --ublk-record` keeps the array's device
    /// number in.
    pub fn ublk_record(&self, name: &str) -> PathBuf {
        self.root.join("ublk").join(name)
    }

    /// The device number recorded for `name`.
    pub fn ublk_id(&self, name: &str) -> Option<u32> {
        std::fs::read_to_string(self.ublk_record(name))
            .ok()?
            .trim()
            .parse()
            .ok()
    }

    /// The array whose record holds device number `id` (for the udev rule
    /// that names `/dev/nvraid/NAME`).
    pub fn name_of_ublk(&self, id: u32) -> Option<String> {
        let mut names: Vec<String> = std::fs::read_dir(self.root.join("ublk"))
            .ok()?
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|name| !name.starts_with('.'))
            .collect();
        names.sort();
        names
            .into_iter()
            .find(|name| self.ublk_id(name) == Some(id))
    }

    /// The array's control socket.
    pub fn control(&self, name: &str) -> PathBuf {
        self.root.join(format!("{name}.ctl"))
    }

    /// The Unix socket an array exported `none` listens on.
    pub fn socket(&self, name: &str) -> PathBuf {
        self.root.join(format!("{name}.sock"))
    }
}

/// What a member's arrival leads to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Decision {
    /// Every active role is present: start the array's service.
    Start,
    /// Not yet (`why`): arm the last-resort timer, which starts the array
    /// degraded if nothing more comes.
    Wait { why: String },
}

/// The array `uuid` as a scan of `paths` finds it.
pub fn judge(uuid: &[u8; 16], paths: &[String]) -> Option<ScannedArray> {
    let text = format_uuid(uuid);
    nvraid_array::scan(paths)
        .arrays
        .into_iter()
        .find(|a| a.uuid == text)
}

/// Start when complete; otherwise wait (degraded, or not startable yet:
/// more members may come).
pub fn decide(array: Option<&ScannedArray>) -> Decision {
    match array {
        Some(a) if a.status == "complete" => Decision::Start,
        Some(a) => Decision::Wait {
            why: format!(
                "{}{}",
                a.status,
                a.reason
                    .as_ref()
                    .map(|r| format!(": {r}"))
                    .unwrap_or_default()
            ),
        },
        None => Decision::Wait {
            why: "no member readable".into(),
        },
    }
}

/// The array's service.
pub fn service_unit(name: &str) -> String {
    format!("nvraid@{name}.service")
}

/// The array's last-resort timer.
pub fn timer_unit(name: &str) -> String {
    format!("nvraid-last-resort@{name}.timer")
}

/// `systemctl` (or `NVRAID_SYSTEMCTL`, for tests).
#[derive(Clone, Debug)]
pub struct Systemctl {
    pub program: PathBuf,
}

impl Systemctl {
    pub fn from_env() -> Systemctl {
        Systemctl {
            program: std::env::var_os("NVRAID_SYSTEMCTL")
                .map(PathBuf::from)
                .unwrap_or_else(|| PathBuf::from("systemctl")),
        }
    }

    /// `systemctl --no-block start UNIT`: queued, not waited for (udev
    /// must not wait for an array to start).
    pub fn start(&self, unit: &str) -> io::Result<()> {
        let status = std::process::Command::new(&self.program)
            .args(["--no-block", "start", unit])
            .status()
            .map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", self.program.display())))?;
        if status.success() {
            Ok(())
        } else {
            Err(io::Error::other(format!(
                "{} --no-block start {unit}: {status}",
                self.program.display()
            )))
        }
    }
}

/// Block devices directly under `dir` (`/dev`), and regular files too
/// when `dir` is not `/dev` (a test's directory of member images), one
/// path per device (the first name, sorted, of each device number).
pub fn devices_in(dir: &Path) -> Vec<String> {
    use std::os::unix::fs::{FileTypeExt, MetadataExt};
    let files_too = dir != Path::new("/dev");
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut names: Vec<PathBuf> = entries.flatten().map(|e| e.path()).collect();
    names.sort();
    let mut seen = Vec::new();
    let mut out = Vec::new();
    for path in names {
        // symlink_metadata: /dev's aliases (symlinks) are not followed.
        let Ok(meta) = std::fs::symlink_metadata(&path) else {
            continue;
        };
        let kind = meta.file_type();
        let id = if kind.is_block_device() {
            (0, meta.rdev())
        } else if files_too && kind.is_file() {
            (meta.dev(), meta.ino())
        } else {
            continue;
        };
        if !seen.contains(&id) {
            seen.push(id);
            out.push(path.display().to_string());
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_are_kept_once_and_listed() {
        let dir = tempfile::tempdir().unwrap();
        let run = RunDir {
            root: dir.path().to_path_buf(),
        };
        let uuid = [7u8; 16];
        assert!(run.recorded(&uuid).is_empty());
        assert!(run.first_seen(&uuid).is_none());
        assert!(run.record(&uuid, "/dev/vdc").unwrap());
        assert!(run.record(&uuid, "/dev/vdb").unwrap());
        assert!(!run.record(&uuid, "/dev/vdb").unwrap(), "recorded twice");
        assert_eq!(run.recorded(&uuid), vec!["/dev/vdb", "/dev/vdc"]);
        assert!(run.first_seen(&uuid).is_some());
        assert!(!run.degraded_allowed(&uuid));
        run.allow_degraded(&uuid).unwrap();
        assert!(run.degraded_allowed(&uuid));
    }

    #[test]
    fn the_ublk_registry_maps_numbers_to_names() {
        let dir = tempfile::tempdir().unwrap();
        let run = RunDir {
            root: dir.path().to_path_buf(),
        };
        assert_eq!(run.name_of_ublk(3), None);
        write_atomically(&run.ublk_record("data"), "3\n").unwrap();
        write_atomically(&run.ublk_record("logs"), "12").unwrap();
        assert_eq!(run.ublk_id("data"), Some(3));
        assert_eq!(run.name_of_ublk(3).as_deref(), Some("data"));
        assert_eq!(run.name_of_ublk(12).as_deref(), Some("logs"));
        assert_eq!(run.name_of_ublk(1), None);
    }

    #[test]
    fn unit_names() {
        assert_eq!(service_unit("data"), "nvraid@data.service");
        assert_eq!(timer_unit("data"), "nvraid-last-resort@data.timer");
    }
}
