//! End-to-end tests of the `nvraid` binary: every refusal leaves every byte
//! of every member as it was; real peers (mdadm) read what nvraid writes;
//! arrays the kernel wrote read back exactly.

mod common;

use common::*;
use sha2::{Digest, Sha256};
use std::path::{Path, PathBuf};
use std::process::Command;

mod bad_input {
    use super::*;

    fn array(dir: &Path, level: &str, names: &[&str]) {
        let mut args = vec!["create", "--level", level, "--size", "8M"];
        args.extend_from_slice(names);
        ok(&args, dir);
    }

    /// RAID 4/5/6 bad input: too few members, an unknown or misplaced
    /// layout, a chunk that is not a power of two, a PPL on RAID 6, two
    /// members missing on RAID 5 (three on RAID 6): each refused by name,
    /// with no byte of any member changed.
    #[test]
    fn parity_bad_input_is_refused_by_name() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("x"), [1u8; 8192]).unwrap();
        for (level, names, needle) in [
            ("5", &["a", "b"][..], "at least 3"),
            ("6", &["a", "b", "c"][..], "at least 4"),
        ] {
            let mut args = vec!["create", "--level", level, "--size", "8M"];
            args.extend_from_slice(names);
            refused(&args, dir.path(), &[needle]);
        }
        let make = |extra: &[&str]| {
            let mut args = vec!["create", "--level", "5", "--size", "8M"];
            args.extend_from_slice(extra);
            args.extend_from_slice(&["a", "b", "c"]);
            args.into_iter().map(String::from).collect::<Vec<_>>()
        };
        for (extra, needles) in [
            (
                &["--layout", "diagonal"][..],
                &["unknown raid5 layout \"diagonal\"", "left-symmetric"][..],
            ),
            (
                &["--layout", "left-symmetric-6"][..],
                &["unknown raid5 layout"][..],
            ),
            (&["--chunk", "48K"][..], &["power of two"][..]),
        ] {
            let args = make(extra);
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            refused(&args, dir.path(), needles);
        }
        refused(
            &[
                "create",
                "--level",
                "6",
                "--consistency-policy",
                "ppl",
                "--size",
                "8M",
                "a",
                "b",
                "c",
                "d",
            ],
            dir.path(),
            &["partial parity log", "RAID 4/5 only"],
        );
        refused(
            &[
                "create", "--level", "4", "--layout", "ls", "--size", "8M", "a", "b", "c",
            ],
            dir.path(),
            &["raid4"],
        );
        assert!(
            !dir.path().join("a").exists(),
            "a refused create creates nothing"
        );
        // Two of four RAID 5 members gone, three of five RAID 6 members.
        for (level, count, gone) in [("5", 4, &[1usize, 3][..]), ("6", 5, &[0, 2, 4][..])] {
            let names: Vec<String> = (0..count).map(|i| format!("r{level}-{i}")).collect();
            let mut args = vec!["create", "--level", level, "--size", "8M"];
            args.extend(names.iter().map(String::as_str));
            ok(&args, dir.path());
            let kept: Vec<&str> = (0..count)
                .filter(|i| !gone.contains(i))
                .map(|i| names[i].as_str())
                .collect();
            let roles = gone
                .iter()
                .map(|r| r.to_string())
                .collect::<Vec<_>>()
                .join(", ");
            let mut read = vec!["read", "--length", "4096"];
            read.extend(kept.iter().copied());
            refused(
                &read,
                dir.path(),
                &[&format!("roles {roles} are missing"), "can rebuild at most"],
            );
            let mut write = vec!["write", "--degraded", "--input", "x"];
            write.extend(kept.iter().copied());
            refused(&write, dir.path(), &[&format!("roles {roles} are missing")]);
        }
    }

    /// md's write journal: refused on a level without parity, beside a
    /// bitmap or another policy, on a member too small for a log, on a
    /// member of the array itself; an array with a journal is refused for
    /// writing without it. Nothing changes on any member.
    #[test]
    fn write_journal_bad_input_is_refused_by_name() {
        let dir = tempfile::tempdir().unwrap();
        let base = ["create", "--size", "8M"];
        let with = |extra: &[&'static str]| {
            let mut args = base.to_vec();
            args.extend_from_slice(extra);
            args
        };
        refused(
            &with(&["--level", "1", "--write-journal", "j", "a", "b"]),
            dir.path(),
            &["write journal on a raid1", "RAID 4/5/6 only"],
        );
        refused(
            &with(&[
                "--level",
                "5",
                "--write-journal",
                "j",
                "--bitmap",
                "internal",
                "a",
                "b",
                "c",
            ]),
            dir.path(),
            &["--write-journal contradicts --bitmap internal"],
        );
        refused(
            &with(&[
                "--level",
                "5",
                "--write-journal",
                "j",
                "--consistency-policy",
                "ppl",
                "a",
                "b",
                "c",
            ]),
            dir.path(),
            &["--consistency-policy ppl contradicts --write-journal"],
        );
        refused(
            &with(&[
                "--level",
                "5",
                "--consistency-policy",
                "journal",
                "a",
                "b",
                "c",
            ]),
            dir.path(),
            &["needs --write-journal"],
        );
        refused(
            &with(&["--level", "5", "--write-journal", "a", "a", "b", "c"]),
            dir.path(),
            &["a"],
        );
        assert!(
            !dir.path().join("a").exists(),
            "a refused create creates nothing"
        );
        // Without --size (which would extend it), a journal too small.
        for name in ["a", "b", "c"] {
            std::fs::write(dir.path().join(name), vec![0u8; 8 << 20]).unwrap();
        }
        std::fs::write(dir.path().join("small"), vec![0u8; 2 << 20]).unwrap();
        refused(
            &[
                "create",
                "--level",
                "5",
                "--write-journal",
                "small",
                "a",
                "b",
                "c",
            ],
            dir.path(),
            &["small", "log of 4 MiB"],
        );
        ok(
            &with(&["--level", "5", "--write-journal", "j", "a", "b", "c"]),
            dir.path(),
        );
        std::fs::write(dir.path().join("x"), [7u8; 4096]).unwrap();
        refused(
            &["write", "--input", "x", "a", "b", "c"],
            dir.path(),
            &["write journal", "journal member"],
        );
        let examined = ok(&["examine", "j"], dir.path());
        assert!(examined.contains("journal"), "{examined}");
        // Each writable assembly ends the log with a new empty block and
        // moves the tail to it. A log whose blocks were wiped is empty: a
        // new one starts at the ring's start, as md does.
        let tail = |dir: &Path| -> u64 {
            let d: serde_json::Value =
                serde_json::from_str(&ok(&["detail", "--json", "a", "b", "c", "j"], dir)).unwrap();
            let members = d["members"].as_array().unwrap().clone();
            let j = members.iter().find(|m| m["state"] == "journal").unwrap();
            let reason = j["reason"].as_str().unwrap();
            reason.rsplit(' ').next().unwrap().parse().unwrap()
        };
        assert_eq!(
            tail(dir.path()),
            0,
            "create leaves the tail at the log's start"
        );
        ok(&["write", "--input", "x", "a", "b", "c", "j"], dir.path());
        let moved = tail(dir.path());
        assert!(moved > 0 && moved % 8 == 0, "tail {moved}");
        let mut journal = std::fs::read(dir.path().join("j")).unwrap();
        journal[1 << 20..(1 << 20) + (64 << 10)].fill(0);
        std::fs::write(dir.path().join("j"), &journal).unwrap();
        ok(&["write", "--input", "x", "a", "b", "c", "j"], dir.path());
        assert!(tail(dir.path()) < moved, "a new log from the start");
        let journal = std::fs::read(dir.path().join("j")).unwrap();
        assert_eq!(
            journal[1 << 20..(1 << 20) + 4],
            0x6433_c509u32.to_le_bytes()
        );
        let scanned: serde_json::Value =
            serde_json::from_str(&ok(&["assemble", "--scan", "--json", "."], dir.path())).unwrap();
        let states: Vec<(String, String)> = scanned["arrays"][0]["members"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| {
                (
                    m["path"].as_str().unwrap().to_string(),
                    m["state"].as_str().unwrap().to_string(),
                )
            })
            .collect();
        assert!(
            states.contains(&("./j".to_string(), "journal".to_string())),
            "{states:?}"
        );
    }

    #[test]
    fn member_with_an_md_superblock_needs_force() {
        let dir = tempfile::tempdir().unwrap();
        array(dir.path(), "1", &["a", "b"]);
        refused(
            &["create", "--level", "0", "a", "b"],
            dir.path(),
            &["a: already carries an md v1.2 superblock", "--force"],
        );
        ok(&["create", "--level", "0", "--force", "a", "b"], dir.path());
        assert!(ok(&["detail", "--json", "a", "b"], dir.path()).contains("\"level\": 0"));
    }

    #[test]
    fn member_with_a_filesystem_needs_force() {
        let dir = tempfile::tempdir().unwrap();
        for (mkfs, what) in [("mkfs.ext4", "ext2/3/4"), ("mkfs.xfs", "XFS")] {
            let fs = dir.path().join("fs.img");
            // Sparse: mkfs.xfs wants at least 300 MB.
            std::fs::File::create(&fs)
                .unwrap()
                .set_len(320 << 20)
                .unwrap();
            let status = Command::new(tool(mkfs))
                .arg("-q")
                .arg(if mkfs == "mkfs.xfs" { "-f" } else { "-F" })
                .arg(&fs)
                .status()
                .unwrap();
            assert!(status.success(), "{mkfs} failed");
            refused(
                &["create", "--level", "1", "--size", "32M", "fs.img", "other"],
                dir.path(),
                &["fs.img", what],
            );
            assert!(
                !dir.path().join("other").exists(),
                "a refused create must not create files"
            );
        }
    }

    #[test]
    fn a_create_that_fails_part_way_puts_everything_back() {
        let dir = tempfile::tempdir().unwrap();
        // An existing, smaller file that create would extend, and a member
        // whose directory does not exist: the second open fails after the
        // first member was already extended.
        std::fs::write(dir.path().join("a.img"), vec![7u8; 2 << 20]).unwrap();
        refused(
            &[
                "create",
                "--level",
                "1",
                "--size",
                "8M",
                "a.img",
                "no-dir/b.img",
                "c.img",
            ],
            dir.path(),
            &["no-dir/b.img"],
        );
        assert!(!dir.path().join("c.img").exists());
    }

    #[test]
    fn members_of_unequal_size_need_an_explicit_size() {
        let dir = tempfile::tempdir().unwrap();
        for (name, size) in [
            ("big.img", 256u64 << 20),
            ("small.img", 8 << 20),
            ("big2.img", 256 << 20),
        ] {
            std::fs::File::create(dir.path().join(name))
                .unwrap()
                .set_len(size)
                .unwrap();
        }
        refused(
            &["create", "--level", "1", "big.img", "small.img"],
            dir.path(),
            &["small.img has 8388608 bytes (8 MiB)", "big.img", "--size"],
        );
        refused(
            &["create", "--level", "0", "small.img", "big.img"],
            dir.path(),
            &["unused", "--size"],
        );
        // --size on members larger than it is honoured: 64 MiB of each.
        let size = |args: &[&str]| {
            let out = ok(args, dir.path());
            let detail: serde_json::Value = serde_json::from_str(&out).unwrap();
            detail["size_bytes"].as_u64().unwrap()
        };
        assert_eq!(
            size(&["create", "--json", "--level", "1", "--size", "64M", "big.img", "big2.img"]),
            63 << 20
        );
        assert_eq!(
            size(&[
                "create",
                "--json",
                "--force",
                "--level",
                "0",
                "--size",
                "8M",
                "big.img",
                "small.img"
            ]),
            14 << 20
        );
        assert_eq!(
            std::fs::metadata(dir.path().join("big.img")).unwrap().len(),
            256 << 20
        );
    }

    #[test]
    fn writing_a_degraded_array_needs_degraded() {
        let dir = tempfile::tempdir().unwrap();
        array(dir.path(), "1", &["a", "b"]);
        std::fs::write(dir.path().join("data"), vec![9u8; 4096]).unwrap();
        refused(
            &["write", "--input", "data", "a"],
            dir.path(),
            &["roles 1 are missing", "--degraded"],
        );
        ok(&["write", "--degraded", "--input", "data", "a"], dir.path());
        let d: serde_json::Value =
            serde_json::from_str(&ok(&["detail", "--json", "a", "b"], dir.path())).unwrap();
        assert_eq!(d["members"][2]["state"], "faulty", "{d}");
        assert_eq!(d["members"][2]["path"], "b", "{d}");
    }

    #[test]
    fn a_missing_member_is_named_without_a_create_hint() {
        let dir = tempfile::tempdir().unwrap();
        array(dir.path(), "1", &["a", "b"]);
        for command in ["detail", "read"] {
            let out = nvraid(&[command, "a", "gone.img"], dir.path());
            let stderr = String::from_utf8_lossy(&out.stderr);
            assert_eq!(out.status.code(), Some(1), "{command}: {stderr}");
            assert!(
                stderr.contains("gone.img: does not exist"),
                "{command}: {stderr}"
            );
            assert!(
                !stderr.contains("--size"),
                "{command} has no --size: {stderr}"
            );
        }
        refused(
            &["create", "--level", "1", "x.img", "y.img"],
            dir.path(),
            &["x.img: does not exist", "give --size"],
        );
    }

    #[test]
    fn too_small_and_wrong_counts() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("small"), vec![0u8; 512 * 1024]).unwrap();
        std::fs::write(dir.path().join("big"), vec![0u8; 8 << 20]).unwrap();
        refused(
            &["create", "--level", "0", "big", "small"],
            dir.path(),
            &["small", "too small"],
        );
        refused(
            &["create", "--level", "1", "big"],
            dir.path(),
            &["raid1 needs at least 2 members, got 1"],
        );
        refused(
            &["create", "--level", "10", "big"],
            dir.path(),
            &["raid10 with 2 copies needs", "got 1 members"],
        );
        refused(
            &["create", "--level", "5", "big", "small"],
            dir.path(),
            &["raid5", "at least 3 members, got 2"],
        );
        refused(
            &["create", "--level", "7", "big", "small"],
            dir.path(),
            &["unsupported level"],
        );
    }

    #[test]
    fn chunk_must_be_a_power_of_two() {
        let dir = tempfile::tempdir().unwrap();
        refused(
            &[
                "create", "--level", "0", "--chunk", "96K", "--size", "8M", "a", "b",
            ],
            dir.path(),
            &["98304", "not a power of two"],
        );
        refused(
            &[
                "create", "--level", "0", "--chunk", "2K", "--size", "8M", "a", "b",
            ],
            dir.path(),
            &["outside 4 KiB"],
        );
        assert!(hash_files(dir.path()).is_empty());
    }

    #[test]
    fn the_same_member_twice() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("a"), vec![0u8; 8 << 20]).unwrap();
        std::os::unix::fs::symlink("a", dir.path().join("link")).unwrap();
        refused(
            &["create", "--level", "1", "a", "a"],
            dir.path(),
            &["a: given twice"],
        );
        refused(
            &["create", "--level", "1", "a", "link"],
            dir.path(),
            &["link: given twice", "a"],
        );
        refused(
            &["create", "--level", "1", "--size", "8M", "new", "./new"],
            dir.path(),
            &["given twice"],
        );
    }

    #[test]
    fn members_of_two_arrays() {
        let dir = tempfile::tempdir().unwrap();
        array(dir.path(), "1", &["a0", "a1"]);
        array(dir.path(), "1", &["b0", "b1"]);
        refused(
            &["detail", "a0", "b1"],
            dir.path(),
            &["b1 belongs to array", "a0", "two different arrays"],
        );
        refused(
            &["write", "--input", "/dev/null", "a0", "b1"],
            dir.path(),
            &["two different arrays"],
        );
    }

    fn corrupt(path: &Path, offset: u64, byte: u8) {
        use std::os::unix::fs::FileExt;
        let f = std::fs::OpenOptions::new().write(true).open(path).unwrap();
        f.write_all_at(&[byte], offset).unwrap();
    }

    #[test]
    fn bad_checksum_and_unknown_version() {
        let dir = tempfile::tempdir().unwrap();
        array(dir.path(), "1", &["a", "b"]);
        corrupt(&dir.path().join("a"), 4096 + 100, 0x77);
        refused(
            &["examine", "a"],
            dir.path(),
            &["a: md superblock checksum mismatch"],
        );
        // At assembly the damaged member is set aside, as md does, and named
        // (members_disagree.rs has the rest).
        let out = nvraid(&["detail", "b", "a"], dir.path());
        assert_eq!(out.status.code(), Some(0));
        assert!(String::from_utf8_lossy(&out.stderr).contains("a: md superblock checksum mismatch"));
        corrupt(&dir.path().join("b"), 4096 + 4, 9);
        refused(
            &["examine", "b"],
            dir.path(),
            &["b: md superblock major version 9"],
        );
    }

    #[test]
    fn wrong_order_on_assemble_is_put_right_by_roles() {
        let dir = tempfile::tempdir().unwrap();
        array(dir.path(), "0", &["m0", "m1", "m2"]);
        let data: Vec<u8> = (0..3 << 20).map(|i: u32| (i * 7 % 253) as u8).collect();
        std::fs::write(dir.path().join("in"), &data).unwrap();
        ok(&["write", "--input", "in", "m2", "m0", "m1"], dir.path());
        ok(
            &[
                "read", "--length", "3M", "--output", "out", "m1", "m2", "m0",
            ],
            dir.path(),
        );
        assert_eq!(std::fs::read(dir.path().join("out")).unwrap(), data);
        let detail: serde_json::Value =
            serde_json::from_str(&ok(&["detail", "--json", "m2", "m1", "m0"], dir.path())).unwrap();
        let roles: Vec<(String, u64)> = detail["members"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| {
                (
                    m["path"].as_str().unwrap().to_string(),
                    m["role"].as_u64().unwrap(),
                )
            })
            .collect();
        assert_eq!(
            roles,
            vec![("m0".into(), 0), ("m1".into(), 1), ("m2".into(), 2)]
        );
    }

    #[test]
    fn truncated_member() {
        let dir = tempfile::tempdir().unwrap();
        array(dir.path(), "0", &["m0", "m1"]);
        let f = std::fs::OpenOptions::new()
            .write(true)
            .open(dir.path().join("m1"))
            .unwrap();
        f.set_len(4 << 20).unwrap();
        refused(&["detail", "m0", "m1"], dir.path(), &["m1: truncated"]);
        f.set_len(6000).unwrap();
        refused(&["examine", "m1"], dir.path(), &["m1: truncated"]);
    }

    #[test]
    fn read_and_write_past_the_end() {
        let dir = tempfile::tempdir().unwrap();
        array(dir.path(), "0", &["m0", "m1"]);
        let size: u64 = serde_json::from_str::<serde_json::Value>(&ok(
            &["detail", "--json", "m0", "m1"],
            dir.path(),
        ))
        .unwrap()["size_bytes"]
            .as_u64()
            .unwrap();
        std::fs::write(dir.path().join("in"), vec![1u8; 8192]).unwrap();
        let offset = (size - 4096).to_string();
        refused(
            &["write", "--offset", &offset, "--input", "in", "m0", "m1"],
            dir.path(),
            &["pass the end of the array", "nothing written"],
        );
        refused(
            &["read", "--offset", &offset, "--length", "8192", "m0", "m1"],
            dir.path(),
            &["pass the end of the array"],
        );
        refused(
            &["write", "--offset", "100", "--input", "in", "m0", "m1"],
            dir.path(),
            &["offset 100 is not a multiple"],
        );
        // From a pipe, too: the input is measured before anything is written.
        let before = hash_files(dir.path());
        let out = Command::new("sh")
            .arg("-c")
            .arg(format!(
                "head -c 8192 /dev/zero | {} write --offset {offset} m0 m1",
                env!("CARGO_BIN_EXE_nvraid")
            ))
            .current_dir(dir.path())
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(1));
        assert_eq!(hash_files(dir.path()), before);
    }
}

