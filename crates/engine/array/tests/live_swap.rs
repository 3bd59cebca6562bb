//! A served array's shape swapped when a served reshape ends
//! (`Array::swap_shape`): clients on fast-path queues of their own, on
//! several threads, read and write through the reshape and across the
//! swap; each queue takes the new shape (geometry, size, parity shape) at
//! its next request, the grown region is read and written through the
//! fast path, a second reshape runs in the same run, and every byte reads
//! back, in the run and after the array is assembled again.

mod common;

use common::{new_array, one, pattern, writable, Rng};
use nvraid_array::reshape::{LiveGrow, LiveGrowOptions, LiveLevel, LiveShapeOptions};
use nvraid_array::{assemble, Array, AssembleOptions, FanoutTarget};
use nvraid_io::engine::EngineKind;
use nvraid_io::queue::{OpKind, Target};
use nvraid_layout::parity::ParityLayout;
use nvraid_layout::Level;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

const BLOCK: u64 = 4096;
const THREADS: u64 = 4;

fn empty_member(dir: &tempfile::TempDir, name: &str, bytes: u64) -> String {
    let path = dir.path().join(name);
    std::fs::File::create(&path)
        .unwrap()
        .set_len(bytes)
        .unwrap();
    path.display().to_string()
}

/// Each block's last version, shared by the clients (each owns every
/// `THREADS`-th block; 0: the fill, absent past the first size: zeros).
type Versions = Arc<Mutex<HashMap<u64, u64>>>;

/// Clients on queues opened before any reshape, each writing and reading
/// back its own blocks until `running` goes false, over the array's size
/// as it is at each request (so the grown region once it is served). A
/// request past the size a queue serves is refused by the queue: with a
/// stale size, the clients fail.
fn clients(
    array: &Arc<Array>,
    versions: &Versions,
    running: &Arc<AtomicBool>,
) -> Vec<std::thread::JoinHandle<u64>> {
    let first_size = array.size_bytes();
    (0..THREADS)
        .map(|t| {
            let (array, versions, running) = (array.clone(), versions.clone(), running.clone());
            std::thread::spawn(move || {
                let target = FanoutTarget::array(array.clone(), EngineKind::Psync);
                let mut queue = target.open_queue(1, 64 << 10).unwrap();
                let mut rng = Rng(0x5eed + t);
                let mut want = vec![0u8; BLOCK as usize];
                let mut past_first = 0;
                while running.load(Ordering::Acquire) {
                    let blocks = array.size_bytes() / BLOCK;
                    let b = rng.below(blocks / THREADS) * THREADS + t;
                    past_first += u64::from(b * BLOCK >= first_size);
                    let known = versions.lock().unwrap().get(&b).copied();
                    if rng.below(3) == 0 {
                        let v = known.unwrap_or(0) + 1;
                        pattern(b, v, &mut queue.buffer_mut(0)[..BLOCK as usize]);
                        one(&mut queue, OpKind::Write, b * BLOCK, BLOCK as u32);
                        versions.lock().unwrap().insert(b, v);
                    } else {
                        one(&mut queue, OpKind::Read, b * BLOCK, BLOCK as u32);
                        match known {
                            Some(v) => pattern(b, v, &mut want),
                            None if b * BLOCK < first_size => pattern(b, 0, &mut want),
                            None => want.fill(0),
                        }
                        assert!(
                            queue.buffer(0)[..BLOCK as usize] == want[..],
                            "block {b} read back wrong (size {})",
                            array.size_bytes()
                        );
                    }
                }
                past_first
            })
        })
        .collect()
}

/// Fill every block with its version 0 through a fast-path queue.
fn fill(array: &Arc<Array>) {
    let target = FanoutTarget::array(array.clone(), EngineKind::Psync);
    let mut queue = target.open_queue(1, 64 << 10).unwrap();
    for b in 0..array.size_bytes() / BLOCK {
        pattern(b, 0, &mut queue.buffer_mut(0)[..BLOCK as usize]);
        one(&mut queue, OpKind::Write, b * BLOCK, BLOCK as u32);
    }
}

/// Wait for a served reshape's end to be adopted (its route gone).
fn wait_swapped(array: &Array, live: &LiveGrow, thread: std::thread::JoinHandle<()>) {
    thread.join().unwrap();
    let status = live.status();
    assert_eq!(status.state, "finished", "{status:?}");
    assert!(
        !array.is_reshaping_live(),
        "the finished reshape's route still takes every request"
    );
}

