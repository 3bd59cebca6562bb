//! Conformance: the same reference-model workload through the fast queue on
//! every engine (io_uring, psync, and psync with injected short transfers
//! and EAGAIN), at several queue depths, for every level; then errors from
//! members are reported, never ignored.

mod common;

use nvraid_array::{create, CreateOptions, FanoutTarget};
use nvraid_io::engine::{EngineKind, FaultPlan};
use nvraid_io::queue::{Completion, OpKind, Target};
use nvraid_layout::Level;
use nvraid_member::{Member, OpenOptions};
use std::sync::Arc;

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

const ENGINES: [EngineKind; 3] = [
    EngineKind::Uring,
    EngineKind::Psync,
    EngineKind::Faulty(FaultPlan {
        transfer_bytes_max: 1536,
        eagain_every: 7,
        eio_file: None,
    }),
];

fn new_array(dir: &tempfile::TempDir, level: Level, members: usize) -> Vec<String> {
    common::new_array(dir, level, members, 8192, 3 << 20)
}

/// Assemble the array `specs` form, writable, for queues to share.
fn open_writable(specs: &[String]) -> Arc<nvraid_array::Array> {
    common::writable(specs)
}

/// Keep `depth` random requests in flight; writes land in the model when
/// they complete, and reads are checked against the model, so no read ever
/// overlaps a write in flight (each slot owns a disjoint region stripe).
fn drive(target: &FanoutTarget, depth: u32, ops: usize, seed: u64) -> Vec<u8> {
    let label = target.describe();
    let size = target.size_bytes() as usize;
    let mut model = vec![0u8; size];
    let mut queue = target.open_queue(depth, 64 * 1024).unwrap();
    let region = size / depth as usize / 512 * 512;
    let mut rng = Rng(seed);
    let mut pending: Vec<Option<(OpKind, u64, u32, u8)>> = vec![None; depth as usize];
    let mut issued = 0;
    while issued < ops || pending.iter().any(Option::is_some) {
        for slot in 0..depth {
            if pending[slot as usize].is_some() || issued >= ops {
                continue;
            }
            let len = (1 + rng.next() % (region as u64 / 1024).min(128)) as u32 * 512;
            let start = slot as u64 * region as u64
                + (rng.next() % ((region as u64 - u64::from(len)) / 512)) * 512;
            let pick = rng.next() % 10;
            let op = match pick {
                0..=4 => OpKind::Write,
                5..=8 => OpKind::Read,
                _ => OpKind::Flush,
            };
            let fill = rng.next() as u8;
            if op == OpKind::Write {
                queue.buffer_mut(slot)[..len as usize]
                    .iter_mut()
                    .enumerate()
                    .for_each(|(i, b)| *b = fill ^ (i as u8));
            }
            queue
                .submit(slot, op, start, len, rng.next().is_multiple_of(5))
                .unwrap();
            pending[slot as usize] = Some((op, start, len, fill));
            issued += 1;
        }
        let mut done: Vec<Completion> = Vec::new();
        queue.reap(1, &mut |c| done.push(c)).unwrap();
        for c in done {
            let (op, start, len, fill) = pending[c.slot as usize]
                .take()
                .expect("completion for a pending slot");
            let moved = c
                .result
                .unwrap_or_else(|e| panic!("{label}: {op:?} at {start} failed with errno {e}"));
            let (s, l) = (start as usize, len as usize);
            match op {
                OpKind::Write => {
                    assert_eq!(moved, len);
                    model[s..s + l]
                        .iter_mut()
                        .enumerate()
                        .for_each(|(i, b)| *b = fill ^ (i as u8));
                }
                OpKind::Read => {
                    assert_eq!(moved, len);
                    assert!(
                        queue.buffer_mut(c.slot)[..l] == model[s..s + l],
                        "{label} depth {depth}: read at {start}+{len} differs"
                    );
                }
                _ => {}
            }
        }
    }
    model
}

#[test]
fn every_engine_matches_the_model_on_every_level() {
    let levels = [
        (Level::Raid0, 4),
        (Level::Raid1, 2),
        (Level::Raid10 { near: 2 }, 3),
    ];
    for (level, members) in levels {
        for engine in ENGINES {
            for depth in [1u32, 8, 32] {
                let dir = tempfile::tempdir().unwrap();
                let specs = new_array(&dir, level, members);
                let array = open_writable(&specs);
                let target = FanoutTarget::array(array.clone(), engine);
                let model = drive(&target, depth, 600, 99 + u64::from(depth));
                drop(target);
                // Whatever the queue wrote, the simple path reads back.
                let mut whole = vec![0u8; model.len()];
                array.read_at(&mut whole, 0).unwrap();
                assert!(
                    whole == model,
                    "{level} {engine:?} depth {depth}: array differs from model"
                );
                Arc::try_unwrap(array).unwrap().close().unwrap();
            }
        }
    }
}

