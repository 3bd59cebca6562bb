//! Helpers of the reshape tests (grow, shape, takeover, size and the
//! online and resumed grows): filled and blank members, the served
//! array's control socket, fio verifying through NBD, failpoint kills,
//! and the kernel's md in tools/mdvm assembling and checking the result.

use super::{fio_nbd, mdvm_on, ok, ok_bytes, FIO_VERIFY_JOB};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

pub const MIB: u64 = 1 << 20;

/// Block `b` of 4 KiB holds `b` (little-endian u64) over and over: what
/// `pattern verify` checks in the VM, and what a misplaced block shows.
pub fn pattern(bytes: u64) -> Vec<u8> {
    let mut out = Vec::with_capacity(bytes as usize);
    for block in 0..bytes / 4096 {
        for _ in 0..512 {
            out.extend_from_slice(&block.to_le_bytes());
        }
    }
    out
}

/// `head` followed by the members' names.
pub fn with<'a>(head: &[&'a str], members: &'a [String]) -> Vec<&'a str> {
    let mut args = head.to_vec();
    args.extend(members.iter().map(String::as_str));
    args
}

/// The array's first `len` bytes (`nvraid read`).
pub fn read(dir: &Path, members: &[String], len: u64) -> Vec<u8> {
    let len = len.to_string();
    ok_bytes(&with(&["read", "--length", &len], members), dir)
}

/// `nvraid detail --json` of the members.
pub fn detail(dir: &Path, members: &[String]) -> serde_json::Value {
    serde_json::from_slice(&ok_bytes(&with(&["detail", "--json"], members), dir)).unwrap()
}

/// The array on `survivors` is a degraded one of `raid_disks` members
/// whose first `size` bytes read back as `data` followed by zeros.
pub fn assert_degraded_holds(
    dir: &Path,
    survivors: &[String],
    raid_disks: u32,
    data: &[u8],
    size: u64,
) {
    let detail = detail(dir, survivors);
    assert_eq!(detail["raid_disks"], raid_disks, "{detail}");
    assert!(
        detail["state"].as_str().unwrap().contains("degraded"),
        "{detail}"
    );
    let got = read(dir, survivors, size);
    assert!(
        got[..data.len()] == data[..],
        "the bytes read degraded differ"
    );
    assert!(
        got[data.len()..].iter().all(|&b| b == 0),
        "new space not zeros"
    );
}

/// A new blank member of `mib` MiB named `name` (returned).
pub fn blank_mib(dir: &Path, name: &str, mib: u64) -> String {
    let f = std::fs::File::create(dir.join(name)).unwrap();
    f.set_len(mib * MIB).unwrap();
    name.into()
}

/// Run `nvraid args` with `NVRAID_FAILPOINT=point` and check that it
/// stopped there.
pub fn killed_at(dir: &Path, args: &[&str], point: &str) {
    let out = Command::new(env!("CARGO_BIN_EXE_nvraid"))
        .current_dir(dir)
        .env("NVRAID_FAILPOINT", point)
        .args(args)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && stderr.contains("failpoint"),
        "{args:?} did not stop at {point}: {stderr}"
    );
}

/// The served array's control socket (serve's `--control`).
pub fn control(dir: &Path) -> String {
    dir.join("md.ctl").display().to_string()
}

/// `nvraid status --json` of the served array.
pub fn status(dir: &Path) -> serde_json::Value {
    serde_json::from_str(&ok(&["status", "--json", "--socket", &control(dir)], dir)).unwrap()
}

