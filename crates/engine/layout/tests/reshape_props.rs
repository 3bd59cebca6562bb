//! Property tests of a reshaping array's map (`Reshape`): pieces cover a
//! request in order, each in the shape the position puts it in; and a
//! reshape done in steps that `step_is_safe` allows, over members kept in
//! memory, reads every array byte back exactly at every moment, both
//! before each step's new position is recorded (a crash there) and after.

use nvraid_layout::parity::ParityLayout;
use nvraid_layout::{Direction, Geometry, Level, Reshape, Shape};
use proptest::prelude::*;

const CHUNK: u64 = 4096;

fn level() -> impl Strategy<Value = Level> {
    prop_oneof![
        Just(Level::Raid0),
        Just(Level::Raid5 {
            layout: ParityLayout::LeftSymmetric
        }),
        Just(Level::Raid5 {
            layout: ParityLayout::RightAsymmetric
        }),
        Just(Level::Raid5 {
            layout: ParityLayout::ParityLast
        }),
        Just(Level::Raid6 {
            layout: ParityLayout::LeftSymmetric
        }),
        Just(Level::Raid10 { near: 2 }),
    ]
}

/// A grow (forwards, data offset moved down by `gap` chunks) or a shrink
/// (backwards, moved up), over members of `chunks` chunks of data.
fn reshape() -> impl Strategy<Value = (Reshape, u64)> {
    (
        level(),
        0u32..4,
        1u32..=2,
        8u64..40,
        1u64..4,
        any::<bool>(),
        1u64..6,
    )
        .prop_filter_map(
            "invalid shape",
            |(level, extra, delta, chunks, gap, shrink, step_units)| {
                let fewer = level.members_min() + extra;
                let more = fewer + delta;
                let data = chunks * CHUNK;
                let base = 16 * CHUNK;
                let a = Geometry::new(level, fewer, CHUNK, data).ok()?;
                let b = Geometry::new(level, more, CHUNK, data).ok()?;
                let r = if shrink {
                    // A shrink keeps only what the smaller shape holds.
                    let size = a.array_bytes().min(b.array_bytes());
                    let start = Reshape::new(
                        b.clone(),
                        a.clone(),
                        0,
                        Direction::Backwards,
                        vec![base; more as usize],
                        vec![base + gap * CHUNK; fewer as usize],
                    )
                    .ok()?;
                    start.at(size).ok()?
                } else {
                    Reshape::new(
                        a,
                        b,
                        0,
                        Direction::Forwards,
                        vec![base; fewer as usize],
                        vec![base - gap * CHUNK; more as usize],
                    )
                    .ok()?
                };
                Some((r, step_units))
            },
        )
}

/// The byte the array holds at `logical`.
fn byte(logical: u64) -> u8 {
    ((logical / 7) ^ (logical >> 12)) as u8
}

/// Members of `bytes` each.
struct Disks(Vec<Vec<u8>>);

impl Disks {
    fn write(&mut self, r: &Reshape, shape: Shape, start: u64, end: u64) {
        for piece in r.pieces(start, end - start) {
            assert_eq!(piece.shape, shape);
            for copy in 0..r.geometry(shape).copies() {
                let at = r.locate(&piece, copy);
                let disk = &mut self.0[at.member as usize];
                for i in 0..piece.len {
                    disk[(at.member_offset + i) as usize] = byte(piece.logical_offset + i);
                }
            }
        }
    }

    /// Whether every byte of the array reads back through `r`.
    fn reads_back(&self, r: &Reshape) -> bool {
        r.pieces(0, r.array_bytes()).iter().all(|piece| {
            let at = r.locate(piece, 0);
            let disk = &self.0[at.member as usize];
            (0..piece.len)
                .all(|i| disk[(at.member_offset + i) as usize] == byte(piece.logical_offset + i))
        })
    }

    /// Scribble over the parity rows a parity step writes beside its data
    /// (whole stripes of the new shape, every member), as a stripe write
    /// would before its data lands.
    fn scribble_rows(&mut self, r: &Reshape, start: u64, end: u64) {
        let g = r.geometry(Shape::New);
        if g.level().parity_chunks() == 0 {
            return;
        }
        for piece in r.pieces(start, end - start) {
            let row = g.locate(piece.logical_offset, 0).member_offset / CHUNK;
            for member in 0..g.members() {
                let base = r.data_offset(Shape::New, member).unwrap() + row * CHUNK;
                let d = &mut self.0[member as usize];
                for i in 0..CHUNK {
                    d[(base + i) as usize] ^= 0x5a;
                }
            }
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    #[test]
    fn pieces_split_at_the_position_and_cover_the_request(
        (r, _) in reshape(),
        at in 0u64..1 << 20,
        len in 1u64..1 << 18,
    ) {
        let size = r.array_bytes();
        let offset = at % size;
        let len = len.min(size - offset);
        let pieces = r.pieces(offset, len);
        let mut next = offset;
        for p in &pieces {
            prop_assert_eq!(p.logical_offset, next);
            prop_assert!(p.len > 0);
            let last = p.logical_offset + p.len - 1;
            prop_assert_eq!(r.shape_of(p.logical_offset), p.shape);
            prop_assert_eq!(r.shape_of(last), p.shape);
            next += p.len;
        }
        prop_assert_eq!(next, offset + len);
    }

    #[test]
    fn a_reshape_in_safe_steps_reads_back_at_every_moment((r, step_units) in reshape()) {
        let members = r.old().members().max(r.new_shape().members()) as usize;
        let bytes = 16 * CHUNK + r.old().member_used_bytes().max(r.new_shape().member_used_bytes()) + 8 * CHUNK;
        let mut disks = Disks(vec![vec![0u8; bytes as usize]; members]);
        let size = r.array_bytes();
        let old_only = match r.direction() {
            Direction::Forwards => r.at(0).unwrap(),
            Direction::Backwards => r.at(size).unwrap(),
        };
        disks.write(&old_only, Shape::Old, 0, size);
        prop_assert!(disks.reads_back(&old_only));
        let unit = r.position_unit();
        let mut now = old_only;
        loop {
            let p = now.position();
            let done = match now.direction() {
                Direction::Forwards => p == size,
                Direction::Backwards => p == 0,
            };
            if done {
                break;
            }
            // The largest safe step of at most `step_units` units.
            let mut to = None;
            for k in (1..=step_units).rev() {
                let q = match now.direction() {
                    Direction::Forwards => (p + k * unit).min(size),
                    Direction::Backwards => p.saturating_sub(k * unit),
                };
                if now.step_is_safe(q) {
                    to = Some(q);
                    break;
                }
            }
            let Some(q) = to else {
                // No step is safe: the offsets leave no room (md would
                // need a backup file); nothing was written.
                prop_assert!(disks.reads_back(&now));
                return Ok(());
            };
            let (lo, hi) = if q > p { (p, q) } else { (q, p) };
            let next = now.at(q).unwrap();
            // Every row the step writes, then its data: a crash anywhere in
            // between leaves the recorded position `p`, which must still read
            // every byte.
            disks.scribble_rows(&next, lo, hi);
            prop_assert!(disks.reads_back(&now), "step {p}..{q} clobbered live data");
            disks.write(&next, Shape::New, lo, hi);
            prop_assert!(disks.reads_back(&now));
            prop_assert!(disks.reads_back(&next));
            now = next;
        }
        prop_assert!(disks.reads_back(&now));
    }
}