#[test]
fn raw_member_target_on_every_engine() {
    for engine in ENGINES {
        let member = Arc::new(
            Member::open(
                "mem:2M",
                OpenOptions {
                    write: true,
                    ..Default::default()
                },
            )
            .unwrap(),
        );
        let target = FanoutTarget::raw(member.clone(), engine);
        let model = drive(&target, 16, 500, 7);
        let mut whole = vec![0u8; model.len()];
        member.read_at(&mut whole, 0).unwrap();
        assert!(whole == model, "{engine:?}");
    }
}

#[test]
fn member_errors_are_reported_not_ignored() {
    for engine in [EngineKind::Uring, EngineKind::Psync] {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("short");
        std::fs::write(&path, vec![7u8; 1 << 20]).unwrap();
        let member = Arc::new(
            Member::open(
                path.to_str().unwrap(),
                OpenOptions {
                    write: false,
                    create_bytes: None,
                    direct: false,
                    ..Default::default()
                },
            )
            .unwrap(),
        );
        // The file shrinks under the open member: a read past its new end
        // moves part of the data and then nothing. That is an error (EIO),
        // not a silently short read.
        std::fs::OpenOptions::new()
            .write(true)
            .open(&path)
            .unwrap()
            .set_len(4096 + 1000)
            .unwrap();
        let target = FanoutTarget::raw(member, engine);
        let mut queue = target.open_queue(2, 65536).unwrap();
        queue.submit(0, OpKind::Read, 4096, 8192, false).unwrap();
        // A write to a member opened read-only fails with EBADF.
        queue.submit(1, OpKind::Write, 0, 4096, false).unwrap();
        let mut results = Vec::new();
        while results.len() < 2 {
            queue.reap(1, &mut |c| results.push(c)).unwrap();
        }
        results.sort_by_key(|c| c.slot);
        assert_eq!(results[0].result, Err(libc::EIO), "{engine:?} short read");
        assert_eq!(
            results[1].result,
            Err(libc::EBADF),
            "{engine:?} write to read-only member"
        );
    }
}

#[test]
fn null_members_complete_without_io_and_read_zeros() {
    let specs: Vec<String> = (0..4).map(|_| "null:1G".to_string()).collect();
    let options = CreateOptions {
        level: Level::Raid0,
        chunk_bytes: 65536,
        name: "null".into(),
        size_bytes: None,
        force: false,
        direct: true,
        bitmap: nvraid_array::BitmapChoice::Auto,
    };
    let array = Arc::new(create(&specs, &options).unwrap());
    let target = FanoutTarget::array(array, EngineKind::Uring);
    assert_eq!(target.size_bytes(), 4 * ((1 << 30) - (1 << 20)));
    let mut queue = target.open_queue(4, 1 << 20).unwrap();
    queue.buffer_mut(0).fill(9);
    queue
        .submit(0, OpKind::Read, 1 << 20, 1 << 20, false)
        .unwrap();
    let mut got = Vec::new();
    queue.reap(1, &mut |c| got.push(c)).unwrap();
    assert_eq!(
        got,
        vec![Completion {
            slot: 0,
            result: Ok(1 << 20)
        }]
    );
    assert!(queue.buffer_mut(0).iter().all(|&b| b == 0));
}

#[test]
fn merged_vectored_write_then_read_on_every_engine() {
    let dir = tempfile::tempdir().unwrap();
    let specs = new_array(&dir, Level::Raid0, 4);
    let array = open_writable(&specs);
    for engine in ENGINES {
        let target = FanoutTarget::array(array.clone(), engine);
        let mut queue = target.open_queue(1, 65536).unwrap();
        let data: Vec<u8> = (0..64512u32).map(|i| (i % 251) as u8 ^ 0x5a).collect();
        queue.buffer_mut(0)[..64512].copy_from_slice(&data);
        queue
            .submit(0, OpKind::Write, 6203392, 64512, false)
            .unwrap();
        let mut got = Vec::new();
        queue.reap(1, &mut |c| got.push(c)).unwrap();
        assert_eq!(got[0].result, Ok(64512), "{engine:?} write");
        let mut back = vec![0u8; 64512];
        array.read_at(&mut back, 6203392).unwrap();
        assert!(
            back == data,
            "{engine:?}: simple path reads back the vectored write"
        );
        queue.buffer_mut(0).fill(0);
        queue
            .submit(0, OpKind::Read, 6203392, 64512, false)
            .unwrap();
        got.clear();
        queue.reap(1, &mut |c| got.push(c)).unwrap();
        assert!(
            queue.buffer_mut(0)[..64512] == data[..],
            "{engine:?}: vectored read"
        );
    }
}

