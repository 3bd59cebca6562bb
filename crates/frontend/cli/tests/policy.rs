//! `nvraid grow --consistency-policy bitmap|resync|ppl` and `--bitmap
//! internal|none`: an array's consistency policy changed offline, as
//! `mdadm --grow` changes it; md refuses to reshape an array with a
//! partial parity log, so this is the way to grow one.

mod common;

use common::reshape::*;
use common::*;
use std::path::{Path, PathBuf};

const MIB: u64 = 1 << 20;

/// A `level` array of `count` members of 16 MiB made with `extra` create
/// options, the pattern written over all of it; its members and size.
fn filled(dir: &Path, level: &str, count: usize, extra: &[&str]) -> (Vec<String>, u64) {
    let names: Vec<String> = (0..count).map(|i| format!("d{i}")).collect();
    let mut args = vec!["create", "--level", level, "--size", "16M"];
    args.extend_from_slice(extra);
    args.extend(names.iter().map(String::as_str));
    ok(&args, dir);
    let size = detail(dir, &names)["size_bytes"].as_u64().unwrap();
    std::fs::write(dir.join("data"), pattern(size)).unwrap();
    ok(&with(&["write", "--input", "data"], &names), dir);
    std::fs::remove_file(dir.join("data")).unwrap();
    (names, size)
}

fn policy_of(dir: &Path, m: &[String]) -> String {
    detail(dir, m)["consistency_policy"]
        .as_str()
        .unwrap()
        .to_string()
}

fn change(dir: &Path, m: &[String], args: &[&str]) -> serde_json::Value {
    let mut all = vec!["grow"];
    all.extend_from_slice(args);
    all.push("--json");
    serde_json::from_str(&ok(&with(&all, m), dir)).unwrap()
}

fn no_mismatch(dir: &Path, m: &[String], what: &str) {
    let check: serde_json::Value =
        serde_json::from_str(&ok(&with(&["check", "--json"], m), dir)).unwrap();
    assert_eq!(check["mismatch_sectors"], 0, "{what}: {check}");
}

#[test]
fn a_raid5_with_a_partial_parity_log_goes_to_resync_is_grown_and_goes_back_to_ppl() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let (m, size) = filled(d, "5", 4, &["--consistency-policy", "ppl"]);
    assert_eq!(policy_of(d, &m), "ppl");
    blank_mib(d, "d4", 17);
    // md's rule: no reshape with a PPL; the refusal names the way out.
    refused(
        &with(&["grow", "-n", "5", "--add", "d4"], &m),
        d,
        &["partial parity log", "--consistency-policy resync"],
    );
    let off = change(d, &m, &["--consistency-policy", "resync"]);
    assert_eq!(off["from"], "ppl", "{off}");
    assert_eq!(off["to"], "resync", "{off}");
    assert_eq!(policy_of(d, &m), "resync");
    ok(&with(&["grow", "-n", "5", "--add", "d4"], &m), d);
    let mut five = m.clone();
    five.push("d4".into());
    let on = change(d, &five, &["--consistency-policy", "ppl"]);
    assert_eq!(on["to"], "ppl", "{on}");
    assert!(on["ppl_area_bytes"].as_u64().unwrap() > 64 << 10, "{on}");
    assert_eq!(policy_of(d, &five), "ppl");
    assert!(read(d, &five, size) == pattern(size), "the bytes differ");
    no_mismatch(d, &five, "ppl again");
    // Again: nothing to do, nothing written.
    let before = hash_files(d);
    let again = change(d, &five, &["--consistency-policy", "ppl"]);
    assert_eq!(again["changed"], false, "{again}");
    assert_eq!(hash_files(d), before);
}

