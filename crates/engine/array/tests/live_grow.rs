//! A RAID 4/5/6 gaining members while clients read and write it through
//! the fast path (`reshape::LiveGrow`, what `nvraid grow --socket` runs
//! in a served array): every byte the clients wrote reads back, during the
//! grow through the two shapes and after it from the new shape assembled
//! again.

mod common;

use common::{clients_during, new_array, one, pattern, writable};
use nvraid_array::reshape::{LiveGrow, LiveGrowOptions};
use nvraid_array::{assemble, AssembleOptions, FanoutTarget};
use nvraid_io::engine::EngineKind;
use nvraid_io::queue::{OpKind, Target};
use nvraid_layout::parity::ParityLayout;
use nvraid_layout::Level;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

const BLOCK: u64 = 4096;

fn empty_member(dir: &tempfile::TempDir, name: &str, bytes: u64) -> String {
    let path = dir.path().join(name);
    std::fs::File::create(&path)
        .unwrap()
        .set_len(bytes)
        .unwrap();
    path.display().to_string()
}

fn grow_online_and_check(level: Level, members: usize, add: usize, clients: Clients) {
    grow_online_failing(level, members, add, clients, &[]);
}

/// [`grow_online_and_check`], the old members in `fail` failed (recorded
/// faulty, as an I/O error on them does) once the grow is part-way: it
/// goes on degraded and every byte reads back from the others.
fn grow_online_failing(level: Level, members: usize, add: usize, clients: Clients, fail: &[usize]) {
    let dir = tempfile::tempdir().unwrap();
    let member_bytes = 6 << 20;
    let specs = new_array(&dir, level, members, 64 << 10, member_bytes);
    let new: Vec<String> = (0..add)
        .map(|k| empty_member(&dir, &format!("n{k}"), member_bytes))
        .collect();
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
    let mixed = matches!(clients, Clients::Mixed);
    let (threads, writes, step_bytes, max_bytes_per_sec) = match clients {
        Clients::Mixed => (4, true, 256 << 10, Some(16 << 20)),
        // Only reads, as many as the cores take, and the smallest steps
        // at full speed: the most position moves under reads in flight.
        Clients::Readers => (8, false, 1, None),
    };
    let clients = clients_during(
        &array,
        threads,
        writes.then_some(3),
        0x1234,
        "grow",
        &running,
    );
    std::thread::sleep(std::time::Duration::from_millis(50));
    let (live, thread) = LiveGrow::start(
        &array,
        &LiveGrowOptions {
            raid_devices: (members + add) as u32,
            add: new.clone(),
            direct: true,
            force: false,
            // Small steps: many windows, many position moves under the
            // clients' reads.
            step_bytes,
            max_bytes_per_sec,
            min_bytes_per_sec: None,
        },
    )
    .unwrap();
    let second = LiveGrow::start(
        &array,
        &LiveGrowOptions {
            raid_devices: (members + add + 1) as u32,
            add: vec![empty_member(&dir, "extra", member_bytes)],
            direct: true,
            force: false,
            step_bytes: 256 << 10,
            max_bytes_per_sec: None,
            min_bytes_per_sec: None,
        },
    );
    let refused = second
        .expect_err("a second grow while one runs")
        .to_string();
    assert!(refused.contains("second grow"), "{refused}");
    let mut saw_mid = false;
    let mut failed_mid = None;
    while live.status().state == "running" {
        let s = live.status();
        saw_mid |= s.position_bytes > 0 && s.position_bytes < s.end_bytes;
        if saw_mid && failed_mid.is_none() {
            for &role in fail {
                array
                    .fail_member(role, &std::io::Error::from_raw_os_error(libc::EIO))
                    .unwrap();
            }
            failed_mid = Some(s.position_bytes);
        }
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    thread.join().unwrap();
    let status = live.status();
    assert_eq!(status.state, "finished", "{status:?}");
    assert!(saw_mid, "the status never showed the grow part-way");
    if !fail.is_empty() {
        let at = failed_mid.expect("failed part-way");
        assert!(at < status.end_bytes, "failed at {at}, the end");
        assert!(fail.iter().all(|&r| !array.is_usable(r)));
    }
    // Clients on after the end: all in the new shape now.
    std::thread::sleep(std::time::Duration::from_millis(100));
    running.store(false, Ordering::Release);
    let mut versions = std::collections::HashMap::new();
    for c in clients {
        versions.extend(c.join().unwrap());
    }
    // The grow's end was adopted (`Array::swap_shape`): the added members
    // are the array's own, the served size the new one, and the bits the
    // clients' writes set go with the bitmap's passes as in any whole
    // array (each pass flushes every member first, the added ones
    // included). While the grow ran, no pass cleared any
    // (`may_clear_bits`).
    assert!(!array.is_reshaping_live(), "the grow's route outlived it");
    assert_eq!(array.size_bytes(), live.status().new_size_bytes);
    let dirty = array.bitmap_info().expect("a bitmap").dirty_chunks;
    assert!(dirty > 0 || !mixed, "the clients' writes set no bit");
    array.clear_idle_bits().unwrap();
    std::thread::sleep(std::time::Duration::from_millis(20));
    array.clear_idle_bits().unwrap();
    // A degraded array keeps its bits (the missing member needs them).
    assert_eq!(
        array.bitmap_info().unwrap().dirty_chunks,
        if fail.is_empty() { 0 } else { dirty },
        "write-intent bits of idle chunks after the online grow ended"
    );
    drop(live);
    Arc::try_unwrap(array).unwrap().close().unwrap();
    // Assembled again: the new shape, larger, every block as last written.
    let all: Vec<String> = specs
        .iter()
        .enumerate()
        .filter(|(role, _)| !fail.contains(role))
        .map(|(_, s)| s)
        .chain(&new)
        .cloned()
        .collect();
    let grown = assemble(
        &all,
        AssembleOptions {
            writable: false,
            allow_degraded: true,
            ..Default::default()
        },
    )
    .unwrap();
    assert_eq!(grown.geometry().members() as usize, members + add);
    assert_eq!(grown.is_degraded(), !fail.is_empty());
    assert_eq!(grown.size_bytes(), status.new_size_bytes);
    assert!(grown.size_bytes() > size);
    let mut got = vec![0u8; BLOCK as usize];
    let mut want = vec![0u8; BLOCK as usize];
    for b in 0..size / BLOCK {
        grown.read_at(&mut got, b * BLOCK).unwrap();
        pattern(b, versions.get(&b).copied().unwrap_or(0), &mut want);
        assert!(got == want, "block {b} wrong after the grow");
    }
    for b in size / BLOCK..grown.size_bytes() / BLOCK {
        grown.read_at(&mut got, b * BLOCK).unwrap();
        assert!(got.iter().all(|&x| x == 0), "new space block {b} not zeros");
    }
}

#[derive(Clone, Copy)]
enum Clients {
    /// Reads and writes, each client its own blocks.
    Mixed,
    /// Reads only.
    Readers,
}

/// A step overwrites old-shape rows of bytes already moved; a read routed
/// to the old shape just before the position passed them must have
/// finished first (the step drains every request older than it).
#[test]
fn a_read_routed_to_the_old_shape_is_never_overwritten_under_it_by_the_next_step() {
    grow_online_and_check(
        Level::Raid5 {
            layout: ParityLayout::LeftSymmetric,
        },
        4,
        1,
        Clients::Readers,
    );
}

#[test]
fn clients_read_and_write_through_an_online_raid5_grow_and_every_byte_reads_back() {
    grow_online_and_check(
        Level::Raid5 {
            layout: ParityLayout::LeftSymmetric,
        },
        4,
        1,
        Clients::Mixed,
    );
}

#[test]
fn clients_read_and_write_through_an_online_raid6_grow_and_every_byte_reads_back() {
    grow_online_and_check(
        Level::Raid6 {
            layout: ParityLayout::LeftSymmetric,
        },
        5,
        1,
        Clients::Mixed,
    );
}

/// A served RAID 10 near=2 gains a member: the new shape's rows written
/// whole by each step (chunks just below the position and just past the
/// step's end among them) while clients write their blocks.
#[test]
fn clients_read_and_write_through_an_online_raid10_grow_and_every_byte_reads_back() {
    grow_online_and_check(Level::Raid10 { near: 2 }, 4, 1, Clients::Mixed);
}

#[test]
fn reads_of_an_online_raid10_grow_never_see_a_row_rewritten_under_them() {
    grow_online_and_check(Level::Raid10 { near: 2 }, 4, 1, Clients::Readers);
}

#[test]
fn two_members_failing_mid_online_raid6_grow_are_recorded_faulty_and_the_grow_finishes_degraded() {
    grow_online_failing(
        Level::Raid6 {
            layout: ParityLayout::LeftSymmetric,
        },
        5,
        1,
        Clients::Mixed,
        &[1, 3],
    );
}

#[test]
fn a_member_failing_mid_online_raid5_grow_is_recorded_faulty_and_the_grow_finishes_degraded() {
    grow_online_failing(
        Level::Raid5 {
            layout: ParityLayout::LeftSymmetric,
        },
        4,
        1,
        Clients::Mixed,
        &[2],
    );
}

#[test]
fn an_online_grow_with_a_wrong_member_count_is_refused_and_nothing_written() {
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
    let extra = empty_member(&dir, "n0", 6 << 20);
    let array = writable(&specs);
    let before: Vec<Vec<u8>> = specs
        .iter()
        .chain([&extra])
        .map(|s| std::fs::read(s).unwrap())
        .collect();
    let err = LiveGrow::start(
        &array,
        &LiveGrowOptions {
            raid_devices: 6,
            add: vec![extra.clone()],
            direct: true,
            force: false,
            step_bytes: 1 << 20,
            max_bytes_per_sec: None,
            min_bytes_per_sec: None,
        },
    )
    .expect_err("6 members with one added to 4")
    .to_string();
    assert!(err.contains("--raid-devices"), "{err}");
    assert!(!array.is_reshaping_live());
    let after: Vec<Vec<u8>> = specs
        .iter()
        .chain([&extra])
        .map(|s| std::fs::read(s).unwrap())
        .collect();
    assert!(before == after, "a refused grow changed a member");
}

/// `serve --reshape-speed MIN:MAX`'s MIN: while clients are doing I/O the
/// grow moves rows no faster than MIN (the rebuild's rule, sampled every
/// 100 ms), and once they stop it runs unlimited (no MAX given).
#[test]
fn an_online_grow_slows_to_its_minimum_while_clients_are_busy_and_speeds_up_when_idle() {
    let dir = tempfile::tempdir().unwrap();
    let member_bytes = 8 << 20;
    let specs = new_array(
        &dir,
        Level::Raid5 {
            layout: ParityLayout::LeftSymmetric,
        },
        4,
        64 << 10,
        member_bytes,
    );
    let new = empty_member(&dir, "n0", member_bytes);
    let array = writable(&specs);
    // The size filled (the served size is the grown one once the grow
    // ends: `Array::swap_shape`).
    let size = array.size_bytes();
    {
        let target = FanoutTarget::array(array.clone(), EngineKind::Psync);
        let mut queue = target.open_queue(1, 64 << 10).unwrap();
        for b in 0..array.size_bytes() / BLOCK {
            pattern(b, 0, &mut queue.buffer_mut(0)[..BLOCK as usize]);
            one(&mut queue, OpKind::Write, b * BLOCK, BLOCK as u32);
        }
    }
    let running = Arc::new(AtomicBool::new(true));
    let clients = clients_during(&array, 2, None, 0x1234, "grow", &running);
    std::thread::sleep(std::time::Duration::from_millis(50));
    let min: u64 = 500_000;
    let step: u64 = 128 << 10;
    let started = std::time::Instant::now();
    let (live, thread) = LiveGrow::start(
        &array,
        &LiveGrowOptions {
            raid_devices: 5,
            add: vec![new],
            direct: true,
            force: false,
            step_bytes: step,
            max_bytes_per_sec: None,
            min_bytes_per_sec: Some(min),
        },
    )
    .unwrap();
    std::thread::sleep(std::time::Duration::from_millis(1500));
    let busy = live.status();
    let busy_secs = started.elapsed().as_secs_f64();
    running.store(false, Ordering::Release);
    for client in clients {
        client.join().unwrap();
    }
    // At MIN (0.5 MB/s) for 1.5 s: about 0.75 MB; two steps ahead at
    // most, and the first look's slack.
    let allowed = (min as f64 * busy_secs) as u64 + 2 * step + (256 << 10);
    assert!(
        busy.position_bytes <= allowed,
        "the grow moved {} bytes in {busy_secs:.2} s beside busy clients (MIN {min} B/s allows {allowed})",
        busy.position_bytes
    );
    assert!(
        busy.position_bytes >= step,
        "the grow did not move at its minimum beside busy clients: {busy:?}"
    );
    assert_eq!(busy.state, "running", "{busy:?}");
    // Idle: no MAX, so the rest (about 30 MiB, a minute at MIN) goes at
    // full speed (over 5 MB/s in a debug build beside other builds).
    let idle = std::time::Instant::now();
    thread.join().unwrap();
    let status = live.status();
    assert_eq!(status.state, "finished", "{status:?}");
    let remaining = status.end_bytes - busy.position_bytes;
    assert!(
        idle.elapsed().as_secs_f64() < remaining as f64 / min as f64 / 2.0,
        "the idle grow took {:.1} s for {remaining} bytes: it did not leave its minimum",
        idle.elapsed().as_secs_f64()
    );
    // Every byte reads back from the new shape.
    drop(live);
    Arc::try_unwrap(array).unwrap().close().unwrap();
    let members: Vec<String> = specs
        .iter()
        .cloned()
        .chain([dir.path().join("n0").display().to_string()])
        .collect();
    let grown = assemble(
        &members,
        AssembleOptions {
            writable: false,
            ..Default::default()
        },
    )
    .unwrap();
    assert_eq!(grown.geometry().members(), 5);
    let mut got = vec![0u8; BLOCK as usize];
    let mut want = vec![0u8; BLOCK as usize];
    for b in 0..size / BLOCK {
        grown.read_at(&mut got, b * BLOCK).unwrap();
        pattern(b, 0, &mut want);
        assert!(got == want, "block {b} wrong after the paced grow");
    }
}

/// A served RAID 1 gaining a mirror, stopped part-way (the server
/// stopping): the array closes with the new count and the new member
/// recorded recovering at the copy's position; assembled again, every
/// member is in, the rebuild goes on from that position, and the new
/// mirror then holds every block the clients last wrote.
#[test]
fn a_mirror_added_online_and_stopped_part_way_is_recovering_from_its_position_when_assembled() {
    use nvraid_array::reshape::start_live;
    let dir = tempfile::tempdir().unwrap();
    let member_bytes = 8 << 20;
    let specs = new_array(&dir, Level::Raid1, 2, 64 << 10, member_bytes);
    let new = empty_member(&dir, "n0", member_bytes);
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
    let clients = clients_during(&array, 4, Some(3), 0x1234, "grow", &running);
    let (live, thread) = start_live(
        &array,
        &LiveGrowOptions {
            raid_devices: 3,
            add: vec![new.clone()],
            direct: true,
            force: false,
            step_bytes: 256 << 10,
            max_bytes_per_sec: Some(4 << 20),
            min_bytes_per_sec: None,
        },
    )
    .unwrap();
    let mid = loop {
        let s = live.status();
        if s.position_bytes >= size / 3 {
            break s;
        }
        assert_eq!(s.state, "running", "{s:?}");
        std::thread::sleep(std::time::Duration::from_millis(5));
    };
    assert_eq!(mid.kind, "mirror");
    live.stop();
    thread.join().unwrap();
    let stopped = live.status();
    assert_eq!(stopped.state, "failed", "{stopped:?}");
    assert!(stopped.position_bytes < size, "{stopped:?}");
    running.store(false, Ordering::Release);
    let mut versions = std::collections::HashMap::new();
    for c in clients {
        versions.extend(c.join().unwrap());
    }
    drop(live);
    Arc::try_unwrap(array).unwrap().close().unwrap();
    let all: Vec<String> = specs.iter().chain([&new]).cloned().collect();
    let again = assemble(
        &all,
        AssembleOptions {
            writable: true,
            ..Default::default()
        },
    )
    .unwrap();
    assert_eq!(again.geometry().members(), 3);
    assert!(again.set_aside().is_empty(), "{:?}", again.set_aside());
    assert_eq!(
        again.in_sync_bytes(2),
        Some(stopped.position_bytes),
        "the new mirror's recovery offset is not the copy's position"
    );
    nvraid_array::recovery::rebuild(&again, None, &mut |_| {}).unwrap();
    assert_eq!(again.in_sync_bytes(2), None);
    again.close().unwrap();
    // The new mirror alone holds every block as last written.
    let data_offset = {
        let bytes = std::fs::read(&new).unwrap();
        nvraid_metadata::Superblock::decode(&bytes[4096..8192])
            .unwrap()
            .data_offset_sectors
            * 512
    };
    let bytes = std::fs::read(&new).unwrap();
    let mut want = vec![0u8; BLOCK as usize];
    for b in 0..size / BLOCK {
        pattern(b, versions.get(&b).copied().unwrap_or(0), &mut want);
        let at = (data_offset + b * BLOCK) as usize;
        assert!(
            bytes[at..at + BLOCK as usize] == want[..],
            "block {b} wrong on the new mirror"
        );
    }
}
