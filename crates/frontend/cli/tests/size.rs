//! `nvraid grow --size`: `max` after every member grew raises the array
//! and marks the new region for a resync, as md does (the bitmap's size
//! raised and its new bits set, `resync_offset` at the old end); a
//! smaller size is refused without `--force`, naming the filesystem check
//! to do first, and nothing is written; the kernel's md assembles a
//! resized array, resyncs the new region and finds no mismatch.

mod common;

use common::reshape::*;
use common::*;
use std::io::Write;
use std::path::{Path, PathBuf};

const PER: u64 = 14 * MIB;

fn data_members(level: &str, count: u64) -> u64 {
    match level {
        "1" => 1,
        "10" => count / 2,
        "6" => count - 2,
        _ => count - 1,
    }
}

/// A RAID `level` of `count` 15 MiB members with a bitmap, filled with
/// the pattern.
fn filled(dir: &Path, level: &str, count: usize, name: &str) -> (Vec<String>, Vec<u8>) {
    let names: Vec<String> = (0..count).map(|i| format!("d{i}")).collect();
    let mut args = vec![
        "create", "--level", level, "--bitmap", "internal", "--size", "15M", "--name", name,
    ];
    args.extend(names.iter().map(String::as_str));
    ok(&args, dir);
    let data = pattern(data_members(level, count as u64) * PER);
    std::fs::write(dir.join("data"), &data).unwrap();
    ok(&with(&["write", "--input", "data"], &names), dir);
    std::fs::remove_file(dir.join("data")).unwrap();
    (names, data)
}

/// Every member grows by `mib` MiB of bytes that are no array's (so the
/// new region's copies or parity disagree until it is resynced).
fn grow_members(dir: &Path, members: &[String], mib: u64) {
    for (i, name) in members.iter().enumerate() {
        let mut f = std::fs::OpenOptions::new()
            .append(true)
            .open(dir.join(name))
            .unwrap();
        let junk: Vec<u8> = (0..mib * MIB)
            .map(|b| (b as u8).wrapping_mul(31).wrapping_add(i as u8 * 7 + 1))
            .collect();
        f.write_all(&junk).unwrap();
    }
}

fn json(dir: &Path, args: &[&str]) -> serde_json::Value {
    serde_json::from_str(&ok(args, dir)).unwrap()
}

#[test]
fn size_max_after_the_members_grew_raises_the_array_and_resyncs_the_new_region() {
    for (level, count) in [("5", 4), ("6", 4), ("1", 2), ("10", 4)] {
        let dir = tempfile::tempdir().unwrap();
        let (m, data) = filled(dir.path(), level, count, "size");
        grow_members(dir.path(), &m, 8);
        let r = json(dir.path(), &with(&["grow", "--size", "max", "--json"], &m));
        let grown = data_members(level, count as u64) * 22 * MIB;
        assert_eq!(r["size_bytes"], grown, "raid{level}: {r}");
        assert_eq!(r["member_bytes"], 22 * MIB, "raid{level}: {r}");
        let d = json(dir.path(), &with(&["detail", "--json"], &m));
        assert_eq!(d["size_bytes"], grown, "raid{level}: {d}");
        assert_ne!(
            d["state"], "clean",
            "raid{level}: the new region is due a resync: {d}"
        );
        assert!(
            d["bitmap"]["dirty_chunks"].as_u64().unwrap() > 0,
            "raid{level}: the new region's bits: {d}"
        );
        let len = (data.len() as u64).to_string();
        assert!(
            ok_bytes(&with(&["read", "--length", &len], &m), dir.path()) == data,
            "raid{level}: the old bytes changed"
        );
        ok(&with(&["repair"], &m), dir.path());
        let check = json(dir.path(), &with(&["check", "--json"], &m));
        assert_eq!(check["mismatch_sectors"], 0, "raid{level}: {check}");
        let d = json(dir.path(), &with(&["detail", "--json"], &m));
        assert_eq!(d["state"], "clean", "raid{level}: {d}");
        assert!(
            ok_bytes(&with(&["read", "--length", &len], &m), dir.path()) == data,
            "raid{level}: the old bytes changed in the resync"
        );
    }
}

