//! nvraid as a system service, through the real binary: `config
//! add|remove|list|check`, `assemble --incremental` (udev's command),
//! `run NAME` (the service's start; `--dry-run` prints the `nvraid serve`
//! command it would exec), `ublk name`. systemctl is a script that records
//! its calls; the run directory, /dev and sysfs are test directories.

mod common;

use common::{hash_files, said_once};
use std::path::PathBuf;
use std::process::{Command, Output};

/// A test machine: members in `m/`, configuration files in `etc/`, the
/// run directory `run/`, a fake sysfs `sys/`, and systemctl's calls in
/// `calls`.
struct Machine {
    _dir: tempfile::TempDir,
    root: PathBuf,
}

impl Machine {
    fn new() -> Machine {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().to_path_buf();
        for sub in ["m", "etc/mdadm", "run", "sys/block", "other"] {
            std::fs::create_dir_all(root.join(sub)).unwrap();
        }
        let systemctl = root.join("systemctl");
        std::fs::write(
            &systemctl,
            format!("#!/bin/sh\necho \"$*\" >> {}/calls\n", root.display()),
        )
        .unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&systemctl, std::fs::Permissions::from_mode(0o755)).unwrap();
        Machine { _dir: dir, root }
    }

    fn path(&self, rel: &str) -> PathBuf {
        self.root.join(rel)
    }

    fn text(&self, rel: &str) -> String {
        std::fs::read_to_string(self.path(rel)).unwrap_or_default()
    }

    /// `nvraid ARGS` with the test machine's environment.
    fn run(&self, args: &[&str]) -> Output {
        Command::new(env!("CARGO_BIN_EXE_nvraid"))
            .args(args)
            .current_dir(&self.root)
            .env("NVRAID_CONF", self.path("etc/nvraid.conf"))
            .env("NVRAID_RUN_DIR", self.path("run"))
            .env("NVRAID_SYSTEMCTL", self.path("systemctl"))
            .env("NVRAID_SYSFS", self.path("sys"))
            .env("NVRAID_DEV_DIR", self.path("m"))
            // what udev's commands log goes to stderr, not the host's journal
            .env("NVRAID_JOURNAL_SOCKET", self.path("no-journal.socket"))
            .env_remove("NOTIFY_SOCKET")
            .output()
            .unwrap()
    }

    fn ok(&self, args: &[&str]) -> String {
        let out = self.run(args);
        assert!(
            out.status.success(),
            "nvraid {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap()
    }

    /// Exit 1, a message with every needle, said once.
    fn refused(&self, args: &[&str], needles: &[&str]) -> String {
        let out = self.run(args);
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        assert_eq!(out.status.code(), Some(1), "nvraid {args:?}: {stderr}");
        for needle in needles {
            assert!(
                stderr.contains(needle),
                "nvraid {args:?}: {stderr:?} lacks {needle:?}"
            );
        }
        said_once(&stderr);
        stderr
    }

    /// `nvraid create` of a RAID 5 of 3 in `dir` (16 MiB members).
    fn create(&self, dir: &str, name: &str) -> Vec<String> {
        let members: Vec<String> = ["a", "b", "c"]
            .iter()
            .map(|m| self.path(dir).join(m).display().to_string())
            .collect();
        let mut args = vec!["create", "-l", "5", "-z", "16M", "-N", name];
        args.extend(members.iter().map(String::as_str));
        self.ok(&args);
        members
    }

    fn uuid(&self, member: &str) -> String {
        let out = self.ok(&["examine", "--json", member]);
        let v: serde_json::Value = serde_json::from_str(&out).unwrap();
        v[0]["superblock"]["set_uuid"]
            .as_str()
            .unwrap_or_else(|| panic!("no set_uuid in {v}"))
            .to_string()
    }

    fn calls(&self) -> Vec<String> {
        self.text("calls").lines().map(str::to_string).collect()
    }
}

const MDADM_CONF: &str =
    "# mdadm.conf\n#\n# !NB! Run update-initramfs -u after updating this file.\n\
    HOMEHOST <system>\nMAILADDR root\n\n# definitions of existing MD arrays\n\
    ARRAY /dev/md/0  metadata=1.2 UUID=aaaaaaaa:bbbbbbbb:cccccccc:dddddddd name=host:0\n";

