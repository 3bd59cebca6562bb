//! mdadm's `--backup-file` (docs/reshape.md, "A backup file"): `nvraid
//! grow --backup-file FILE` keeps a grow in place's critical section in a
//! file in mdadm's format (beside nvraid's backup area, or alone when the
//! new members have no room for it); `grow --continue --backup-file FILE`
//! and `read --backup-file FILE` restore it; a missing, foreign, damaged
//! or stale file is refused by name with nothing changed; mdadm's
//! `--assemble --backup-file` restores what nvraid wrote.

mod common;

use common::reshape::*;
use common::*;
use std::path::{Path, PathBuf};

/// Data bytes each member holds (7 MiB members less 1 MiB of metadata).
const PER: u64 = 6 * MIB;
/// The critical section of a RAID 5 of 4 members in chunks of 1 MiB
/// growing to 5 (mdadm's `Grow_restart`): 12 MiB.
const SECTION: u64 = 12 * MIB;

/// A RAID 5 of 4 members of 7 MiB in chunks of 1 MiB (less than a chunk
/// of room below the data: the grow runs in place), named `name`, no
/// bitmap, filled with the pattern; and a blank fifth member of
/// `new_mib` MiB (12: room for nvraid's backup area; 8: none).
fn in_place(dir: &Path, name: &str, new_mib: u64) -> (Vec<String>, Vec<u8>) {
    in_place_level(dir, name, "5", new_mib)
}

/// [`in_place`] of RAID `level` (5 or 6).
fn in_place_level(dir: &Path, name: &str, level: &str, new_mib: u64) -> (Vec<String>, Vec<u8>) {
    let names: Vec<String> = (0..4).map(|i| format!("d{i}")).collect();
    let mut args = vec![
        "create", "--level", level, "--chunk", "1M", "--bitmap", "none", "--size", "7M", "--name",
        name,
    ];
    args.extend(names.iter().map(String::as_str));
    ok(&args, dir);
    let data = pattern(if level == "6" { 2 } else { 3 } * PER);
    std::fs::write(dir.join("data"), &data).unwrap();
    ok(&with(&["write", "--input", "data"], &names), dir);
    std::fs::remove_file(dir.join("data")).unwrap();
    blank_mib(dir, "d4", new_mib);
    (names, data)
}

fn all(old: &[String]) -> Vec<String> {
    old.iter().cloned().chain(["d4".to_string()]).collect()
}

fn examine(dir: &Path, name: &str) -> serde_json::Value {
    let out = ok(&["examine", "--json", name], dir);
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    v[0]["superblock"].clone()
}

/// Every byte of the grown array (the pattern, then zeros) and every
/// parity right.
fn assert_grown(dir: &Path, members: &[String], data: &[u8], what: &str) {
    assert_grown_to(dir, members, data, 4 * PER, what)
}

/// [`assert_grown`] of an array of `size` bytes.
fn assert_grown_to(dir: &Path, members: &[String], data: &[u8], size: u64, what: &str) {
    let got = read(dir, members, size);
    assert!(
        got[..data.len()] == data[..],
        "{what}: the old bytes moved wrong"
    );
    assert!(
        got[data.len()..].iter().all(|&b| b == 0),
        "{what}: the new space is not zeros"
    );
    assert_checks_clean(dir, members, what);
}

/// Copy every file of `from` into a new temporary directory.
fn copied(from: &Path) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let path = entry.unwrap().path();
        std::fs::copy(&path, dir.path().join(path.file_name().unwrap())).unwrap();
    }
    dir
}

/// The array's UUID as the superblock holds it (16 bytes).
fn set_uuid(dir: &Path, name: &str) -> Vec<u8> {
    let text = examine(dir, name)["set_uuid"]
        .as_str()
        .unwrap()
        .replace([':', '-'], "");
    (0..16)
        .map(|i| u8::from_str_radix(&text[2 * i..2 * i + 2], 16).unwrap())
        .collect()
}

fn le64(r: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(r[at..at + 8].try_into().unwrap())
}

/// Grow killed at the first checkpoint inside the section (position 4
/// MiB), with the file `bf` written.
fn killed_inside(dir: &Path, old: &[String]) {
    killed_inside_at(dir, old, "reshape-superblock:8")
}

