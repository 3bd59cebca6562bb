//! `/dev/ublk-control`: adding, configuring, starting, stopping and
//! deleting devices, and handing a device over to a new server.
//!
//! Three commands wait in the kernel for the server's queues: START_DEV
//! and END_USER_RECOVERY until every queue has fetched all its tags (and
//! START_DEV then reads the partition table through those queues),
//! STOP_DEV and DEL_DEV until requests in flight are done (DEL_DEV also
//! until every /dev/ublkcN is closed). A thread that blocked on one of
//! them while it is the one serving a queue would wait forever, so these
//! commands never block: they return a [`Pending`] (its own small ring),
//! which the caller polls beside its queues ([`Pending::fd`],
//! [`Pending::poll`]) or waits for from a thread that serves no queue
//! ([`Pending::wait`], with a deadline). The other commands are answered
//! at once and are plain calls.

use std::fs::File;
use std::os::fd::{AsRawFd, RawFd};
use std::time::{Duration, Instant};

use crate::error::{Cmd, Error};
use crate::sys::CtrlRing;
use crate::uapi::{self, CtrlCmd, DevInfo, Params};

pub const CONTROL_PATH: &str = "/dev/ublk-control";

/// What ADD_DEV asks for.
#[derive(Clone, Copy, Debug)]
pub struct DeviceSpec {
    /// A device number, or `None` for the first free one.
    pub id: Option<u32>,
    pub queues: u16,
    pub depth: u16,
    /// Largest request's data (each tag's buffer).
    pub max_io_buf_bytes: u32,
    /// `uapi::F_*` (e.g. `F_USER_RECOVERY | F_USER_RECOVERY_REISSUE`);
    /// `F_CMD_IOCTL_ENCODE` is always added.
    pub flags: u64,
}

/// An open `/dev/ublk-control`.
pub struct Control {
    file: File,
    ring: CtrlRing,
}

impl Control {
    /// Open `/dev/ublk-control`. Without the `ublk_drv` module the node is
    /// missing, and the error says so.
    pub fn open() -> Result<Control, Error> {
        Control::open_at(CONTROL_PATH)
    }

    fn open_at(path: &str) -> Result<Control, Error> {
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(path)
            .map_err(|e| match e.raw_os_error() {
                Some(libc::ENOENT) | Some(libc::ENODEV) | Some(libc::ENXIO) => Error::NoDriver,
                _ => Error::Io {
                    what: format!("open {path}"),
                    source: e,
                },
            })?;
        let ring = CtrlRing::new().map_err(|e| Error::io("create the control ring", e))?;
        Ok(Control { file, ring })
    }

    /// Run `cmd` on device `dev` and wait for its answer (commands the
    /// kernel answers without waiting for a server only).
    fn run<T: crate::sys::Plain>(
        &mut self,
        cmd: Cmd,
        dev: u32,
        data: u64,
        buf: Option<&mut T>,
    ) -> Result<i32, Error> {
        let arg = CtrlCmd {
            dev_id: dev,
            queue_id: u16::MAX,
            data: [data],
            ..CtrlCmd::default()
        };
        let res = self
            .ring
            .run(self.file.as_raw_fd(), cmd.op(), arg, buf)
            .map_err(|e| Error::io(&format!("ublk {}", cmd.name()), e))?;
        if res < 0 {
            return Err(Error::command(cmd, dev, -res));
        }
        Ok(res)
    }

    /// The driver's feature bits (`uapi::F_*` it understands).
    pub fn features(&mut self) -> Result<u64, Error> {
        let mut features = 0u64;
        self.run(Cmd::GetFeatures, u32::MAX, 0, Some(&mut features))?;
        Ok(features)
    }

    /// Add a device (its /dev/ublkcN appears; /dev/ublkbN only at start).
    /// Returns what the kernel made of the request: its id, and queue
    /// count, depth and buffer size as granted.
    pub fn add(&mut self, spec: &DeviceSpec) -> Result<DevInfo, Error> {
        let dev = spec.id.unwrap_or(u32::MAX);
        let mut info = DevInfo {
            nr_hw_queues: spec.queues,
            queue_depth: spec.depth,
            max_io_buf_bytes: spec.max_io_buf_bytes,
            dev_id: dev,
            flags: spec.flags | uapi::F_CMD_IOCTL_ENCODE,
            ..DevInfo::default()
        };
        self.run(Cmd::AddDev, dev, 0, Some(&mut info))?;
        Ok(info)
    }

    /// Tell the kernel a started device's new size (`sectors` of 512
    /// bytes): its disk takes the capacity and tells udev. Needs
    /// [`uapi::F_UPDATE_SIZE`] in [`Control::features`] (Linux 6.16 on).
    pub fn update_size(&mut self, dev: u32, sectors: u64) -> Result<(), Error> {
        self.run::<u64>(Cmd::UpdateSize, dev, sectors, None)?;
        Ok(())
    }

    pub fn info(&mut self, dev: u32) -> Result<DevInfo, Error> {
        let mut info = DevInfo::default();
        self.run(Cmd::GetDevInfo, dev, 0, Some(&mut info))?;
        Ok(info)
    }

    /// Set the device's parameters (before START_DEV).
    pub fn set_params(&mut self, dev: u32, params: &Params) -> Result<(), Error> {
        let mut copy = *params;
        copy.len = std::mem::size_of::<Params>() as u32;
        self.run(Cmd::SetParams, dev, 0, Some(&mut copy))?;
        Ok(())
    }