mod interop {
    use super::*;
    use crate::common::examine_field as field;

    #[test]
    fn mdadm_examine_reads_nvraid_members() {
        let cases = [
            ("0", "raid0", Some("64K"), None),
            ("1", "raid1", None, None),
            ("10", "raid10", Some("256K"), Some("near=2")),
        ];
        for (level, name, chunk, layout) in cases {
            let dir = tempfile::tempdir().unwrap();
            let mut args = vec![
                "create", "--level", level, "--size", "40M", "--name", "interop",
            ];
            if let Some(c) = chunk {
                args.extend_from_slice(&["--chunk", c]);
            }
            args.extend_from_slice(&["d0", "d1", "d2"]);
            if level == "1" {
                args.pop();
            }
            ok(&args, dir.path());
            let members: Vec<&str> = if level == "1" {
                vec!["d0", "d1"]
            } else {
                vec!["d0", "d1", "d2"]
            };
            let detail: serde_json::Value = serde_json::from_str(&ok(
                &[&["detail", "--json"][..], &members[..]].concat(),
                dir.path(),
            ))
            .unwrap();
            for (role, m) in members.iter().enumerate() {
                let text = mdadm_examine(&dir.path().join(m));
                assert!(field(&text, "Checksum").ends_with("- correct"), "{text}");
                assert_eq!(field(&text, "Array UUID"), detail["uuid"].as_str().unwrap());
                assert_eq!(field(&text, "Raid Level"), name);
                assert_eq!(field(&text, "Raid Devices"), members.len().to_string());
                assert_eq!(field(&text, "Device Role"), format!("Active device {role}"));
                assert_eq!(field(&text, "Data Offset"), "2048 sectors");
                assert_eq!(field(&text, "State"), "clean");
                if let Some(c) = chunk {
                    assert_eq!(field(&text, "Chunk Size"), c);
                }
                if let Some(l) = layout {
                    assert_eq!(field(&text, "Layout"), l);
                }
                if level != "0" {
                    // "Array Size : 39936 KiB (...)": mdadm's own arithmetic agrees with nvraid's.
                    let kib: u64 = field(&text, "Array Size")
                        .split_whitespace()
                        .next()
                        .unwrap()
                        .parse()
                        .unwrap();
                    assert_eq!(kib * 1024, detail["size_bytes"].as_u64().unwrap(), "{text}");
                }
            }
        }
    }
}