fn grow(
    array: &Arc<Array>,
    raid_devices: u32,
    add: Vec<String>,
) -> (Arc<LiveGrow>, std::thread::JoinHandle<()>) {
    LiveGrow::start(
        array,
        &LiveGrowOptions {
            raid_devices,
            add,
            direct: true,
            force: false,
            step_bytes: 256 << 10,
            max_bytes_per_sec: Some(32 << 20),
            min_bytes_per_sec: None,
        },
    )
    .unwrap()
}

/// Every block as `versions` says, read through a new fast-path queue and
/// through the simple path of the array assembled again from `specs`.
fn check_all(array: Arc<Array>, versions: &Versions, first_size: u64, specs: &[String]) {
    let size = array.size_bytes();
    let versions = versions.lock().unwrap().clone();
    let want_of = |b: u64, want: &mut [u8]| match versions.get(&b) {
        Some(&v) => pattern(b, v, want),
        None if b * BLOCK < first_size => pattern(b, 0, want),
        None => want.fill(0),
    };
    let mut want = vec![0u8; BLOCK as usize];
    {
        let target = FanoutTarget::array(array.clone(), EngineKind::Psync);
        let mut queue = target.open_queue(1, 64 << 10).unwrap();
        for b in 0..size / BLOCK {
            one(&mut queue, OpKind::Read, b * BLOCK, BLOCK as u32);
            want_of(b, &mut want);
            assert!(
                queue.buffer(0)[..BLOCK as usize] == want[..],
                "block {b} wrong in the run"
            );
        }
    }
    Arc::try_unwrap(array).unwrap().close().unwrap();
    let again = assemble(
        specs,
        AssembleOptions {
            writable: false,
            ..Default::default()
        },
    )
    .unwrap();
    assert_eq!(
        again.size_bytes(),
        size,
        "the served size is not the assembled one"
    );
    let mut got = vec![0u8; BLOCK as usize];
    for b in 0..size / BLOCK {
        again.read_at(&mut got, b * BLOCK).unwrap();
        want_of(b, &mut want);
        assert!(got == want, "block {b} wrong after assembly");
    }
}

#[test]
fn a_served_raid5_grow_swaps_in_the_new_shape_under_clients_and_a_second_grow_runs_in_the_same_run()
{
    let dir = tempfile::tempdir().unwrap();
    let member_bytes = 6 << 20;
    let specs = new_array(
        &dir,
        Level::Raid5 {
            layout: ParityLayout::LeftSymmetric,
        },
        4,
        64 << 10,
        member_bytes,
    );
    let added: Vec<String> = (0..2)
        .map(|k| empty_member(&dir, &format!("n{k}"), member_bytes))
        .collect();
    let array = writable(&specs);
    let first_size = array.size_bytes();
    fill(&array);
    let versions = Versions::default();
    let running = Arc::new(AtomicBool::new(true));
    let clients = clients(&array, &versions, &running);
    std::thread::sleep(std::time::Duration::from_millis(50));

    let (live, thread) = grow(&array, 5, vec![added[0].clone()]);
    wait_swapped(&array, &live, thread);
    assert_eq!(array.geometry().members(), 5);
    assert_eq!(array.roles(), 5);
    assert_eq!(array.size_bytes(), live.status().new_size_bytes);
    assert!(array.size_bytes() > first_size);
    assert!(!array.is_degraded());
    std::thread::sleep(std::time::Duration::from_millis(200));

    // A second grow in the same run, clients still going.
    let (live, thread) = grow(&array, 6, vec![added[1].clone()]);
    wait_swapped(&array, &live, thread);
    assert_eq!(array.geometry().members(), 6);
    assert_eq!(array.size_bytes(), live.status().new_size_bytes);
    std::thread::sleep(std::time::Duration::from_millis(300));
    running.store(false, Ordering::Release);
    let past: u64 = clients.into_iter().map(|c| c.join().unwrap()).sum();
    assert!(past > 0, "no client request reached the grown region");
    drop(live);
    let all: Vec<String> = specs.iter().chain(&added).cloned().collect();
    check_all(array, &versions, first_size, &all);
}

