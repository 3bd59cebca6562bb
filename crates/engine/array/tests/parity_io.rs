//! RAID 5 and RAID 6 through the fast path: random writes and reads from
//! several queues at once leave every stripe's P and Q equal to what they
//! must be (computed here, independently, from the member files), the data
//! equal to a model, and a member that fails part-way is read around.

mod common;

use common::Rng;
use nvraid_array::FanoutTarget;
use nvraid_io::engine::{EngineKind, FaultPlan};
use nvraid_io::queue::{OpKind, Target};
use nvraid_layout::parity::ParityLayout;
use nvraid_layout::Level;
use std::sync::Arc;

const CHUNK: u64 = 16 * 1024;
const DATA_OFFSET: u64 = 1 << 20;

fn levels() -> Vec<(Level, usize)> {
    vec![
        (
            Level::Raid5 {
                layout: ParityLayout::LeftSymmetric,
            },
            4,
        ),
        (
            Level::Raid5 {
                layout: ParityLayout::RightAsymmetric,
            },
            5,
        ),
        (
            Level::Raid6 {
                layout: ParityLayout::LeftSymmetric,
            },
            5,
        ),
        (
            Level::Raid6 {
                layout: ParityLayout::LeftAsymmetric,
            },
            6,
        ),
    ]
}

/// Whether every stripe's P (and Q) equals the parity of its data, read
/// straight from the member files: the first stripe that differs, if any.
fn first_bad_stripe(specs: &[String], level: Level) -> Option<u64> {
    let members: Vec<Vec<u8>> = specs.iter().map(|s| std::fs::read(s).unwrap()).collect();
    let n = members.len() as u32;
    let map = level.stripe_map(n).unwrap();
    let data_len = (members[0].len() as u64 - DATA_OFFSET) / CHUNK * CHUNK;
    let block = |m: u32, stripe: u64| -> &[u8] {
        let at = (DATA_OFFSET + stripe * CHUNK) as usize;
        &members[m as usize][at..at + CHUNK as usize]
    };
    for stripe in 0..data_len / CHUNK {
        let blocks = map.stripe(stripe);
        let mut data: Vec<&[u8]> = vec![&[]; blocks.data.len()];
        let order: Vec<usize> = match blocks.q {
            Some(_) => map.q_slots(stripe),
            None => (0..blocks.data.len()).collect(),
        };
        for (d, m) in blocks.data.iter().enumerate() {
            data[order[d]] = block(*m, stripe);
        }
        let mut p = vec![0u8; CHUNK as usize];
        let mut q = vec![0u8; CHUNK as usize];
        let kernel = nvraid_parity::Kernel::Scalar;
        match blocks.q {
            Some(_) => nvraid_parity::gen_pq(kernel, &data, &mut p, &mut q),
            None => nvraid_parity::gen_p(kernel, &data, &mut p),
        }
        if p != block(blocks.p, stripe) || blocks.q.is_some_and(|m| q != block(m, stripe)) {
            return Some(stripe);
        }
    }
    None
}