#[test]
fn a_bitmap_is_added_and_removed_on_raid1_raid10_and_raid5_and_ppl_trades_places_with_it() {
    for (level, count) in [("1", 2), ("10", 4), ("5", 3)] {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        let (m, size) = filled(d, level, count, &["--bitmap", "none"]);
        assert_eq!(policy_of(d, &m), "resync", "raid{level}");
        let added = change(d, &m, &["--bitmap", "internal", "--bitmap-chunk", "1M"]);
        assert_eq!(added["bitmap_chunk_bytes"], MIB, "raid{level}: {added}");
        let det = detail(d, &m);
        assert_eq!(det["consistency_policy"], "bitmap", "raid{level}: {det}");
        assert_eq!(det["bitmap"]["chunk_bytes"], MIB, "raid{level}: {det}");
        assert_eq!(det["bitmap"]["dirty_chunks"], 0, "raid{level}: {det}");
        // The bitmap is kept: a write through nvraid sets and clears bits,
        // and the array stays readable.
        std::fs::write(d.join("x"), vec![0x5au8; 4096]).unwrap();
        ok(&with(&["write", "--input", "x", "--offset", "8192"], &m), d);
        let mut want = pattern(size);
        want[8192..12288].fill(0x5a);
        assert!(
            read(d, &m, size) == want,
            "raid{level}: bytes with a bitmap"
        );
        let removed = change(d, &m, &["--bitmap", "none"]);
        assert_eq!(removed["from"], "bitmap", "raid{level}: {removed}");
        assert_eq!(policy_of(d, &m), "resync", "raid{level}");
        assert!(read(d, &m, size) == want, "raid{level}: bytes without");
        no_mismatch(d, &m, level);
        if level == "5" {
            // bitmap -> ppl passes through resync: two changes recorded.
            change(d, &m, &["--consistency-policy", "bitmap"]);
            let events = detail(d, &m)["events"].as_u64().unwrap();
            let ppl = change(d, &m, &["--consistency-policy", "ppl"]);
            assert_eq!(ppl["from"], "bitmap", "{ppl}");
            assert_eq!(ppl["events"], events + 2, "{ppl}");
            assert_eq!(policy_of(d, &m), "ppl");
            let back = change(d, &m, &["--consistency-policy", "bitmap"]);
            assert_eq!(back["from"], "ppl", "{back}");
            assert_eq!(policy_of(d, &m), "bitmap");
            assert!(read(d, &m, size) == want, "raid5: bytes after ppl");
        }
    }
}

