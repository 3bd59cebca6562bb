//! What the reboot tests share: a whole Debian trixie booted with systemd under
//! qemu (`tools/bootvm`), its root a qcow2 overlay of the test's own on the cached
//! image of `tools/bootvm/mkroot`, booted as often as the test likes with member
//! images as virtio disks of fixed serials (nv0, nv1, ...: a disk left out does
//! not rename the others).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

const TOOLS: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../tools/bootvm");

/// The Debian package of `binary` (`dist/build-deb`), written into `out`;
/// fails the test with build-deb's reasons. Returns build-deb's stderr.
pub fn build_package(binary: &Path, out: &Path) -> String {
    std::fs::create_dir_all(out).unwrap();
    let started = Instant::now();
    let built = Command::new(Path::new(TOOLS).join("../../dist/build-deb"))
        .arg("--binary")
        .arg(binary)
        .arg("--out")
        .arg(out)
        .output()
        .expect("dist/build-deb");
    let said = String::from_utf8_lossy(&built.stderr).into_owned();
    assert!(built.status.success(), "dist/build-deb failed: {said}");
    eprintln!("build-deb took {:?}", started.elapsed());
    said
}

/// One test's machine: its root overlay and its disks.
pub struct Machine {
    root: PathBuf,
    disks: Vec<PathBuf>,
}

/// How one boot goes besides its script.
#[derive(Default)]
pub struct Boot<'a> {
    /// A directory the guest sees as `$BOOTVM_IN`.
    pub indir: Option<&'a Path>,
    /// Exported in the guest.
    pub env: Vec<(&'a str, String)>,
    /// Disks (by index) not attached this time.
    pub absent: Vec<usize>,
    /// Disks (by index) the script may unplug and plug back while it runs
    /// (bootvm's `--hotplug`: it prints `BOOTVM_UNPLUG_$BOOTVM_NONCE N`).
    pub hotplug: Vec<usize>,
    /// A power cut: qemu is killed once a line of the script's output matches.
    pub cut: Option<&'a str>,
    /// Seconds before the VM is killed (default 400).
    pub timeout_s: Option<u32>,
}

/// What one boot printed: the script's output, bootvm's own lines, the exit
/// status and the wall time.
pub struct Booted {
    pub output: String,
    pub stderr: String,
    pub code: Option<i32>,
    pub wall: Duration,
}

impl Machine {
    /// A machine in `dir` (its overlay `dir/root.qcow2`) with `disks` as nv0,
    /// nv1, ...; builds the root image first when it is not cached yet (minutes,
    /// once per machine: mmdebstrap).
    pub fn new(dir: &Path, disks: &[PathBuf]) -> Machine {
        let root = dir.join("root.qcow2");
        let started = Instant::now();
        let out = Command::new(Path::new(TOOLS).join("mkroot"))
            .arg("--overlay")
            .arg(&root)
            .output()
            .expect("tools/bootvm/mkroot");
        assert!(
            out.status.success(),
            "tools/bootvm/mkroot failed (./test.sh installs what it needs):\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        eprintln!(
            "mkroot: {} in {:?}\n{}",
            String::from_utf8_lossy(&out.stdout).trim(),
            started.elapsed(),
            String::from_utf8_lossy(&out.stderr)
        );
        Machine {
            root,
            disks: disks.to_vec(),
        }
    }

    /// The root's qcow2 overlay.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// The initramfs the next boot would run, read out of the root as bootvm
    /// reads it before a boot, written to `out`; bootvm's stderr on failure.
    pub fn initrd(&self, out: &Path) -> Result<(), String> {
        let got = Command::new(Path::new(TOOLS).join("bootvm"))
            .arg("--extract-initrd")
            .arg(out)
            .arg(&self.root)
            .output()
            .expect("tools/bootvm/bootvm");
        if got.status.success() {
            Ok(())
        } else {
            Err(String::from_utf8_lossy(&got.stderr).into_owned())
        }
    }

    /// Boots the machine, runs `script` (bash, as root, after multi-user.target),
    /// powers it off cleanly (or cuts the power, see [`Boot::cut`]).
    pub fn boot(&self, script: &Path, how: &Boot) -> Booted {
        let mut vm = Command::new(Path::new(TOOLS).join("bootvm"));
        vm.arg("--timeout")
            .arg(how.timeout_s.unwrap_or(400).to_string())
            .arg("--script")
            .arg(script);
        if let Some(dir) = how.indir {
            vm.arg("--indir").arg(dir);
        }
        for (key, value) in &how.env {
            vm.arg("--env").arg(format!("{key}={value}"));
        }
        for n in &how.absent {
            vm.arg("--absent").arg(n.to_string());
        }
        for n in &how.hotplug {
            vm.arg("--hotplug").arg(n.to_string());
        }
        if let Some(cut) = how.cut {
            vm.arg("--cut").arg(cut);
        }
        vm.arg(&self.root).args(&self.disks);
        let started = Instant::now();
        let out = vm.output().expect("tools/bootvm/bootvm");
        let booted = Booted {
            output: String::from_utf8_lossy(&out.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
            code: out.status.code(),
            wall: started.elapsed(),
        };
        eprintln!(
            "boot of {}: {:?}, exit {:?}\n{}{}",
            script.display(),
            booted.wall,
            booted.code,
            booted.stderr,
            booted.output
        );
        booted
    }
}

impl Booted {
    /// Fails the test, showing everything, unless the script exited 0.
    pub fn succeeded(&self) -> &Self {
        assert_eq!(
            self.code,
            Some(0),
            "the boot's script failed:\n{}\n{}",
            self.output,
            self.stderr
        );
        self
    }

    /// The first line of the script's output that starts with `prefix`.
    pub fn line(&self, prefix: &str) -> &str {
        self.output
            .lines()
            .find(|l| l.starts_with(prefix))
            .unwrap_or_else(|| panic!("no {prefix:?} in:\n{}\n{}", self.output, self.stderr))
    }

    /// bootvm's timing line: when multi-user.target was reached and the script
    /// started, in seconds of guest uptime, and the wall time from qemu's start
    /// to the script's.
    pub fn times(&self) -> &str {
        self.stderr
            .lines()
            .find(|l| l.starts_with("bootvm: multi-user.target at"))
            .unwrap_or_else(|| panic!("no timing line from bootvm:\n{}", self.stderr))
    }
}