#[test]
fn a_served_raid10_grow_swaps_in_the_new_shape_and_its_bitmap_covers_the_grown_region() {
    let dir = tempfile::tempdir().unwrap();
    let member_bytes = 6 << 20;
    // Small bitmap chunks: the grown region needs bits of its own.
    let specs: Vec<String> = (0..4)
        .map(|i| dir.path().join(format!("m{i}")).display().to_string())
        .collect();
    let options = nvraid_array::CreateOptions {
        level: Level::Raid10 { near: 2 },
        chunk_bytes: 64 << 10,
        name: "tests".into(),
        size_bytes: Some(member_bytes),
        force: false,
        direct: true,
        bitmap: nvraid_array::BitmapChoice::Internal {
            chunk_bytes: Some(1 << 20),
        },
    };
    nvraid_array::create(&specs, &options)
        .unwrap()
        .close()
        .unwrap();
    let added = vec![empty_member(&dir, "n0", member_bytes)];
    let array = writable(&specs);
    let first_size = array.size_bytes();
    let chunks_before = array.bitmap_info().expect("a bitmap").chunks;
    fill(&array);
    let versions = Versions::default();
    let running = Arc::new(AtomicBool::new(true));
    let clients = clients(&array, &versions, &running);
    std::thread::sleep(std::time::Duration::from_millis(50));
    let (live, thread) = grow(&array, 5, added.clone());
    wait_swapped(&array, &live, thread);
    assert_eq!(array.geometry().members(), 5);
    assert!(array.size_bytes() > first_size);
    let info = array.bitmap_info().unwrap();
    assert!(
        info.chunks > chunks_before && info.chunks * info.chunk_bytes >= array.size_bytes(),
        "the bitmap still covers {chunks_before} chunks of the old size: {info:?}"
    );
    std::thread::sleep(std::time::Duration::from_millis(300));
    running.store(false, Ordering::Release);
    let past: u64 = clients.into_iter().map(|c| c.join().unwrap()).sum();
    assert!(past > 0, "no client request reached the grown region");
    drop(live);
    let all: Vec<String> = specs.iter().chain(&added).cloned().collect();
    check_all(array, &versions, first_size, &all);
}

#[test]
fn a_served_restripe_swaps_in_the_new_chunk_under_clients() {
    let dir = tempfile::tempdir().unwrap();
    let specs = new_array(
        &dir,
        Level::Raid5 {
            layout: ParityLayout::LeftSymmetric,
        },
        4,
        64 << 10,
        6 << 20,
    );
    let array = writable(&specs);
    let first_size = array.size_bytes();
    fill(&array);
    let versions = Versions::default();
    let running = Arc::new(AtomicBool::new(true));
    let clients = clients(&array, &versions, &running);
    std::thread::sleep(std::time::Duration::from_millis(50));
    let (live, thread) = LiveGrow::start_shape(
        &array,
        &LiveShapeOptions {
            chunk_bytes: Some(32 << 10),
            layout: None,
            step_bytes: 256 << 10,
            min_bytes_per_sec: None,
            max_bytes_per_sec: Some(32 << 20),
        },
    )
    .unwrap();
    wait_swapped(&array, &live, thread);
    assert_eq!(array.geometry().chunk_bytes(), Some(32 << 10));
    std::thread::sleep(std::time::Duration::from_millis(200));
    running.store(false, Ordering::Release);
    for c in clients {
        c.join().unwrap();
    }
    drop(live);
    check_all(array, &versions, first_size, &specs);
}

#[test]
fn a_served_raid1_taken_over_as_raid5_swaps_in_the_parity_family_and_a_grow_follows_in_the_same_run(
) {
    let dir = tempfile::tempdir().unwrap();
    let member_bytes = 6 << 20;
    let specs = new_array(&dir, Level::Raid1, 2, 64 << 10, member_bytes);
    let added = vec![empty_member(&dir, "n0", member_bytes)];
    let array = writable(&specs);
    let first_size = array.size_bytes();
    fill(&array);
    let versions = Versions::default();
    let running = Arc::new(AtomicBool::new(true));
    let clients = clients(&array, &versions, &running);
    std::thread::sleep(std::time::Duration::from_millis(50));
    LiveLevel::start(&array, 5).unwrap();
    assert!(
        matches!(array.geometry().level(), Level::Raid5 { .. }),
        "{:?}",
        array.geometry()
    );
    assert!(
        !array.is_reshaping_live(),
        "the level change's route still takes every request"
    );
    std::thread::sleep(std::time::Duration::from_millis(200));
    let (live, thread) = grow(&array, 3, added.clone());
    wait_swapped(&array, &live, thread);
    assert!(matches!(array.geometry().level(), Level::Raid5 { .. }));
    assert_eq!(array.geometry().members(), 3);
    assert!(array.size_bytes() > first_size);
    std::thread::sleep(std::time::Duration::from_millis(200));
    running.store(false, Ordering::Release);
    for c in clients {
        c.join().unwrap();
    }
    drop(live);
    let all: Vec<String> = specs.iter().chain(&added).cloned().collect();
    check_all(array, &versions, first_size, &all);
}