#[test]
fn config_add_list_check_remove_round_trip_and_mdadm_conf_keeps_its_lines() {
    let m = Machine::new();
    let members = m.create("m", "host:data");
    let uuid = m.uuid(&members[0]);
    std::fs::write(m.path("etc/mdadm/mdadm.conf"), MDADM_CONF).unwrap();
    let out = m.ok(&[
        "config",
        "add",
        &members[0],
        "--degraded-after",
        "45",
        "--mdadm-conf",
        "etc/mdadm/mdadm.conf",
    ]);
    assert!(out.contains("update-initramfs -u"), "{out}");
    assert!(out.contains("/dev/nvraid/data"), "{out}");
    assert_eq!(
        m.text("etc/nvraid.conf"),
        format!("ARRAY data UUID={uuid} degraded-after=45\n")
    );
    let md = m.text("etc/mdadm/mdadm.conf");
    assert!(md.starts_with(MDADM_CONF), "{md}");
    assert!(
        md.contains(&format!("ARRAY <ignore> UUID={uuid}\n")),
        "{md}"
    );
    // Twice: refused, nothing written again.
    let before = (m.text("etc/nvraid.conf"), md.clone());
    m.refused(
        &[
            "config",
            "add",
            &members[1],
            "--name",
            "again",
            "--mdadm-conf",
            "etc/mdadm/mdadm.conf",
        ],
        &["listed already", "as data on line 1"],
    );
    assert_eq!(
        (m.text("etc/nvraid.conf"), m.text("etc/mdadm/mdadm.conf")),
        before
    );

    let list = m.ok(&["config", "list"]);
    assert!(
        list.contains("data") && list.contains(&uuid) && list.contains("degraded-after=45s"),
        "{list}"
    );
    let json: serde_json::Value =
        serde_json::from_str(&m.ok(&["config", "list", "--json"])).unwrap();
    assert_eq!(json["arrays"][0]["name"], "data");
    assert_eq!(json["arrays"][0]["uuid"], uuid.as_str());
    assert_eq!(json["arrays"][0]["export"], "ublk");
    let check = m.ok(&["config", "check", "--mdadm-conf", "etc/mdadm/mdadm.conf"]);
    assert!(check.contains("data: complete (3 of 3"), "{check}");

    // A second array, exported over NBD, then the first removed: mdadm.conf
    // keeps the second's line and every line of its own.
    let second = m.create("other", "two");
    let uuid2 = m.uuid(&second[0]);
    m.ok(&[
        "config",
        "add",
        &second[1],
        "--export",
        "nbd:tcp:10809",
        "--mdadm-conf",
        "etc/mdadm/mdadm.conf",
    ]);
    m.ok(&[
        "config",
        "remove",
        "data",
        "--mdadm-conf",
        "etc/mdadm/mdadm.conf",
    ]);
    assert_eq!(
        m.text("etc/nvraid.conf"),
        format!("ARRAY two UUID={uuid2} export=nbd:tcp:10809\n")
    );
    let md = m.text("etc/mdadm/mdadm.conf");
    assert!(
        md.starts_with(MDADM_CONF) && !md.contains(&uuid) && md.contains(&uuid2),
        "{md}"
    );
    m.ok(&[
        "config",
        "remove",
        "two",
        "--mdadm-conf",
        "etc/mdadm/mdadm.conf",
    ]);
    assert_eq!(
        m.text("etc/mdadm/mdadm.conf"),
        MDADM_CONF,
        "mdadm.conf back byte for byte"
    );
    m.refused(&["config", "remove", "two"], &["no ARRAY line for two"]);
}

