//! A seeded simulator of bad days, RAID 1, 10, 5 (with and without md's
//! partial parity log) and 6: rounds of writes (through the simple
//! path and the fast queues), a member failing under I/O, crashes (the
//! array dropped without an orderly close), reassembly, rebuild onto a new
//! member, repair, and (issue 29) a write failing on a member a degraded
//! RAID 5/6 cannot lose, whole or torn, all checked against a reference
//! model of the array's bytes. Every round ends with every acknowledged
//! write readable, `check` finding all copies equal, and a clean array.
//!
//! A write that failed may or may not have landed: the model keeps, per
//! 4 KiB block, the contents such writes would have left, and a read may
//! give the acknowledged bytes or one of those, never anything else. It may
//! fail only in a stripe row a failed write touched (those rows are
//! recorded as bad blocks; see docs/redundancy.md).
//!
//! CI runs `NVRAID_SIM_ROUNDS` rounds (default 24); a long soak:
//! `NVRAID_SIM_ROUNDS=2000 cargo test --release -p nvraid-array --test simulator`.
//! A failure names its seed; `NVRAID_SIM_SEED=N` replays that round alone.

mod common;

use common::Rng;
use nvraid_array::recovery::{self, Mode};
use nvraid_array::{assemble, create, Array, AssembleOptions, CreateOptions, FanoutTarget};
use nvraid_io::engine::{EngineKind, FaultPlan};
use nvraid_io::queue::{OpKind, Target};
use nvraid_layout::parity::ParityLayout;
use nvraid_layout::Level;
use nvraid_member::{Member, OpenOptions};
use std::sync::Arc;

const LEVELS: [(Level, usize); 10] = [
    (Level::Raid1, 2),
    (Level::Raid1, 3),
    (Level::Raid10 { near: 2 }, 3),
    (Level::Raid10 { near: 2 }, 4),
    (
        Level::Raid10Far {
            copies: 2,
            offset: false,
        },
        3,
    ),
    (
        Level::Raid10Far {
            copies: 2,
            offset: true,
        },
        4,
    ),
    (
        Level::Raid5 {
            layout: ParityLayout::LeftSymmetric,
        },
        3,
    ),
    (
        Level::Raid5 {
            layout: ParityLayout::RightAsymmetric,
        },
        4,
    ),
    (
        Level::Raid6 {
            layout: ParityLayout::LeftSymmetric,
        },
        4,
    ),
    (
        Level::Raid6 {
            layout: ParityLayout::LeftAsymmetric,
        },
        5,
    ),
];

struct World {
    dir: tempfile::TempDir,
    /// The member files of the array as it stands (one per role).
    specs: Vec<String>,
    /// What the array must read back.
    model: Vec<u8>,
    /// Per 4 KiB block: contents a failed write may have left there.
    maybe: std::collections::BTreeMap<u64, Vec<Vec<u8>>>,
    /// Stripe rows (array bytes / row_bytes) a failed write touched.
    failed_rows: std::collections::BTreeSet<u64>,
    row_bytes: u64,
    next_file: usize,
    seed: u64,
}

impl World {
    fn path(&self, name: &str) -> String {
        self.dir.path().join(name).display().to_string()
    }

    fn assemble(&self) -> Array {
        assemble(
            &self.specs,
            AssembleOptions {
                writable: true,
                direct: true,
                allow_degraded: true,
            },
        )
        .unwrap_or_else(|e| panic!("seed {}: assemble: {e}", self.seed))
    }

    fn write_simple(&mut self, array: &Array, rng: &mut Rng) {
        let size = array.size_bytes();
        let len = (1 + rng.below(32)) * 4096;
        let offset = rng.below((size - len) / 4096) * 4096;
        let fill = rng.next() as u8;
        let data: Vec<u8> = (0..len).map(|i| fill ^ (i as u8)).collect();
        if let Err(e) = array.write_at(&data, offset, rng.below(4) == 0) {
            self.refused(offset, len, &e.to_string());
            return self.failed(offset, &data);
        }
        self.model[offset as usize..(offset + len) as usize].copy_from_slice(&data);
        self.acknowledged(offset, len);
    }

    /// A write failed: allowed only into a row an earlier failed write left
    /// with bad blocks.
    fn refused(&self, offset: u64, len: u64, error: &str) {
        let rows = offset / self.row_bytes..=(offset + len - 1) / self.row_bytes;
        assert!(
            rows.clone().any(|r| self.failed_rows.contains(&r)),
            "seed {}: write at {offset}+{len} failed outside every failed row: {error}",
            self.seed
        );
    }

