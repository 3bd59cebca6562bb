//! Clean/dirty state and the events counter follow md's rules.

use nvraid_array::{assemble, create, read_superblock, AssembleOptions, CreateOptions};
use nvraid_layout::Level;
use nvraid_member::{Member, OpenOptions};
use nvraid_metadata::RESYNC_CLEAN;

fn specs(dir: &tempfile::TempDir, n: usize) -> Vec<String> {
    (0..n)
        .map(|i| dir.path().join(format!("m{i}")).display().to_string())
        .collect()
}

fn options(level: Level) -> CreateOptions {
    CreateOptions {
        level,
        chunk_bytes: 64 * 1024,
        name: "state".into(),
        size_bytes: Some(8 << 20),
        force: false,
        direct: true,
        bitmap: nvraid_array::BitmapChoice::Auto,
    }
}

/// A new array of `members` files in `dir`, created and cleanly closed.
fn created(dir: &tempfile::TempDir, level: Level, members: usize) -> Vec<String> {
    let specs = specs(dir, members);
    create(&specs, &options(level)).unwrap().close().unwrap();
    specs
}

fn on_disk(spec: &str) -> (u64, u64) {
    let sb = read_superblock(&Member::open(spec, OpenOptions::default()).unwrap()).unwrap();
    (sb.events, sb.resync_offset)
}

const RW: AssembleOptions = AssembleOptions {
    writable: true,
    direct: true,
    allow_degraded: false,
};

#[test]
fn raid1_is_dirty_on_disk_before_the_first_write_lands_and_clean_after_close() {
    let dir = tempfile::tempdir().unwrap();
    let specs = created(&dir, Level::Raid1, 2);
    assert_eq!(on_disk(&specs[0]), (0, RESYNC_CLEAN));
    let array = assemble(&specs, RW).unwrap();
    let mut buf = vec![0u8; 4096];
    array.read_at(&mut buf, 0).unwrap();
    assert_eq!(
        on_disk(&specs[1]),
        (0, RESYNC_CLEAN),
        "reads do not dirty the array"
    );
    array.write_at(&[7u8; 4096], 0, false).unwrap();
    for spec in &specs {
        assert_eq!(
            on_disk(spec),
            (1, 0),
            "{spec} marked dirty before the write completes"
        );
    }
    array.write_at(&[8u8; 4096], 4096, true).unwrap();
    assert_eq!(
        on_disk(&specs[0]).0,
        1,
        "only the first write updates the superblock"
    );
    array.close().unwrap();
    for spec in &specs {
        assert_eq!(on_disk(spec), (2, RESYNC_CLEAN));
    }
}

#[test]
fn a_crash_leaves_the_array_dirty_and_nvraid_does_not_pretend_it_is_clean() {
    let dir = tempfile::tempdir().unwrap();
    let specs = created(&dir, Level::Raid10 { near: 2 }, 4);
    let array = assemble(&specs, RW).unwrap();
    array.write_at(&[1u8; 8192], 65536 - 4096, false).unwrap();
    drop(array); // no orderly close: as if the process died
    let array = assemble(&specs, RW).unwrap();
    assert!(array.is_dirty());
    assert_eq!(nvraid_array::info::detail(&array).state, "active");
    array.close().unwrap();
    assert_eq!(
        on_disk(&specs[2]),
        (1, 0),
        "still dirty: nvraid has not resynced the copies"
    );
    // Writing to an array that came up dirty still moves the events counter,
    // before the write and again at close, so the kernel can tell this
    // session's state from the crashed one's.
    let array = assemble(&specs, RW).unwrap();
    array.write_at(&[2u8; 4096], 0, false).unwrap();
    for spec in &specs {
        assert_eq!(on_disk(spec), (2, 0), "{spec}");
    }
    array.close().unwrap();
    for spec in &specs {
        assert_eq!(on_disk(spec), (3, 0), "{spec}: dirty, one event later");
    }
}

#[test]
fn raid0_is_never_marked_dirty_as_in_md() {
    let dir = tempfile::tempdir().unwrap();
    let specs = created(&dir, Level::Raid0, 2);
    let array = assemble(&specs, RW).unwrap();
    array.write_at(&[1u8; 4096], 0, true).unwrap();
    assert_eq!(on_disk(&specs[0]), (0, RESYNC_CLEAN));
    array.close().unwrap();
    assert_eq!(on_disk(&specs[1]), (0, RESYNC_CLEAN));
}

#[test]
fn a_member_missing_at_the_first_write_is_recorded_faulty_and_left_out() {
    let dir = tempfile::tempdir().unwrap();
    let specs = created(&dir, Level::Raid1, 2);
    // Assemble with only member 0 and write: member 1 falls behind.
    let degraded = AssembleOptions {
        allow_degraded: true,
        ..RW
    };
    let array = assemble(&specs[..1], degraded).unwrap();
    array.write_at(&[3u8; 4096], 0, false).unwrap();
    array.close().unwrap();
    // The surviving superblock records role 1 as faulty (md's 0xfffe).
    let sb = read_superblock(&Member::open(&specs[0], OpenOptions::default()).unwrap()).unwrap();
    assert_eq!(&sb.roles_raw[..2], &[0, 0xfffe]);
    assert_eq!(sb.events, 2, "dirty and clean transitions");
    let err = assemble(&specs, RW).unwrap_err().to_string();
    assert!(err.contains("roles 1 are missing or set aside"), "{err}");
    let array = assemble(&specs, degraded).unwrap();
    assert_eq!(array.set_aside().len(), 1);
    assert_eq!(array.set_aside()[0].spec, specs[1]);
    assert_eq!(array.set_aside()[0].reason, nvraid_array::SetAside::Faulty);
    let mut buf = vec![0u8; 4096];
    array.read_at(&mut buf, 0).unwrap();
    assert_eq!(buf, vec![3u8; 4096], "reads come from the fresh copy");
}

/// A crash right after the first write to a degraded RAID 1 (no orderly
/// close): the real kernel md, given every member including the one that
/// missed the write, reads nvraid's data, not the stale copy.
#[test]
fn kernel_reads_the_writes_of_a_crashed_degraded_array() {
    use sha2::{Digest, Sha256};
    let dir = tempfile::tempdir().unwrap();
    let specs = created(&dir, Level::Raid1, 3);
    let degraded = AssembleOptions {
        allow_degraded: true,
        ..RW
    };
    let array = assemble(&specs[..2], degraded).unwrap();
    let data: Vec<u8> = (0..(1u32 << 20)).map(|i| (i % 253) as u8 | 1).collect();
    array.write_at(&data, 0, true).unwrap();
    drop(array); // as if the process were killed: still dirty on disk
    let read_only = AssembleOptions {
        writable: false,
        ..degraded
    };
    let array = assemble(&specs, read_only).unwrap();
    assert!(array.is_dirty());
    assert_eq!(array.set_aside()[0].spec, specs[2]);
    let mut whole = vec![0u8; array.size_bytes() as usize];
    array.read_at(&mut whole, 0).unwrap();
    assert_eq!(&whole[..data.len()], &data[..]);
    let sha = format!("{:x}", Sha256::digest(&whole));
    let check =
        std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../../tools/mdvm/mdvm-check");
    let out = std::process::Command::new(&check)
        .arg("--expect")
        .arg(&sha)
        .arg("--")
        .args(&specs)
        .output()
        .unwrap_or_else(|e| panic!("{}: {e}", check.display()));
    assert!(
        out.status.success(),
        "the kernel did not read nvraid's data (install the VM's tools with ./test.sh):\n{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}