#[test]
fn a_served_raid1_gaining_a_mirror_swaps_in_the_new_count_and_the_added_mirror_holds_every_block() {
    let dir = tempfile::tempdir().unwrap();
    let member_bytes = 6 << 20;
    let specs = new_array(&dir, Level::Raid1, 2, 64 << 10, member_bytes);
    let added = vec![empty_member(&dir, "n0", member_bytes)];
    let array = writable(&specs);
    let first_size = array.size_bytes();
    fill(&array);
    let versions = Versions::default();
    let running = Arc::new(AtomicBool::new(true));
    let clients = clients(&array, &versions, &running);
    std::thread::sleep(std::time::Duration::from_millis(50));
    let (live, thread) = nvraid_array::reshape::start_live(
        &array,
        &LiveGrowOptions {
            raid_devices: 3,
            add: added.clone(),
            direct: true,
            force: false,
            step_bytes: 256 << 10,
            max_bytes_per_sec: Some(32 << 20),
            min_bytes_per_sec: None,
        },
    )
    .unwrap();
    thread.join().unwrap();
    assert_eq!(live.status().state, "finished", "{:?}", live.status());
    assert!(!array.is_reshaping_live(), "the mirror's route outlived it");
    assert_eq!(array.roles(), 3);
    assert!(array.is_usable(2) && array.in_sync_bytes(2).is_none());
    std::thread::sleep(std::time::Duration::from_millis(200));
    running.store(false, Ordering::Release);
    for c in clients {
        c.join().unwrap();
    }
    drop(live);
    // Each mirror alone holds every block: the added one assembled alone.
    let all: Vec<String> = specs.iter().chain(&added).cloned().collect();
    let sizes = array.size_bytes();
    assert_eq!(sizes, first_size);
    check_all(array, &versions, first_size, &all);
    let alone = assemble(
        &added,
        AssembleOptions {
            writable: false,
            allow_degraded: true,
            ..Default::default()
        },
    )
    .unwrap();
    let versions = versions.lock().unwrap().clone();
    let (mut got, mut want) = (vec![0u8; BLOCK as usize], vec![0u8; BLOCK as usize]);
    for b in 0..first_size / BLOCK {
        alone.read_at(&mut got, b * BLOCK).unwrap();
        pattern(b, versions.get(&b).copied().unwrap_or(0), &mut want);
        assert!(got == want, "block {b} wrong on the added mirror");
    }
}

/// Requests a queue's route finished but the caller has not reaped yet
/// when the shape is swapped are reaped after it (the queue made again
/// for the new shape keeps them): before, they were lost and the server's
/// worker waited for them for ever.
#[test]
fn completions_a_queue_has_not_reaped_when_the_shape_swaps_are_reaped_after_it() {
    let dir = tempfile::tempdir().unwrap();
    let member_bytes = 6 << 20;
    let specs = new_array(
        &dir,
        Level::Raid5 {
            layout: ParityLayout::LeftSymmetric,
        },
        4,
        64 << 10,
        member_bytes,
    );
    let added = vec![empty_member(&dir, "n0", member_bytes)];
    let array = writable(&specs);
    fill(&array);
    let target = FanoutTarget::array(array.clone(), EngineKind::Psync);
    let mut queue = target.open_queue(8, 64 << 10).unwrap();
    let (live, thread) = grow(&array, 5, added);
    // Routed (the grow runs): done at once, their completions waiting.
    for slot in 0..4u32 {
        queue
            .submit(
                slot,
                OpKind::Read,
                u64::from(slot) * BLOCK,
                BLOCK as u32,
                false,
            )
            .unwrap();
    }
    wait_swapped(&array, &live, thread);
    // The first request after the swap makes the queue again.
    queue
        .submit(4, OpKind::Read, 4 * BLOCK, BLOCK as u32, false)
        .unwrap();
    let mut done = Vec::new();
    let started = std::time::Instant::now();
    while done.len() < 5 {
        assert!(
            started.elapsed() < std::time::Duration::from_secs(10),
            "completions lost across the swap: got {done:?}"
        );
        queue
            .reap(1, &mut |c| done.push((c.slot, c.result)))
            .unwrap();
    }
    done.sort_by_key(|&(slot, _)| slot);
    let mut want = vec![0u8; BLOCK as usize];
    for (slot, result) in done {
        assert_eq!(result, Ok(BLOCK as u32));
        pattern(u64::from(slot), 0, &mut want);
        assert!(
            queue.buffer(slot)[..BLOCK as usize] == want[..],
            "slot {slot}"
        );
    }
}

