//! md's write-intent bitmap, maintained by nvraid: bits durable before the
//! data they cover, cleared lazily and only when every copy holds the data,
//! never while degraded; a resync after a crash visits only the set bits;
//! and the real kernel md reads what nvraid leaves.

mod common;

use nvraid_array::recovery::{self, Mode};
use nvraid_array::{assemble, create, AssembleOptions, BitmapChoice, CreateOptions};
use nvraid_io::queue::{OpKind, Target};
use nvraid_layout::Level;
use nvraid_metadata::bitmap::{self, BitmapHeader};
use nvraid_metadata::Superblock;
use std::sync::Arc;

const CHUNK: u64 = 64 << 10;
/// The bitmap's place on a member nvraid creates: 4 KiB after the
/// superblock at 4 KiB.
const BITMAP_AT: usize = 8192;

fn create_mirror(dir: &tempfile::TempDir, member_bytes: u64, chunk: u64) -> Vec<String> {
    create_named(dir, "bitmap", member_bytes, chunk)
}

fn create_named(dir: &tempfile::TempDir, name: &str, member_bytes: u64, chunk: u64) -> Vec<String> {
    let specs: Vec<String> = (0..2)
        .map(|i| dir.path().join(format!("{name}{i}")).display().to_string())
        .collect();
    let options = CreateOptions {
        level: Level::Raid1,
        chunk_bytes: 64 << 10,
        name: name.into(),
        size_bytes: Some(member_bytes),
        force: false,
        direct: true,
        bitmap: BitmapChoice::Internal {
            chunk_bytes: Some(chunk),
        },
    };
    create(&specs, &options).unwrap().close().unwrap();
    specs
}

const RW: AssembleOptions = AssembleOptions {
    writable: true,
    direct: true,
    allow_degraded: true,
};

/// The bitmap header, the bits set, and the superblock, as on `spec` now.
fn on_disk(spec: &str) -> (BitmapHeader, Vec<u64>, Superblock) {
    let image = std::fs::read(spec).unwrap();
    let sb = Superblock::decode(&image[4096..8192]).unwrap();
    let header = BitmapHeader::decode(&image[BITMAP_AT..], &sb.set_uuid).unwrap();
    let bits = (0..header.bits())
        .filter(|&b| bitmap::test_bit(&image[BITMAP_AT..], b))
        .collect();
    (header, bits, sb)
}

#[test]
fn create_writes_an_md_bitmap_with_mdadm_defaults() {
    let dir = tempfile::tempdir().unwrap();
    let specs: Vec<String> = (0..2)
        .map(|i| dir.path().join(format!("m{i}")).display().to_string())
        .collect();
    let options = CreateOptions {
        level: Level::Raid10 { near: 2 },
        chunk_bytes: 64 << 10,
        name: "defaults".into(),
        size_bytes: Some(16 << 20),
        force: false,
        direct: true,
        bitmap: BitmapChoice::Auto,
    };
    let array = create(&specs, &options).unwrap();
    let size = array.size_bytes();
    array.close().unwrap();
    for spec in &specs {
        let (header, bits, sb) = on_disk(spec);
        assert_eq!(sb.feature_map & 1, 1, "BITMAP_OFFSET set");
        assert_eq!(sb.bitmap_offset, 8);
        assert_eq!(header.version, 4);
        assert_eq!(header.chunk_bytes, 64 << 20, "mdadm's default chunk");
        assert_eq!(header.sync_size_sectors, size / 512, "the array's size");
        assert_eq!(header.daemon_sleep, 5);
        assert!(
            header.events >= sb.events,
            "bitmap no older than superblock"
        );
        assert!(bits.is_empty());
    }
    // RAID 0 gets none by default, and refuses one asked for.
    let r0: Vec<String> = (0..2)
        .map(|i| dir.path().join(format!("z{i}")).display().to_string())
        .collect();
    let raid0 = CreateOptions {
        level: Level::Raid0,
        ..options.clone()
    };
    create(&r0, &raid0).unwrap().close().unwrap();
    let sb = Superblock::decode(&std::fs::read(&r0[0]).unwrap()[4096..8192]).unwrap();
    assert_eq!(sb.feature_map & 1, 0);
    let refused = create(
        &r0,
        &CreateOptions {
            force: true,
            bitmap: BitmapChoice::Internal { chunk_bytes: None },
            ..raid0
        },
    )
    .unwrap_err()
    .to_string();
    assert!(refused.contains("raid0"), "{refused}");
}

