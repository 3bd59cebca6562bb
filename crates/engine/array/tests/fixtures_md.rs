//! Arrays written by the Linux kernel's md driver (tests/fixtures/md):
//! nvraid assembles each one, in any member order, and reads exactly the
//! content the fixture's README records.

use nvraid_array::{assemble, AssembleOptions};
use sha2::{Digest, Sha256};
use std::path::{Path, PathBuf};
use std::process::Command;

fn fixture_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../../tests/fixtures/md")
}

/// Decompress a fixture's members into `dir`; returns their paths by role.
fn unpack(name: &str, dir: &Path) -> Vec<String> {
    unpack_from(&fixture_dir().join(name), name, dir)
}

fn unpack_from(src: &Path, name: &str, dir: &Path) -> Vec<String> {
    let src = src.to_path_buf();
    assert!(src.is_dir(), "fixture {} missing", src.display());
    let mut out = Vec::new();
    for disk in 0.. {
        let xz = src.join(format!("disk{disk}.img.xz"));
        if !xz.exists() {
            break;
        }
        let img = dir.join(format!("{name}-disk{disk}.img"));
        let data = Command::new("xz")
            .arg("-dc")
            .arg(&xz)
            .output()
            .expect("xz must be installed");
        assert!(data.status.success());
        std::fs::write(&img, data.stdout).unwrap();
        out.push(img.display().to_string());
    }
    out
}

fn check(name: &str, size_bytes: u64, sha256: &str) {
    let dir = tempfile::tempdir().unwrap();
    let mut specs = unpack(name, dir.path());
    specs.reverse(); // the command-line order must not matter
    let array = assemble(&specs, AssembleOptions::default()).unwrap();
    assert_eq!(array.size_bytes(), size_bytes);
    let mut content = vec![0u8; size_bytes as usize];
    array.read_at(&mut content, 0).unwrap();
    assert_eq!(
        format!("{:x}", Sha256::digest(&content)),
        sha256,
        "{name} content hash"
    );
    for (block, data) in content.chunks(4096).enumerate() {
        let expected = (block as u64).to_le_bytes().repeat(512);
        assert_eq!(data, &expected[..], "{name}: block {block}");
    }
    // Every copy agrees: read each piece from every mirror explicitly.
    let g = array.geometry().clone();
    for offset in (0..size_bytes).step_by(64 * 1024) {
        for copy in 0..g.copies() {
            let loc = g.locate(offset, copy);
            let slot = array.slot(loc.member as usize).unwrap();
            let mut block = vec![0u8; 4096];
            slot.member
                .read_at(&mut block, slot.data_offset_bytes() + loc.member_offset)
                .unwrap();
            assert_eq!(
                block,
                content[offset as usize..offset as usize + 4096],
                "{name} copy {copy} at {offset}"
            );
        }
    }
}

#[test]
fn kernel_raid0_four_disks_64k() {
    check(
        "raid0-4d-64k",
        62914560,
        "8e6e73eea1220034991c9011134b0b04bade2d528c3461586aa3246116d77ffe",
    );
}

#[test]
fn kernel_raid1_two_disks() {
    check(
        "raid1-2d",
        15728640,
        "c2d1f08aafe760a103a34b1dbd40baebfee00c75656c3fe8f1333fb0a928fb99",
    );
}

#[test]
fn kernel_raid10_near2_four_disks_64k() {
    check(
        "raid10-n2-4d-64k",
        31457280,
        "b8ced061a8866ab159a41700c17e0c6a0e611caf466f23d8376d6b312b8e8a90",
    );
}

/// The kernel's arrays with read limits (bad blocks on both mirrors, a
/// member recovered part-way, a dirty mirror whose copies differ) read the
/// kernel's bytes through the fast path too, on every engine and at depth.
#[test]
fn kernel_states_read_through_the_fast_path() {
    use nvraid_array::FanoutTarget;
    use nvraid_io::engine::EngineKind;
    use nvraid_io::queue::{OpKind, Target};
    let states =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../../tests/fixtures/md-states");
    for state in ["badblocks", "recovering", "dirty"] {
        let dir = tempfile::tempdir().unwrap();
        let specs = unpack_from(&states.join(state), state, dir.path());
        let expected =
            std::fs::read_to_string(states.join(state).join("kernel-sha256.txt")).unwrap();
        let array = std::sync::Arc::new(assemble(&specs, AssembleOptions::default()).unwrap());
        // 4 MiB reads span both mirrors' bad ranges: no single copy serves
        // them, so the queue splits them across copies.
        for (engine, io) in [
            (EngineKind::Psync, 64u32 << 10),
            (EngineKind::Uring, 4 << 20),
            (EngineKind::Psync, 4 << 20),
        ] {
            let target = FanoutTarget::array(array.clone(), engine);
            let depth = 4u32;
            let mut queue = target.open_queue(depth, io).unwrap();
            let size = array.size_bytes();
            let mut content = vec![0u8; size as usize];
            let mut offset = 0u64;
            while offset < size {
                let mut submitted = Vec::new();
                for slot in 0..depth {
                    if offset >= size {
                        break;
                    }
                    let len = (size - offset).min(u64::from(io)) as u32;
                    queue
                        .submit(slot, OpKind::Read, offset, len, false)
                        .unwrap();
                    submitted.push((slot, offset, len));
                    offset += u64::from(len);
                }
                let mut done = 0;
                while done < submitted.len() {
                    done += queue
                        .reap(1, &mut |c| {
                            assert_eq!(c.result.map(|_| ()), Ok(()), "{state} {engine:?}")
                        })
                        .unwrap() as usize;
                }
                for (slot, at, len) in submitted {
                    content[at as usize..(at + u64::from(len)) as usize]
                        .copy_from_slice(&queue.buffer_mut(slot)[..len as usize]);
                }
            }
            assert_eq!(
                format!("{:x}", Sha256::digest(&content)),
                expected.trim(),
                "{state} through {engine:?}"
            );
        }
    }
}