/// A served RAID 10 near=2 of four taken over as RAID 0 and back, twice,
/// under clients on fast-path queues: the roles renumbered at each swap
/// (RAID 10 role 2i or 2i+1 is RAID 0 role i, RAID 0 role k is RAID 10
/// role 2k), a role a new shape fills working (not faulty, not left, even
/// when the member that held it before left), a role it leaves empty
/// missing (the RAID 10 degraded by it, not "left"), and every block
/// where the clients last wrote it, in the run and assembled again.
#[test]
fn a_served_raid10_taken_over_as_raid0_and_back_renumbers_its_roles_under_clients() {
    let dir = tempfile::tempdir().unwrap();
    let specs: Vec<String> = (0..4)
        .map(|i| dir.path().join(format!("m{i}")).display().to_string())
        .collect();
    let options = nvraid_array::CreateOptions {
        level: Level::Raid10 { near: 2 },
        chunk_bytes: 64 << 10,
        name: "tests".into(),
        size_bytes: Some(6 << 20),
        force: false,
        direct: true,
        // md's RAID 0 keeps no bitmap: md takes over none that has one.
        bitmap: nvraid_array::BitmapChoice::None,
    };
    nvraid_array::create(&specs, &options)
        .unwrap()
        .close()
        .unwrap();
    let array = writable(&specs);
    let first_size = array.size_bytes();
    fill(&array);
    let versions = Versions::default();
    let running = Arc::new(AtomicBool::new(true));
    let clients = clients(&array, &versions, &running);
    let spec_of =
        |array: &Array, role: usize| array.slot(role).map(|s| s.member.spec().to_string());
    std::thread::sleep(std::time::Duration::from_millis(50));
    // RAID 10 -> 0: the first copy of each pair kept, m1 and m3 leave.
    let live = LiveLevel::start(&array, 0).unwrap();
    assert_eq!(
        live.switched().released,
        vec![specs[1].clone(), specs[3].clone()]
    );
    assert_eq!(array.geometry().level(), Level::Raid0);
    assert_eq!(array.geometry().members(), 2);
    assert_eq!(
        [spec_of(&array, 0), spec_of(&array, 1)],
        [Some(specs[0].clone()), Some(specs[2].clone())]
    );
    // Role 1 held m1, which left; m2 holds it now, working.
    assert!(array.is_usable(1) && !array.is_faulty(1) && !array.has_left(1));
    assert!(!array.is_degraded());
    std::thread::sleep(std::time::Duration::from_millis(100));
    // RAID 0 -> 10: m0 role 0, m2 role 2, roles 1 and 3 missing (role 3's
    // member left before: missing now, not left).
    LiveLevel::start(&array, 10).unwrap();
    assert_eq!(array.geometry().level(), Level::Raid10 { near: 2 });
    assert_eq!(array.geometry().members(), 4);
    assert_eq!(
        (0..4).map(|r| spec_of(&array, r)).collect::<Vec<_>>(),
        [Some(specs[0].clone()), None, Some(specs[2].clone()), None]
    );
    assert!(!array.has_left(1) && !array.has_left(3));
    assert!(array.is_degraded());
    std::thread::sleep(std::time::Duration::from_millis(100));
    // And back to RAID 0 from the copies left: nothing leaves.
    let live = LiveLevel::start(&array, 0).unwrap();
    assert!(live.switched().released.is_empty());
    assert_eq!(
        [spec_of(&array, 0), spec_of(&array, 1)],
        [Some(specs[0].clone()), Some(specs[2].clone())]
    );
    std::thread::sleep(std::time::Duration::from_millis(100));
    running.store(false, Ordering::Release);
    for c in clients {
        c.join().unwrap();
    }
    drop(live);
    let kept = vec![specs[0].clone(), specs[2].clone()];
    check_all(array, &versions, first_size, &kept);
}