/// Grow (`--step 4M`, the file `bf`) killed at `point` inside the section.
fn killed_inside_at(dir: &Path, old: &[String], point: &str) {
    killed_at(
        dir,
        &with(
            &[
                "grow",
                "-n",
                "5",
                "--add",
                "d4",
                "--step",
                "4M",
                "--backup-file",
                "bf",
            ],
            old,
        ),
        point,
    );
    let position = examine(dir, "d0")["reshape_position"].as_u64().unwrap() * 512;
    assert!(
        position > 0 && position < SECTION,
        "killed at {position}, not inside the section"
    );
}

#[test]
fn a_grow_in_place_with_a_backup_file_writes_the_section_in_mdadms_format() {
    for new_mib in [12, 8] {
        let dir = tempfile::tempdir().unwrap();
        let (old, data) = in_place(dir.path(), "bf", new_mib);
        killed_inside(dir.path(), &old);
        let file = std::fs::read(dir.path().join("bf")).unwrap();
        let r = &file[..512];
        assert_eq!(&r[..16], b"md_backup_data-1", "{new_mib}: magic");
        assert_eq!(r[16..32], set_uuid(dir.path(), "d0")[..], "{new_mib}: uuid");
        assert_eq!(le64(r, 40), 8, "{new_mib}: devstart (sectors)");
        assert_eq!(le64(r, 48), 0, "{new_mib}: arraystart");
        assert_eq!(le64(r, 56) * 512, SECTION, "{new_mib}: length");
        // mdadm's bsb_csum of 64 bytes starting with 'm' (see md_backup.rs).
        assert_eq!(
            u32::from_le_bytes(r[64..68].try_into().unwrap()),
            613_566_741,
            "{new_mib}: checksum"
        );
        assert!(
            file[4096..4096 + SECTION as usize] == data[..SECTION as usize],
            "{new_mib}: the section's bytes"
        );
        let tail = 4096 + SECTION as usize;
        assert_eq!(
            file[tail..tail + 512],
            file[..512],
            "{new_mib}: second record"
        );
        // The grow finished by continue with the file; the file removed.
        let m = all(&old);
        ok(
            &with(&["grow", "--continue", "--backup-file", "bf"], &m),
            dir.path(),
        );
        assert_grown(dir.path(), &m, &data, &format!("{new_mib} MiB"));
        assert!(
            !dir.path().join("bf").exists(),
            "{new_mib}: the file stayed"
        );
    }
}

#[test]
fn a_grow_in_place_with_no_room_for_its_backup_area_grows_with_a_backup_file_alone() {
    let dir = tempfile::tempdir().unwrap();
    let (old, data) = in_place(dir.path(), "alone", 8);
    // Without the file: refused as before, nothing changed.
    refused(
        &with(&["grow", "-n", "5", "--add", "d4"], &old),
        dir.path(),
        &["d4", "too small", "backup of the critical section"],
    );
    let out = ok(
        &with(
            &["grow", "-n", "5", "--add", "d4", "--backup-file", "bf"],
            &old,
        ),
        dir.path(),
    );
    assert!(out.contains("from 4 to 5 members"), "{out}");
    // No backup area: the new member's data starts where the others' do.
    assert_eq!(examine(dir.path(), "d4")["data_offset_sectors"], 2048);
    assert!(
        !dir.path().join("bf").exists(),
        "the file stayed after the grow"
    );
    assert_grown(dir.path(), &all(&old), &data, "grown with the file alone");
    // A RAID 6 (4 -> 5 members: a section of 6 MiB), killed inside it
    // mid-step, continued from the file.
    let dir = tempfile::tempdir().unwrap();
    let (old, data) = in_place_level(dir.path(), "alone6", "6", 8);
    killed_at(
        dir.path(),
        &with(
            &[
                "grow",
                "-n",
                "5",
                "--add",
                "d4",
                "--step",
                "3M",
                "--backup-file",
                "bf",
            ],
            &old,
        ),
        "reshape-write:9",
    );
    let position = examine(dir.path(), "d0")["reshape_position"]
        .as_u64()
        .unwrap()
        * 512;
    assert!(position > 0 && position < 6 * MIB, "killed at {position}");
    let m = all(&old);
    ok(
        &with(&["grow", "--continue", "--backup-file", "bf"], &m),
        dir.path(),
    );
    assert_grown_to(dir.path(), &m, &data, 3 * PER, "RAID 6 with the file alone");
}

