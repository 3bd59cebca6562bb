//! Errors that name what failed: the command, the device, and the errno
//! by its name, with what it means for that command.

use std::time::Duration;

use crate::uapi;

/// The control commands, for their numbers and their names in messages.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Cmd {
    GetFeatures,
    AddDev,
    DelDev,
    StartDev,
    StopDev,
    SetParams,
    GetParams,
    GetDevInfo,
    StartUserRecovery,
    EndUserRecovery,
    UpdateSize,
}

impl Cmd {
    pub fn op(self) -> u32 {
        match self {
            Cmd::GetFeatures => uapi::U_CMD_GET_FEATURES,
            Cmd::AddDev => uapi::U_CMD_ADD_DEV,
            Cmd::DelDev => uapi::U_CMD_DEL_DEV,
            Cmd::StartDev => uapi::U_CMD_START_DEV,
            Cmd::StopDev => uapi::U_CMD_STOP_DEV,
            Cmd::SetParams => uapi::U_CMD_SET_PARAMS,
            Cmd::GetParams => uapi::U_CMD_GET_PARAMS,
            Cmd::GetDevInfo => uapi::U_CMD_GET_DEV_INFO,
            Cmd::StartUserRecovery => uapi::U_CMD_START_USER_RECOVERY,
            Cmd::EndUserRecovery => uapi::U_CMD_END_USER_RECOVERY,
            Cmd::UpdateSize => uapi::U_CMD_UPDATE_SIZE,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Cmd::GetFeatures => "GET_FEATURES",
            Cmd::AddDev => "ADD_DEV",
            Cmd::DelDev => "DEL_DEV",
            Cmd::StartDev => "START_DEV",
            Cmd::StopDev => "STOP_DEV",
            Cmd::SetParams => "SET_PARAMS",
            Cmd::GetParams => "GET_PARAMS",
            Cmd::GetDevInfo => "GET_DEV_INFO",
            Cmd::StartUserRecovery => "START_USER_RECOVERY",
            Cmd::EndUserRecovery => "END_USER_RECOVERY",
            Cmd::UpdateSize => "UPDATE_SIZE",
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(
        "no /dev/ublk-control: the kernel has no ublk driver loaded \
         (module ublk_drv, CONFIG_BLK_DEV_UBLK, Linux 6.0 or later; try `modprobe ublk_drv`)"
    )]
    NoDriver,
    #[error("ublk {}: {} ({detail})", cmd.name(), errno_name(*errno))]
    Command {
        cmd: Cmd,
        dev: u32,
        errno: i32,
        detail: String,
    },
    #[error("ublk {cmd}: no answer from the kernel for device {dev} within {after:?}")]
    Timeout {
        cmd: &'static str,
        dev: u32,
        after: Duration,
    },
    #[error("ublk queue {q_id} of device {dev}: tag {tag}: the kernel answered {} ({detail})", errno_name(*errno))]
    Tag {
        dev: u32,
        q_id: u16,
        tag: u16,
        errno: i32,
        detail: &'static str,
    },
    #[error("{what}: {source}")]
    Io {
        what: String,
        source: std::io::Error,
    },
}

impl Error {
    pub(crate) fn io(what: &str, source: std::io::Error) -> Error {
        Error::Io {
            what: what.to_string(),
            source,
        }
    }

    /// The kernel refused `cmd` on device `dev` with `errno`.
    pub(crate) fn command(cmd: Cmd, dev: u32, errno: i32) -> Error {
        let detail = match (cmd, errno) {
            (Cmd::AddDev, libc::EEXIST) => format!("device {dev} exists"),
            (Cmd::AddDev, libc::EINVAL) => {
                "the kernel refused the queue count, depth, buffer size or flags".into()
            }
            (_, libc::ENODEV) => format!("no device {dev}"),
            (Cmd::SetParams, libc::EACCES) => {
                format!("device {dev} is started: parameters are set before START_DEV")
            }
            (Cmd::SetParams, libc::EINVAL) => format!(
                "the kernel refused the parameters of device {dev} \
                 (block sizes, request size above the buffer, discard limits)"
            ),
            (Cmd::StartUserRecovery, libc::EBUSY) => format!(
                "device {dev} is not quiesced yet, or its old server still holds /dev/ublkc{dev}"
            ),
            (Cmd::StartUserRecovery, libc::EINVAL) => {
                format!("device {dev} was not added with user recovery, or was never started")
            }
            (Cmd::StartDev, libc::EEXIST) => format!("device {dev} is already started"),
            (_, libc::EPERM) | (_, libc::EACCES) => {
                format!("not allowed on device {dev} (needs CAP_SYS_ADMIN)")
            }
            (_, libc::EINTR) => "interrupted while the kernel waited".into(),
            (_, libc::EOPNOTSUPP) => "this kernel's ublk_drv does not have the command".into(),
            _ => std::io::Error::from_raw_os_error(errno).to_string(),
        };
        Error::Command {
            cmd,
            dev,
            errno,
            detail,
        }
    }
}

/// The symbolic name of an errno (the number when it is not one of those
/// ublk answers with).
pub fn errno_name(errno: i32) -> String {
    let name = match errno {
        libc::EPERM => "EPERM",
        libc::ENOENT => "ENOENT",
        libc::EINTR => "EINTR",
        libc::EIO => "EIO",
        libc::ENXIO => "ENXIO",
        libc::E2BIG => "E2BIG",
        libc::EBADF => "EBADF",
        libc::EAGAIN => "EAGAIN",
        libc::ENOMEM => "ENOMEM",
        libc::EACCES => "EACCES",
        libc::EFAULT => "EFAULT",
        libc::EBUSY => "EBUSY",
        libc::EEXIST => "EEXIST",
        libc::ENODEV => "ENODEV",
        libc::EINVAL => "EINVAL",
        libc::ENOSPC => "ENOSPC",
        libc::ERANGE => "ERANGE",
        libc::ENOTSUP => "EOPNOTSUPP",
        libc::ETIMEDOUT => "ETIMEDOUT",
        libc::ECANCELED => "ECANCELED",
        _ => return format!("errno {errno}"),
    };
    name.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refused_command_names_itself_the_errno_and_the_device() {
        let e = Error::command(Cmd::AddDev, 3, libc::EEXIST);
        assert_eq!(e.to_string(), "ublk ADD_DEV: EEXIST (device 3 exists)");
        let e = Error::command(Cmd::StartUserRecovery, 7, libc::EBUSY);
        assert!(
            e.to_string()
                .starts_with("ublk START_USER_RECOVERY: EBUSY (device 7 is not quiesced"),
            "{e}"
        );
        let e = Error::command(Cmd::GetDevInfo, 9, libc::ENODEV);
        assert_eq!(e.to_string(), "ublk GET_DEV_INFO: ENODEV (no device 9)");
        assert!(Error::NoDriver.to_string().contains("ublk_drv"));
    }
}
