//! Property tests: the forward and inverse maps agree for every level and
//! random geometries; pieces cover a request exactly and never cross a chunk.

use nvraid_layout::{Geometry, GeometryError, Level, Raid0Layout};
use proptest::prelude::*;
use std::collections::HashSet;

fn level() -> impl Strategy<Value = Level> {
    prop_oneof![
        Just(Level::Raid0),
        Just(Level::Raid1),
        (2u32..=4).prop_map(|near| Level::Raid10 { near }),
        (2u32..=3, any::<bool>()).prop_map(|(copies, offset)| Level::Raid10Far { copies, offset })
    ]
}

fn equal_members() -> impl Strategy<Value = Geometry> {
    (level(), 1u32..=9, 12u32..=22, 1u64..=64, 0u64..4096).prop_filter_map(
        "invalid geometry",
        |(level, members, chunk_shift, chunks, extra)| {
            let chunk = 1u64 << chunk_shift;
            Geometry::new(level, members, chunk, chunks * chunk + extra * 512).ok()
        },
    )
}

/// RAID 0 over members of unequal size (md's zones), either layout.
fn zoned() -> impl Strategy<Value = Geometry> {
    (
        proptest::collection::vec((1u64..=24, 0u64..64), 1..=7),
        12u32..=20,
        prop_oneof![Just(Raid0Layout::Original), Just(Raid0Layout::Alternate)],
    )
        .prop_filter_map("invalid geometry", |(sizes, chunk_shift, layout)| {
            let chunk = 1u64 << chunk_shift;
            let bytes: Vec<u64> = sizes.iter().map(|(c, e)| c * chunk + e * 512).collect();
            Geometry::raid0_zones(&bytes, chunk, layout).ok()
        })
}

fn geometry() -> impl Strategy<Value = Geometry> {
    prop_oneof![3 => equal_members(), 1 => zoned()]
}