    /// A write of `[offset, offset + len)` was acknowledged: what failed
    /// writes may have left there is gone.
    fn acknowledged(&mut self, offset: u64, len: u64) {
        for block in offset / 4096..(offset + len).div_ceil(4096) {
            self.maybe.remove(&block);
        }
    }

    /// A write of `data` at `offset` failed: its blocks may read as before
    /// or as written, and its rows may no longer be readable.
    fn failed(&mut self, offset: u64, data: &[u8]) {
        for (i, block) in data.chunks(4096).enumerate() {
            let at = offset / 4096 + i as u64;
            self.maybe.entry(at).or_default().push(block.to_vec());
        }
        let len = data.len() as u64;
        self.failed_rows
            .extend(offset / self.row_bytes..=(offset + len - 1) / self.row_bytes);
    }

    /// Writes through a fast queue while one member's writes fail (every
    /// one, or torn: the first 4 KiB lands), on a RAID 5/6 that cannot
    /// lose it. Writes that reach it fail; the others succeed.
    fn write_failing(&mut self, array: &Arc<Array>, rng: &mut Rng, victim: u32) {
        use nvraid_io::engine::{FileRange, MemberFaults, TornFileWrite};
        let whole = (0, u64::MAX);
        let faults = if rng.below(2) == 0 {
            MemberFaults {
                eio_range: Some(FileRange {
                    file: victim,
                    start: whole.0,
                    end: whole.1,
                    reads: false,
                    writes: true,
                }),
                ..MemberFaults::NONE
            }
        } else {
            MemberFaults {
                torn_write: Some(TornFileWrite {
                    file: victim,
                    start: whole.0,
                    end: whole.1,
                    keep_bytes: 4096,
                }),
                ..MemberFaults::NONE
            }
        };
        let engine = EngineKind::FaultyMember(FaultPlan::NONE, faults);
        let target = FanoutTarget::array(array.clone(), engine);
        let mut queue = target.open_queue(1, 128 << 10).unwrap();
        let size = array.size_bytes();
        for _ in 0..6 {
            let len = (1 + rng.below(16)) * 4096;
            let offset = rng.below((size - len) / 4096) * 4096;
            let fill = rng.next() as u8;
            let data: Vec<u8> = (0..len).map(|i| fill ^ (i as u8)).collect();
            queue.buffer_mut(0)[..len as usize].copy_from_slice(&data);
            queue
                .submit(0, OpKind::Write, offset, len as u32, false)
                .unwrap();
            let mut result = None;
            while result.is_none() {
                queue.reap(1, &mut |c| result = Some(c.result)).unwrap();
            }
            if result.unwrap().is_ok() {
                self.model[offset as usize..(offset + len) as usize].copy_from_slice(&data);
                self.acknowledged(offset, len);
            } else {
                self.failed(offset, &data);
            }
        }
    }

    /// Writes through a fast queue whose engine fails every operation on
    /// `failing` (if any): the member is marked faulty and the writes still
    /// succeed.
    fn write_fast(&mut self, array: &Arc<Array>, rng: &mut Rng, failing: Option<u32>) {
        let engine = EngineKind::Faulty(FaultPlan {
            eio_file: failing,
            ..FaultPlan::NONE
        });
        let target = FanoutTarget::array(array.clone(), engine);
        let mut queue = target.open_queue(4, 128 << 10).unwrap();
        let size = array.size_bytes();
        for _ in 0..8 {
            let mut pending = Vec::new();
            for slot in 0..4u32 {
                let len = ((1 + rng.below(32)) * 4096) as u32;
                // Slots write disjoint quarters, so order inside a batch
                // does not matter to the model.
                let quarter = size / 4;
                let room = (quarter - u64::from(len)) / 4096;
                let offset = u64::from(slot) * quarter + rng.below(room) * 4096;
                let fill = rng.next() as u8;
                let buf = queue.buffer_mut(slot);
                for (i, b) in buf[..len as usize].iter_mut().enumerate() {
                    *b = fill ^ (i as u8);
                }
                queue
                    .submit(slot, OpKind::Write, offset, len, false)
                    .unwrap();
                pending.push((slot, offset, len, fill));
            }
            let mut results = vec![None; pending.len()];
            let mut done = 0;
            while done < pending.len() {
                done += queue
                    .reap(1, &mut |c| results[c.slot as usize] = Some(c.result))
                    .unwrap() as usize;
            }
            for ((_, offset, len, fill), result) in pending.into_iter().zip(results) {
                let data: Vec<u8> = (0..len as usize).map(|i| fill ^ (i as u8)).collect();
                if let Some(Err(errno)) = result {
                    self.refused(offset, u64::from(len), &format!("errno {errno}"));
                    self.failed(offset, &data);
                    continue;
                }
                self.model[offset as usize..offset as usize + len as usize].copy_from_slice(&data);
                self.acknowledged(offset, u64::from(len));
            }
        }
    }