#[test]
fn a_bit_is_durable_before_its_write_and_cleared_only_when_idle_and_whole() {
    let dir = tempfile::tempdir().unwrap();
    let specs = create_mirror(&dir, 8 << 20, CHUNK);
    let array = assemble(&specs, RW).unwrap();
    array.write_at(&[1u8; 4096], 0, false).unwrap();
    array
        .write_at(&[2u8; 8192], 17 * CHUNK + 4096, false)
        .unwrap();
    // The write returned: its bits are on both members already.
    for spec in &specs {
        let (header, bits, sb) = on_disk(spec);
        assert_eq!(bits, vec![0, 17], "{spec}");
        assert!(header.events >= sb.events);
    }
    // First pass: both chunks were written since the last one; they stay.
    array.clear_idle_bits().unwrap();
    assert_eq!(on_disk(&specs[0]).1, vec![0, 17]);
    // Chunk 17 written again; chunk 0 idle for a whole pass now: it goes.
    array.write_at(&[3u8; 4096], 17 * CHUNK, false).unwrap();
    array.clear_idle_bits().unwrap();
    for spec in &specs {
        assert_eq!(on_disk(spec).1, vec![17], "{spec}");
    }
    array.clear_idle_bits().unwrap();
    assert_eq!(on_disk(&specs[1]).1, Vec::<u64>::new());
    let cleared = on_disk(&specs[0]).0.events_cleared;
    array.close().unwrap();

    // Degraded: bits stay set through passes and close (a member that
    // comes back needs them), and events_cleared does not move.
    let array = assemble(&specs[..1], RW).unwrap();
    assert!(array.is_degraded());
    array.write_at(&[4u8; 4096], 5 * CHUNK, false).unwrap();
    for _ in 0..3 {
        array.clear_idle_bits().unwrap();
    }
    array.close().unwrap();
    let (header, bits, sb) = on_disk(&specs[0]);
    assert_eq!(bits, vec![5]);
    assert_eq!(header.events_cleared, cleared);
    assert_eq!(header.events, sb.events);
}

#[test]
fn fast_path_writes_set_bits_before_they_land() {
    let dir = tempfile::tempdir().unwrap();
    let specs = create_mirror(&dir, 8 << 20, CHUNK);
    let array = Arc::new(assemble(&specs, RW).unwrap());
    let target =
        nvraid_array::FanoutTarget::array(array.clone(), nvraid_io::engine::EngineKind::Psync);
    let mut queue = target.open_queue(4, 64 << 10).unwrap();
    for (slot, chunk) in [(0u32, 3u64), (1, 40), (2, 41)] {
        queue.buffer_mut(slot)[..4096].fill(9);
        queue
            .submit(slot, OpKind::Write, chunk * CHUNK, 4096, false)
            .unwrap();
    }
    let mut done = Vec::new();
    while done.len() < 3 {
        queue.reap(1, &mut |c| done.push(c)).unwrap();
    }
    assert!(done.iter().all(|c| c.result == Ok(4096)), "{done:?}");
    assert_eq!(on_disk(&specs[1]).1, vec![3, 40, 41]);
    assert_eq!(array.bitmap_info().unwrap().dirty_chunks, 3);
    drop(queue);
    drop(target);
    Arc::try_unwrap(array).unwrap().close().unwrap();
    assert_eq!(on_disk(&specs[1]).1, Vec::<u64>::new(), "clean at close");
}

