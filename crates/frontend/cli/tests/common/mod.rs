//! Helpers shared by the `nvraid` binary's integration tests.
#![allow(dead_code)] // each test binary uses its own subset

pub mod reshape;

use sha2::{Digest, Sha256};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::Duration;

/// The repository's root (for tools/ and tests/fixtures/).
pub fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../..")
}

/// Run `nvraid ARGS` in `dir`.
pub fn nvraid(args: &[&str], dir: &Path) -> Output {
    Command::new(env!("CARGO_BIN_EXE_nvraid"))
        .args(args)
        .current_dir(dir)
        .output()
        .expect("run nvraid")
}

/// Run a command that must succeed; its stdout as bytes.
pub fn ok_bytes(args: &[&str], dir: &Path) -> Vec<u8> {
    let out = nvraid(args, dir);
    assert!(
        out.status.success(),
        "nvraid {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out.stdout
}

/// Run a command that must succeed; its stdout as text.
pub fn ok(args: &[&str], dir: &Path) -> String {
    String::from_utf8(ok_bytes(args, dir)).expect("text output")
}

/// Every file directly in `dir`, sorted, with its sha256.
pub fn hash_files(dir: &Path) -> Vec<(PathBuf, String)> {
    let mut entries: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    entries.sort();
    entries
        .into_iter()
        .filter(|p| p.is_file())
        .map(|p| {
            let digest = format!("{:x}", Sha256::digest(std::fs::read(&p).unwrap()));
            (p, digest)
        })
        .collect()
}

/// Run a command that must be refused: exit code 1, a message containing
/// every `needles`, no reason said twice, and no byte of any file in `dir`
/// changed (nor a file added or removed).
pub fn refused(args: &[&str], dir: &Path, needles: &[&str]) {
    let before = hash_files(dir);
    let stderr = refusal(args, dir);
    for needle in needles {
        assert!(
            stderr.contains(needle),
            "nvraid {args:?}: message {stderr:?} lacks {needle:?}"
        );
    }
    assert_eq!(hash_files(dir), before, "nvraid {args:?} changed a member");
    said_once(&stderr);
}

/// Run a command that must fail with exit code 1; its stderr.
pub fn refusal(args: &[&str], dir: &Path) -> String {
    // A refusal comes at once; a command that runs on instead (a server
    // that should have been refused) fails the test rather than hangs it.
    let out = run_within(args, dir, Duration::from_secs(120));
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(
        out.status.code(),
        Some(1),
        "nvraid {args:?} should be refused; stderr: {stderr}"
    );
    stderr
}

/// No part of a message repeats (an error that prints its cause, whose cause
/// is then printed again).
pub fn said_once(stderr: &str) {
    for line in stderr.lines() {
        let parts: Vec<&str> = line.split(": ").filter(|p| p.len() > 12).collect();
        for (i, part) in parts.iter().enumerate() {
            assert!(
                !parts[..i].contains(part),
                "{part:?} is said twice in {line:?}"
            );
        }
    }
}

/// `mdadm --examine PATH`'s text (the test fails when mdadm does).
pub fn mdadm_examine(path: &Path) -> String {
    let out = Command::new(tool("mdadm"))
        .arg("--examine")
        .arg(path)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "mdadm --examine {} failed: {}",
        path.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// The value of the line `NAME : value` of an examine text (mdadm's or
/// nvraid's, which print alike); the test fails when there is none.
pub fn examine_field<'a>(text: &'a str, name: &str) -> &'a str {
    text.lines()
        .find_map(|l| {
            l.trim()
                .strip_prefix(name)
                .map(|r| r.trim_start_matches([' ', ':']).trim())
        })
        .unwrap_or_else(|| panic!("the examine text lacks {name}:\n{text}"))
}

/// The `Device Role` of `nvraid examine`'s text for one member:
/// `Active device N`, `spare`, `faulty` or `journal`.
pub fn device_role(examine: &str) -> &str {
    examine_field(examine, "Device Role")
}

/// The path of an installed tool, or a failure that says how to get it.
pub fn tool(name: &str) -> String {
    let found = Command::new("sh")
        .arg("-c")
        .arg(format!("command -v {name}"))
        .output()
        .unwrap();
    assert!(
        found.status.success(),
        "{name} is not installed: run ./test.sh (it installs the test peers)"
    );
    String::from_utf8(found.stdout).unwrap().trim().to_string()
}

