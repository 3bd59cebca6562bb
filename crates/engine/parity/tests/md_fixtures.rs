//! Golden vectors from the Linux kernel: RAID 5 and RAID 6 arrays that md
//! made and filled with its test pattern (tests/fixtures/md-states/raid5_*
//! and raid6_*, every layout family, odd and even member counts). For every
//! stripe of every array, nvraid's stripe map must find each data chunk
//! where md put it (the pattern says which logical block it is), and
//! nvraid's parity must equal the P and Q md wrote, block for block.

use nvraid_layout::parity::{ParityLayout, StripeMap};
use nvraid_metadata::{Role, Superblock};
use nvraid_parity::{gen_pq, Kernel};
use std::path::PathBuf;
use std::process::Command;

const STATES: &[&str] = &[
    "raid5_ls_4d",
    "raid5_la_3d",
    "raid5_rs_5d",
    "raid5_ra_4d",
    "raid5_pf_4d",
    "raid5_pl_3d",
    "raid6_ls_5d",
    "raid6_la_4d",
    "raid6_rs_6d",
    "raid6_ra_5d",
];

/// The members of a fixture, in role order, with their superblocks.
fn members(state: &str) -> Vec<(Vec<u8>, Superblock)> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../../tests/fixtures/md-states")
        .join(state);
    let mut found = Vec::new();
    for disk in 0.. {
        let xz = dir.join(format!("disk{disk}.img.xz"));
        if !xz.exists() {
            break;
        }
        let out = Command::new("xz")
            .arg("-dc")
            .arg(&xz)
            .output()
            .expect("xz (apt-get install xz-utils)");
        assert!(out.status.success(), "xz -dc {}", xz.display());
        let sb = Superblock::decode(&out.stdout[4096..8192]).unwrap();
        found.push((out.stdout, sb));
    }
    assert!(!found.is_empty(), "no members in {}", dir.display());
    found.sort_by_key(|(_, sb)| match sb.role() {
        Role::Active(r) => r,
        other => panic!("{state}: a member with role {other:?}"),
    });
    found
}

/// md's `pattern write`: 4 KiB block N of the array holds the
/// little-endian u64 N, repeated.
fn pattern_ok(chunk: &[u8], first_block: u64) -> bool {
    chunk.chunks(4096).enumerate().all(|(i, block)| {
        let want = (first_block + i as u64).to_le_bytes();
        block.chunks(8).all(|w| w == want)
    })
}

#[test]
fn md_put_every_chunk_and_parity_block_where_the_stripe_map_says() {
    for state in STATES {
        let members = members(state);
        let sb = &members[0].1;
        let n = sb.raid_disks;
        let parity = match sb.level {
            5 => 1,
            6 => 2,
            other => panic!("{state}: level {other}"),
        };
        let layout = ParityLayout::from_md(sb.layout).unwrap();
        assert!(
            state.contains(match layout.name() {
                "left-symmetric" => "_ls_",
                "left-asymmetric" => "_la_",
                "right-symmetric" => "_rs_",
                "right-asymmetric" => "_ra_",
                "parity-first" => "_pf_",
                "parity-last" => "_pl_",
                other => other,
            }),
            "{state}: superblock says {}",
            layout.name()
        );
        let map = StripeMap::new(n, parity, layout).unwrap();
        let chunk = sb.chunk_sectors as usize * 512;
        let stripes = sb.size_sectors as usize * 512 / chunk;
        let data_at = sb.data_offset_sectors as usize * 512;
        let block = |member: u32, stripe: usize| {
            let at = data_at + stripe * chunk;
            &members[member as usize].0[at..at + chunk]
        };
        let data_disks = map.data_per_stripe() as usize;
        let (mut p, mut q) = (vec![0u8; chunk], vec![0u8; chunk]);
        for stripe in 0..stripes {
            let blocks = map.stripe(stripe as u64);
            for (d, member) in blocks.data.iter().enumerate() {
                let logical_chunk = (stripe * data_disks + d) as u64;
                assert!(
                    pattern_ok(block(*member, stripe), logical_chunk * chunk as u64 / 4096),
                    "{state}: stripe {stripe} data {d} is not on member {member}"
                );
            }
            // Data in md's Q order: RAID 5 has no Q; its order is moot.
            let mut ordered: Vec<&[u8]> = vec![&[]; data_disks];
            let slots = if parity == 2 {
                map.q_slots(stripe as u64)
            } else {
                (0..data_disks).collect()
            };
            for (d, member) in blocks.data.iter().enumerate() {
                ordered[slots[d]] = block(*member, stripe);
            }
            gen_pq(Kernel::best(), &ordered, &mut p, &mut q);
            assert!(
                p == block(blocks.p, stripe),
                "{state}: stripe {stripe}: P on member {} differs",
                blocks.p
            );
            if let Some(qm) = blocks.q {
                assert!(
                    q == block(qm, stripe),
                    "{state}: stripe {stripe}: Q on member {qm} differs"
                );
            }
        }
        eprintln!("{state}: {stripes} stripes of {n} members match md");
    }
}