mod fixtures {
    use super::*;

    #[test]
    fn kernel_arrays_read_back_through_the_cli() {
        let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../../tests/fixtures/md");
        let readme =
            std::fs::read_to_string(root.join("README.md")).expect("tests/fixtures/md/README.md");
        // Table rows: | `folder` | level | members | chunk | layout | size | `sha256` |
        let rows: Vec<(String, String)> = readme
            .lines()
            .filter(|l| l.starts_with("| `"))
            .map(|l| {
                let cells: Vec<&str> = l.split('|').map(|c| c.trim().trim_matches('`')).collect();
                (cells[1].to_string(), cells[7].to_string())
            })
            .collect();
        assert_eq!(rows.len(), 3, "fixture table");
        for (folder, sha) in rows {
            let dir = tempfile::tempdir().unwrap();
            let mut members = Vec::new();
            for entry in std::fs::read_dir(root.join(&folder)).unwrap() {
                let path = entry.unwrap().path();
                if path.extension().is_some_and(|e| e == "xz") {
                    let img = dir.path().join(path.file_stem().unwrap());
                    let out = Command::new(tool("xz"))
                        .arg("-dc")
                        .arg(&path)
                        .output()
                        .unwrap();
                    std::fs::write(&img, out.stdout).unwrap();
                    members.push(img.file_name().unwrap().to_str().unwrap().to_string());
                }
            }
            let mut args = vec!["read".to_string()];
            args.extend(members);
            let out = nvraid(
                &args.iter().map(String::as_str).collect::<Vec<_>>(),
                dir.path(),
            );
            assert!(
                out.status.success(),
                "{folder}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
            assert_eq!(
                format!("{:x}", Sha256::digest(&out.stdout)),
                sha,
                "{folder}"
            );
            let scan = ok(&["assemble", "--scan", "--json", "."], dir.path());
            assert!(scan.contains("\"status\": \"complete\""), "{scan}");
        }
    }
}

mod bench {
    use super::*;

