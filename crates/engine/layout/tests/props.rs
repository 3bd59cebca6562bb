//! Property tests: the forward and inverse maps agree for every level and
//! random geometries; pieces cover a request exactly and never cross a chunk.

use nvraid_layout::{Geometry, GeometryError, Level};
use proptest::prelude::*;
use std::collections::HashSet;

fn level() -> impl Strategy<Value = Level> {
    prop_oneof![
        Just(Level::Raid0),
        Just(Level::Raid1),
        (2u32..=4).prop_map(|near| Level::Raid10 { near })
    ]
}

fn geometry() -> impl Strategy<Value = Geometry> {
    (level(), 1u32..=9, 12u32..=22, 1u64..=64, 0u64..4096).prop_filter_map(
        "invalid geometry",
        |(level, members, chunk_shift, chunks, extra)| {
            let chunk = 1u64 << chunk_shift;
            Geometry::new(level, members, chunk, chunks * chunk + extra * 512).ok()
        },
    )
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
                prop_assert!(last.member_offset < g.member_used_bytes());
                prop_assert!(members.insert(first.member), "two copies on one member");
                prop_assert_eq!(g.logical_of(first.member, first.member_offset), Some((piece.logical_offset, copy)));
                prop_assert_eq!(g.logical_of(last.member, last.member_offset), Some((piece.logical_offset + piece.len - 1, copy)));
            }
        }
    }

    #[test]
    fn every_member_byte_maps_to_at_most_one_array_byte(g in geometry(), member in 0u32..9, sector in 0u64..100_000) {
        let member = member % g.members();
        let member_offset = (sector * 512) % g.member_used_bytes();
        if let Some((logical, copy)) = g.logical_of(member, member_offset) {
            let back = g.locate(logical, copy);
            prop_assert_eq!((back.member, back.member_offset), (member, member_offset));
        }
    }
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