    /// Everything the model holds is what the array reads, and every copy
    /// agrees. After failed writes: block by block, each as acknowledged
    /// or as a failed write may have left it, or unreadable in a row a
    /// failed write touched.
    fn verify(&self, array: &Array, what: &str) {
        if !self.failed_rows.is_empty() {
            return self.verify_blocks(array, what);
        }
        let mut got = vec![0u8; array.size_bytes() as usize];
        array
            .read_at(&mut got, 0)
            .unwrap_or_else(|e| panic!("seed {}: read after {what}: {e}", self.seed));
        if got != self.model {
            let at = got
                .iter()
                .zip(&self.model)
                .position(|(a, b)| a != b)
                .unwrap();
            panic!(
                "seed {}: after {what}, byte {at} differs from the model",
                self.seed
            );
        }
        let found = recovery::scrub(array, Mode::Check, &mut |_| {}).unwrap();
        assert_eq!(
            found.mismatch_sectors, 0,
            "seed {}: after {what}, copies differ: {:?}",
            self.seed, found.regions
        );
    }

    fn verify_blocks(&self, array: &Array, what: &str) {
        let mut got = vec![0u8; 4096];
        for block in 0..array.size_bytes() / 4096 {
            let at = block * 4096;
            if array.read_at(&mut got, at).is_err() {
                assert!(
                    self.failed_rows.contains(&(at / self.row_bytes)),
                    "seed {}: after {what}, block {block} is unreadable though no failed write touched its row",
                    self.seed
                );
                continue;
            }
            let model = &self.model[at as usize..at as usize + 4096];
            let allowed = got == model || self.maybe.get(&block).is_some_and(|m| m.contains(&got));
            assert!(
                allowed,
                "seed {}: after {what}, block {block} reads bytes nobody wrote",
                self.seed
            );
        }
        // Rows with bad blocks are not compared (nothing true to compare
        // them with); every other row agrees with its parity.
        let found = recovery::scrub(array, Mode::Check, &mut |_| {}).unwrap();
        assert_eq!(
            found.mismatch_sectors, 0,
            "seed {}: after {what}, copies differ: {:?}",
            self.seed, found.regions
        );
    }

    /// Replace the roles with no working member by new files, rebuilt.
    fn rebuild_missing(&mut self, mut array: Array) -> Array {
        while array.is_degraded() {
            let name = format!("new{}.img", self.next_file);
            self.next_file += 1;
            let path = self.path(&name);
            let new = Member::open(
                &path,
                OpenOptions {
                    write: true,
                    create_bytes: Some(4 << 20),
                    direct: true,
                    ..Default::default()
                },
            )
            .unwrap();
            let (next, added) = recovery::add_member(array, new)
                .unwrap_or_else(|e| panic!("seed {}: add: {e}", self.seed));
            array = next;
            let recovery::Added::Recovering { role } = added else {
                panic!("seed {}: a degraded array took a spare", self.seed);
            };
            recovery::rebuild(&array, None, &mut |_| {})
                .unwrap_or_else(|e| panic!("seed {}: rebuild: {e}", self.seed));
            self.specs[role as usize] = path;
        }
        array
    }
}