    fn members(dir: &Path, level: &str) {
        ok(
            &["create", "--level", level, "--size", "16M", "m0", "m1"],
            dir,
        );
    }

    #[test]
    fn write_jobs_on_an_existing_array_need_destructive() {
        let dir = tempfile::tempdir().unwrap();
        members(dir.path(), "1");
        let job = [
            "bench",
            "--rw",
            "randwrite",
            "--runtime",
            "200ms",
            "m0",
            "m1",
        ];
        refused(&job, dir.path(), &["--destructive", "m0"]);
        // Read-only jobs are always allowed, and change nothing.
        let before = hash_files(dir.path());
        ok(
            &[
                "bench",
                "--rw",
                "randread",
                "--runtime",
                "200ms",
                "m0",
                "m1",
            ],
            dir.path(),
        );
        assert_eq!(
            hash_files(dir.path()),
            before,
            "a read job changed a member"
        );
        let out = ok(
            &[&job[..6], &["--destructive", "--json"], &job[6..]].concat(),
            dir.path(),
        );
        let json: serde_json::Value = serde_json::from_str(&out).unwrap();
        assert!(
            json["jobs"][0]["write"]["iops"].as_f64().unwrap() > 0.0,
            "{out}"
        );
        // The array is still an array, closed clean.
        let detail: serde_json::Value =
            serde_json::from_str(&ok(&["detail", "--json", "m0", "m1"], dir.path())).unwrap();
        assert_eq!(detail["state"], "clean");
    }