/// Poll the served array's `status` until its reshape runs part-way,
/// past `past` bytes (within 60 s); the status.
pub fn wait_reshape_past(dir: &Path, past: u64) -> serde_json::Value {
    let started = std::time::Instant::now();
    loop {
        let s = status(dir);
        let r = &s["array"]["reshape"];
        let (p, end) = (
            r["position_bytes"].as_u64().unwrap_or(0),
            r["end_bytes"].as_u64().unwrap_or(0),
        );
        if r["state"] == "running" && p > past && p < end {
            return s;
        }
        assert!(
            started.elapsed() < std::time::Duration::from_secs(60),
            "no reshape part-way past {past}: {s}"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

/// Poll `status` until the served array's reshape has finished (within
/// 120 s), running all the while; the status.
pub fn wait_reshape_finished(dir: &Path) -> serde_json::Value {
    let started = std::time::Instant::now();
    loop {
        let s = status(dir);
        if s["array"]["reshape"]["state"] == "finished" {
            return s;
        }
        assert!(
            s["array"]["reshape"]["state"] == "running",
            "the reshape stopped: {s}"
        );
        assert!(
            started.elapsed() < std::time::Duration::from_secs(120),
            "the reshape did not finish: {s}"
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
}

/// Poll `status` until the background resync of an array that came up
/// dirty has finished (within 120 s), with no error.
pub fn wait_resynced(dir: &Path) {
    let started = std::time::Instant::now();
    loop {
        let s = status(dir);
        let resync = &s["array"]["resync"];
        assert!(resync.is_null() || resync["error"].is_null(), "{s}");
        if resync["finished"] == true {
            return;
        }
        assert!(
            started.elapsed() < std::time::Duration::from_secs(120),
            "the resync did not finish: {s}"
        );
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
}

/// What the server wrote to `serve.log` in `dir` (empty when nothing).
pub fn serve_log(dir: &Path) -> String {
    std::fs::read_to_string(dir.join("serve.log")).unwrap_or_default()
}

/// fio's verified random writes over the first 48 MiB through NBD, in
/// two jobs of 24 MiB at `rate` IOPS from `seed` (or, `verify_only`, the
/// read pass that checks every block they wrote).
pub fn fio_verify(dir: &Path, name: &str, rate: u32, seed: u32, verify_only: bool) -> Child {
    let mut fio = fio_nbd(dir, name);
    fio.args(FIO_VERIFY_JOB).args([
        "--size=24m".to_string(),
        "--offset_increment=24m".to_string(),
        format!("--rate_iops={rate}"),
        "--do_verify=1".to_string(),
        format!("--randseed={seed}"),
        "--output-format=json".to_string(),
    ]);
    if verify_only {
        fio.arg("--verify_only");
    }
    fio.stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("fio (apt-get install fio)")
}

/// Wait for a [`fio_verify`] and check that it verified all it wrote
/// without an error.
pub fn fio_done(fio: Child) {
    let out = fio.wait_with_output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "fio failed: {text}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report: serde_json::Value = serde_json::from_str(&text[text.find('{').unwrap()..]).unwrap();
    let job = &report["jobs"][0];
    assert_eq!(job["error"], 0, "{job}");
    assert!(
        job["read"]["io_bytes"].as_u64().unwrap() >= 48 << 20,
        "fio verified less than it wrote: {job}"
    );
}

/// The kernel's md (tools/mdvm, Linux 6.1) assembles the member images,
/// finishes any reshape, resync or recovery, checks the array, and
/// verifies the first `bytes` as [`pattern`]. One `KERNEL md=... level=
/// layout= chunk= disks= size= pattern= mismatch= reshape= degraded= offset=
/// bitmap= bchunk=` line per array; `ASSEMBLED n` counts the arrays
/// resyncing or recovering right after assembly, `STALE_BITMAPS n` the
/// kernel's complaints of a stale bitmap.
pub fn kernel_finishes(images: &[PathBuf], bytes: u64) -> String {
    let script = images[0].parent().unwrap().join("check.sh");
    std::fs::write(
        &script,
        format!(
            r#"set +e
mdadm --assemble --scan --run 2>&1
echo 200000 > /proc/sys/dev/raid/speed_limit_min
echo 2000000 > /proc/sys/dev/raid/speed_limit_max
cat /proc/mdstat
echo "ASSEMBLED $(grep -c -e resync -e recovery /proc/mdstat)"
i=0; while grep -q -e reshape -e resync -e recovery /proc/mdstat && [ $i -lt 240 ]; do sleep 1; i=$((i+1)); done
cat /proc/mdstat
for sys in /sys/block/md*; do
  md=/dev/${{sys##*/}}
  echo check > $sys/md/sync_action; sleep 1; mdadm --wait $md >/dev/null 2>&1
  if pattern verify -n {bytes} $md; then pv=ok; else pv=FAILED; fi
  echo "KERNEL md=$md level=$(cat $sys/md/level) layout=$(cat $sys/md/layout) chunk=$(cat $sys/md/chunk_size) disks=$(cat $sys/md/raid_disks) size=$(blockdev --getsize64 $md) pattern=$pv mismatch=$(cat $sys/md/mismatch_cnt) reshape=$(cat $sys/md/reshape_position) degraded=$(cat $sys/md/degraded) offset=$(cat $sys/md/dev-*/offset | sort -u | tr '\n' ,) bitmap=$(cat $sys/md/bitmap/location 2>/dev/null || echo none) bchunk=$(cat $sys/md/bitmap/chunksize 2>/dev/null || echo none)"
done
echo "STALE_BITMAPS $(dmesg | grep -c 'out of date')"
dmesg | grep -i -e 'md/raid' -e reshape | tail -20
"#
        ),
    )
    .unwrap();
    let out = mdvm_on("mdvm", "6.1", &[])
        .arg("--snapshot")
        .arg("--script")
        .arg(&script)
        .args(images)
        .output()
        .expect("tools/mdvm/mdvm (./test.sh installs its tools)");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The kernel's md (tools/mdvm, Linux 6.1) assembles every array among
/// the images (degraded ones too), finishes what runs, and reports per
/// array `KERNEL name=... level= disks= degraded= size= pattern=
/// mismatch= chunk= layout=`: the pattern verified over the bytes
/// `bytes` names for the array (4 KiB otherwise), the check run only on
/// whole arrays (`mismatch=none` on degraded ones). The script is
/// written to `script_dir`; mdvm's own complaints follow the report.
pub fn kernel_reports(script_dir: &Path, images: &[PathBuf], bytes: &[(&str, u64)]) -> String {
    let script = script_dir.join("check.sh");
    let cases: String = bytes
        .iter()
        .map(|(name, n)| format!("    *{name}) n={n} ;;\n"))
        .collect();
    std::fs::write(
        &script,
        format!(
            r#"set +e
mdadm --assemble --scan --run 2>&1
echo 200000 > /proc/sys/dev/raid/speed_limit_min
echo 2000000 > /proc/sys/dev/raid/speed_limit_max
i=0; while grep -q -e reshape -e resync -e recovery /proc/mdstat && [ $i -lt 240 ]; do sleep 1; i=$((i+1)); done
cat /proc/mdstat
for sys in /sys/block/md*; do
  md=/dev/${{sys##*/}}
  name=$(mdadm --detail $md | sed -n 's/ *Name : \([^ ]*\).*/\1/p')
  case "$name" in
{cases}    *) n=4096 ;;
  esac
  if pattern verify -n $n $md; then pv=ok; else pv=FAILED; fi
  mm=none
  if [ -e $sys/md/sync_action ] && [ "$(cat $sys/md/degraded)" = 0 ]; then
    echo check > $sys/md/sync_action; sleep 1; mdadm --wait $md >/dev/null 2>&1
    mm=$(cat $sys/md/mismatch_cnt)
  fi
  echo "KERNEL name=$name level=$(cat $sys/md/level) disks=$(cat $sys/md/raid_disks) degraded=$(cat $sys/md/degraded) size=$(blockdev --getsize64 $md) pattern=$pv mismatch=$mm chunk=$(cat $sys/md/chunk_size) layout=$(cat $sys/md/layout)"
done
"#
        ),
    )
    .unwrap();
    let out = mdvm_on("mdvm", "6.1", &[])
        .arg("--snapshot")
        .arg("--script")
        .arg(&script)
        .args(images)
        .output()
        .expect("tools/mdvm/mdvm (./test.sh installs its tools)");
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// The `KERNEL` line of the array named `name` in a [`kernel_reports`].
pub fn kernel_line<'a>(report: &'a str, name: &str) -> &'a str {
    report
        .lines()
        .find(|l| {
            l.starts_with("KERNEL ")
                && (l.contains(&format!("name={name} ")) || l.contains(&format!(":{name} ")))
        })
        .unwrap_or_else(|| panic!("the kernel did not assemble {name}:\n{report}"))
}

/// An NBD member through nbdkit's error filter: the file `image` in
/// `dir` served on a unix socket, its requests failing with EIO once
/// [`FailingNode::fail`] made the trigger file.
pub struct FailingNode {
    child: Child,
    socket: PathBuf,
    trigger: PathBuf,
}

impl FailingNode {
    /// Every request fails once triggered.
    pub fn up(dir: &Path, image: &str) -> FailingNode {
        FailingNode::start(dir, image, "error", None)
    }

    /// [`FailingNode::up`] with each write delayed 60 ms (nbdkit's delay
    /// filter), so that an offline grow lasts a few seconds.
    pub fn slow(dir: &Path, image: &str) -> FailingNode {
        FailingNode::start(dir, image, "error", Some("60ms"))
    }

    /// Only writes fail once triggered (reads go on), each write delayed
    /// 60 ms.
    pub fn slow_failing_writes(dir: &Path, image: &str) -> FailingNode {
        FailingNode::start(dir, image, "error-pwrite", Some("60ms"))
    }

    /// `errors`: the error filter's parameter prefix (`error` for every
    /// request, `error-pwrite` for writes); `wdelay`: each write's delay.
    fn start(dir: &Path, image: &str, errors: &str, wdelay: Option<&str>) -> FailingNode {
        let socket = dir.join(format!("{image}.sock"));
        let trigger = dir.join(format!("{image}.trigger"));
        let mut nbdkit = Command::new(super::tool("nbdkit"));
        nbdkit
            .arg("-f")
            .arg("-U")
            .arg(&socket)
            .arg("--filter=error");
        if wdelay.is_some() {
            nbdkit.arg("--filter=delay");
        }
        nbdkit
            .arg("file")
            .arg(dir.join(image))
            .arg(format!("{errors}-rate=100%"))
            .arg(format!("{errors}-file={}", trigger.display()));
        if let Some(delay) = wdelay {
            nbdkit.arg(format!("wdelay={delay}"));
        }
        let child = nbdkit
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("nbdkit (./test.sh installs it)");
        let started = std::time::Instant::now();
        while !socket.exists() {
            assert!(
                started.elapsed() < std::time::Duration::from_secs(10),
                "nbdkit did not start"
            );
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
        FailingNode {
            child,
            socket,
            trigger,
        }
    }

    /// The member's address.
    pub fn uri(&self) -> String {
        format!("nbd+unix:///?socket={}", self.socket.display())
    }

    /// From now on its requests fail.
    pub fn fail(&self) {
        std::fs::write(&self.trigger, b"").unwrap();
    }

    /// From now on its requests succeed again.
    pub fn heal(&self) {
        std::fs::remove_file(&self.trigger).unwrap();
    }
}

impl Drop for FailingNode {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// qemu-io writes `count` 4 KiB blocks at random places (from `seed`) of
/// the array served in `dir` (`md.sock`), half below `position` and half
/// above (so both shapes of a reshape get some), each filled with its own
/// byte; every write must be acknowledged. `data` gets them.
pub fn write_blocks(dir: &Path, position: u64, count: u64, seed: u64, data: &mut [u8]) {
    let blocks = data.len() as u64 / 4096;
    let mut rng = seed;
    let mut qemu_io = Command::new(super::tool("qemu-io"));
    qemu_io.args(["-f", "raw"]);
    let mut writes = Vec::new();
    for i in 0..count {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        let below = (position / 4096).max(1);
        let b = if i % 2 == 0 {
            rng % below
        } else {
            below + rng % (blocks - below)
        };
        let byte = (i % 250 + 1) as u8;
        qemu_io.args(["-c", &format!("write -P {byte} {} 4096", b * 4096)]);
        writes.push((b, byte));
    }
    let out = qemu_io
        .arg(format!(
            "nbd+unix:///?socket={}",
            dir.join("md.sock").display()
        ))
        .output()
        .expect("qemu-io (qemu-utils)");
    let acked = String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| l.starts_with("wrote 4096/4096"))
        .count();
    assert_eq!(
        acked,
        writes.len(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for (b, byte) in writes {
        data[(b * 4096) as usize..((b + 1) * 4096) as usize].fill(byte);
    }
}

/// A state the kernel's md left (tests/fixtures/md-states/`state`, made
/// by its `make` script in tools/mdvm): its members decompressed into
/// `dir`; their file names, by disk.
pub fn md_state(state: &str, dir: &Path) -> Vec<String> {
    let src = super::repo().join("tests/fixtures/md-states").join(state);
    let mut names = Vec::new();
    for disk in 0.. {
        let xz = src.join(format!("disk{disk}.img.xz"));
        if !xz.exists() {
            break;
        }
        let name = format!("{state}-{disk}.img");
        let out = Command::new("xz")
            .arg("-dc")
            .arg(&xz)
            .output()
            .expect("xz (apt-get install xz-utils)");
        assert!(out.status.success(), "xz -dc {}", xz.display());
        std::fs::write(dir.join(&name), out.stdout).unwrap();
        names.push(name);
    }
    assert!(!names.is_empty(), "no members in {}", src.display());
    names
}

/// The sha256 of what the kernel reads of a [`md_state`]'s array.
pub fn md_state_sha(state: &str) -> String {
    std::fs::read_to_string(
        super::repo()
            .join("tests/fixtures/md-states")
            .join(state)
            .join("kernel-sha256.txt"),
    )
    .unwrap()
    .trim()
    .to_string()
}

/// Poll the served array's `status` until its reshape running backwards
/// (a shrink: the position falls to 0) is part-way, below `below` bytes
/// (within 60 s); the status.
pub fn wait_reshape_below(dir: &Path, below: u64) -> serde_json::Value {
    let started = std::time::Instant::now();
    loop {
        let s = status(dir);
        let r = &s["array"]["reshape"];
        let p = r["position_bytes"].as_u64().unwrap_or(u64::MAX);
        if r["state"] == "running" && p < below && p > 0 {
            return s;
        }
        assert!(
            started.elapsed() < std::time::Duration::from_secs(60),
            "no reshape part-way below {below}: {s}"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

/// The whole array served on `md.sock` in `d`, through NBD (`nbdcopy`).
pub fn served_bytes(d: &Path) -> Vec<u8> {
    let got = Command::new(super::tool("nbdcopy"))
        .arg(format!(
            "nbd+unix:///?socket={}",
            d.join("md.sock").display()
        ))
        .arg("-")
        .output()
        .unwrap();
    assert!(
        got.status.success(),
        "{}",
        String::from_utf8_lossy(&got.stderr)
    );
    got.stdout
}