fn round(seed: u64) {
    let mut rng = Rng(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1);
    let (level, members) = LEVELS[rng.below(LEVELS.len() as u64) as usize];
    let dir = tempfile::tempdir().unwrap();
    let specs: Vec<String> = (0..members)
        .map(|i| dir.path().join(format!("m{i}.img")).display().to_string())
        .collect();
    let chunk = 4096 << rng.below(3);
    // RAID 5 keeps md's partial parity log in half of its rounds.
    let bitmap = if level.parity_chunks() == 1 && rng.below(2) == 0 {
        nvraid_array::BitmapChoice::Ppl
    } else {
        nvraid_array::BitmapChoice::Auto
    };
    let array = create(
        &specs,
        &CreateOptions {
            level,
            chunk_bytes: chunk,
            name: "sim".into(),
            size_bytes: Some(4 << 20),
            force: false,
            direct: true,
            bitmap,
        },
    )
    .unwrap_or_else(|e| panic!("seed {seed}: create {level}: {e}"));
    let size = array.size_bytes() as usize;
    array.close().unwrap();
    let data_chunks = members as u64 - u64::from(level.parity_chunks());
    let mut world = World {
        dir,
        specs,
        model: vec![0; size],
        maybe: Default::default(),
        failed_rows: Default::default(),
        row_bytes: if level.parity_chunks() > 0 {
            chunk * data_chunks
        } else {
            u64::MAX
        },
        next_file: 0,
        seed,
    };
    let mut array = Arc::new(world.assemble());
    for step in 0..12 {
        match rng.below(11) {
            10 if level.parity_chunks() > 0 => {
                // A member the degraded array cannot lose fails writes:
                // degrade it first (as far as its parity allows), then
                // pick a member that now holds the last copy of some data.
                let mut usable: Vec<bool> = (0..members).map(|r| array.is_usable(r)).collect();
                for role in 0..members {
                    let mut rest = usable.clone();
                    rest[role] = false;
                    if usable[role] && nvraid_array::has_every_byte(array.geometry(), &rest) {
                        let eio = std::io::Error::from_raw_os_error(libc::EIO);
                        array.fail_member(role, &eio).unwrap();
                        usable = rest;
                    }
                }
                let last: Vec<u32> = (0..members as u32)
                    .filter(|&r| usable[r as usize])
                    .collect();
                let victim = last[rng.below(last.len() as u64) as usize];
                world.write_failing(&array, &mut rng, victim);
                assert!(
                    !array.is_faulty(victim as usize) || array.slot(victim as usize).is_none(),
                    "seed {seed} step {step}: the last copy was failed"
                );
                world.verify(
                    &array,
                    &format!("writes failing on role {victim} at step {step}"),
                );
            }
            0..=3 => world.write_simple(&array, &mut rng),
            4..=5 => world.write_fast(&array, &mut rng, None),
            6 => {
                // A member fails under fast-path writes, unless it holds
                // the last copy of some data (md, and nvraid, keep such a
                // member and fail the request: not what this step tests).
                let role = rng.below(members as u64) as u32;
                let mut rest: Vec<bool> = (0..members).map(|r| array.is_usable(r)).collect();
                rest[role as usize] = false;
                if array.is_usable(role as usize)
                    && nvraid_array::has_every_byte(array.geometry(), &rest)
                {
                    world.write_fast(&array, &mut rng, Some(role));
                    assert!(
                        array.is_faulty(role as usize) || !touches(&array, role),
                        "seed {seed} step {step}: member {role} failed unnoticed"
                    );
                }
            }
            7 => {
                // Crash: no orderly close; reassemble.
                drop(array);
                let again = world.assemble();
                world.verify(&again, &format!("a crash at step {step}"));
                array = Arc::new(again);
            }
            8 => {
                // Orderly close, reassemble, rebuild what is missing.
                let closed = Arc::try_unwrap(array).expect("only owner");
                closed.close().unwrap();
                let again = world.rebuild_missing(world.assemble());
                world.verify(&again, &format!("a rebuild at step {step}"));
                array = Arc::new(again);
            }
            _ => {
                // Repair (the resync of a dirty array).
                let found = recovery::scrub(&array, Mode::Repair, &mut |_| {})
                    .unwrap_or_else(|e| panic!("seed {seed}: repair: {e}"));
                assert_eq!(
                    found.mismatch_sectors, 0,
                    "seed {seed}: repair found differences"
                );
            }
        }
    }
    // End of the round: whole, verified, clean.
    let closed = Arc::try_unwrap(array).expect("only owner");
    closed.close().unwrap();
    let again = world.rebuild_missing(world.assemble());
    let _ = recovery::scrub(&again, Mode::Repair, &mut |_| {}).unwrap();
    world.verify(&again, "the end of the round");
    again.close().unwrap();
    let last = world.assemble();
    assert!(
        !last.is_dirty() && !last.is_degraded(),
        "seed {seed}: not clean and whole (dirty {}, degraded {})",
        last.is_dirty(),
        last.is_degraded()
    );
    assert!(
        last.set_aside().is_empty()
            || last
                .set_aside()
                .iter()
                .all(|m| !world.specs.contains(&m.spec)),
        "seed {seed}"
    );
    world.verify(&last, "a clean reassembly");
}

/// Whether any write could have reached `role` (it holds some data).
fn touches(array: &Array, role: u32) -> bool {
    array.geometry().member_used_bytes_of(role) > 0
}

#[test]
fn seeded_bad_days_keep_every_acknowledged_write() {
    if let Some(seed) = std::env::var("NVRAID_SIM_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
    {
        round(seed);
        return;
    }
    let rounds: u64 = std::env::var("NVRAID_SIM_ROUNDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(24);
    // The default rounds, then the seeds that found bugs: 63 (a PPL RAID 5
    // crashed right after a crash's replay, before any write, came back
    // dirty with empty logs, read as never written through them, and
    // stayed dirty through an orderly close).
    for seed in (1..=rounds).chain([63].into_iter().filter(|&s| s > rounds)) {
        round(seed);
    }
}