    pub fn params(&mut self, dev: u32) -> Result<Params, Error> {
        let mut params = Params::default();
        self.run(Cmd::GetParams, dev, 0, Some(&mut params))?;
        Ok(params)
    }

    /// Prepare a quiesced device (its server gone, `F_USER_RECOVERY`) for
    /// a new server. EBUSY while the old server's /dev/ublkcN is not yet
    /// closed or the device not yet quiesced: see
    /// [`Control::start_recovery_within`].
    pub fn start_recovery(&mut self, dev: u32) -> Result<(), Error> {
        self.run::<u64>(Cmd::StartUserRecovery, dev, 0, None)?;
        Ok(())
    }

    /// [`Control::start_recovery`], retried while the kernel answers EBUSY
    /// (the old server's exit still being torn down), up to `limit`.
    pub fn start_recovery_within(&mut self, dev: u32, limit: Duration) -> Result<(), Error> {
        let deadline = Instant::now() + limit;
        loop {
            match self.start_recovery(dev) {
                Err(Error::Command { errno, .. })
                    if errno == libc::EBUSY && Instant::now() < deadline =>
                {
                    std::thread::sleep(Duration::from_millis(20));
                }
                other => return other,
            }
        }
    }

    /// Start the device: the kernel waits until every queue has fetched
    /// all its tags, then adds /dev/ublkbN (reading it through the queues).
    pub fn start(&self, dev: u32, pid: u32) -> Result<Pending, Error> {
        self.pending(Cmd::StartDev, dev, pid as u64)
    }

    /// Hand the recovered device to this server (after `start_recovery`):
    /// like `start`, the kernel waits for every queue's fetches.
    pub fn end_recovery(&self, dev: u32, pid: u32) -> Result<Pending, Error> {
        self.pending(Cmd::EndUserRecovery, dev, pid as u64)
    }

    /// Stop the device: /dev/ublkbN goes away, and every queue's fetches
    /// complete with ABORT.
    pub fn stop(&self, dev: u32) -> Result<Pending, Error> {
        self.pending(Cmd::StopDev, dev, 0)
    }

    /// Delete the device (stopping it first if needed); completes once its
    /// /dev/ublkcN is closed by every server.
    pub fn delete(&self, dev: u32) -> Result<Pending, Error> {
        self.pending(Cmd::DelDev, dev, 0)
    }

    fn pending(&self, cmd: Cmd, dev: u32, data: u64) -> Result<Pending, Error> {
        let file = self
            .file
            .try_clone()
            .map_err(|e| Error::io(CONTROL_PATH, e))?;
        let mut ring = CtrlRing::new().map_err(|e| Error::io("create a control ring", e))?;
        let arg = CtrlCmd {
            dev_id: dev,
            queue_id: u16::MAX,
            data: [data],
            ..CtrlCmd::default()
        };
        ring.submit(file.as_raw_fd(), cmd.op(), arg)
            .map_err(|e| Error::io(&format!("ublk {}", cmd.name()), e))?;
        Ok(Pending {
            cmd,
            dev,
            ring,
            _file: file,
            done: None,
        })
    }
}

/// A control command submitted and not yet answered. Dropping it before
/// the answer cancels the command in the kernel (its ring is closed).
pub struct Pending {
    cmd: Cmd,
    dev: u32,
    ring: CtrlRing,
    _file: File,
    done: Option<i32>,
}

impl Pending {
    /// Readable (POLLIN) once the answer is there.
    pub fn fd(&self) -> RawFd {
        self.ring.fd()
    }

    pub fn command(&self) -> &'static str {
        self.cmd.name()
    }

    /// The answer, if it has come (never blocks).
    pub fn poll(&mut self) -> Option<Result<(), Error>> {
        if self.done.is_none() {
            match self.ring.complete(false) {
                Ok(res) => self.done = res,
                Err(e) => return Some(Err(Error::io(&format!("ublk {}", self.cmd.name()), e))),
            }
        }
        self.done.map(|res| {
            if res < 0 {
                Err(Error::command(self.cmd, self.dev, -res))
            } else {
                Ok(())
            }
        })
    }

    /// Wait for the answer, at most `limit`. Only from a thread that
    /// serves none of the device's queues.
    pub fn wait(mut self, limit: Duration) -> Result<(), Error> {
        let deadline = Instant::now() + limit;
        loop {
            if let Some(answer) = self.poll() {
                return answer;
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(Error::Timeout {
                    cmd: self.cmd.name(),
                    dev: self.dev,
                    after: limit,
                });
            }
            let mut fds = [libc::pollfd {
                fd: self.fd(),
                events: libc::POLLIN,
                revents: 0,
            }];
            crate::sys::poll(&mut fds, left.as_millis().clamp(1, 1000) as i32);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Where ublk_drv is not loaded there is no control node: the error
    /// names the module, not just ENOENT.
    #[test]
    fn without_the_driver_the_error_names_the_module() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("ublk-control");
        let err = Control::open_at(missing.to_str().unwrap()).err().unwrap();
        assert!(matches!(err, Error::NoDriver), "{err}");
        assert!(err.to_string().contains("module ublk_drv"), "{err}");
    }
}
