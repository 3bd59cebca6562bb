//! The fast path makes no allocation per request on any level: a run of
//! several times more requests through a `FanoutQueue` over real member
//! files makes (about) as many allocations as a short one. RAID 0, 1, 10,
//! 5 and 6, and RAID 5 with md's partial parity log; random writes and
//! reads at depth 4, sizes from 4 KiB to 64 KiB. Its own test binary,
//! because the counting allocator sees every thread of the process.

mod common;

use common::Rng;
use nvraid_array::{create, BitmapChoice, CreateOptions, FanoutTarget};
use nvraid_io::engine::EngineKind;
use nvraid_io::queue::{OpKind, Queue, Target};
use nvraid_layout::parity::ParityLayout;
use nvraid_layout::Level;
use nvraid_testing::alloc::allocations;
use nvraid_testing::CountingAllocator;

#[global_allocator]
static GLOBAL: CountingAllocator = CountingAllocator;

const DEPTH: u32 = 4;

/// `requests` random writes and reads through `queue`, `DEPTH` at a time.
fn drive(queue: &mut dyn Queue, size: u64, rng: &mut Rng, requests: u32) {
    let mut in_flight = 0;
    let mut free: Vec<u32> = (0..DEPTH).collect();
    let mut issued = 0;
    while issued < requests || in_flight > 0 {
        while issued < requests {
            let Some(slot) = free.pop() else { break };
            let len = ((1 + rng.below(16)) * 4096) as u32;
            let offset = rng.below((size - u64::from(len)) / 4096) * 4096;
            let kind = if rng.below(2) == 0 {
                OpKind::Write
            } else {
                OpKind::Read
            };
            queue.submit(slot, kind, offset, len, false).unwrap();
            issued += 1;
            in_flight += 1;
        }
        queue
            .reap(1, &mut |c| {
                assert!(c.result.is_ok(), "request failed: {:?}", c.result);
                free.push(c.slot);
                in_flight -= 1;
            })
            .unwrap();
    }
}

/// Allocations made by `requests` requests on an open, warmed-up queue.
fn allocations_for(queue: &mut dyn Queue, size: u64, seed: u64, requests: u32) -> u64 {
    let mut rng = Rng(seed);
    let before = allocations();
    drive(queue, size, &mut rng, requests);
    allocations() - before
}

#[test]
fn the_fast_path_does_not_allocate_per_request_on_any_level() {
    let raid5 = Level::Raid5 {
        layout: ParityLayout::LeftSymmetric,
    };
    let cases = [
        (Level::Raid0, 4, BitmapChoice::Auto),
        (Level::Raid1, 2, BitmapChoice::None),
        (Level::Raid10 { near: 2 }, 4, BitmapChoice::None),
        (raid5, 4, BitmapChoice::None),
        (raid5, 4, BitmapChoice::Ppl),
        (
            Level::Raid6 {
                layout: ParityLayout::LeftSymmetric,
            },
            5,
            BitmapChoice::None,
        ),
    ];
    for (level, members, bitmap) in cases {
        let what = format!("{level} x{members} {bitmap:?}");
        let dir = tempfile::tempdir().unwrap();
        let specs: Vec<String> = (0..members)
            .map(|i| dir.path().join(format!("m{i}")).display().to_string())
            .collect();
        let options = CreateOptions {
            level,
            chunk_bytes: 16 << 10,
            name: "alloc".into(),
            size_bytes: Some(8 << 20),
            force: false,
            direct: false,
            bitmap,
        };
        create(&specs, &options).unwrap().close().unwrap();
        let array = common::writable(&specs);
        let size = array.size_bytes();
        let target = FanoutTarget::array(array.clone(), EngineKind::Psync);
        let mut queue = target.open_queue(DEPTH, 64 << 10).unwrap();
        // Warm up: first writes mark the array dirty, scratch grows to its
        // largest request, the PPL's ring comes around.
        allocations_for(queue.as_mut(), size, 7, 2000);
        let short = allocations_for(queue.as_mut(), size, 11, 500);
        let long = allocations_for(queue.as_mut(), size, 13, 2500);
        assert!(
            long.abs_diff(short) <= 16 && long <= 64,
            "{what}: {short} allocations for 500 requests, {long} for 2500"
        );
    }
}