/// A self-signed certificate for localhost with an RSA key of `key_bits`,
/// written to `cert.pem` and `key.pem` in `dir`; their paths.
pub fn self_signed_certificate(dir: &Path, key_bits: u32) -> (PathBuf, PathBuf) {
    let (cert, key) = (dir.join("cert.pem"), dir.join("key.pem"));
    let made = Command::new(tool("openssl"))
        .args(["req", "-x509", "-newkey", &format!("rsa:{key_bits}")])
        .args(["-nodes", "-days", "2", "-subj", "/CN=localhost"])
        .args(["-addext", "subjectAltName=DNS:localhost", "-keyout"])
        .arg(&key)
        .arg("-out")
        .arg(&cert)
        .output()
        .unwrap();
    assert!(
        made.status.success(),
        "openssl: {}",
        String::from_utf8_lossy(&made.stderr)
    );
    (cert, key)
}

/// The sha256 of `data`, in hex.
pub fn sha(data: &[u8]) -> String {
    format!("{:x}", Sha256::digest(data))
}

/// A tools/mdvm program (`mdvm` or `mdvm-check`) whose VM boots kernel
/// `series` — "6.1", the host's bookworm kernel in /boot, or "6.12", Debian
/// trixie's, which tools/mdvm/fetch-kernel fetches once and caches — with
/// `modules` (and their dependencies) loaded at boot beside md's.
pub fn mdvm_on(program: &str, series: &str, modules: &[&str]) -> Command {
    let mut command = Command::new(repo().join("tools/mdvm").join(program));
    command
        .env("MDVM_KERNEL_SERIES", series)
        .env("MDVM_MODULES", modules.join(" "));
    command
}