#[test]
fn a_grow_killed_at_any_write_of_its_critical_section_is_restored_from_the_backup_file() {
    // For 4 -> 5 members of 1 MiB chunks the section ends at 12 MiB: with
    // steps of 4 MiB, three steps inside it (each 5 member writes and the
    // flush, then 5 superblocks), the record before them (5 superblocks),
    // the file's writes (bytes, records) before that and its forgetting
    // after. With nvraid's backup area too (12 MiB new member) its own
    // backup writes; without (8 MiB) the file alone.
    for new_mib in [12u64, 8] {
        let template = tempfile::tempdir().unwrap();
        let (old, data) = in_place(template.path(), "crash", new_mib);
        let m = all(&old);
        let grow = with(
            &[
                "grow",
                "-n",
                "5",
                "--add",
                "d4",
                "--step",
                "4M",
                "--backup-file",
                "bf",
            ],
            &old,
        );
        let mut points: Vec<String> = (1..=3)
            .map(|n| format!("reshape-backup-file:{n}"))
            .collect();
        points.extend((1..=18).map(|n| format!("reshape-write:{n}")));
        points.extend((1..=20).map(|n| format!("reshape-superblock:{n}")));
        if new_mib == 12 {
            points.extend((1..=9).map(|n| format!("reshape-backup:{n}")));
        }
        for point in &points {
            let what = format!("{new_mib} MiB, {point}");
            let dir = copied(template.path());
            killed_at(dir.path(), &grow, point);
            if point.starts_with("reshape-backup-file:") && point != "reshape-backup-file:3" {
                // Before the record: the array as it was.
                assert!(
                    read(dir.path(), &old, data.len() as u64) == data,
                    "{what}: the array changed"
                );
                continue;
            }
            let recorded = !(1..=5).any(|n| *point == format!("reshape-superblock:{n}"));
            if recorded {
                // Read as left, the section from the file.
                let got = ok_bytes(
                    &with(
                        &[
                            "read",
                            "--length",
                            &data.len().to_string(),
                            "--backup-file",
                            "bf",
                        ],
                        &m,
                    ),
                    dir.path(),
                );
                assert!(got == data, "{what}: read with the file differs");
            }
            let out = ok(
                &with(
                    &["grow", "--continue", "--step", "4M", "--backup-file", "bf"],
                    &m,
                ),
                dir.path(),
            );
            assert!(out.contains("to 5 members"), "{what}: {out}");
            assert_grown(dir.path(), &m, &data, &what);
        }
    }
}

#[test]
fn a_backup_file_missing_foreign_damaged_or_stale_is_refused_by_name_unchanged() {
    let dir = tempfile::tempdir().unwrap();
    let (old, _) = in_place(dir.path(), "refuse", 8);
    killed_inside(dir.path(), &old);
    let m = all(&old);
    // No file: the section is nowhere else.
    refused(
        &with(&["grow", "--continue"], &m),
        dir.path(),
        &["--backup-file", "critical section", "nothing was written"],
    );
    refused(
        &with(&["read", "--length", "4M", "--offset", "4M"], &m),
        dir.path(),
        &["--backup-file", "critical section"],
    );
    // A file that is not there.
    refused(
        &with(&["grow", "--continue", "--backup-file", "gone"], &m),
        dir.path(),
        &["--backup-file", "gone", "cannot open"],
    );
    // Another array's file (a second array grown the same way).
    let other = dir.path().join("other");
    std::fs::create_dir(&other).unwrap();
    let (other_old, _) = in_place(&other, "other", 8);
    killed_inside(&other, &other_old);
    std::fs::rename(other.join("bf"), dir.path().join("foreign")).unwrap();
    std::fs::remove_dir_all(&other).unwrap();
    refused(
        &with(&["grow", "--continue", "--backup-file", "foreign"], &m),
        dir.path(),
        &["foreign", "not of this array"],
    );
    let good = std::fs::read(dir.path().join("bf")).unwrap();
    // A damaged record.
    let mut bad = good.clone();
    bad[64] ^= 1;
    std::fs::write(dir.path().join("damaged"), &bad).unwrap();
    refused(
        &with(&["grow", "--continue", "--backup-file", "damaged"], &m),
        dir.path(),
        &["damaged", "checksum"],
    );
    // Stale: a copy that ends before the position (4 MiB): 2 MiB long
    // (mdadm's checksum does not cover the fields' values).
    let mut stale = good.clone();
    stale[56..64].copy_from_slice(&(2 * MIB / 512).to_le_bytes());
    std::fs::write(dir.path().join("stale"), &stale).unwrap();
    refused(
        &with(&["grow", "--continue", "--backup-file", "stale"], &m),
        dir.path(),
        &["stale", "inside its critical section"],
    );
    // Forgotten (length 0): the section was done when it was written.
    let mut done = good.clone();
    done[56..64].copy_from_slice(&0u64.to_le_bytes());
    std::fs::write(dir.path().join("done"), &done).unwrap();
    refused(
        &with(&["grow", "--continue", "--backup-file", "done"], &m),
        dir.path(),
        &["done", "no copy"],
    );
    // A grow naming a file that exists: refused, as mdadm refuses it.
    let dir2 = tempfile::tempdir().unwrap();
    let (old2, _) = in_place(dir2.path(), "exists", 8);
    std::fs::write(dir2.path().join("bf"), b"mine").unwrap();
    refused(
        &with(
            &["grow", "-n", "5", "--add", "d4", "--backup-file", "bf"],
            &old2,
        ),
        dir2.path(),
        &["bf", "cannot create"],
    );
}

