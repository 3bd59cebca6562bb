//! A rebuild beside idle clients reads the next step's first pieces while
//! it writes the last ones of the step it holds, before it holds the next
//! (16 MiB of a member per step while idle on RAID 1/4/5/6, a chunk on
//! RAID 10). The next hold tells whether a client write reached that
//! step's regions in between; if one did, the pieces are read again.

mod common;

use nvraid_array::recovery::{add_member_to, rebuild_online, Added, RebuildPace};
use nvraid_layout::parity::ParityLayout;
use nvraid_layout::Level;

const CHUNK: u64 = 64 * 1024;
const MEMBER_BYTES: u64 = 40 << 20;

/// A client write that lands between the read ahead and the next hold
/// must not be undone. It comes from the rebuild's own progress report
/// after the first step (that step's hold released, the next not yet
/// raised, the read ahead long done), over the array bytes of the next
/// step's first member rows (up to 3 MiB of them). Afterwards the array
/// equals the model, and so does the array read with the rebuilt member in
/// place of another (its blocks serve those reads). With the hold's
/// comparison removed, the rebuilt member gets those rows' old bytes back
/// and this fails.
#[test]
fn a_client_write_between_a_rebuilds_read_ahead_and_its_hold_is_kept() {
    let left_symmetric = ParityLayout::LeftSymmetric;
    // Level, members, the role lost, array bytes per member row byte.
    let cases = [
        (Level::Raid1, 2, 1, 1),
        (Level::Raid10 { near: 2 }, 4, 1, 2),
        (
            Level::Raid5 {
                layout: left_symmetric,
            },
            4,
            2,
            3,
        ),
        (
            Level::Raid6 {
                layout: left_symmetric,
            },
            5,
            2,
            3,
        ),
    ];
    for (level, members, lost, width) in cases {
        let dir = tempfile::tempdir().unwrap();
        let specs = common::new_array(&dir, level, members, CHUNK, MEMBER_BYTES);
        {
            let array = common::writable(&specs);
            let size = array.size_bytes() as usize;
            let data: Vec<u8> = (0..size).map(|i| (i * 13 % 251) as u8).collect();
            array.write_at(&data, 0, true).unwrap();
            std::sync::Arc::try_unwrap(array).unwrap().close().unwrap();
        }
        let present = common::lose(&specs, &[lost]);
        let array = common::writable(&present);
        let size = array.size_bytes() as usize;
        let mut model = vec![0u8; size];
        array.read_at(&mut model, 0).unwrap();
        let new = common::fresh_member(&specs[lost], MEMBER_BYTES);
        assert_eq!(
            add_member_to(&array, new).unwrap(),
            Added::Recovering { role: lost as u32 },
            "{level}"
        );
        let mut wrote = None;
        rebuild_online(&array, &RebuildPace::default(), &mut |p| {
            if wrote.is_none() && p.done_bytes < p.total_bytes {
                // The first step ended at member row `p.done_bytes`.
                let rows = p.done_bytes.min(3 << 20);
                let (at, len) = (p.done_bytes * width, rows * width);
                std::thread::sleep(std::time::Duration::from_millis(100));
                let bytes: Vec<u8> = (0..len).map(|i| (i % 241) as u8 ^ 0xa5).collect();
                array.write_at(&bytes, at, true).unwrap();
                wrote = Some((at as usize, bytes));
            }
        })
        .unwrap();
        let Some((at, bytes)) = wrote else {
            panic!("{level}: the rebuild reported no step before its end")
        };
        model[at..at + bytes.len()].copy_from_slice(&bytes);
        assert_eq!(array.in_sync_bytes(lost), None, "{level}: rebuilt");
        let mut whole = vec![0u8; size];
        array.read_at(&mut whole, 0).unwrap();
        assert!(whole == model, "{level}: the array differs from the model");
        std::sync::Arc::try_unwrap(array).unwrap().close().unwrap();
        // The rebuilt member in place of another present one.
        let mut kept = present.clone();
        kept.remove(if lost == 0 { 1 } else { 0 });
        kept.insert(lost.min(kept.len()), specs[lost].clone());
        common::reads_as(
            &kept,
            &model,
            &format!("{level}: the rebuilt member's blocks are wrong"),
        );
    }
}