#[test]
fn queues_count_each_members_operations_and_bytes() {
    let dir = tempfile::tempdir().unwrap();
    let specs = new_array(&dir, Level::Raid1, 2);
    let array = open_writable(&specs);
    for engine in [EngineKind::Uring, EngineKind::Psync] {
        let target = FanoutTarget::array(array.clone(), engine);
        let mut queue = target.open_queue(2, 65536).unwrap();
        queue.submit(0, OpKind::Write, 0, 8192, false).unwrap();
        queue.submit(1, OpKind::Read, 65536, 4096, false).unwrap();
        let mut done = 0;
        while done < 2 {
            done += queue.reap(1, &mut |c| assert!(c.result.is_ok())).unwrap();
        }
        queue.submit(0, OpKind::Read, 4096, 4096, false).unwrap();
        queue.reap(1, &mut |c| assert!(c.result.is_ok())).unwrap();
    }
    // Per engine: the write reaches both mirrors (2 ops of 8 KiB) and each
    // read one of them (2 ops of 4 KiB).
    let counters = array.member_counters();
    let ops: u64 = counters
        .iter()
        .map(|c| c.ops.load(std::sync::atomic::Ordering::Relaxed))
        .sum();
    let bytes: u64 = counters
        .iter()
        .map(|c| c.bytes.load(std::sync::atomic::Ordering::Relaxed))
        .sum();
    assert_eq!(ops, 2 * 4);
    assert_eq!(bytes, 2 * (2 * 8192 + 2 * 4096));
    assert!(
        counters
            .iter()
            .all(|c| c.ops.load(std::sync::atomic::Ordering::Relaxed) >= 2),
        "both mirrors are used"
    );
    assert!(counters
        .iter()
        .all(|c| c.errors.load(std::sync::atomic::Ordering::Relaxed) == 0));
}

/// A queue opened over local members only drives its plain engine (no
/// dispatch to remote channels per operation); a remote member that joins
/// the array later must still be reached through that same queue: here an
/// NBD export is rebuilt into a RAID 1, the local member fails, and every
/// read the open queue makes afterwards comes from the export.
#[test]
fn a_remote_member_joining_a_queue_of_local_members_is_read_through_it() {
    use nvraid_array::recovery::{add_member_to, rebuild, Added};
    use nvraid_testing::nbdkit::Nbdkit;
    for engine in [EngineKind::Uring, EngineKind::Psync] {
        let dir = tempfile::tempdir().unwrap();
        let specs = common::new_array(&dir, Level::Raid1, 2, 65536, 4 << 20);
        let array = common::writable(&specs);
        let size = 1usize << 20;
        let data: Vec<u8> = (0..size).map(|i| (i * 7 % 251) as u8).collect();
        array.write_at(&data, 0, true).unwrap();
        let target = FanoutTarget::array(array.clone(), engine);
        let mut queue = target.open_queue(4, 65536).unwrap();
        let read_all = |queue: &mut Box<dyn nvraid_io::queue::Queue>, what: &str| {
            for at in (0..size).step_by(65536) {
                queue
                    .submit(0, OpKind::Read, at as u64, 65536, false)
                    .unwrap();
                let mut result = None;
                while result.is_none() {
                    queue.reap(1, &mut |c| result = Some(c.result)).unwrap();
                }
                assert_eq!(result, Some(Ok(65536)), "{engine:?} {what}: read at {at}");
                assert!(
                    queue.buffer_mut(0)[..] == data[at..at + 65536],
                    "{engine:?} {what}: data at {at}"
                );
            }
        };
        read_all(&mut queue, "both members local");

        // Member 1 leaves; an export served by nbdkit takes its role.
        array
            .fail_member(1, &std::io::Error::other("test: member pulled"))
            .unwrap();
        array.remove_member(1).unwrap();
        let image = dir.path().join("remote.img");
        let bytes = std::fs::metadata(&specs[1]).unwrap().len();
        std::fs::File::create(&image)
            .unwrap()
            .set_len(bytes)
            .unwrap();
        let socket = dir.path().join("remote.sock");
        let server = Nbdkit::start(
            &socket,
            ["file".to_string(), format!("file={}", image.display())],
        );
        let remote = Member::open(
            &server.uri(),
            OpenOptions {
                write: true,
                ..Default::default()
            },
        )
        .unwrap();
        assert_eq!(
            add_member_to(&array, remote).unwrap(),
            Added::Recovering { role: 1 }
        );
        rebuild(&array, None, &mut |_| {}).unwrap();
        // The local member fails: only the export is left to read.
        array
            .fail_member(0, &std::io::Error::other("test: member pulled"))
            .unwrap();
        read_all(&mut queue, "only the remote member left");
        drop(queue);
        drop(server);
    }
}