/// After a crash, the resync visits only the chunks whose bits are set: a
/// torn write in a dirty chunk is repaired; a difference planted in a clean
/// chunk (no write could have torn it) is not visited, as in md.
#[test]
fn a_resync_after_a_crash_visits_only_the_dirty_chunks() {
    let dir = tempfile::tempdir().unwrap();
    let specs = create_mirror(&dir, 8 << 20, CHUNK);
    let array = assemble(&specs, RW).unwrap();
    let size = array.size_bytes() as usize;
    let base: Vec<u8> = (0..size).map(|i| (i % 251) as u8).collect();
    array.write_at(&base, 0, true).unwrap();
    array.close().unwrap();

    let array = assemble(&specs, RW).unwrap();
    array.write_at(&[0xaa; 8192], 3 * CHUNK, true).unwrap();
    drop(array); // killed: no orderly close
                 // The crash tore that write: member 1 kept the old bytes of its second
                 // half. And a difference nobody wrote sits in chunk 10.
    let data_at = 1 << 20; // nvraid's data offset
    let mut m1 = std::fs::OpenOptions::new()
        .write(true)
        .open(&specs[1])
        .unwrap();
    use std::io::{Seek, SeekFrom, Write};
    let torn = 3 * CHUNK as usize + 4096;
    m1.seek(SeekFrom::Start((data_at + torn) as u64)).unwrap();
    m1.write_all(&base[torn..torn + 4096]).unwrap();
    m1.seek(SeekFrom::Start(data_at as u64 + 10 * CHUNK))
        .unwrap();
    m1.write_all(&[0x55; 512]).unwrap();
    drop(m1);

    let array = assemble(&specs, RW).unwrap();
    assert!(array.is_dirty());
    assert_eq!(array.bitmap_info().unwrap().dirty_chunks, 1);
    let found = recovery::scrub(&array, Mode::Repair, &mut |_| {}).unwrap();
    assert!(found.resynced);
    assert_eq!(found.bytes, CHUNK, "only the dirty chunk was compared");
    assert_eq!(found.mismatch_sectors, 8);
    assert_eq!(found.regions, vec![(torn as u64, torn as u64 + 4096)]);
    assert_eq!(array.bitmap_info().unwrap().dirty_chunks, 0);
    // A full check still sees the planted difference: the resync left it.
    let check = recovery::scrub(&array, Mode::Check, &mut |_| {}).unwrap();
    assert_eq!(check.mismatch_sectors, 1);
    assert_eq!(check.regions, vec![(10 * CHUNK, 10 * CHUNK + 512)]);
    array.close().unwrap();
    let (_, bits, sb) = on_disk(&specs[0]);
    assert!(bits.is_empty() && sb.is_clean());
}

/// nvraid crashes with bits set on two mirrors; the real kernel md
/// assembles both and resyncs by those bits. Mirror `torn` lost part of a
/// write on its second copy: md's resync repairs it from the first copy and
/// md reads nvraid's data, and a check finds no difference left. Mirror
/// `stray` holds a difference in a chunk whose bit is clear (no write
/// touched it): md's check still finds it afterwards, so md trusted
/// nvraid's bits rather than resyncing everything.
#[test]
fn kernel_resyncs_by_the_bits_nvraid_left() {
    use sha2::{Digest, Sha256};
    use std::io::{Seek, SeekFrom, Write};
    let dir = tempfile::tempdir().unwrap();
    let mib = 1u64 << 20;
    let data_at = 1u64 << 20; // nvraid's data offset
    let mut images = Vec::new();
    let mut expect = String::new();
    for name in ["torn", "stray"] {
        let specs = create_named(&dir, name, 16 << 20, mib);
        let array = assemble(&specs, RW).unwrap();
        let size = array.size_bytes() as usize;
        let mut model: Vec<u8> = (0..size).map(|i| (i % 241) as u8).collect();
        array.write_at(&model, 0, true).unwrap();
        array.close().unwrap();
        let array = assemble(&specs, RW).unwrap();
        for chunk in [2u64, 9] {
            let at = (chunk * mib) as usize;
            model[at..at + 65536].fill(0xc3);
            array
                .write_at(&model[at..at + 65536], at as u64, true)
                .unwrap();
        }
        drop(array); // a crash: dirty, bits 2 and 9 set
        for spec in &specs {
            let (header, bits, sb) = on_disk(spec);
            assert_eq!(bits, vec![2, 9]);
            assert!(!sb.is_clean() && header.events >= sb.events);
        }
        let mut m1 = std::fs::OpenOptions::new()
            .write(true)
            .open(&specs[1])
            .unwrap();
        let planted = if name == "torn" { 2 } else { 5 };
        m1.seek(SeekFrom::Start(data_at + planted * mib)).unwrap();
        m1.write_all(&[0u8; 4096]).unwrap();
        drop(m1);
        if name == "torn" {
            expect = format!("{:x}", Sha256::digest(&model));
        }
        images.extend(specs);
    }
    let out = common::kernel_check(&images, &["--scrub", "--expect", &expect]);
    let bitmap_lines: Vec<&str> = out
        .lines()
        .filter(|l| l.starts_with("MDVM_BITMAP"))
        .collect();
    assert_eq!(bitmap_lines.len(), 4, "{out}");
    assert!(
        bitmap_lines.iter().all(|l| l.ends_with("bits=15 dirty=2")),
        "{out}"
    );
    let check = |name: &str| {
        out.lines()
            .find(|l| {
                l.starts_with("MDVM_CHECK md=")
                    && (l.contains(&format!(" name={name} ")) || l.contains(&format!(":{name} ")))
            })
            .unwrap_or_else(|| panic!("no {name} array: {out}"))
            .to_string()
    };
    assert!(check("torn").ends_with(" mismatch=0"), "{out}");
    let stray = check("stray");
    assert!(
        !stray.ends_with(" mismatch=0") && !stray.ends_with(" mismatch=-"),
        "{out}"
    );
}