    #[test]
    fn raw_members_with_a_signature_need_destructive() {
        let dir = tempfile::tempdir().unwrap();
        members(dir.path(), "0");
        refused(
            &[
                "bench",
                "--raw",
                "--rw",
                "write",
                "--runtime",
                "200ms",
                "m0",
            ],
            dir.path(),
            &["m0: carries an md v1.2 superblock", "--destructive"],
        );
        refused(
            &[
                "bench",
                "--level",
                "0",
                "--rw",
                "read",
                "--runtime",
                "200ms",
                "m0",
                "m1",
            ],
            dir.path(),
            &["--destructive"],
        );
    }

    #[test]
    fn bad_job_specs_are_refused_before_any_io() {
        let dir = tempfile::tempdir().unwrap();
        members(dir.path(), "0");
        refused(
            &[
                "bench",
                "--rw",
                "read",
                "--bs",
                "1000",
                "--runtime",
                "200ms",
                "m0",
                "m1",
            ],
            dir.path(),
            &["bs"],
        );
        refused(
            &[
                "bench",
                "--rw",
                "read",
                "--size",
                "1G",
                "--runtime",
                "200ms",
                "m0",
                "m1",
            ],
            dir.path(),
            &["size"],
        );
        let usage = nvraid(
            &["bench", "--rw", "read", "--iodepth", "0", "m0", "m1"],
            dir.path(),
        );
        assert_ne!(usage.status.code(), Some(0));
        assert!(String::from_utf8_lossy(&usage.stderr).contains("iodepth"));
        let usage = nvraid(
            &["bench", "--rw", "read", "--runtime", "0s", "m0", "m1"],
            dir.path(),
        );
        assert_ne!(usage.status.code(), Some(0));
        assert!(String::from_utf8_lossy(&usage.stderr).contains("runtime"));
    }