fn geometry_and_range() -> impl Strategy<Value = (Geometry, u64, u64)> {
    geometry().prop_flat_map(|g| {
        let sectors = g.array_bytes() / 512;
        (Just(g), 0..sectors).prop_flat_map(move |(g, start)| {
            let max_len = (sectors - start).min(4096);
            (
                Just(g),
                Just(start * 512),
                (1..=max_len).prop_map(|l| l * 512),
            )
        })
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    #[test]
    fn pieces_cover_exactly_and_stay_in_one_chunk((g, offset, len) in geometry_and_range()) {
        let mut next = offset;
        for piece in g.pieces(offset, len) {
            prop_assert_eq!(piece.logical_offset, next);
            prop_assert!(piece.len > 0);
            if let Some(chunk) = g.chunk_bytes() {
                prop_assert_eq!(piece.logical_offset / chunk, (piece.logical_offset + piece.len - 1) / chunk);
            }
            next += piece.len;
        }
        prop_assert_eq!(next, offset + len);
    }

    #[test]
    fn locate_and_logical_of_round_trip((g, offset, len) in geometry_and_range()) {
        for piece in g.pieces(offset, len) {
            let mut members = HashSet::new();
            for copy in 0..g.copies() {
                let first = g.locate(piece.logical_offset, copy);
                let last = g.locate(piece.logical_offset + piece.len - 1, copy);
                // Each copy of a piece is contiguous on one member.
                prop_assert_eq!(first.member, last.member);
                prop_assert_eq!(last.member_offset - first.member_offset, piece.len - 1);
                prop_assert!(last.member_offset < g.member_used_bytes_of(last.member));
                prop_assert!(members.insert(first.member), "two copies on one member");
                prop_assert_eq!(g.logical_of(first.member, first.member_offset), Some((piece.logical_offset, copy)));
                prop_assert_eq!(g.logical_of(last.member, last.member_offset), Some((piece.logical_offset + piece.len - 1, copy)));
            }
        }
    }

    #[test]
    fn every_member_byte_maps_to_at_most_one_array_byte(g in geometry(), member in 0u32..9, sector in 0u64..100_000) {
        let member = member % g.members();
        let member_offset = (sector * 512) % g.member_used_bytes_of(member);
        if let Some((logical, copy)) = g.logical_of(member, member_offset) {
            let back = g.locate(logical, copy);
            prop_assert_eq!((back.member, back.member_offset), (member, member_offset));
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]

    /// Every chunk a zoned RAID 0's members hold maps to exactly one array
    /// chunk, and every array chunk is held: the zones tile the members.
    #[test]
    fn zones_tile_the_members_exactly(g in zoned()) {
        let chunk = g.chunk_bytes().unwrap();
        let mut seen = HashSet::new();
        for member in 0..g.members() {
            for row in 0..g.member_used_bytes_of(member) / chunk {
                let (logical, copy) = g.logical_of(member, row * chunk).expect("held chunk maps");
                prop_assert_eq!(copy, 0);
                prop_assert_eq!(logical % chunk, 0);
                prop_assert!(seen.insert(logical / chunk), "two member chunks for one array chunk");
            }
        }
        prop_assert_eq!(seen.len() as u64, g.array_bytes() / chunk);
    }
}

#[test]
fn zones_follow_md() {
    // 16, 24 and 32 MiB members less 1 MiB of metadata, 64 KiB chunks.
    let mib = 1u64 << 20;
    let chunk = 64 << 10;
    let g = Geometry::raid0_zones(
        &[15 * mib, 23 * mib, 31 * mib],
        chunk,
        Raid0Layout::Original,
    )
    .unwrap();
    assert_eq!(g.zone_count(), 3);
    assert_eq!(g.array_bytes(), 69 * mib);
    // Zone 1 starts at 45 MiB = chunk 720, on members 1 and 2 at 15 MiB.
    // Original layout: chunk 720 % 2 = 0 -> member 1; alternate: 0 % 2 -> member 1.
    let at = g.locate(45 * mib, 0);
    assert_eq!((at.member, at.member_offset), (1, 15 * mib));
    let at = g.locate(45 * mib + chunk, 0);
    assert_eq!((at.member, at.member_offset), (2, 15 * mib));
    // Zone 2 starts at 61 MiB = chunk 976, only member 2, at 23 MiB.
    let at = g.locate(61 * mib + 5, 0);
    assert_eq!((at.member, at.member_offset), (2, 23 * mib + 5));
    // Where the layouts differ: a zone whose first chunk number is odd.
    let g = Geometry::raid0_zones(
        &[3 * chunk, 5 * chunk, 5 * chunk],
        chunk,
        Raid0Layout::Original,
    )
    .unwrap();
    // Zone 0: 9 chunks; zone 1 starts at chunk 9 on members 1 and 2.
    assert_eq!(
        g.locate(9 * chunk, 0).member,
        2,
        "original: 9 % 2 = 1 -> member 2"
    );
    let alt = Geometry::raid0_zones(
        &[3 * chunk, 5 * chunk, 5 * chunk],
        chunk,
        Raid0Layout::Alternate,
    )
    .unwrap();
    assert_eq!(
        alt.locate(9 * chunk, 0).member,
        1,
        "alternate: 0 % 2 = 0 -> member 1"
    );
    // Equal members give md's single zone, whatever the layout.
    let one = Geometry::raid0_zones(&[8 * chunk; 4], chunk, Raid0Layout::Alternate).unwrap();
    assert_eq!(
        one,
        Geometry::new(Level::Raid0, 4, chunk, 8 * chunk).unwrap()
    );
}

#[test]
fn capacity_is_members_times_used_over_copies() {
    let g = Geometry::new(Level::Raid10 { near: 2 }, 4, 65536, 65536 * 100).unwrap();
    assert_eq!(g.array_bytes(), 65536 * 200);
    let g = Geometry::new(Level::Raid0, 5, 4096, 4096 * 7).unwrap();
    assert_eq!(g.array_bytes(), 4096 * 35);
}

#[test]
fn constructor_refuses_bad_geometry() {
    assert_eq!(
        Geometry::new(Level::Raid0, 0, 65536, 1 << 20),
        Err(GeometryError::NoMembers)
    );
    assert_eq!(
        Geometry::new(Level::Raid0, 2, 65536 + 512, 1 << 20),
        Err(GeometryError::ChunkNotPowerOfTwo(65536 + 512))
    );
    assert_eq!(
        Geometry::new(Level::Raid0, 2, 2048, 1 << 20),
        Err(GeometryError::ChunkOutOfRange(2048))
    );
    assert_eq!(
        Geometry::new(Level::Raid0, 2, 8 << 20, 1 << 30),
        Err(GeometryError::ChunkOutOfRange(8 << 20))
    );
    assert_eq!(
        Geometry::new(Level::Raid1, 1, 0, 1 << 20),
        Err(GeometryError::TooFewMembers {
            level: Level::Raid1,
            min: 2,
            got: 1
        })
    );
    assert_eq!(
        Geometry::new(Level::Raid10 { near: 2 }, 1, 65536, 1 << 20),
        Err(GeometryError::BadCopies {
            near: 2,
            members: 1
        })
    );
    assert_eq!(
        Geometry::new(Level::Raid10 { near: 1 }, 4, 65536, 1 << 20),
        Err(GeometryError::BadCopies {
            near: 1,
            members: 4
        })
    );
    assert_eq!(
        Geometry::new(Level::Raid0, 2, 1 << 20, 1 << 19),
        Err(GeometryError::MemberTooSmall {
            member_bytes: 1 << 19,
            chunk_bytes: 1 << 20
        })
    );
    assert_eq!(
        Geometry::new(Level::Raid0, 129, 65536, 1 << 20),
        Err(GeometryError::TooManyMembers { got: 129 })
    );
}