#[test]
fn config_add_refuses_an_array_the_kernels_md_holds_and_writes_nothing() {
    let m = Machine::new();
    let members = m.create("m", "data");
    std::fs::write(m.path("etc/mdadm/mdadm.conf"), MDADM_CONF).unwrap();
    // The kernel's md127 holds member b through loop0 (what `losetup` +
    // mdadm's incremental would show in sysfs).
    let loop0 = m.path("sys/block/md127/slaves/loop0/loop");
    std::fs::create_dir_all(&loop0).unwrap();
    let real = std::fs::canonicalize(&members[1]).unwrap();
    std::fs::write(loop0.join("backing_file"), format!("{}\n", real.display())).unwrap();
    let before = hash_files(&m.path("m"));
    m.refused(
        &[
            "config",
            "add",
            &members[0],
            &members[1],
            "--mdadm-conf",
            "etc/mdadm/mdadm.conf",
        ],
        &[&members[1], "/dev/md127", "mdadm --stop /dev/md127"],
    );
    assert!(
        !m.path("etc/nvraid.conf").exists(),
        "the configuration was written"
    );
    assert_eq!(m.text("etc/mdadm/mdadm.conf"), MDADM_CONF);
    assert_eq!(hash_files(&m.path("m")), before, "a member changed");
    // md127 lets it go: accepted.
    std::fs::remove_dir_all(m.path("sys/block/md127")).unwrap();
    m.ok(&[
        "config",
        "add",
        &members[0],
        "--mdadm-conf",
        "etc/mdadm/mdadm.conf",
    ]);
}

#[test]
fn config_add_refuses_members_of_two_arrays_and_a_file_that_is_no_member() {
    let m = Machine::new();
    let one = m.create("m", "one");
    let two = m.create("other", "two");
    m.refused(
        &[
            "config",
            "add",
            &one[0],
            &two[0],
            "--mdadm-conf",
            "etc/mdadm/mdadm.conf",
        ],
        &["belong to 2 different arrays", &one[0], &two[0]],
    );
    let plain = m.path("plain");
    std::fs::write(&plain, vec![0u8; 1 << 20]).unwrap();
    m.refused(
        &[
            "config",
            "add",
            plain.to_str().unwrap(),
            "--mdadm-conf",
            "etc/mdadm/mdadm.conf",
        ],
        &["plain", "no md superblock"],
    );
    m.refused(
        &["config", "add", &one[0], "--name", "a/b"],
        &["is not an array name"],
    );
    assert!(!m.path("etc/nvraid.conf").exists());
}