/// The real kernel md (tools/mdvm, on a snapshot of the images) assembles
/// whatever arrays `images` hold and must read each of `expect`; returns
/// its report.
pub fn kernel_reads(images: &[PathBuf], expect: &[String]) -> String {
    let check = repo().join("tools/mdvm/mdvm-check");
    let mut cmd = Command::new(&check);
    for sha in expect {
        cmd.arg("--expect").arg(sha);
    }
    let out = cmd
        .arg("--")
        .args(images)
        .output()
        .unwrap_or_else(|e| panic!("{}: {e}", check.display()));
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "the kernel did not read nvraid's data (install the VM's tools with ./test.sh):\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

/// Start `nvraid serve` on `members` in `dir` (listening on `md.sock`,
/// control socket `md.ctl`, stderr in `serve.log`), once it answers.
pub fn serve(dir: &Path, members: &[String]) -> Served {
    serve_with(dir, members, &[])
}

pub fn serve_with(dir: &Path, members: &[String], extra: &[&str]) -> Served {
    serve_env(dir, members, extra, &[])
}

/// [`serve_with`], with environment variables for the server.
pub fn serve_env(dir: &Path, members: &[String], extra: &[&str], env: &[(&str, &str)]) -> Served {
    let mut command = Command::new(env!("CARGO_BIN_EXE_nvraid"));
    command.envs(env.iter().copied());
    serve_through(dir, command, members, extra)
}

/// [`serve`] started through `command`: the nvraid binary itself, or a
/// wrapper that runs it (`ip netns exec NS nvraid`), given the arguments
/// that follow.
pub fn serve_through(
    dir: &Path,
    mut command: Command,
    members: &[String],
    extra: &[&str],
) -> Served {
    let socket = dir.join("md.sock");
    let _ = std::fs::remove_file(dir.join("md.ctl"));
    let log = std::fs::File::create(dir.join("serve.log")).unwrap();
    let mut child = command
        .arg("serve")
        .arg("--listen")
        .arg(format!("unix:{}", socket.display()))
        .args(extra)
        .args(members)
        .current_dir(dir)
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .unwrap();
    for _ in 0..400 {
        if dir.join("md.ctl").exists() {
            return Served(child);
        }
        std::thread::sleep(Duration::from_millis(25));
    }
    let _ = child.kill();
    let _ = child.wait();
    panic!(
        "serve did not start: {}",
        std::fs::read_to_string(dir.join("serve.log")).unwrap_or_default()
    );
}

/// A running `nvraid serve`, killed (SIGKILL) when dropped: a test that
/// fails midway leaves no server behind. Derefs to its [`Child`].
pub struct Served(pub Child);

impl std::ops::Deref for Served {
    type Target = Child;
    fn deref(&self) -> &Child {
        &self.0
    }
}

impl std::ops::DerefMut for Served {
    fn deref_mut(&mut self) -> &mut Child {
        &mut self.0
    }
}

impl Served {
    /// SIGINT, then wait: the server must exit 0 (flushed, marked clean).
    pub fn interrupt(mut self) {
        Command::new("kill")
            .arg("-INT")
            .arg(self.id().to_string())
            .status()
            .unwrap();
        let status = self.wait().unwrap();
        assert!(status.success(), "serve exited with {status}");
    }
}

impl Drop for Served {
    fn drop(&mut self) {
        if matches!(self.0.try_wait(), Ok(None)) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
}

/// fio with its NBD engine on the server `serve` started in `dir`
/// (`md.sock`), running job `name`, in `dir`; add the job's options.
pub fn fio_nbd(dir: &Path, name: &str) -> Command {
    let mut fio = Command::new("fio");
    fio.current_dir(dir)
        .arg(format!("--name={name}"))
        .arg("--ioengine=nbd")
        .arg(format!(
            "--uri=nbd+unix:///?socket={}",
            dir.join("md.sock").display()
        ));
    fio
}

/// The verified random-write job the failover tests run through a server:
/// two jobs of `size` each, side by side (crc32c in every block).
pub const FIO_VERIFY_JOB: [&str; 7] = [
    "--rw=randwrite",
    "--bs=4k",
    "--iodepth=8",
    "--numjobs=2",
    "--verify=crc32c",
    "--verify_fatal=1",
    "--group_reporting",
];

/// `nvraid check` on `members` finds every copy and parity in agreement
/// (exit 0); otherwise fails with `what` and check's report.
pub fn assert_checks_clean(dir: &Path, members: &[String], what: &str) {
    let mut check = vec!["check", "--json"];
    check.extend(members.iter().map(String::as_str));
    let out = nvraid(&check, dir);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{what}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Sets a member image's superblock `events` (the superblock at 4 KiB),
/// its checksum rewritten; returns the value it had.
pub fn set_events(path: &Path, events: impl FnOnce(u64) -> u64) -> u64 {
    let mut bytes = std::fs::read(path).unwrap();
    let mut sb = nvraid_metadata::Superblock::decode(&bytes[4096..8192]).unwrap();
    let was = sb.events;
    sb.events = events(was);
    sb.encode(&mut bytes[4096..8192]).unwrap();
    std::fs::write(path, bytes).unwrap();
    was
}

/// A RAID 5 member with md's partial parity log: flip a byte of the parity
/// of every row its newest log write covers (the member holds the parity
/// of the stripes it logs). Returns the entries spoiled. Only a replay of
/// the log (partial parity XOR the written blocks) puts them right.
pub fn spoil_logged_parity(path: &Path) -> usize {
    let mut bytes = std::fs::read(path).unwrap();
    let sb = nvraid_metadata::Superblock::decode(&bytes[4096..8192]).unwrap();
    let area = nvraid_metadata::ppl::PplArea::from_superblock(&sb)
        .unwrap()
        .expect("a member with a partial parity log");
    let start = (area.start_sector(sb.super_offset_sectors).unwrap() * 512) as usize;
    let len = (area.usable_sectors() * 512) as usize;
    let log = bytes[start..start + len].to_vec();
    let Some(newest) = nvraid_metadata::ppl::newest(&log, &sb.set_uuid).unwrap() else {
        return 0;
    };
    let chunk = u64::from(sb.chunk_sectors) * 512;
    let data = u64::from(sb.raid_disks) - 1;
    for e in &newest.header.entries {
        assert_eq!(e.parity_disk, sb.dev_number, "logged on the parity member");
        let at = e.data_sector * 512;
        let row = (at / chunk / data) * chunk + at % chunk;
        bytes[(sb.data_offset_sectors * 512 + row) as usize] ^= 0xa5;
    }
    std::fs::write(path, bytes).unwrap();
    newest.header.entries.len()
}

/// The member states (`active`, `faulty`, ...) a running server started
/// by [`serve`] in `dir` reports through its control socket, by role.
pub fn member_states(dir: &Path) -> Vec<String> {
    let out = ok(&["status", "--socket", "md.ctl", "--json"], dir);
    let status: serde_json::Value = serde_json::from_str(&out).unwrap();
    status["array"]["members"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["state"].as_str().unwrap_or("?").to_string())
        .collect()
}

/// Run nvraid with `args` in `dir`; a run past `limit` is killed and fails
/// the test with what it printed.
pub fn run_within(args: &[&str], dir: &Path, limit: Duration) -> Output {
    let mut child = Command::new(env!("CARGO_BIN_EXE_nvraid"))
        .args(args)
        .current_dir(dir)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let started = std::time::Instant::now();
    while child.try_wait().unwrap().is_none() {
        if started.elapsed() > limit {
            let _ = child.kill();
            let out = child.wait_with_output().unwrap();
            panic!(
                "nvraid {args:?} still ran after {limit:?}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    child.wait_with_output().unwrap()
}

/// Host tools and binaries shipped into the kernel VM (see
/// `nvraid_testing::vm`).
#[allow(unused_imports)]
pub use nvraid_testing::vm::{host_tool, ship as vm_indir};

/// Run `script` in the 6.12 kernel VM (`tools/mdvm`, or the mdvm that
/// `NVRAID_MDVM` names) with `modules`, `inside` as `$MDVM_IN` and `images`
/// as its disks (2 vCPUs, 1 GiB); its console, once it exited 0 (a failure
/// shows the console otherwise).
pub fn run_vm_612(
    modules: &[&str],
    inside: &Path,
    script: &Path,
    images: &[PathBuf],
    timeout_s: u32,
) -> String {
    run_vm_series("6.12", modules, inside, script, images, timeout_s)
}

/// [`run_vm_612`] on the kernel `series` names (`tools/mdvm --kernel`:
/// `6.12`, or `backports`, trixie-backports' newest).
pub fn run_vm_series(
    series: &str,
    modules: &[&str],
    inside: &Path,
    script: &Path,
    images: &[PathBuf],
    timeout_s: u32,
) -> String {
    let mut vm = match std::env::var_os("NVRAID_MDVM") {
        Some(mdvm) => {
            let mut c = Command::new(mdvm);
            c.args(["--kernel", series, "--modules", &modules.join(" ")]);
            c
        }
        None => mdvm_on("mdvm", series, modules),
    };
    let started = std::time::Instant::now();
    let out = vm
        .args([
            "--smp",
            "2",
            "--mem",
            "1G",
            "--timeout",
            &timeout_s.to_string(),
        ])
        .arg("--indir")
        .arg(inside)
        .arg("--script")
        .arg(script)
        .args(images)
        .output()
        .expect("tools/mdvm/mdvm (./test.sh installs its tools)");
    let console = String::from_utf8_lossy(&out.stdout).into_owned();
    eprintln!("the VM took {:?}\n{console}", started.elapsed());
    assert_eq!(
        out.status.code(),
        Some(0),
        "the VM script failed:\n{console}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    console
}

/// The first line of `console` starting with `prefix`, or a failure that
/// shows the console.
pub fn console_line<'a>(console: &'a str, prefix: &str) -> &'a str {
    console
        .lines()
        .find(|l| l.starts_with(prefix))
        .unwrap_or_else(|| panic!("no {prefix:?} in:\n{console}"))
}

/// A member image served by nbdkit through its `error` filter on a unix
/// socket in `dir`: once [`ErrorFilterNode::fail`] creates the trigger
/// file, every request of the kinds `ops` names fails with EIO (`ops`:
/// `"error"` for all, `"error-pwrite"` for writes only: the filter's
/// parameter prefix). Killed when dropped.
pub struct ErrorFilterNode {
    child: Child,
    socket: PathBuf,
    trigger: PathBuf,
}

impl ErrorFilterNode {
    pub fn up(dir: &Path, image: &str, ops: &str) -> ErrorFilterNode {
        let socket = dir.join(format!("{image}.sock"));
        let trigger = dir.join(format!("{image}.trigger"));
        let child = Command::new(tool("nbdkit"))
            .arg("-f")
            .arg("-U")
            .arg(&socket)
            .args(["--filter=error", "file"])
            .arg(dir.join(image))
            .arg(format!("{ops}-rate=100%"))
            .arg(format!("{ops}-file={}", trigger.display()))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("nbdkit (./test.sh installs it)");
        let started = std::time::Instant::now();
        while !socket.exists() {
            assert!(
                started.elapsed() < Duration::from_secs(10),
                "nbdkit did not start"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        std::thread::sleep(Duration::from_millis(100));
        ErrorFilterNode {
            child,
            socket,
            trigger,
        }
    }

    pub fn uri(&self) -> String {
        format!("nbd+unix:///?socket={}", self.socket.display())
    }

    /// From now on the requests `ops` names fail.
    pub fn fail(&self) {
        std::fs::write(&self.trigger, b"").unwrap();
    }
}

impl Drop for ErrorFilterNode {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
