//! A member that fails while the array runs: on RAID 1/10 its reads are
//! served by another copy and its writes go on to the others, the client
//! sees no error, and before the request completes the member is recorded
//! faulty (events + 1) in every other member's superblock. RAID 0, and the
//! last copy of any data, fail the request with EIO instead.

mod common;

use common::writable;
use nvraid_array::{assemble, read_superblock, AssembleOptions, FanoutTarget, SetAside};
use nvraid_io::engine::{EngineKind, FaultPlan};
use nvraid_io::queue::{OpKind, Target};
use nvraid_layout::Level;
use nvraid_member::{Member, OpenOptions};
use std::sync::Arc;

fn new_array(dir: &tempfile::TempDir, level: Level, members: usize) -> Vec<String> {
    common::new_array(dir, level, members, 16384, 4 << 20)
}

fn failing(member: u32) -> EngineKind {
    EngineKind::Faulty(FaultPlan {
        eio_file: Some(member),
        ..FaultPlan::NONE
    })
}

/// Run `ops` (kind, offset, len) at depth 4 with a pattern per offset;
/// returns each request's result.
fn run(target: &FanoutTarget, ops: &[(OpKind, u64, u32)]) -> Vec<Result<u32, i32>> {
    let mut queue = target.open_queue(4, 64 << 10).unwrap();
    let mut results = Vec::new();
    for batch in ops.chunks(4) {
        for (slot, &(kind, offset, len)) in batch.iter().enumerate() {
            if kind == OpKind::Write {
                let buf = queue.buffer_mut(slot as u32);
                for (i, b) in buf[..len as usize].iter_mut().enumerate() {
                    *b = ((offset as usize + i) % 251) as u8;
                }
            }
            queue.submit(slot as u32, kind, offset, len, false).unwrap();
        }
        let mut done = vec![None; batch.len()];
        let mut got = 0;
        while got < batch.len() {
            got += queue
                .reap(1, &mut |c| done[c.slot as usize] = Some(c.result))
                .unwrap() as usize;
        }
        for (slot, &(kind, offset, len)) in batch.iter().enumerate() {
            let result = done[slot].unwrap();
            if kind == OpKind::Read && result.is_ok() {
                let buf = queue.buffer_mut(slot as u32);
                for (i, b) in buf[..len as usize].iter().enumerate() {
                    assert_eq!(
                        *b,
                        ((offset as usize + i) % 251) as u8,
                        "byte {} of read at {offset}",
                        i
                    );
                }
            }
            results.push(result);
        }
    }
    results
}

fn writes_then_reads(size: u64) -> Vec<(OpKind, u64, u32)> {
    let mut ops = Vec::new();
    for kind in [OpKind::Write, OpKind::Read, OpKind::Read] {
        for i in 0..16u64 {
            // 48 KiB requests at scattered offsets: several chunks each.
            let offset = (i * 7 * 65536) % (size - 65536);
            ops.push((kind, offset, 48 << 10));
        }
    }
    ops
}

fn on_disk(spec: &str) -> nvraid_metadata::Superblock {
    read_superblock(&Member::open(spec, OpenOptions::default()).unwrap()).unwrap()
}

#[test]
fn a_failing_mirror_is_marked_faulty_and_the_client_sees_no_error() {
    for (level, members, bad) in [
        (Level::Raid1, 2, 1u32),
        (Level::Raid1, 3, 0),
        (Level::Raid10 { near: 2 }, 4, 2),
        (Level::Raid10 { near: 2 }, 3, 1),
        (
            Level::Raid10Far {
                copies: 2,
                offset: false,
            },
            3,
            2,
        ),
        (
            Level::Raid10Far {
                copies: 2,
                offset: true,
            },
            4,
            0,
        ),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let specs = new_array(&dir, level, members);
        let events_before = on_disk(&specs[0]).events;
        let array = writable(&specs);
        let target = FanoutTarget::array(array.clone(), failing(bad));
        let results = run(&target, &writes_then_reads(array.size_bytes()));
        assert!(
            results.iter().all(Result::is_ok),
            "{level} member {bad}: {results:?}"
        );
        assert!(
            array.is_faulty(bad as usize),
            "{level}: member {bad} not marked faulty"
        );
        assert!(array.is_degraded());
        // Recorded on the others before the requests completed.
        let good = specs
            .iter()
            .enumerate()
            .find(|(i, _)| *i != bad as usize)
            .unwrap()
            .1;
        let sb = on_disk(good);
        assert_eq!(sb.roles_raw[bad as usize], 0xfffe, "{level}");
        assert!(sb.events > events_before);
        assert_eq!(
            nvraid_array::info::detail(&array).members[bad as usize].state,
            "faulty"
        );
        drop(target);
        Arc::try_unwrap(array).unwrap().close().unwrap();
        // Reassembled, the failed member is set aside and the data is intact.
        let again = assemble(
            &specs,
            AssembleOptions {
                allow_degraded: true,
                ..Default::default()
            },
        )
        .unwrap();
        assert_eq!(again.set_aside()[0].reason, SetAside::Faulty, "{level}");
        let mut buf = vec![0u8; 48 << 10];
        again.read_at(&mut buf, 7 * 65536).unwrap();
        assert!(buf
            .iter()
            .enumerate()
            .all(|(i, b)| *b == ((7 * 65536 + i) % 251) as u8));
    }
}

#[test]
fn raid0_and_the_last_copy_fail_with_eio_and_are_not_marked() {
    // RAID 0: no other copy.
    let dir = tempfile::tempdir().unwrap();
    let specs = new_array(&dir, Level::Raid0, 2);
    let events = on_disk(&specs[0]).events;
    let array = writable(&specs);
    let target = FanoutTarget::array(array.clone(), failing(1));
    let results = run(&target, &writes_then_reads(array.size_bytes()));
    assert!(results.contains(&Err(libc::EIO)), "{results:?}");
    assert!(!array.is_faulty(1));
    assert_eq!(on_disk(&specs[0]).events, events);

    // RAID 1 running degraded on one member: it holds the last copy.
    let dir = tempfile::tempdir().unwrap();
    let specs = new_array(&dir, Level::Raid1, 2);
    let array = writable(&specs[1..]);
    let target = FanoutTarget::array(array.clone(), failing(1));
    let results = run(
        &target,
        &[(OpKind::Write, 0, 4096), (OpKind::Read, 0, 4096)],
    );
    assert_eq!(results, vec![Err(libc::EIO), Err(libc::EIO)]);
    assert!(!array.is_faulty(1), "the last copy stays in use");
}