#[test]
fn bad_config_lines_are_named_by_line_and_the_good_array_still_starts() {
    let m = Machine::new();
    let members = m.create("m", "data");
    let uuid = m.uuid(&members[0]);
    std::fs::write(
        m.path("etc/nvraid.conf"),
        format!(
            "# arrays\nARRAY data UUID={uuid}\nDEVICE /dev/sd*\nARRAY broken UUID=12345678:9abcdef0\n\
             ARRAY dup UUID=11111111:22222222:33333333:44444444\nARRAY dup2 UUID=11111111:22222222:33333333:44444444\n\
             ARRAY data2 UUID=99999999:99999999:99999999:99999999 export=floppy\n"
        ),
    )
    .unwrap();
    let out = m.run(&["config", "check"]);
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    for needle in [
        "line 3: unknown keyword \"DEVICE\"",
        "line 4: ARRAY broken: UUID=12345678:9abcdef0 is not an md array UUID",
        "lines 5 and 6: two ARRAY lines for UUID 11111111:22222222:33333333:44444444",
        "lines 6 and 5:",
        "line 7: ARRAY data2: export=floppy",
    ] {
        assert!(stderr.contains(needle), "{stderr:?} lacks {needle:?}");
    }
    // The good array starts, the bad lines are warnings for it.
    let out = m.run(&["run", "data", "--dry-run"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stderr).contains("warning"));
    // The arrays of bad lines are refused with their line.
    m.refused(
        &["run", "broken", "--dry-run"],
        &["line 4", "broken is not started"],
    );
    m.refused(
        &["run", "dup", "--dry-run"],
        &["lines 5 and 6", "dup is not started"],
    );
    // A line with a UUID no device has: check says so.
    std::fs::write(
        m.path("etc/nvraid.conf"),
        "ARRAY ghost UUID=99999999:99999999:99999999:99999999\n",
    )
    .unwrap();
    let out = m.run(&["config", "check"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("line 1: no member of ghost"));
}

#[test]
fn incremental_arms_the_timer_until_the_last_member_then_starts_the_service() {
    let m = Machine::new();
    let members = m.create("m", "data");
    let uuid = m.uuid(&members[0]);
    m.ok(&[
        "config",
        "add",
        &members[0],
        "--mdadm-conf",
        "etc/mdadm/mdadm.conf",
    ]);
    let before = hash_files(&m.path("m"));
    m.ok(&["assemble", "--incremental", &members[0]]);
    assert_eq!(
        m.calls(),
        vec!["--no-block start nvraid-last-resort@data.timer"]
    );
    m.ok(&["assemble", "--incremental", &members[2]]);
    // A member seen again (udev's change event): nothing.
    m.ok(&["assemble", "--incremental", &members[2]]);
    assert_eq!(m.calls().len(), 2, "{:?}", m.calls());
    m.ok(&["assemble", "--incremental", &members[1]]);
    assert_eq!(
        m.calls(),
        vec![
            "--no-block start nvraid-last-resort@data.timer",
            "--no-block start nvraid-last-resort@data.timer",
            "--no-block start nvraid@data.service",
        ]
    );
    let records = m.path(&format!("run/incremental/{uuid}/members"));
    assert_eq!(std::fs::read_dir(records).unwrap().count(), 3);
    assert_eq!(
        hash_files(&m.path("m")),
        before,
        "incremental wrote to a member"
    );
}

#[test]
fn incremental_leaves_an_array_not_in_the_config_alone() {
    let m = Machine::new();
    let listed = m.create("m", "data");
    m.ok(&[
        "config",
        "add",
        &listed[0],
        "--mdadm-conf",
        "etc/mdadm/mdadm.conf",
    ]);
    let stranger = m.create("other", "stranger");
    let before = hash_files(&m.path("other"));
    let out = m.run(&["assemble", "--incremental", &stranger[0]]);
    assert!(out.status.success());
    assert!(out.stdout.is_empty() && out.stderr.is_empty(), "{out:?}");
    assert!(m.calls().is_empty());
    assert_eq!(
        std::fs::read_dir(m.path("run")).unwrap().count(),
        0,
        "a record was written"
    );
    assert_eq!(hash_files(&m.path("other")), before);
    // No configuration at all: the same.
    std::fs::remove_file(m.path("etc/nvraid.conf")).unwrap();
    let out = m.run(&["assemble", "--incremental", &listed[0]]);
    assert!(out.status.success() && out.stdout.is_empty() && out.stderr.is_empty());
    assert!(m.calls().is_empty());
    // Not an md member: the same.
    std::fs::write(m.path("plain"), vec![0u8; 1 << 20]).unwrap();
    let out = m.run(&["assemble", "--incremental", "plain"]);
    assert!(out.status.success() && out.stderr.is_empty());
}

#[test]
fn run_refuses_a_degraded_start_until_the_last_resort_allows_it() {
    let m = Machine::new();
    let members = m.create("m", "data");
    let uuid = m.uuid(&members[0]);
    m.ok(&[
        "config",
        "add",
        &members[0],
        "--degraded-after",
        "1",
        "--mdadm-conf",
        "etc/mdadm/mdadm.conf",
    ]);
    // Member c is gone.
    std::fs::rename(&members[2], m.path("c.away")).unwrap();
    m.ok(&["assemble", "--incremental", &members[0]]);
    m.ok(&["assemble", "--incremental", &members[1]]);
    m.refused(
        &["run", "data", "--dry-run"],
        &[
            "data is degraded",
            "degraded-after=1",
            "degraded-ok",
            "nvraid run data --last-resort",
        ],
    );
    let started = std::time::Instant::now();
    m.ok(&["run", "data", "--last-resort"]);
    assert!(m
        .path(&format!("run/incremental/{uuid}/degraded-ok"))
        .exists());
    assert_eq!(
        m.calls().last().unwrap(),
        "--no-block start nvraid@data.service"
    );
    assert!(started.elapsed() < std::time::Duration::from_secs(10));
    let json: serde_json::Value =
        serde_json::from_str(&m.ok(&["run", "data", "--dry-run"])).unwrap();
    assert_eq!(json["status"], "degraded");
    assert_eq!(json["members"].as_array().unwrap().len(), 2);
}

#[test]
fn run_last_resort_starts_nothing_when_the_array_cannot_run() {
    let m = Machine::new();
    let members = m.create("m", "data");
    let uuid = m.uuid(&members[0]);
    m.ok(&[
        "config",
        "add",
        &members[0],
        "--degraded-after",
        "0",
        "--mdadm-conf",
        "etc/mdadm/mdadm.conf",
    ]);
    std::fs::rename(&members[1], m.path("b.away")).unwrap();
    std::fs::rename(&members[2], m.path("c.away")).unwrap();
    m.ok(&["assemble", "--incremental", &members[0]]);
    m.refused(
        &["run", "data", "--last-resort"],
        &["cannot start even degraded"],
    );
    assert!(!m
        .path(&format!("run/incremental/{uuid}/degraded-ok"))
        .exists());
    assert_eq!(
        m.calls(),
        vec!["--no-block start nvraid-last-resort@data.timer"]
    );
}

#[test]
fn run_dry_run_prints_the_serve_command_with_the_configs_flags() {
    let m = Machine::new();
    let members = m.create("m", "data");
    m.ok(&[
        "config",
        "add",
        &members[0],
        "--export",
        "ublk:4",
        "--mdadm-conf",
        "etc/mdadm/mdadm.conf",
    ]);
    let mut conf = m.text("etc/nvraid.conf");
    conf.push_str("PROGRAM /usr/local/bin/alert\nMAILADDR root\nMETRICS 127.0.0.1:9177\n");
    std::fs::write(m.path("etc/nvraid.conf"), conf).unwrap();
    // Nothing recorded: the members are found by the scan of "/dev".
    let out = m.run(&["run", "data", "--dry-run"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let args: Vec<&str> = json["args"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap())
        .collect();
    let run = m.path("run");
    let expected = format!(
        "serve --ublk=4 --ublk-record {run}/ublk/data --control {run}/data.ctl --re-add \
         --alert-program /usr/local/bin/alert --alert-mail root --metrics 127.0.0.1:9177 -- {}",
        members.join(" "),
        run = run.display()
    );
    assert_eq!(args.join(" "), expected);
    assert_eq!(json["program"], env!("CARGO_BIN_EXE_nvraid"));
    // The exec'd command line is said on stderr first.
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains(&format!("exec {} {expected}", env!("CARGO_BIN_EXE_nvraid"))),
        "{stderr}"
    );
    // A device the last daemon left (its record, and /dev/ublkc7 still
    // there) is taken over.
    std::fs::create_dir_all(m.path("run/ublk")).unwrap();
    std::fs::write(m.path("run/ublk/data"), "7\n").unwrap();
    std::fs::write(m.path("m/ublkc7"), "").unwrap();
    let json: serde_json::Value =
        serde_json::from_str(&m.ok(&["run", "data", "--dry-run"])).unwrap();
    assert_eq!(json["args"][1], "--ublk=7");
    // nvraid serve takes that command line (exit 1, not the command
    // line's 2): a file where the control socket goes makes it stop in its
    // checks, before it assembles anything. (The alert flags are left out
    // until nvraid serve has them.)
    let first_line = m
        .text("etc/nvraid.conf")
        .lines()
        .next()
        .unwrap()
        .to_string();
    std::fs::write(m.path("etc/nvraid.conf"), first_line + "\n").unwrap();
    let json: serde_json::Value =
        serde_json::from_str(&m.ok(&["run", "data", "--dry-run"])).unwrap();
    let args: Vec<&str> = json["args"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap())
        .collect();
    std::fs::write(m.path("run/data.ctl"), "not a socket").unwrap();
    let before = hash_files(&m.path("m"));
    let out = Command::new(env!("CARGO_BIN_EXE_nvraid"))
        .args(&args)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(!stderr.contains("unexpected argument"), "{stderr}");
    assert_eq!(hash_files(&m.path("m")), before);
    m.refused(
        &["run", "nothere", "--dry-run"],
        &["no ARRAY line for nothere"],
    );
}

#[test]
fn ublk_name_reads_the_record_serve_wrote() {
    let m = Machine::new();
    std::fs::create_dir_all(m.path("run/ublk")).unwrap();
    std::fs::write(m.path("run/ublk/data"), "5\n").unwrap();
    std::fs::write(m.path("run/ublk/logs"), "12\n").unwrap();
    assert_eq!(m.ok(&["ublk", "name", "ublkb5"]), "data\n");
    assert_eq!(m.ok(&["ublk", "name", "/dev/ublkb12"]), "logs\n");
    m.refused(&["ublk", "name", "ublkb6"], &["ublk device 6"]);
    m.refused(&["ublk", "name", "sda"], &["not ublkbN"]);
}

#[test]
fn serve_tells_systemd_ready_once_listening_and_stopping_at_shutdown() {
    use std::os::unix::net::UnixDatagram;
    let m = Machine::new();
    let members = m.create("m", "data");
    let notify_path = m.path("notify");
    let notify = UnixDatagram::bind(&notify_path).unwrap();
    notify
        .set_read_timeout(Some(std::time::Duration::from_secs(60)))
        .unwrap();
    let mut served = common::serve_env(
        &m.root,
        &members,
        &[],
        &[("NOTIFY_SOCKET", notify_path.to_str().unwrap())],
    );
    let mut buffer = [0u8; 4096];
    let n = notify
        .recv(&mut buffer)
        .expect("no READY=1 from nvraid serve");
    let ready = String::from_utf8_lossy(&buffer[..n]).into_owned();
    let socket = m.path("md.sock");
    assert_eq!(
        ready,
        format!("READY=1\nSTATUS=serving unix:{}", socket.display())
    );
    assert!(socket.exists(), "READY=1 before the listener was up");
    let killed = Command::new("kill")
        .args(["-TERM", &served.id().to_string()])
        .status()
        .unwrap();
    assert!(killed.success());
    let n = notify
        .recv(&mut buffer)
        .expect("no STOPPING=1 from nvraid serve");
    assert_eq!(&buffer[..n], b"STOPPING=1");
    let status = served.0.wait().unwrap();
    assert!(status.success(), "{}", m.text("serve.log"));
}

/// The member states of the array `nvraid run data` serves, by role.
fn running_states(m: &Machine) -> Vec<String> {
    let control = m.path("run/data.ctl").display().to_string();
    let out = m.ok(&["status", "--socket", &control, "--json"]);
    let status: serde_json::Value = serde_json::from_str(&out).unwrap();
    status["array"]["members"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| {
            format!(
                "{}:{}",
                m["path"]
                    .as_str()
                    .unwrap_or("-")
                    .rsplit('/')
                    .next()
                    .unwrap(),
                m["state"].as_str().unwrap_or("?")
            )
        })
        .collect()
}

#[test]
fn a_member_unplugged_and_back_while_its_array_runs_is_failed_then_re_added_by_the_bitmap() {
    let m = Machine::new();
    let members: Vec<String> = ["a", "b", "c"]
        .iter()
        .map(|n| m.path("m").join(n).display().to_string())
        .collect();
    let mut create = vec![
        "create",
        "-l",
        "5",
        "-z",
        "32M",
        "-N",
        "data",
        "--bitmap-chunk",
        "1M",
    ];
    create.extend(members.iter().map(String::as_str));
    m.ok(&create);
    let export = format!("nbd:unix:{}", m.path("md.sock").display());
    m.ok(&[
        "config",
        "add",
        &members[0],
        "--export",
        &export,
        "--mdadm-conf",
        "etc/mdadm/mdadm.conf",
    ]);
    // The service's start: `nvraid run data` execs the daemon.
    let mut daemon = common::Served(
        Command::new(env!("CARGO_BIN_EXE_nvraid"))
            .args(["run", "data"])
            .current_dir(&m.root)
            .env("NVRAID_CONF", m.path("etc/nvraid.conf"))
            .env("NVRAID_RUN_DIR", m.path("run"))
            .env("NVRAID_SYSTEMCTL", m.path("systemctl"))
            .env("NVRAID_DEV_DIR", m.path("m"))
            .env("NVRAID_JOURNAL_SOCKET", m.path("no-journal.socket"))
            .env_remove("NOTIFY_SOCKET")
            .stderr(std::fs::File::create(m.path("daemon.log")).unwrap())
            .spawn()
            .unwrap(),
    );
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while !(m.path("md.sock").exists() && m.path("run/data.ctl").exists()) {
        assert!(
            std::time::Instant::now() < deadline,
            "no daemon: {}",
            m.text("daemon.log")
        );
        assert!(
            daemon.0.try_wait().unwrap().is_none(),
            "daemon died: {}",
            m.text("daemon.log")
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    // udev reports the members the daemon serves: nothing is started, and
    // nothing is added twice.
    for member in &members {
        let out = m.run(&["assemble", "--incremental", member]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{stderr}");
        assert!(stderr.contains("already a working member"), "{stderr}");
    }
    assert!(m.calls().is_empty(), "{:?}", m.calls());
    // Unplugged: udev's remove event fails and removes it in the daemon.
    let out = m.run(&["assemble", "--incremental", &members[1], "--removed"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(stderr.contains("went away: removed"), "{stderr}");
    let states = running_states(&m);
    assert!(!states.iter().any(|s| s.starts_with("b:")), "{states:?}");
    // Written while it is away: the bitmap records where.
    common::tool("fio");
    let out = common::fio_nbd(&m.root, "away")
        .args([
            "--rw=randwrite",
            "--bs=4k",
            "--size=4m",
            "--offset=8m",
            "--verify=crc32c",
        ])
        .args(["--do_verify=0", "--randseed=7", "--output-format=terse"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "fio: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    // Plugged back: re-added by the bitmap, and in sync again.
    let out = m.run(&["assemble", "--incremental", &members[1]]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(stderr.contains("re-added (bitmap)"), "{stderr}");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    loop {
        let states = running_states(&m);
        if states.iter().filter(|s| s.ends_with(":active")).count() == 3 {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{states:?}\n{}",
            m.text("daemon.log")
        );
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    assert!(m.calls().is_empty(), "{:?}", m.calls());
    // 4 MiB of the array at 8 MiB are member rows 4 to 6 MiB (RAID 5 of
    // 3): bitmap chunks 4 and 5, and nothing else, are copied.
    let control = m.path("run/data.ctl").display().to_string();
    let status: serde_json::Value =
        serde_json::from_str(&m.ok(&["status", "--socket", &control, "--json"])).unwrap();
    assert_eq!(
        status["array"]["recovery"]["rebuild"]["copied_bytes"],
        2u64 << 20,
        "{status}"
    );
    // What was written while it was away reads back (through the member
    // that came back too: the parity check below reads every byte).
    let out = common::fio_nbd(&m.root, "away")
        .args([
            "--rw=randread",
            "--bs=4k",
            "--size=4m",
            "--offset=8m",
            "--verify=crc32c",
        ])
        .args(["--randseed=7", "--verify_fatal=1", "--output-format=terse"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "fio verify: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    daemon.interrupt();
    common::assert_checks_clean(&m.root, &members, "after the re-add");
}

#[test]
fn run_starts_the_array_without_metrics_when_their_address_is_taken() {
    let m = Machine::new();
    let members = m.create("m", "data");
    let holder = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let taken = holder.local_addr().unwrap().to_string();
    m.ok(&[
        "config",
        "add",
        &members[0],
        "--metrics",
        &taken,
        "--mdadm-conf",
        "etc/mdadm/mdadm.conf",
    ]);
    let out = m.run(&["run", "data", "--dry-run"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let args = json["args"].to_string();
    assert!(!args.contains("--metrics"), "{args}");
    assert!(
        stderr.contains(&format!("--metrics {taken}: the address is in use"))
            && stderr.contains("the array starts without metrics"),
        "{stderr}"
    );
    // Once free, the daemon gets it.
    drop(holder);
    let json: serde_json::Value =
        serde_json::from_str(&m.ok(&["run", "data", "--dry-run"])).unwrap();
    assert!(
        json["args"]
            .to_string()
            .contains(&format!("\"--metrics\",\"{taken}\"")),
        "{json}"
    );
}

#[test]
fn run_starts_an_array_its_members_record_mid_grow() {
    // A RAID 5 whose server was stopped part-way through an online grow:
    // the boot path finds it complete (every member of both shapes) and
    // starts `nvraid serve` on all four, which goes on with the grow
    // (grow_resume.rs); before, its scan refused the reshape.
    let m = Machine::new();
    let mut members = m.create("m", "data");
    let new = m.path("m").join("d");
    std::fs::File::create(&new)
        .unwrap()
        .set_len(17 << 20)
        .unwrap();
    m.ok(&[
        "config",
        "add",
        &members[0],
        "--mdadm-conf",
        "etc/mdadm/mdadm.conf",
    ]);
    let other = m.path("other");
    let server = common::serve_with(&other, &members, &["--reshape-speed", "1"]);
    let ctl = other.join("md.ctl").display().to_string();
    let mut grow = Command::new(env!("CARGO_BIN_EXE_nvraid"))
        .args(["grow", "--socket", &ctl, "-n", "4", "--add"])
        .arg(&new)
        .args(["--step", "1M"])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let started = std::time::Instant::now();
    loop {
        let s: serde_json::Value =
            serde_json::from_str(&m.ok(&["status", "--json", "--socket", &ctl])).unwrap();
        let p = s["array"]["reshape"]["position_bytes"]
            .as_u64()
            .unwrap_or(0);
        if s["array"]["reshape"]["state"] == "running" && p > 0 {
            break;
        }
        assert!(started.elapsed().as_secs() < 60, "no grow part-way: {s}");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    server.interrupt();
    let _ = grow.kill();
    let _ = grow.wait();
    members.push(new.display().to_string());
    let json: serde_json::Value =
        serde_json::from_str(&m.ok(&["run", "data", "--dry-run"])).unwrap();
    assert_eq!(json["status"], "complete", "{json}");
    let mut listed: Vec<String> = json["members"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap().to_string())
        .collect();
    listed.sort();
    members.sort();
    assert_eq!(listed, members, "{json}");
}

#[test]
fn serve_extends_systemds_start_timeout_while_it_finishes_a_grow_before_serving() {
    // A server killed mid-grow leaves the array dirty: the next serve
    // finishes the grow before it serves, which may outlast the unit's
    // start timeout; each step asks systemd for more time
    // (EXTEND_TIMEOUT_USEC) before READY=1.
    use std::os::unix::net::UnixDatagram;
    let m = Machine::new();
    let mut members = m.create("m", "data");
    let new = m.path("m").join("d");
    std::fs::File::create(&new)
        .unwrap()
        .set_len(17 << 20)
        .unwrap();
    let other = m.path("other");
    let mut server = common::serve_with(&other, &members, &["--reshape-speed", "1"]);
    let ctl = other.join("md.ctl").display().to_string();
    let mut grow = Command::new(env!("CARGO_BIN_EXE_nvraid"))
        .args(["grow", "--socket", &ctl, "-n", "4", "--add"])
        .arg(&new)
        .args(["--step", "1M"])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let started = std::time::Instant::now();
    loop {
        let s: serde_json::Value =
            serde_json::from_str(&m.ok(&["status", "--json", "--socket", &ctl])).unwrap();
        let p = s["array"]["reshape"]["position_bytes"]
            .as_u64()
            .unwrap_or(0);
        if s["array"]["reshape"]["state"] == "running" && p > 0 {
            break;
        }
        assert!(started.elapsed().as_secs() < 60, "no grow part-way: {s}");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    server.kill().unwrap();
    server.wait().unwrap();
    let _ = grow.kill();
    let _ = grow.wait();
    members.push(new.display().to_string());
    let notify_path = m.path("notify");
    let notify = UnixDatagram::bind(&notify_path).unwrap();
    notify
        .set_read_timeout(Some(std::time::Duration::from_secs(60)))
        .unwrap();
    let served = common::serve_env(
        &m.root,
        &members,
        &[],
        &[("NOTIFY_SOCKET", notify_path.to_str().unwrap())],
    );
    let mut said = Vec::new();
    let mut buffer = [0u8; 4096];
    loop {
        let n = notify
            .recv(&mut buffer)
            .expect("no READY=1 from nvraid serve");
        let message = String::from_utf8_lossy(&buffer[..n]).into_owned();
        let ready = message.starts_with("READY=1");
        said.push(message);
        if ready {
            break;
        }
    }
    assert!(
        said.len() > 1
            && said[..said.len() - 1].iter().all(|m| m.starts_with(
                "EXTEND_TIMEOUT_USEC=120000000\nSTATUS=finishing the recorded grow before serving"
            )),
        "{said:?}"
    );
    served.interrupt();
    assert!(m.text("serve.log").contains("event=reshape-finished"));
}