#[test]
fn a_backup_file_where_none_is_needed_is_ignored_as_mdadm_ignores_it() {
    // Room to move the data offset (the default 1 MiB offset, 64 KiB
    // chunks): no backup; the file is not made.
    let dir = tempfile::tempdir().unwrap();
    let names: Vec<String> = (0..4).map(|i| format!("d{i}")).collect();
    let mut args = vec!["create", "--level", "5", "--bitmap", "none", "--size", "7M"];
    args.extend(names.iter().map(String::as_str));
    ok(&args, dir.path());
    let data = pattern(3 * PER);
    std::fs::write(dir.path().join("data"), &data).unwrap();
    ok(&with(&["write", "--input", "data"], &names), dir.path());
    blank_mib(dir.path(), "d4", 8);
    ok(
        &with(
            &["grow", "-n", "5", "--add", "d4", "--backup-file", "bf"],
            &names,
        ),
        dir.path(),
    );
    assert!(
        !dir.path().join("bf").exists(),
        "a file made though none was needed"
    );
    let m = all(&names);
    assert!(read(dir.path(), &m, data.len() as u64) == data);
    // A change that keeps no backup (a restripe moving the data offset):
    // said so, the file not made.
    let out = nvraid(
        &with(&["grow", "--chunk", "128K", "--backup-file", "bf"], &m),
        dir.path(),
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success() && stderr.contains("--backup-file bf: not used"),
        "{stderr}"
    );
    assert!(!dir.path().join("bf").exists(), "a file made by a restripe");
    assert!(read(dir.path(), &m, data.len() as u64) == data);
    // A grow in place killed past its section: continue needs no file, a
    // missing one is no matter.
    let dir = tempfile::tempdir().unwrap();
    let (old, data) = in_place(dir.path(), "past", 8);
    killed_at(
        dir.path(),
        &with(
            &[
                "grow",
                "-n",
                "5",
                "--add",
                "d4",
                "--step",
                "4M",
                "--backup-file",
                "bf",
            ],
            &old,
        ),
        "reshape-superblock:25",
    );
    let m = all(&old);
    assert!(
        examine(dir.path(), "d0")["reshape_position"]
            .as_u64()
            .unwrap()
            * 512
            > SECTION
    );
    assert!(read(dir.path(), &m, data.len() as u64) == data);
    std::fs::remove_file(dir.path().join("bf")).unwrap();
    ok(
        &with(&["grow", "--continue", "--backup-file", "bf"], &m),
        dir.path(),
    );
    assert_grown(dir.path(), &m, &data, "past the section");
}

/// The images of a grow in place (file alone) killed inside its section,
/// in the middle of the second step's member writes (old rows the
/// recorded position reads already overwritten), named `name` in
/// `dir/name`, and the file padded to whole MiB (a disk in the VM).
fn vm_case(dir: &Path, name: &str) -> (Vec<PathBuf>, PathBuf) {
    let sub = dir.join(name);
    std::fs::create_dir(&sub).unwrap();
    let (old, _) = in_place(&sub, name, 8);
    killed_inside_at(&sub, &old, "reshape-write:9");
    let file = sub.join("bf");
    let len = std::fs::metadata(&file).unwrap().len();
    std::fs::OpenOptions::new()
        .write(true)
        .open(&file)
        .unwrap()
        .set_len(len.next_multiple_of(1 << 20))
        .unwrap();
    (all(&old).iter().map(|n| sub.join(n)).collect(), file)
}