#[test]
fn a_smaller_size_is_refused_without_force_naming_the_filesystem_check_and_nothing_is_written() {
    let dir = tempfile::tempdir().unwrap();
    let (m, data) = filled(dir.path(), "5", 4, "size");
    refused(
        &with(&["grow", "--size", "10M"], &m),
        dir.path(),
        &["cuts off", "resize2fs", "xfs cannot shrink", "--force"],
    );
    let r = json(
        dir.path(),
        &with(&["grow", "--size", "10M", "--force", "--json"], &m),
    );
    assert_eq!(r["size_bytes"], 30 * MIB, "{r}");
    assert!(r["resync_from_bytes"].is_null(), "{r}");
    let len = (30 * MIB).to_string();
    assert!(
        ok_bytes(&with(&["read", "--length", &len], &m), dir.path()) == data[..30 * MIB as usize]
    );
    let d = json(dir.path(), &with(&["detail", "--json"], &m));
    assert_eq!(d["state"], "clean", "{d}");
    let check = json(dir.path(), &with(&["check", "--json"], &m));
    assert_eq!(check["mismatch_sectors"], 0, "{check}");
    // And back to the whole members: the cut-off end is resynced.
    ok(&with(&["grow", "--size", "max"], &m), dir.path());
    ok(&with(&["repair"], &m), dir.path());
    let check = json(dir.path(), &with(&["check", "--json"], &m));
    assert_eq!(check["mismatch_sectors"], 0, "{check}");
}

#[test]
fn size_changes_md_refuses_are_refused_by_name_and_nothing_is_written() {
    let dir = tempfile::tempdir().unwrap();
    let r0: Vec<String> = (0..2).map(|i| format!("z{i}")).collect();
    ok(
        &with(&["create", "--level", "0", "--size", "15M"], &r0),
        dir.path(),
    );
    refused(
        &with(&["grow", "--size", "max"], &r0),
        dir.path(),
        &["raid0", "cannot be resized"],
    );
    let (m, _) = filled(dir.path(), "5", 4, "size");
    refused(
        &with(&["grow", "--size", "max"], &m),
        dir.path(),
        &["nothing to change", "larger first"],
    );
    refused(
        &with(&["grow", "--size", "20M"], &m),
        dir.path(),
        &["--size", "holds only"],
    );
    refused(
        &with(&["grow", "--size", "max"], &m[..3]),
        dir.path(),
        &["degraded"],
    );
}

#[test]
fn the_kernel_assembles_a_grown_size_resyncs_the_new_region_and_finds_no_mismatch() {
    let dir = tempfile::tempdir().unwrap();
    let (m, _) = filled(dir.path(), "5", 4, "sized");
    grow_members(dir.path(), &m, 8);
    ok(&with(&["grow", "--size", "max"], &m), dir.path());
    let images: Vec<PathBuf> = m.iter().map(|n| dir.path().join(n)).collect();
    let report = kernel_resyncs(
        dir.path(),
        &images,
        3 * PER,
        "size=$(blockdev --getsize64 $md) component=$(cat $sys/md/component_size)",
        "bitmap=$(cat $sys/md/bitmap/location)",
    );
    let line = report
        .lines()
        .find(|l| l.starts_with("KERNEL "))
        .unwrap_or_else(|| panic!("no array assembled:\n{report}"));
    assert!(
        line.contains(&format!("size={}", 3 * 22 * MIB))
            && line.contains(&format!("component={}", 22 * 1024))
            && line.contains("pattern=ok")
            && line.contains("mismatch=0")
            && line.contains("bitmap=+8"),
        "{line}\n{report}"
    );
    assert!(
        !report.contains("out of date"),
        "md found a bitmap out of date:\n{report}"
    );
}

/// A RAID `level` of 4 members of 16 MiB files using 8 MiB of each (9 MiB
/// with the 1 MiB before the data, as `create --size` counts), with
/// md's bitmap of 4 KiB chunks, filled with the pattern (the same arrays
/// as the kernel's own `--grow --size max` measured in tools/mdvm).
fn small_bitmap(dir: &Path, level: &str, name: &str) -> Vec<String> {
    let names: Vec<String> = (0..4).map(|i| format!("d{i}")).collect();
    for n in &names {
        std::fs::File::create(dir.join(n))
            .unwrap()
            .set_len(16 * MIB)
            .unwrap();
    }
    let mut args = vec![
        "create",
        "--level",
        level,
        "--bitmap",
        "internal",
        "--bitmap-chunk",
        "4K",
        "--size",
        "9M",
        "--name",
        name,
    ];
    args.extend(names.iter().map(String::as_str));
    ok(&args, dir);
    let data = pattern(data_members(level, 4) * 8 * MIB);
    std::fs::write(dir.join("data"), &data).unwrap();
    ok(&with(&["write", "--input", "data"], &names), dir);
    std::fs::remove_file(dir.join("data")).unwrap();
    // A RAID 5 over members that existed is created due a resync.
    ok(&with(&["repair"], &names), dir);
    names
}