    #[test]
    fn null_members_form_a_throwaway_array() {
        let dir = tempfile::tempdir().unwrap();
        let out = ok(
            &[
                "bench",
                "--level",
                "10",
                "--rw",
                "randrw",
                "--runtime",
                "300ms",
                "--json",
                "null:1G",
                "null:1G",
                "null:1G",
                "null:1G",
            ],
            dir.path(),
        );
        let json: serde_json::Value = serde_json::from_str(&out).unwrap();
        let job = &json["jobs"][0];
        assert!(job["read"]["iops"].as_f64().unwrap() > 0.0);
        assert!(job["write"]["iops"].as_f64().unwrap() > 0.0);
        assert!(
            job["read"]["clat_ns"]["percentile"]["99.000000"]
                .as_u64()
                .is_some(),
            "{out}"
        );
    }

    #[test]
    fn the_readme_main_job_runs_on_a_fresh_machine() {
        // `cargo run --release -- bench`: no members, a temporary RAID 0.
        let dir = tempfile::tempdir().unwrap();
        let out = Command::new(env!("CARGO_BIN_EXE_nvraid"))
            .arg("bench")
            .arg("--json")
            .env("TMPDIR", dir.path())
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        let jobs = json["jobs"].as_array().unwrap();
        assert!(jobs.len() >= 4, "the quick preset has read and write steps");
        assert!(jobs.iter().all(|j| j["error"] == 0));
        assert_eq!(
            std::fs::read_dir(dir.path()).unwrap().count(),
            0,
            "the temporary array is removed"
        );
    }
}

mod serve {
    use super::*;