/// A member opened for writing (claimed), as a new or returning member.
fn open_rw(spec: &str) -> nvraid_member::Member {
    nvraid_member::Member::open(
        spec,
        nvraid_member::OpenOptions {
            write: true,
            create_bytes: None,
            direct: true,
            ..Default::default()
        },
    )
    .unwrap()
}

fn read_whole(array: &nvraid_array::Array) -> Vec<u8> {
    let mut whole = vec![0u8; array.size_bytes() as usize];
    array.read_at(&mut whole, 0).unwrap();
    whole
}

/// md's re-add: a member that was away comes back into its role and only
/// the chunks written meanwhile are copied to it; a crash before the copy
/// resumes by bitmap; and a member that left before bits were last cleared
/// is refused (the bitmap no longer covers what it missed).
#[test]
fn a_member_that_comes_back_recovers_only_what_it_missed() {
    let dir = tempfile::tempdir().unwrap();
    let specs = create_mirror(&dir, 8 << 20, CHUNK);
    let array = assemble(&specs, RW).unwrap();
    let size = array.size_bytes() as usize;
    let base: Vec<u8> = (0..size).map(|i| (i % 239) as u8).collect();
    array.write_at(&base, 0, true).unwrap();
    array.close().unwrap();
    // Member 1 is away while chunks 7 and 30 are written.
    let array = assemble(&specs[..1], RW).unwrap();
    array.write_at(&[0x77; 4096], 7 * CHUNK, false).unwrap();
    array
        .write_at(&[0x30; 8192], 30 * CHUNK + 4096, false)
        .unwrap();
    let expected = read_whole(&array);
    array.close().unwrap();

    let array = assemble(&specs[..1], RW).unwrap();
    let old = open_rw(&specs[1]);
    let (array, role) = recovery::re_add(array, old).unwrap();
    assert_eq!(role, 1);
    assert!(array.recovers_by_bitmap(1));
    drop(array); // killed before copying anything
    let array = assemble(&specs, RW).unwrap();
    assert!(
        array.recovers_by_bitmap(1),
        "RECOVERY_BITMAP survives a crash"
    );
    let rebuilt = recovery::rebuild(&array, None, &mut |_| {}).unwrap();
    assert_eq!(rebuilt.len(), 1);
    assert_eq!(rebuilt[0].bytes, 2 * CHUNK, "chunks 7 and 30 only");
    assert!(!array.is_degraded());
    let check = recovery::scrub(&array, Mode::Check, &mut |_| {}).unwrap();
    assert_eq!(check.mismatch_sectors, 0, "{check:?}");
    assert_eq!(read_whole(&array), expected);
    array.close().unwrap();
    assert!(on_disk(&specs[1]).1.is_empty(), "whole again: bits cleared");

    // Member 1 leaves at events E; a new member takes its role and is
    // rebuilt; the whole array clears its bits (events_cleared > E); the
    // new member fails. Member 1 is refused: bits it would need are gone.
    let left_at = on_disk(&specs[1]).2.events;
    let array = assemble(&specs[..1], RW).unwrap();
    array.write_at(&[0x11; 4096], 3 * CHUNK, false).unwrap();
    let spare = dir.path().join("spare").display().to_string();
    std::fs::File::create(&spare)
        .unwrap()
        .set_len(8 << 20)
        .unwrap();
    let new = open_rw(&spare);
    let (array, _) = recovery::add_member(array, new).unwrap();
    recovery::rebuild(&array, None, &mut |_| {}).unwrap();
    array.close().unwrap();
    let whole = [specs[0].clone(), spare.clone()];
    let array = assemble(&whole, RW).unwrap();
    assert!(array.bitmap_info().unwrap().events_cleared > left_at);
    array
        .fail_member(1, &std::io::Error::other("administrator"))
        .unwrap();
    let old = open_rw(&specs[1]);
    let refused = recovery::re_add(array, old).unwrap_err().to_string();
    assert!(
        refused.contains("before bits were last cleared"),
        "{refused}"
    );
}