#[test]
fn policy_changes_that_cannot_be_made_are_refused_by_name_and_nothing_is_written() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    // RAID 0: nothing to keep consistent.
    let r0 = d.join("r0");
    std::fs::create_dir(&r0).unwrap();
    let (m0, _) = filled(&r0, "0", 2, &[]);
    refused(
        &with(&["grow", "--bitmap", "internal"], &m0),
        &r0,
        &["raid0", "no copies or parity"],
    );
    // A partial parity log on RAID 6 (md keeps one for RAID 4/5 only).
    let r6 = d.join("r6");
    std::fs::create_dir(&r6).unwrap();
    let (m6, _) = filled(&r6, "6", 4, &["--bitmap", "none"]);
    refused(
        &with(&["grow", "--consistency-policy", "ppl"], &m6),
        &r6,
        &["--consistency-policy ppl", "RAID 4/5 only"],
    );
    // A member missing.
    refused(
        &with(&["grow", "--consistency-policy", "bitmap"], &m6[..3]),
        &r6,
        &["role 3", "not given"],
    );
    // md's write journal is the policy.
    let rj = d.join("rj");
    std::fs::create_dir(&rj).unwrap();
    ok(
        &[
            "create",
            "--level",
            "5",
            "--size",
            "16M",
            "--write-journal",
            "j",
            "a",
            "b",
            "c",
        ],
        &rj,
    );
    refused(
        &["grow", "--bitmap", "none", "a", "b", "c", "j"],
        &rj,
        &["write journal"],
    );
    // An array needing its resync (made over members that held bytes).
    let dirty = d.join("dirty");
    std::fs::create_dir(&dirty).unwrap();
    for n in ["a", "b", "c"] {
        std::fs::write(dirty.join(n), vec![0x11u8; 16 << 20]).unwrap();
    }
    ok(
        &[
            "create", "--level", "5", "--size", "15M", "--bitmap", "none", "--force", "a", "b", "c",
        ],
        &dirty,
    );
    refused(
        &["grow", "--consistency-policy", "ppl", "a", "b", "c"],
        &dirty,
        &["not clean", "nvraid repair"],
    );
    // A bitmap whose chunk needs more room than the members have behind
    // their superblock (sparse members of 64 GiB, 4 KiB per bit).
    let big = d.join("big");
    std::fs::create_dir(&big).unwrap();
    ok(
        &[
            "create", "--level", "1", "--size", "64G", "--bitmap", "none", "a", "b",
        ],
        &big,
    );
    let head = |n: &str| {
        let mut f = std::fs::File::open(big.join(n)).unwrap();
        let mut buf = vec![0u8; 2 << 20];
        std::io::Read::read_exact(&mut f, &mut buf).unwrap();
        buf
    };
    let before = (head("a"), head("b"));
    let stderr = refusal(
        &[
            "grow",
            "--bitmap",
            "internal",
            "--bitmap-chunk",
            "4K",
            "a",
            "b",
        ],
        &big,
    );
    assert!(
        stderr.contains("--bitmap-chunk") && stderr.contains("larger"),
        "{stderr}"
    );
    assert!((head("a"), head("b")) == before, "the metadata changed");
    // Words that are no policy.
    refused(
        &with(&["grow", "--consistency-policy", "journal"], &m6),
        &r6,
        &["journal", "add-journal"],
    );
    refused(
        &with(&["grow", "--bitmap", "external"], &m6),
        &r6,
        &["--bitmap external"],
    );
}

#[test]
fn a_policy_change_killed_at_any_write_assembles_and_running_it_again_finishes_it() {
    // ppl -> bitmap on a RAID 5 of three: the ppl's removal recorded (3
    // superblocks), the bitmap written (3), its record (3).
    let points = [
        "policy-superblock:1",
        "policy-superblock:3",
        "policy-write:2",
        "policy-superblock:4",
        "policy-superblock:5",
    ];
    for point in points {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        let (m, size) = filled(d, "5", 3, &["--consistency-policy", "ppl"]);
        killed_at(
            d,
            &with(&["grow", "--consistency-policy", "bitmap"], &m),
            point,
        );
        // As it was left: every byte there, or (members disagreeing on the
        // bitmap, which md assembles by the freshest superblock) refused
        // naming the command that finishes the change.
        let mut args = vec!["read".to_string(), "--length".into(), size.to_string()];
        args.extend(m.iter().cloned());
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let out = nvraid(&args, d);
        if out.status.success() {
            assert!(out.stdout == pattern(size), "{point}: mid-way");
        } else {
            let stderr = String::from_utf8_lossy(&out.stderr);
            assert!(
                stderr.contains("nvraid grow --consistency-policy"),
                "{point}: {stderr}"
            );
        }
        change(d, &m, &["--consistency-policy", "bitmap"]);
        let det = detail(d, &m);
        assert_eq!(det["consistency_policy"], "bitmap", "{point}: {det}");
        let events: Vec<u64> = det["members"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| m["events"].as_u64().unwrap())
            .collect();
        assert!(
            events.windows(2).all(|w| w[0] == w[1]),
            "{point}: {events:?}"
        );
        assert!(read(d, &m, size) == pattern(size), "{point}");
        no_mismatch(d, &m, point);
    }
}

