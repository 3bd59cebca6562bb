//! Reference-model test: thousands of random writes, reads, flushes and
//! discards through an array, checked against a plain in-memory disk, across
//! close and reassembly, for RAID 0, 1 and 10 on file and mem members.
//!
//! Replays from a seed: set NVRAID_SEED to reproduce a failure.

mod common;

use common::Rng;
use nvraid_array::{assemble, create, Array, AssembleOptions, CreateOptions};
use nvraid_layout::Level;
use std::os::fd::AsRawFd;

fn seed() -> u64 {
    std::env::var("NVRAID_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0x5eed_1234_abcd)
}

const MEMBER_BYTES: u64 = 3 << 20;

/// Run `ops` random operations in `rounds` assemblies of the array.
fn run_model(level: Level, members: usize, kind: &str, rounds: usize, ops: usize) {
    let mut rng = Rng(seed() ^ (members as u64) << 32 ^ u64::from(level.number()));
    let dir = tempfile::tempdir().unwrap();
    // mem: members live in memfds; /proc/self/fd/N reopens the same memory,
    // which lets a mem array be closed and reassembled within the test.
    let mut keep_alive = Vec::new();
    let specs: Vec<String> = (0..members)
        .map(|i| match kind {
            "file" => dir.path().join(format!("m{i}")).display().to_string(),
            _ => {
                let fd = memfd(MEMBER_BYTES);
                let spec = format!("/proc/self/fd/{}", fd.as_raw_fd());
                keep_alive.push(fd);
                spec
            }
        })
        .collect();
    let options = CreateOptions {
        level,
        chunk_bytes: 16 * 1024,
        name: "model".into(),
        size_bytes: Some(MEMBER_BYTES),
        force: false,
        direct: true,
        bitmap: nvraid_array::BitmapChoice::Auto,
    };
    let mut array = create(&specs, &options).unwrap();
    let size = array.size_bytes();
    let mut model = vec![0u8; size as usize];
    for round in 0..rounds {
        for _ in 0..ops / rounds {
            step(&array, &mut model, &mut rng);
        }
        array.close().unwrap();
        let mut shuffled = specs.clone();
        shuffled.rotate_left(round % members);
        array = assemble(
            &shuffled,
            AssembleOptions {
                writable: true,
                ..Default::default()
            },
        )
        .unwrap();
        assert!(!array.is_dirty(), "an orderly close leaves the array clean");
        let mut whole = vec![0u8; size as usize];
        array.read_at(&mut whole, 0).unwrap();
        assert!(
            whole == model,
            "{level} on {kind}: content differs from the model after reassembly {round}"
        );
    }
    array.close().unwrap();
    drop(keep_alive);
}

fn memfd(len: u64) -> std::fs::File {
    nvraid_io::sys::memfd("model", len).unwrap()
}

fn step(array: &Array, model: &mut [u8], rng: &mut Rng) {
    let sectors = model.len() as u64 / 512;
    let start = rng.below(sectors);
    let len = 1 + rng.below((sectors - start).min(200));
    let (offset, bytes) = ((start * 512) as usize, (len * 512) as usize);
    match rng.below(10) {
        0..=4 => {
            let fill = rng.next();
            let data: Vec<u8> = (0..bytes)
                .map(|i| (fill.rotate_left(i as u32 % 64) as u8) ^ i as u8)
                .collect();
            array
                .write_at(&data, offset as u64, rng.below(4) == 0)
                .unwrap();
            model[offset..offset + bytes].copy_from_slice(&data);
        }
        5..=7 => {
            let mut back = vec![0u8; bytes];
            array.read_at(&mut back, offset as u64).unwrap();
            assert!(
                back == model[offset..offset + bytes],
                "read {offset}+{bytes} differs from the model"
            );
        }
        8 => array.flush().unwrap(),
        _ => {
            // Discard on files and memfds punches holes: reads return zeros.
            array.discard(offset as u64, bytes as u64).unwrap();
            model[offset..offset + bytes].fill(0);
        }
    }
}

#[test]
fn raid0_on_files() {
    run_model(Level::Raid0, 4, "file", 3, 1500);
}

#[test]
fn raid0_on_mem() {
    run_model(Level::Raid0, 3, "mem", 3, 1500);
}

#[test]
fn raid1_on_files() {
    run_model(Level::Raid1, 2, "file", 3, 1200);
}

#[test]
fn raid1_three_mirrors_on_mem() {
    run_model(Level::Raid1, 3, "mem", 3, 1200);
}

#[test]
fn raid10_on_files() {
    run_model(Level::Raid10 { near: 2 }, 4, "file", 3, 1500);
}

#[test]
fn raid10_odd_members_on_mem() {
    run_model(Level::Raid10 { near: 2 }, 3, "mem", 3, 1500);
}