/// `workers` threads, each with its own queue of `depth` slots, write and
/// read random ranges of the sectors they own (sector `i` belongs to
/// worker `i % workers`, so every stripe is written by every worker at
/// once and only the stripe locks keep its parity whole). `base` is what
/// the array holds before (zeros when empty). Returns the model of the
/// array's bytes after.
fn drive(
    target: &FanoutTarget,
    base: &[u8],
    workers: u64,
    depth: u32,
    ops: usize,
    seed: u64,
) -> Vec<u8> {
    let size = target.size_bytes() as usize;
    let models: Vec<Vec<(u64, u8)>> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..workers)
            .map(|w| {
                scope.spawn(move || {
                    let mut rng = Rng(seed + w);
                    let mut queue = target.open_queue(depth, 64 * 1024).unwrap();
                    // Owned sectors written, with the fill they hold.
                    let mut written: Vec<(u64, u8)> = Vec::new();
                    let mut mine = vec![None::<u8>; size / 512];
                    let mut pending: Vec<Option<(OpKind, u64, u8)>> = vec![None; depth as usize];
                    let mut issued = 0;
                    while issued < ops || pending.iter().any(Option::is_some) {
                        for slot in 0..depth {
                            if pending[slot as usize].is_some() || issued >= ops {
                                continue;
                            }
                            // One owned sector, somewhere; or a whole run of
                            // sectors for a full-stripe-sized read.
                            let sector = (rng.below((size / 512) as u64 / workers)) * workers + w;
                            let busy = pending.iter().flatten().any(|&(_, s, _)| s == sector);
                            if busy {
                                continue;
                            }
                            let fill = rng.next() as u8 | 1;
                            let op = if rng.below(3) == 0 {
                                OpKind::Read
                            } else {
                                queue.buffer_mut(slot)[..512].fill(fill);
                                OpKind::Write
                            };
                            queue.submit(slot, op, sector * 512, 512, false).unwrap();
                            pending[slot as usize] = Some((op, sector, fill));
                            issued += 1;
                        }
                        let mut done = Vec::new();
                        queue.reap(1, &mut |c| done.push(c)).unwrap();
                        for c in done {
                            let (op, sector, fill) = pending[c.slot as usize].take().unwrap();
                            c.result.unwrap_or_else(|e| {
                                panic!("worker {w}: {op:?} of sector {sector}: errno {e}")
                            });
                            match op {
                                OpKind::Write => {
                                    mine[sector as usize] = Some(fill);
                                    written.push((sector, fill));
                                }
                                _ => {
                                    let got = &queue.buffer_mut(c.slot)[..512];
                                    let ok = match mine[sector as usize] {
                                        Some(fill) => got.iter().all(|&b| b == fill),
                                        None => got == &base[sector as usize * 512..][..512],
                                    };
                                    assert!(ok, "worker {w}: sector {sector} does not read back");
                                }
                            }
                        }
                    }
                    written
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let mut model = base.to_vec();
    for written in models {
        for (sector, fill) in written {
            model[sector as usize * 512..][..512].fill(fill);
        }
    }
    model
}

/// The array reads back as `model`; closed, every stripe's parity is
/// right (the queues and targets over it are gone).
fn reads_as_model_then_closes(
    array: Arc<nvraid_array::Array>,
    specs: &[String],
    level: Level,
    model: &[u8],
    what: &str,
) {
    let mut whole = vec![0u8; model.len()];
    array.read_at(&mut whole, 0).unwrap();
    assert!(whole == model, "{what}: array differs from the model");
    Arc::try_unwrap(array).unwrap().close().unwrap();
    assert_eq!(first_bad_stripe(specs, level), None, "{what}");
}

/// Write `fill` at `offset` through `queue`'s slot 0 and wait for it.
fn write_through(
    queue: &mut Box<dyn nvraid_io::queue::Queue>,
    offset: u64,
    fill: &[u8],
    what: &str,
) {
    queue.buffer_mut(0)[..fill.len()].copy_from_slice(fill);
    queue
        .submit(0, OpKind::Write, offset, fill.len() as u32, false)
        .unwrap();
    let mut results = Vec::new();
    queue.reap(1, &mut |c| results.push(c.result)).unwrap();
    assert_eq!(results, vec![Ok(fill.len() as u32)], "{what}");
}

/// Every member's partial parity log, as md reads it: each header in its
/// chain checks out with its partial parity. The chains' lengths.
fn ppl_chains(specs: &[String]) -> Vec<usize> {
    specs
        .iter()
        .map(|spec| {
            let bytes = std::fs::read(spec).unwrap();
            let sb = nvraid_metadata::Superblock::decode(&bytes[4096..8192]).unwrap();
            let area = nvraid_metadata::ppl::PplArea::from_superblock(&sb)
                .unwrap()
                .unwrap();
            let start = (area.start_sector(sb.super_offset_sectors).unwrap() * 512) as usize;
            let log = &bytes[start..start + (area.usable_sectors() * 512) as usize];
            let chain = nvraid_metadata::ppl::chain(log, &sb.set_uuid).unwrap();
            for header in &chain {
                header.partial_parity(log).unwrap();
            }
            chain.len()
        })
        .collect()
}

#[test]
fn concurrent_writers_keep_every_stripe_consistent() {
    for (level, members) in levels() {
        for engine in [EngineKind::Uring, EngineKind::Psync] {
            let dir = tempfile::tempdir().unwrap();
            let specs = common::new_array(&dir, level, members, CHUNK, 2 << 20);
            let array = common::writable(&specs);
            let target = FanoutTarget::array(array.clone(), engine);
            let model = drive(
                &target,
                &vec![0; target.size_bytes() as usize],
                2,
                16,
                1500,
                7,
            );
            drop(target);
            let mut whole = vec![0u8; model.len()];
            array.read_at(&mut whole, 0).unwrap();
            assert!(
                whole == model,
                "{level} {engine:?}: array differs from the model"
            );
            Arc::try_unwrap(array).unwrap().close().unwrap();
            assert_eq!(
                first_bad_stripe(&specs, level),
                None,
                "{level} {engine:?}: a stripe's parity is wrong"
            );
        }
    }
}

/// Large requests: full stripes, partial stripes, and requests larger than
/// a slot's scratch holds at once, at every alignment.
#[test]
fn large_writes_and_reads_match_and_keep_parity() {
    for (level, members) in levels() {
        let dir = tempfile::tempdir().unwrap();
        let specs = common::new_array(&dir, level, members, CHUNK, 3 << 20);
        let array = common::writable(&specs);
        let target = FanoutTarget::array(array.clone(), EngineKind::Uring);
        let size = target.size_bytes();
        let max_io = 256 * 1024;
        let mut queue = target.open_queue(4, max_io).unwrap();
        let mut model = vec![0u8; size as usize];
        let mut rng = Rng(11);
        for round in 0..200 {
            let len = (1 + rng.below(u64::from(max_io) / 512)) * 512;
            let offset = rng.below((size - len) / 512) * 512;
            let fill: Vec<u8> = (0..len).map(|_| rng.next() as u8).collect();
            queue.buffer_mut(0)[..len as usize].copy_from_slice(&fill);
            queue
                .submit(0, OpKind::Write, offset, len as u32, round % 7 == 0)
                .unwrap();
            let mut results = Vec::new();
            queue.reap(1, &mut |c| results.push(c.result)).unwrap();
            assert_eq!(
                results,
                vec![Ok(len as u32)],
                "{level}: write {offset}+{len}"
            );
            model[offset as usize..(offset + len) as usize].copy_from_slice(&fill);
            // Read back a range around it.
            let start = offset.saturating_sub(rng.below(8) * 4096);
            let rlen = (len + rng.below(8) * 4096)
                .min(u64::from(max_io))
                .min(size - start);
            queue
                .submit(1, OpKind::Read, start, rlen as u32, false)
                .unwrap();
            results.clear();
            queue.reap(1, &mut |c| results.push(c.result)).unwrap();
            assert_eq!(results, vec![Ok(rlen as u32)]);
            assert!(
                queue.buffer_mut(1)[..rlen as usize]
                    == model[start as usize..(start + rlen) as usize],
                "{level}: read {start}+{rlen} after write {offset}+{len}"
            );
        }
        drop(queue);
        drop(target);
        Arc::try_unwrap(array).unwrap().close().unwrap();
        assert_eq!(first_bad_stripe(&specs, level), None, "{level}");
    }
}

/// A member that fails every operation from the start of the run: the
/// writes go on degraded (its blocks live on in parity), the reads rebuild
/// its chunks, and the array afterwards holds exactly the model.
#[test]
fn a_member_failing_mid_run_is_read_and_written_around() {
    for (level, members) in levels() {
        for failing in [0u32, 2] {
            let dir = tempfile::tempdir().unwrap();
            let specs = common::new_array(&dir, level, members, CHUNK, 2 << 20);
            let array = common::writable(&specs);
            let engine = EngineKind::Faulty(FaultPlan {
                transfer_bytes_max: u32::MAX,
                eagain_every: 0,
                eio_file: Some(failing),
            });
            let target = FanoutTarget::array(array.clone(), engine);
            let model = drive(
                &target,
                &vec![0; target.size_bytes() as usize],
                2,
                8,
                600,
                3,
            );
            drop(target);
            assert!(
                array.is_faulty(failing as usize),
                "{level}: member {failing} failed"
            );
            let mut whole = vec![0u8; model.len()];
            array.read_at(&mut whole, 0).unwrap();
            assert!(
                whole == model,
                "{level}: degraded array differs from the model"
            );
            Arc::try_unwrap(array).unwrap().close().unwrap();
        }
    }
}

/// `check` finds parity that disagrees with its data (a flipped byte of P on
/// RAID 5, of P and of Q on RAID 6), `repair` recomputes it, and the data
/// is untouched.
#[test]
fn check_counts_bad_parity_and_repair_recomputes_it() {
    use nvraid_array::recovery::{scrub, Mode};
    for (level, members) in levels() {
        let dir = tempfile::tempdir().unwrap();
        let specs = common::new_array(&dir, level, members, CHUNK, 2 << 20);
        let array = common::writable(&specs);
        let size = array.size_bytes() as usize;
        let data: Vec<u8> = (0..size).map(|i| (i * 13 % 255) as u8).collect();
        array.write_at(&data, 0, true).unwrap();
        Arc::try_unwrap(array).unwrap().close().unwrap();
        let map = level.stripe_map(members as u32).unwrap();
        // Flip a byte of stripe 3's P, and of stripe 5's Q (RAID 6).
        let mut flips = vec![(map.stripe(3).p, 3u64)];
        if let Some(q) = map.stripe(5).q {
            flips.push((q, 5));
        }
        for &(member, stripe) in &flips {
            let path = &specs[member as usize];
            let mut bytes = std::fs::read(path).unwrap();
            bytes[(DATA_OFFSET + stripe * CHUNK + 700) as usize] ^= 0x40;
            std::fs::write(path, bytes).unwrap();
        }
        assert!(first_bad_stripe(&specs, level).is_some());
        let array = common::writable(&specs);
        let found = scrub(&array, Mode::Check, &mut |_| {}).unwrap();
        assert_eq!(
            found.mismatch_sectors,
            flips.len() as u64,
            "{level}: {found:?}"
        );
        assert_eq!(found.regions.len(), flips.len(), "{level}: {found:?}");
        let stripe_bytes = CHUNK * (members as u64 - level.parity_chunks() as u64);
        assert_eq!(found.regions[0], (3 * stripe_bytes, 4 * stripe_bytes));
        let fixed = scrub(&array, Mode::Repair, &mut |_| {}).unwrap();
        assert_eq!(fixed.repaired_sectors, flips.len() as u64, "{level}");
        let again = scrub(&array, Mode::Check, &mut |_| {}).unwrap();
        assert_eq!(again.mismatch_sectors, 0, "{level}");
        let mut back = vec![0u8; size];
        array.read_at(&mut back, 0).unwrap();
        assert!(back == data, "{level}: repair changed data");
        Arc::try_unwrap(array).unwrap().close().unwrap();
        assert_eq!(first_bad_stripe(&specs, level), None, "{level}");
    }
}

/// A member lost, then a new one added and rebuilt while two workers keep
/// writing and reading through the fast path: the rebuilt member holds
/// exactly its blocks (every stripe's parity is right, and the data equals
/// the model), also when RAID 6 rebuilds one of two lost members.
#[test]
fn a_new_member_is_rebuilt_beside_clients() {
    use nvraid_array::recovery::{add_member_to, rebuild_online, Added, RebuildPace};
    for (level, members) in levels() {
        let dir = tempfile::tempdir().unwrap();
        let specs = common::new_array(&dir, level, members, CHUNK, 3 << 20);
        // Fill, then lose members (RAID 6: two).
        {
            let array = common::writable(&specs);
            let size = array.size_bytes() as usize;
            let data: Vec<u8> = (0..size).map(|i| (i * 31 % 253) as u8).collect();
            array.write_at(&data, 0, true).unwrap();
            Arc::try_unwrap(array).unwrap().close().unwrap();
        }
        let lost: Vec<usize> = (0..level.parity_chunks() as usize)
            .map(|k| 1 + 2 * k)
            .collect();
        let present = common::lose(&specs, &lost);
        let array = common::writable(&present);
        let size = array.size_bytes() as usize;
        let mut model = vec![0u8; size];
        array.read_at(&mut model, 0).unwrap();
        let new = common::fresh_member(&specs[lost[0]], 3 << 20);
        assert_eq!(
            add_member_to(&array, new).unwrap(),
            Added::Recovering {
                role: lost[0] as u32
            }
        );
        let target = FanoutTarget::array(array.clone(), EngineKind::Uring);
        let model = std::thread::scope(|scope| {
            let rebuilder = scope
                .spawn(|| rebuild_online(&array, &RebuildPace::default(), &mut |_| {}).unwrap());
            let model = drive(&target, &model, 2, 8, 800, 21);
            rebuilder.join().unwrap();
            model
        });
        drop(target);
        assert_eq!(array.in_sync_bytes(lost[0]), None, "{level}: rebuilt");
        let mut whole = vec![0u8; size];
        array.read_at(&mut whole, 0).unwrap();
        assert!(whole == model, "{level}: array differs from the model");
        Arc::try_unwrap(array).unwrap().close().unwrap();
        if lost.len() == 1 {
            assert_eq!(first_bad_stripe(&specs, level), None, "{level}");
        }
        // Read with the rebuilt member and without another: its blocks
        // serve the reads.
        let mut kept: Vec<String> = present.clone();
        kept.remove(0);
        kept.push(specs[lost[0]].clone());
        common::reads_as(
            &kept,
            &model,
            &format!("{level}: the rebuilt member's blocks are wrong"),
        );
    }
}

/// The offline rebuild (`nvraid add`), region by region with one large
/// read per member: RAID 6 rebuilds a member while a second is still
/// missing, and every block comes back.
#[test]
fn offline_rebuild_restores_every_block() {
    use nvraid_array::recovery::{add_member, rebuild};
    for (level, members) in levels() {
        let dir = tempfile::tempdir().unwrap();
        // Members larger than one rebuild region (4 MiB).
        let specs = common::new_array(&dir, level, members, CHUNK, 9 << 20);
        let array = common::writable(&specs);
        let size = array.size_bytes() as usize;
        let data: Vec<u8> = (0..size)
            .map(|i| (i * 17 % 251) as u8 ^ (i >> 12) as u8)
            .collect();
        array.write_at(&data, 0, true).unwrap();
        Arc::try_unwrap(array).unwrap().close().unwrap();
        let lost: Vec<usize> = (0..level.parity_chunks() as usize).map(|k| k * 2).collect();
        let present = common::lose(&specs, &lost);
        let array = Arc::try_unwrap(common::writable(&present)).unwrap();
        let new = common::fresh_member(&specs[lost[0]], 9 << 20);
        let (array, _) = add_member(array, new).unwrap();
        let done = rebuild(&array, None, &mut |_| {}).unwrap();
        assert_eq!(done.len(), 1, "{level}");
        array.close().unwrap();
        // The rebuilt member with every other one but the still-missing
        // (RAID 6) and one more left out: its blocks must be right.
        let mut kept: Vec<String> = present.clone();
        kept.remove(0);
        kept.push(specs[lost[0]].clone());
        common::reads_as(&kept, &data, &format!("{level}: rebuilt blocks are wrong"));
    }
}

/// Members that held other bytes: the new RAID 5/6 is created needing a
/// resync (its parity does not match yet, and its bitmap marks everything),
/// and `repair` computes every stripe's parity.
#[test]
fn an_array_over_used_members_is_resynced_whole() {
    use nvraid_array::recovery::{scrub, Mode};
    use nvraid_array::{create, BitmapChoice, CreateOptions};
    for (level, members) in levels() {
        for bitmap in [BitmapChoice::Auto, BitmapChoice::None] {
            let dir = tempfile::tempdir().unwrap();
            let specs: Vec<String> = (0..members)
                .map(|i| dir.path().join(format!("m{i}")).display().to_string())
                .collect();
            let mut rng = Rng(5);
            for spec in &specs {
                let junk: Vec<u8> = (0..(4 << 20)).map(|_| rng.next() as u8).collect();
                std::fs::write(spec, junk).unwrap();
            }
            let options = CreateOptions {
                level,
                chunk_bytes: CHUNK,
                name: "used".into(),
                size_bytes: None,
                force: true,
                direct: true,
                bitmap,
            };
            let array = create(&specs, &options).unwrap();
            assert!(
                array.resync_from() == Some(0),
                "{level}: created needing a resync"
            );
            array.close().unwrap();
            assert!(first_bad_stripe(&specs, level).is_some());
            let array = common::writable(&specs);
            let found = scrub(&array, Mode::Repair, &mut |_| {}).unwrap();
            assert!(found.resynced, "{level} {bitmap:?}");
            assert_eq!(
                found.bytes,
                array.size_bytes(),
                "{level} {bitmap:?}: all of it"
            );
            Arc::try_unwrap(array).unwrap().close().unwrap();
            assert_eq!(first_bad_stripe(&specs, level), None, "{level} {bitmap:?}");
        }
    }
}

/// RAID 5 with md's partial parity log, written by two workers at once on
/// both engines: every write waits for its log entry, the logs' group
/// commit never stalls (the run ends), the data equals the model and every
/// stripe's parity is right; the logs hold md-valid headers.
#[test]
fn ppl_arrays_log_and_keep_parity_under_concurrent_writes() {
    use nvraid_array::{create, BitmapChoice, CreateOptions};
    let level = Level::Raid5 {
        layout: ParityLayout::LeftSymmetric,
    };
    for engine in [EngineKind::Uring, EngineKind::Psync] {
        let dir = tempfile::tempdir().unwrap();
        let specs: Vec<String> = (0..4)
            .map(|i| dir.path().join(format!("m{i}")).display().to_string())
            .collect();
        let options = CreateOptions {
            level,
            chunk_bytes: CHUNK,
            name: "ppl".into(),
            size_bytes: Some(3 << 20),
            force: false,
            direct: true,
            bitmap: BitmapChoice::Ppl,
        };
        create(&specs, &options).unwrap().close().unwrap();
        let array = common::writable(&specs);
        let target = FanoutTarget::array(array.clone(), engine);
        let base = vec![0; target.size_bytes() as usize];
        let model = drive(&target, &base, 2, 16, 1500, 9);
        // Large writes too: full stripes and several columns per round.
        let mut queue = target.open_queue(2, 256 * 1024).unwrap();
        let mut model = model;
        let mut rng = Rng(77);
        for _ in 0..40 {
            let len = (1 + rng.below(512)) * 512;
            let offset = rng.below((model.len() as u64 - len) / 512) * 512;
            let fill: Vec<u8> = (0..len).map(|_| rng.next() as u8).collect();
            write_through(&mut queue, offset, &fill, &format!("{engine:?}"));
            model[offset as usize..(offset + len) as usize].copy_from_slice(&fill);
        }
        drop(queue);
        drop(target);
        reads_as_model_then_closes(array, &specs, level, &model, &format!("{engine:?}"));
        for (spec, headers) in specs.iter().zip(ppl_chains(&specs)) {
            assert!(
                headers > 1,
                "{spec}: the log was written ({headers} headers)"
            );
        }
    }
}

/// After a crash, a RAID 5/6 resync visits only the stripes under set
/// bitmap bits and recomputes their parity: a stripe torn in a dirty chunk
/// (its parity left stale) is put right; parity spoiled in a clean chunk is
/// not visited (as in md), and a full check still finds it.
#[test]
fn a_parity_resync_after_a_crash_visits_only_the_dirty_chunks() {
    use nvraid_array::recovery::{scrub, Mode};
    use nvraid_array::{create, BitmapChoice, CreateOptions};
    let bit = 256 * 1024u64; // bitmap chunk: a few stripes each
    for (level, members) in levels() {
        let dir = tempfile::tempdir().unwrap();
        let specs: Vec<String> = (0..members)
            .map(|i| dir.path().join(format!("m{i}")).display().to_string())
            .collect();
        let options = CreateOptions {
            level,
            chunk_bytes: CHUNK,
            name: "resync".into(),
            size_bytes: Some(4 << 20),
            force: false,
            direct: true,
            bitmap: BitmapChoice::Internal {
                chunk_bytes: Some(bit),
            },
        };
        create(&specs, &options).unwrap().close().unwrap();
        let array = common::writable(&specs);
        let size = array.size_bytes() as usize;
        let base: Vec<u8> = (0..size).map(|i| (i % 253) as u8).collect();
        array.write_at(&base, 0, true).unwrap();
        Arc::try_unwrap(array).unwrap().close().unwrap();
        let array = common::writable(&specs);
        array.write_at(&[0xaa; 4096], 3 * bit, true).unwrap();
        drop(array); // killed: no orderly close
                     // The crash tore that stripe's write (its P kept the old bytes),
                     // and a P byte nobody wrote is spoiled in a stripe of chunk 9.
        let data = u64::from(members as u32 - level.parity_chunks());
        let map = level.stripe_map(members as u32).unwrap();
        let stripe_of = |at: u64| at / (CHUNK * data);
        let torn = stripe_of(3 * bit);
        let spoiled = stripe_of(9 * bit);
        let flip = |stripe: u64, value: Option<u8>| {
            let path = &specs[map.stripe(stripe).p as usize];
            let mut bytes = std::fs::read(path).unwrap();
            let at = (DATA_OFFSET + stripe * CHUNK) as usize;
            match value {
                Some(v) => bytes[at..at + 4096].fill(v),
                None => bytes[at + 100] ^= 0x10,
            }
            std::fs::write(path, bytes).unwrap();
        };
        flip(torn, Some(0x77));
        flip(spoiled, None);
        let array = common::writable(&specs);
        assert!(array.is_dirty(), "{level}");
        assert_eq!(array.bitmap_info().unwrap().dirty_chunks, 1, "{level}");
        let found = scrub(&array, Mode::Repair, &mut |_| {}).unwrap();
        assert!(found.resynced, "{level}");
        // One bit stands for `bit` bytes of rows on every member (md's
        // space for RAID 4/5/6): the stripes of those rows, `bit` times the
        // data chunks per stripe of array bytes.
        assert_eq!(
            found.bytes,
            bit * data,
            "{level}: only the dirty chunk's stripes"
        );
        assert_eq!(found.mismatch_sectors, 8, "{level}: the torn 4 KiB of P");
        let check = scrub(&array, Mode::Check, &mut |_| {}).unwrap();
        assert_eq!(check.mismatch_sectors, 1, "{level}: {check:?}");
        let width = CHUNK * data;
        assert_eq!(
            check.regions,
            vec![(spoiled * width, (spoiled + 1) * width)]
        );
        let mut back = vec![0u8; size];
        array.read_at(&mut back, 0).unwrap();
        let mut want = base.clone();
        want[3 * bit as usize..][..4096].fill(0xaa);
        assert!(back == want, "{level}: data");
    }
}

/// A PPL area smaller than md's default (not a ring: every log write lands
/// at its start) holds less than a full log write's 128 KiB of partial
/// parity. Writes of every size through both data paths keep each log
/// write inside the area: the sectors behind it (here: the rest of md's
/// default area, filled with a pattern) are never touched, the data reads
/// back, and the logs hold md-valid headers.
#[test]
fn a_small_ppl_area_is_never_written_past() {
    use nvraid_array::{create, BitmapChoice, CreateOptions};
    use nvraid_metadata::ppl::PplArea;
    let level = Level::Raid5 {
        layout: ParityLayout::LeftSymmetric,
    };
    const PATTERN: u8 = 0xa5;
    for engine in [EngineKind::Uring, EngineKind::Psync] {
        let dir = tempfile::tempdir().unwrap();
        let specs: Vec<String> = (0..4)
            .map(|i| dir.path().join(format!("m{i}")).display().to_string())
            .collect();
        let options = CreateOptions {
            level,
            chunk_bytes: 64 * 1024,
            name: "small-ppl".into(),
            size_bytes: Some(3 << 20),
            force: false,
            direct: true,
            bitmap: BitmapChoice::Ppl,
        };
        create(&specs, &options).unwrap().close().unwrap();
        // Shrink every member's area to a header and 20 KiB of partial
        // parity; fill what it gave up with the pattern.
        let mut behind = Vec::new();
        for spec in &specs {
            let mut bytes = std::fs::read(spec).unwrap();
            let mut sb = nvraid_metadata::Superblock::decode(&bytes[4096..8192]).unwrap();
            let old = PplArea::from_superblock(&sb).unwrap().unwrap();
            let small = PplArea {
                offset_sectors: old.offset_sectors,
                size_sectors: 8 + 40,
            };
            assert!(!small.is_ring() && small.entry_space_bytes() == 20 * 1024);
            sb.bitmap_offset = small.to_raw();
            let mut out = vec![0u8; 4096];
            sb.encode(&mut out).unwrap();
            bytes[4096..8192].copy_from_slice(&out);
            let start = (old.start_sector(sb.super_offset_sectors).unwrap() * 512) as usize;
            let range = start + (small.usable_sectors() * 512) as usize
                ..start + (old.usable_sectors() * 512) as usize;
            bytes[range.clone()].fill(PATTERN);
            std::fs::write(spec, &bytes).unwrap();
            behind.push(range);
        }
        let array = common::writable(&specs);
        let target = FanoutTarget::array(array.clone(), engine);
        let size = target.size_bytes();
        let mut model = vec![0u8; size as usize];
        array.read_at(&mut model, 0).unwrap();
        let mut rng = Rng(5);
        let mut queue = target.open_queue(2, 1 << 20).unwrap();
        for i in 0..60 {
            // Up to 1 MiB: full stripes, and columns wider than the area.
            let len = (1 + rng.below(2048)) * 512;
            let offset = rng.below((size - len) / 512) * 512;
            let fill: Vec<u8> = (0..len).map(|_| rng.next() as u8).collect();
            if i % 2 == 0 {
                write_through(&mut queue, offset, &fill, &format!("{engine:?}: write {i}"));
            } else {
                array.write_at(&fill, offset, false).unwrap();
            }
            model[offset as usize..(offset + len) as usize].copy_from_slice(&fill);
        }
        drop(queue);
        drop(target);
        reads_as_model_then_closes(array, &specs, level, &model, &format!("{engine:?}"));
        for (spec, range) in specs.iter().zip(&behind) {
            let bytes = std::fs::read(spec).unwrap();
            let touched = bytes[range.clone()].iter().position(|&b| b != PATTERN);
            assert_eq!(
                touched,
                None,
                "{engine:?} {spec}: a log write reached past the PPL area (byte {} of the {} behind it)",
                touched.unwrap_or(0),
                range.len()
            );
        }
        ppl_chains(&specs);
    }
}