#[test]
fn the_kernel_assembles_arrays_whose_consistency_policy_nvraid_changed() {
    // A RAID 5 taken off its PPL, grown, and given it back; a RAID 5 and a
    // RAID 1 given a bitmap; a RAID 10 that lost its bitmap. md assembles
    // each with that policy, reads the pattern, takes writes, and its
    // check finds no mismatch.
    let dir = tempfile::tempdir().unwrap();
    let mut images: Vec<PathBuf> = Vec::new();
    let mut lengths = String::new();
    let cases: [(&str, &str, usize, &[&str], &str); 4] = [
        ("ppl5", "5", 4, &["--consistency-policy", "ppl"], "ppl"),
        ("bitmap5", "5", 3, &["--bitmap", "none"], "bitmap"),
        ("bitmap1", "1", 2, &["--bitmap", "none"], "bitmap"),
        ("resync10", "10", 4, &["--bitmap", "internal"], "resync"),
    ];
    for (name, level, count, extra, to) in cases {
        let sub = dir.path().join(name);
        std::fs::create_dir(&sub).unwrap();
        let mut extra = extra.to_vec();
        extra.extend_from_slice(&["--name", name]);
        let (mut m, size) = filled(&sub, level, count, &extra);
        lengths.push_str(&format!("    *{name}) n={size} ;;\n"));
        if name == "ppl5" {
            change(&sub, &m, &["--consistency-policy", "resync"]);
            blank_mib(&sub, "d4", 17);
            ok(&with(&["grow", "-n", "5", "--add", "d4"], &m), &sub);
            m.push("d4".into());
        }
        change(&sub, &m, &["--consistency-policy", to]);
        assert_eq!(policy_of(&sub, &m), to, "{name}");
        images.extend(m.iter().map(|n| sub.join(n)));
    }
    let script = dir.path().join("check.sh");
    std::fs::write(
        &script,
        format!(
            r#"set +e
mdadm --assemble --scan --run 2>&1
cat /proc/mdstat
for sys in /sys/block/md*; do
  md=/dev/${{sys##*/}}
  name=$(mdadm --detail $md | sed -n 's/ *Name : \([^ ]*\).*/\1/p')
  case "$name" in
{lengths}    *) n=4096 ;;
  esac
  if pattern verify -n $n $md; then pv=ok; else pv=FAILED; fi
  dd if=/dev/urandom of=$md bs=64k count=8 seek=3 oflag=direct 2>/dev/null
  sync
  echo check > $sys/md/sync_action; sleep 1; mdadm --wait $md >/dev/null 2>&1
  echo "KERNEL name=$name policy=$(cat $sys/md/consistency_policy) pattern=$pv mismatch=$(cat $sys/md/mismatch_cnt) degraded=$(cat $sys/md/degraded) bitmap=$(cat $sys/md/bitmap/location 2>/dev/null || echo none)"
done
dmesg | grep -i -e ppl -e bitmap -e 'md/raid' | tail -20
"#
        ),
    )
    .unwrap();
    let out = mdvm_on("mdvm", "6.1", &[])
        .arg("--snapshot")
        .arg("--script")
        .arg(&script)
        .args(&images)
        .output()
        .expect("tools/mdvm/mdvm (./test.sh installs its tools)");
    let report = String::from_utf8_lossy(&out.stdout).into_owned();
    eprintln!("{report}");
    for (name, _, _, _, to) in cases {
        let line = report
            .lines()
            .find(|l| {
                l.starts_with("KERNEL ")
                    && l.split_whitespace()
                        .find_map(|w| w.strip_prefix("name="))
                        .is_some_and(|n| n.ends_with(name))
            })
            .unwrap_or_else(|| panic!("{name} not assembled:\n{report}"));
        assert!(
            line.contains(&format!("policy={to} "))
                && line.contains("pattern=ok")
                && line.contains("mismatch=0")
                && line.contains("degraded=0"),
            "{line}\n{report}"
        );
        if to == "bitmap" {
            assert!(line.contains("bitmap=+8"), "{line}\n{report}");
        }
    }
}
