//! A served RAID 0/5/6/10 restriped (`LiveGrow::start_shape`, what `nvraid
//! grow --socket --chunk/--layout` runs) while clients read and write
//! their own blocks through the fast path: every read during the restripe
//! sees the block's last write, and the array assembled again is in the
//! new chunk and layout with every block as last written.

mod common;

use common::{clients_during, new_array, one, pattern, writable};
use nvraid_array::reshape::{LiveGrow, LiveShapeOptions};
use nvraid_array::{assemble, AssembleOptions, FanoutTarget};
use nvraid_io::engine::EngineKind;
use nvraid_io::queue::{OpKind, Target};
use nvraid_layout::parity::ParityLayout;
use nvraid_layout::Level;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

const BLOCK: u64 = 4096;

/// A RAID `level` of `members` in `chunk`-byte chunks, filled, restriped
/// to `new_chunk` (and `layout`) while four clients write and read; then
/// assembled again: `new_level` in `new_chunk`, every block as last
/// written.
fn restripe_online_and_check(
    level: Level,
    members: usize,
    chunk: u64,
    new_chunk: u64,
    layout: Option<&str>,
    new_level: Level,
) {
    let dir = tempfile::tempdir().unwrap();
    let specs = new_array(&dir, level, members, chunk, 6 << 20);
    let array = writable(&specs);
    let size = array.size_bytes();
    {
        let target = FanoutTarget::array(array.clone(), EngineKind::Psync);
        let mut queue = target.open_queue(1, 64 << 10).unwrap();
        for b in 0..size / BLOCK {
            pattern(b, 0, &mut queue.buffer_mut(0)[..BLOCK as usize]);
            one(&mut queue, OpKind::Write, b * BLOCK, BLOCK as u32);
        }
    }
    let running = Arc::new(AtomicBool::new(true));
    let clients = clients_during(&array, 4, Some(2), 0x5151, "restripe", &running);
    std::thread::sleep(std::time::Duration::from_millis(50));
    let options = LiveShapeOptions {
        chunk_bytes: Some(new_chunk),
        layout: layout.map(str::to_string),
        // Small steps at a modest pace: many windows under the clients.
        step_bytes: 256 << 10,
        min_bytes_per_sec: None,
        max_bytes_per_sec: Some(8 << 20),
    };
    let (live, thread) = LiveGrow::start_shape(&array, &options).unwrap();
    let second = LiveGrow::start_shape(&array, &options)
        .expect_err("a second restripe while one runs")
        .to_string();
    assert!(second.contains("second reshape"), "{second}");
    let mut saw_mid = false;
    while live.status().state == "running" {
        let s = live.status();
        assert_eq!(s.kind, "restripe");
        saw_mid |= s.position_bytes > 0 && s.position_bytes < s.end_bytes;
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    thread.join().unwrap();
    let status = live.status();
    assert_eq!(status.state, "finished", "{status:?}");
    assert!(saw_mid, "the status never showed the restripe part-way");
    // Clients on after the end: all in the new shape now.
    std::thread::sleep(std::time::Duration::from_millis(100));
    running.store(false, Ordering::Release);
    let mut versions = std::collections::HashMap::new();
    for c in clients {
        versions.extend(c.join().unwrap());
    }
    drop(live);
    Arc::try_unwrap(array).unwrap().close().unwrap();
    let restriped = assemble(
        &specs,
        AssembleOptions {
            writable: false,
            ..Default::default()
        },
    )
    .unwrap();
    assert_eq!(restriped.geometry().level(), new_level);
    assert_eq!(restriped.geometry().chunk_bytes(), Some(new_chunk));
    assert_eq!(restriped.size_bytes(), size);
    let mut got = vec![0u8; BLOCK as usize];
    let mut want = vec![0u8; BLOCK as usize];
    for b in 0..size / BLOCK {
        restriped.read_at(&mut got, b * BLOCK).unwrap();
        pattern(b, versions.get(&b).copied().unwrap_or(0), &mut want);
        assert!(got == want, "block {b} wrong after the restripe");
    }
}

#[test]
fn clients_read_and_write_through_an_online_raid5_restripe_to_a_larger_chunk_and_layout() {
    restripe_online_and_check(
        Level::Raid5 {
            layout: ParityLayout::LeftSymmetric,
        },
        4,
        64 << 10,
        128 << 10,
        Some("right-asymmetric"),
        Level::Raid5 {
            layout: ParityLayout::RightAsymmetric,
        },
    );
}

/// A smaller chunk: a new stripe's member rows are part of an old
/// stripe's, whose old-shape array bytes the write is admitted as.
#[test]
fn clients_read_and_write_through_an_online_raid6_restripe_to_a_smaller_chunk() {
    let raid6 = Level::Raid6 {
        layout: ParityLayout::LeftSymmetric,
    };
    restripe_online_and_check(raid6, 5, 128 << 10, 32 << 10, None, raid6);
}

/// The new shape's rows are in the new (larger) chunk: each step's window
/// must cover the array bytes the rows it rewrites whole hold, past its
/// end, or a client's write there is lost.
#[test]
fn clients_read_and_write_through_an_online_raid10_restripe_to_a_larger_chunk() {
    let raid10 = Level::Raid10 { near: 2 };
    restripe_online_and_check(raid10, 4, 64 << 10, 256 << 10, None, raid10);
}

/// A RAID 0's chunk, restriped as md's RAID 4 with its parity missing
/// (`live_raid0`): a larger chunk, then a smaller one; each ends a RAID 0
/// again, in the new chunk, every block as last written.
#[test]
fn clients_read_and_write_through_an_online_raid0_restripe_to_a_larger_chunk() {
    restripe_online_and_check(Level::Raid0, 3, 64 << 10, 256 << 10, None, Level::Raid0);
}

#[test]
fn clients_read_and_write_through_an_online_raid0_restripe_to_a_smaller_chunk() {
    restripe_online_and_check(Level::Raid0, 4, 128 << 10, 32 << 10, None, Level::Raid0);
}