/// A torn write on one member (nvraid-io's faulty engine: the first 4 KiB
/// of an 8 KiB write land on member 1, then EIO): the member is marked
/// faulty, the write succeeds on the other copy, the bit stays set while
/// degraded, and the member re-added afterwards gets exactly that chunk
/// back in sync.
#[test]
fn a_torn_write_on_one_member_is_put_right_by_re_add() {
    use nvraid_io::engine::{EngineKind, FaultPlan, MemberFaults, TornFileWrite};
    let dir = tempfile::tempdir().unwrap();
    let specs = create_mirror(&dir, 8 << 20, CHUNK);
    let array = Arc::new(assemble(&specs, RW).unwrap());
    let data_at = 1u64 << 20;
    let faults = MemberFaults {
        torn_write: Some(TornFileWrite {
            file: 1,
            start: data_at + 9 * CHUNK,
            end: data_at + 10 * CHUNK,
            keep_bytes: 4096,
        }),
        ..MemberFaults::NONE
    };
    let target = nvraid_array::FanoutTarget::array(
        array.clone(),
        EngineKind::FaultyMember(FaultPlan::NONE, faults),
    );
    let mut queue = target.open_queue(2, 64 << 10).unwrap();
    queue.buffer_mut(0)[..8192].fill(0x9e);
    queue
        .submit(0, OpKind::Write, 9 * CHUNK, 8192, false)
        .unwrap();
    let mut done = Vec::new();
    while done.is_empty() {
        queue.reap(1, &mut |c| done.push(c)).unwrap();
    }
    assert_eq!(done[0].result, Ok(8192), "one copy took the write");
    assert!(array.is_faulty(1), "the torn member is marked faulty");
    drop(queue);
    drop(target);
    array.clear_idle_bits().unwrap();
    array.clear_idle_bits().unwrap();
    assert_eq!(
        array.bitmap_info().unwrap().dirty_chunks,
        1,
        "kept while degraded"
    );
    Arc::try_unwrap(array).unwrap().close().unwrap();

    let array = assemble(&specs[..1], RW).unwrap();
    let old = open_rw(&specs[1]);
    let (array, role) = recovery::re_add(array, old).unwrap();
    assert_eq!(role, 1);
    let rebuilt = recovery::rebuild(&array, None, &mut |_| {}).unwrap();
    assert_eq!(rebuilt[0].bytes, CHUNK, "the torn chunk only");
    let check = recovery::scrub(&array, Mode::Check, &mut |_| {}).unwrap();
    assert_eq!(check.mismatch_sectors, 0, "{check:?}");
    let mut got = vec![0u8; 8192];
    array.read_at(&mut got, 9 * CHUNK).unwrap();
    assert_eq!(got, vec![0x9e; 8192]);
    array.close().unwrap();
}