#[test]
fn size_max_doubles_the_bitmap_chunk_when_the_bits_outgrow_their_room() {
    // md's resize keeps the bitmap in the sectors it had (its header's
    // sectors_reserved, or what it takes now): 4 KiB chunks over a RAID
    // 10's 16 MiB (4096 bits, two sectors) or a RAID 5's member rows of
    // 8 MiB (2048 bits, one sector) do not fit at 15 MiB of each member,
    // so the chunk doubles to 8 KiB: 3840 and 1920 bits, as the kernel's
    // own `mdadm --grow --size=max` of the same arrays made them.
    for (level, chunks) in [("10", 3840), ("5", 1920)] {
        let dir = tempfile::tempdir().unwrap();
        let m = small_bitmap(dir.path(), level, "doubled");
        let before = json(dir.path(), &with(&["detail", "--json"], &m));
        assert_eq!(
            before["bitmap"]["chunk_bytes"], 4096,
            "raid{level}: {before}"
        );
        let r = json(dir.path(), &with(&["grow", "--size", "max", "--json"], &m));
        assert_eq!(r["member_bytes"], 15 * MIB, "raid{level}: {r}");
        let d = json(dir.path(), &with(&["detail", "--json"], &m));
        assert_eq!(d["bitmap"]["chunk_bytes"], 8192, "raid{level}: {d}");
        assert_eq!(d["bitmap"]["chunks"], chunks, "raid{level}: {d}");
        let data = pattern(data_members(level, 4) * 8 * MIB);
        let len = (data.len() as u64).to_string();
        assert!(
            ok_bytes(&with(&["read", "--length", &len], &m), dir.path()) == data,
            "raid{level}: the old bytes changed"
        );
        ok(&with(&["repair"], &m), dir.path());
        let check = json(dir.path(), &with(&["check", "--json"], &m));
        assert_eq!(check["mismatch_sectors"], 0, "raid{level}: {check}");
    }
}

#[test]
fn the_kernel_assembles_arrays_whose_bitmap_chunk_size_max_doubled() {
    // md assembles the RAID 10 and RAID 5 nvraid resized (bitmap chunk
    // doubled to 8 KiB), keeps that chunk, resyncs the new region from
    // resync_offset, finds no bitmap out of date and no mismatch.
    let dir = tempfile::tempdir().unwrap();
    let mut images = Vec::new();
    for level in ["10", "5"] {
        let sub = dir.path().join(format!("r{level}"));
        std::fs::create_dir(&sub).unwrap();
        let m = small_bitmap(&sub, level, &format!("r{level}"));
        ok(&with(&["grow", "--size", "max"], &m), &sub);
        images.extend(m.iter().map(|n| sub.join(n)));
    }
    let report = kernel_resyncs(
        dir.path(),
        &images,
        16 * MIB,
        "level=$(cat $sys/md/level) size=$(blockdev --getsize64 $md)",
        "bitmap=$(cat $sys/md/bitmap/location) bchunk=$(cat $sys/md/bitmap/chunksize)",
    );
    let lines: Vec<&str> = report
        .lines()
        .filter(|l| l.starts_with("KERNEL "))
        .collect();
    assert_eq!(lines.len(), 2, "two arrays expected:\n{report}");
    for (level, size) in [("raid10", 30 * MIB), ("raid5", 45 * MIB)] {
        let line = lines
            .iter()
            .find(|l| l.contains(&format!("level={level} ")))
            .unwrap_or_else(|| panic!("no {level}:\n{report}"));
        assert!(
            line.contains(&format!("size={size}"))
                && line.contains("pattern=ok")
                && line.contains("mismatch=0")
                && line.contains("bitmap=+8")
                && line.contains("bchunk=8192"),
            "{line}\n{report}"
        );
    }
    assert!(
        !report.contains("out of date"),
        "md found a bitmap out of date:\n{report}"
    );
}

/// md in tools/mdvm (Linux 6.1) assembles the arrays on `images`, resyncs
/// them at full speed, checks them, and prints a `KERNEL` line per array:
/// `before` (fields in shell, such as `size=$(blockdev --getsize64 $md)`),
/// `pattern=` (the pattern's first `pattern_bytes` read back: `ok` or
/// `FAILED`), `mismatch=` and `after`. The whole report.
fn kernel_resyncs(
    dir: &Path,
    images: &[PathBuf],
    pattern_bytes: u64,
    before: &str,
    after: &str,
) -> String {
    let script = dir.join("check.sh");
    std::fs::write(
        &script,
        format!(
            r#"set +e
mdadm --assemble --scan --run 2>&1
echo 200000 > /proc/sys/dev/raid/speed_limit_min
echo 2000000 > /proc/sys/dev/raid/speed_limit_max
cat /proc/mdstat
i=0; while grep -q -e resync -e recovery /proc/mdstat && [ $i -lt 240 ]; do sleep 1; i=$((i+1)); done
for sys in /sys/block/md*; do
  md=/dev/${{sys##*/}}
  echo check > $sys/md/sync_action; sleep 1; mdadm --wait $md >/dev/null 2>&1
  if pattern verify -n {pattern_bytes} $md; then pv=ok; else pv=FAILED; fi
  echo "KERNEL {before} pattern=$pv mismatch=$(cat $sys/md/mismatch_cnt) {after}"
done
dmesg | grep -i -e bitmap -e resync | tail -10
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