    /// An RSA key of a size the TLS library cannot load (2432 bits: not a
    /// multiple of 512) is refused with that reason, not a bare "failed to
    /// parse private key".
    #[test]
    fn an_rsa_key_of_an_odd_size_is_refused_with_the_reason() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        self_signed_certificate(d, 2432);
        ok(&["create", "--level", "0", "--size", "8M", "m0"], d);
        let out = nvraid(
            &[
                "serve",
                "--listen",
                "unix:s.sock",
                "--tls",
                "on",
                "--tls-cert",
                "cert.pem",
                "--tls-key",
                "key.pem",
                "m0",
            ],
            d,
        );
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{err}");
        assert!(
            err.contains("key.pem") && err.contains("2432 bits") && err.contains("multiple of 512"),
            "{err}"
        );
    }

    /// A member written by a running nvraid is claimed: a second writer
    /// (write, create, a second serve, a destructive bench) is refused with
    /// the holder's pid and command, and changes nothing; readers still work.
    #[test]
    fn a_served_array_is_claimed_against_other_writers() {
        let dir = tempfile::tempdir().unwrap();
        ok(
            &["create", "--level", "1", "--size", "16M", "m0", "m1"],
            dir.path(),
        );
        let mut server = serve(dir.path(), &["m0".to_string(), "m1".to_string()]);
        std::fs::write(dir.path().join("data"), vec![1u8; 4096]).unwrap();
        let holder = format!("pid {}", server.id());
        let before = hash_files(dir.path());
        for args in [
            &["write", "--input", "data", "m0", "m1"][..],
            &["create", "--force", "--level", "0", "m0", "m1"][..],
            &["serve", "--listen", "unix:other.sock", "m1", "m0"][..],
            &[
                "bench",
                "--rw",
                "randwrite",
                "--runtime",
                "1s",
                "--destructive",
                "--raw",
                "m1",
            ][..],
        ] {
            let out = nvraid(args, dir.path());
            let stderr = String::from_utf8_lossy(&out.stderr);
            assert_eq!(
                out.status.code(),
                Some(1),
                "{args:?} should be refused: {stderr}"
            );
            assert!(
                stderr.contains("in use by")
                    && stderr.contains(&holder)
                    && stderr.contains("nvraid serve"),
                "{args:?}: {stderr}"
            );
        }
        let after: Vec<_> = hash_files(dir.path())
            .into_iter()
            .filter(|(p, _)| before.iter().any(|(q, _)| q == p))
            .collect();
        assert_eq!(after, before, "a refused writer changed a member");
        // Readers are not refused.
        ok(&["detail", "m0", "m1"], dir.path());
        ok(&["read", "--length", "4K", "m0", "m1"], dir.path());
        Command::new("kill")
            .arg("-INT")
            .arg(server.id().to_string())
            .status()
            .unwrap();
        assert!(server.wait().unwrap().success());
        // The claim ends with the server.
        ok(&["write", "--input", "data", "m0", "m1"], dir.path());
    }