#[test]
fn mdadm_assembles_with_the_backup_file_nvraid_wrote() {
    let dir = tempfile::tempdir().unwrap();
    let (mut images, file) = vm_case(dir.path(), "bfvm");
    images.push(file);
    let script = dir.path().join("check.sh");
    std::fs::write(
        &script,
        format!(
            r#"set +e
mdadm --assemble /dev/md0 --run --backup-file /dev/vdf /dev/vda /dev/vdb /dev/vdc /dev/vdd /dev/vde 2>&1
echo 200000 > /proc/sys/dev/raid/speed_limit_min
i=0; while grep -q -e reshape /proc/mdstat && [ $i -lt 240 ]; do sleep 1; i=$((i+1)); done
cat /proc/mdstat
sys=/sys/block/md0
if pattern verify -n {bytes} /dev/md0; then pv=ok; else pv=FAILED; fi
echo check > $sys/md/sync_action; sleep 1; mdadm --wait /dev/md0 >/dev/null 2>&1
echo "KERNEL level=$(cat $sys/md/level) disks=$(cat $sys/md/raid_disks) degraded=$(cat $sys/md/degraded) size=$(blockdev --getsize64 /dev/md0) pattern=$pv mismatch=$(cat $sys/md/mismatch_cnt)"
"#,
            bytes = 3 * PER
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
    let report = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        report.contains("restoring critical section"),
        "mdadm did not restore the section:\n{report}"
    );
    let line = report
        .lines()
        .find(|l| l.starts_with("KERNEL "))
        .unwrap_or_else(|| panic!("no array:\n{report}"));
    assert!(
        line.contains("level=raid5 ")
            && line.contains("disks=5 ")
            && line.contains("degraded=0 ")
            && line.contains(&format!("size={} ", 4 * PER))
            && line.contains("pattern=ok")
            && line.ends_with("mismatch=0"),
        "{line}\n{report}"
    );
}

/// The start of a guest script that runs mdadm as it runs on a booted
/// system: mdadm (4.2) does not go on with a reshape from an initramfs
/// (its root on ramfs), so the guest's tools are copied to an ext4 file
/// system on the disk `/dev/vdg` and mdadm runs chrooted there.
const CHROOTED: &str = r#"set +e
mkdir -p /mnt; mke2fs -q /dev/vdg >/dev/null 2>&1 && mount -t ext4 /dev/vdg /mnt || echo MOUNT_FAILED
for d in bin sbin usr lib lib64 etc; do [ -e /$d ] && cp -a /$d /mnt/ 2>/dev/null; done
rm -rf /mnt/lib/modules; rm -f /mnt/etc/initrd-release
mkdir -p /mnt/dev /mnt/proc /mnt/sys /mnt/run /mnt/tmp
mount --bind /dev /mnt/dev; mount -t proc proc /mnt/proc; mount -t sysfs sys /mnt/sys
"#;

/// Run `script` (after [`CHROOTED`]) in tools/mdvm on `images` (the last
/// one the ext4 disk, made here); its output.
fn chrooted_vm(dir: &Path, script: &str, images: &[PathBuf]) -> String {
    let fs = dir.join("fsdisk");
    std::fs::File::create(&fs)
        .unwrap()
        .set_len(64 * MIB)
        .unwrap();
    let path = dir.join("script.sh");
    std::fs::write(&path, format!("{CHROOTED}{script}")).unwrap();
    let out = mdvm_on("mdvm", "6.1", &["ext4"])
        .arg("--script")
        .arg(&path)
        .args(images)
        .arg(&fs)
        .output()
        .expect("tools/mdvm/mdvm (./test.sh installs its tools)");
    std::fs::remove_file(&fs).unwrap();
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

#[test]
fn mdadms_own_backup_file_is_restored_by_continue_as_mdadm_restores_it() {
    // mdadm's `--grow --backup-file` of a RAID 5 with no room to move its
    // data (4 -> 5 members of 32 MiB, chunks of 1 MiB: a section of 12
    // MiB, which mdadm wants below half a member), the slowest sync speed;
    // the file copied out to a disk the moment its record is written,
    // then mdadm killed and the VM powered off with the array running
    // (the superblocks record position 0). Two copies of that state:
    // nvraid's `grow --continue --backup-file` on one, mdadm's `--assemble
    // --backup-file` (and the kernel) on the other; both give the same
    // array bytes, and nvraid's parity is clean.
    let dir = tempfile::tempdir().unwrap();
    let names: Vec<String> = (0..4).map(|i| format!("d{i}")).collect();
    let mut args = vec![
        "create", "--level", "5", "--chunk", "1M", "--bitmap", "none", "--size", "32M", "--name",
        "mdfile",
    ];
    args.extend(names.iter().map(String::as_str));
    ok(&args, dir.path());
    let bytes = 3 * 31 * MIB;
    std::fs::write(dir.path().join("data"), pattern(bytes)).unwrap();
    ok(&with(&["write", "--input", "data"], &names), dir.path());
    std::fs::remove_file(dir.path().join("data")).unwrap();
    blank_mib(dir.path(), "d4", 32);
    blank_mib(dir.path(), "bf", 16);
    let m = all(&names);
    let mut images: Vec<PathBuf> = m.iter().map(|n| dir.path().join(n)).collect();
    images.push(dir.path().join("bf"));
    let captured = chrooted_vm(
        dir.path(),
        r#"chroot /mnt mdadm --assemble /dev/md0 /dev/vda /dev/vdb /dev/vdc /dev/vdd 2>&1
echo 1 > /proc/sys/dev/raid/speed_limit_min
echo 1 > /proc/sys/dev/raid/speed_limit_max
(chroot /mnt mdadm --grow /dev/md0 -n 5 --add /dev/vde --backup-file /bf 2>&1) &
i=0
while [ $i -lt 600 ]; do
  if [ -e /mnt/bf ] && [ "$(dd if=/mnt/bf bs=16 count=1 2>/dev/null)" = "md_backup_data-1" ]; then
    dd if=/mnt/bf of=/dev/vdf bs=1M 2>/dev/null; sync
    echo "CAPTURED $(grep reshape /proc/mdstat)"
    break
  fi
  sleep 0.05; i=$((i+1))
done
kill -9 $(pidof mdadm)
sync
"#,
        &images,
    );
    assert!(
        captured.contains("CAPTURED"),
        "no backup file from mdadm:\n{captured}"
    );
    let position = examine(dir.path(), "d0")["reshape_position"]
        .as_u64()
        .unwrap()
        * 512;
    assert!(
        position < SECTION,
        "mdadm left it at {position}:\n{captured}"
    );
    let theirs = dir.path().join("theirs");
    std::fs::create_dir(&theirs).unwrap();
    for n in m.iter().chain([&"bf".to_string()]) {
        std::fs::copy(dir.path().join(n), theirs.join(n)).unwrap();
    }
    // nvraid's.
    ok(
        &with(&["grow", "--continue", "--backup-file", "bf"], &m),
        dir.path(),
    );
    let ours = read(dir.path(), &m, bytes);
    assert_checks_clean(dir.path(), &m, "nvraid's continue of mdadm's grow");
    // mdadm's.
    let mut images: Vec<PathBuf> = m.iter().map(|n| theirs.join(n)).collect();
    images.push(theirs.join("bf"));
    let report = chrooted_vm(
        &theirs,
        &format!(
            r#"echo 200000 > /proc/sys/dev/raid/speed_limit_min
dd if=/dev/vdf of=/mnt/bf bs=4096 count=3073 2>/dev/null
chroot /mnt mdadm --assemble /dev/md0 --run --backup-file /bf /dev/vda /dev/vdb /dev/vdc /dev/vdd /dev/vde 2>&1
i=0; while grep -q reshape /proc/mdstat && [ $i -lt 200 ]; do sleep 1; i=$((i+1)); done
cat /proc/mdstat
echo "SHA $(head -c {bytes} /dev/md0 | sha256sum)"
"#
        ),
        &images,
    );
    assert!(
        report.contains("restoring critical section"),
        "mdadm did not restore the section:\n{report}"
    );
    assert!(
        report.contains(&format!("SHA {}", sha(&ours))),
        "nvraid's array differs from mdadm's (nvraid's sha256 {}):\n{captured}\n{report}",
        sha(&ours)
    );
}