    #[test]
    fn serve_counts_member_io_and_closes_clean_on_sigint() {
        let dir = tempfile::tempdir().unwrap();
        ok(
            &[
                "create", "--level", "10", "--size", "16M", "m0", "m1", "m2", "m3",
            ],
            dir.path(),
        );
        let socket = dir.path().join("md.sock");
        let members: Vec<String> = (0..4).map(|i| format!("m{i}")).collect();
        let mut server = serve(dir.path(), &members);
        let control = dir.path().join("md.ctl");
        let data: Vec<u8> = (0..4 << 20).map(|i: u32| (i % 241) as u8).collect();
        std::fs::write(dir.path().join("in"), &data).unwrap();
        let uri = format!("nbd+unix:///?socket={}", socket.display());
        let copied = Command::new(tool("nbdcopy"))
            .arg(dir.path().join("in"))
            .arg(&uri)
            .status()
            .unwrap();
        assert!(copied.success());
        let status: serde_json::Value = serde_json::from_str(&ok(
            &["status", "--json", "--socket", control.to_str().unwrap()],
            dir.path(),
        ))
        .unwrap();
        let members = status["array"]["members"].as_array().unwrap();
        let written: u64 = members
            .iter()
            .map(|m| m["io"]["bytes"].as_u64().unwrap())
            .sum();
        assert_eq!(
            written,
            2 * (4 << 20),
            "raid10 near2 writes every byte twice: {status}"
        );
        assert_eq!(
            status["array"]["state"], "active",
            "dirty while serving writes"
        );
        // SIGINT: finish, flush, mark clean, exit 0.
        let killed = Command::new("kill")
            .arg("-INT")
            .arg(server.id().to_string())
            .status()
            .unwrap();
        assert!(killed.success());
        assert!(server.wait().unwrap().success());
        let detail: serde_json::Value = serde_json::from_str(&ok(
            &["detail", "--json", "m0", "m1", "m2", "m3"],
            dir.path(),
        ))
        .unwrap();
        assert_eq!(detail["state"], "clean");
        ok(
            &[
                "read", "--length", "4M", "--output", "out", "m3", "m2", "m1", "m0",
            ],
            dir.path(),
        );
        assert_eq!(std::fs::read(dir.path().join("out")).unwrap(), data);
    }
}

mod manual {
    use super::*;

    const COMMANDS: [&str; 10] = [
        "create", "examine", "detail", "assemble", "write", "read", "bench", "topology", "serve",
        "status",
    ];

    #[test]
    fn man_page_documents_every_command() {
        let dir = tempfile::tempdir().unwrap();
        let page = ok(&["man"], dir.path());
        assert!(page.contains(".TH nvraid 1"), "{page}");
        for command in COMMANDS {
            assert!(page.contains(command), "man page lacks {command}");
        }
        ok(&["man", "--dir", "pages"], dir.path());
        for command in COMMANDS {
            let sub = dir.path().join(format!("pages/nvraid-{command}.1"));
            let text = std::fs::read_to_string(&sub).unwrap_or_else(|e| panic!("{sub:?}: {e}"));
            assert!(text.contains(&format!(".TH nvraid-{command} 1")), "{sub:?}");
        }
        // The create page carries create's options, from the same definitions as --help.
        let create = std::fs::read_to_string(dir.path().join("pages/nvraid-create.1")).unwrap();
        for option in ["\\-\\-level", "\\-\\-chunk", "\\-\\-size", "\\-\\-force"] {
            assert!(create.contains(option), "nvraid-create.1 lacks {option}");
        }
    }

    #[test]
    fn completions_for_each_shell_know_every_command() {
        let dir = tempfile::tempdir().unwrap();
        for shell in ["bash", "zsh", "fish"] {
            let script = ok(&["completions", shell], dir.path());
            for command in COMMANDS {
                assert!(
                    script.contains(command),
                    "{shell} completions lack {command}"
                );
            }
        }
        let bash = ok(&["completions", "bash"], dir.path());
        assert!(bash.contains("complete -F _nvraid"), "{bash}");
        let out = nvraid(&["completions", "tcsh"], dir.path());
        assert_eq!(
            out.status.code(),
            Some(2),
            "an unknown shell is a usage error"
        );
        // bash itself accepts the script.
        let file = dir.path().join("nvraid.bash");
        std::fs::write(&file, &bash).unwrap();
        let status = Command::new("bash").arg("-n").arg(&file).status().unwrap();
        assert!(status.success(), "bash -n rejects the completion script");
    }
}
