//! md's write journal under a write cache (md's write-back mode), at the
//! crate level and deterministic: the cache logs two pages of one row
//! (different members), writes one of them back, and the process dies
//! before the other is written back. The replay must leave every row's
//! parity equal to its data, and both pages as the cache acknowledged them.

use nvraid_array::recovery::{scrub, Mode};
use nvraid_array::{assemble, create, AssembleOptions, BitmapChoice, CreateOptions};
use nvraid_io::AlignedBuf;
use nvraid_layout::parity::ParityLayout;
use nvraid_layout::Level;

const CHUNK: u64 = 64 * 1024;
const PAGE: usize = 4096;

fn page(byte: u8) -> AlignedBuf {
    let mut buf = AlignedBuf::zeroed(PAGE);
    buf.fill(byte);
    buf
}

fn writable() -> AssembleOptions {
    AssembleOptions {
        writable: true,
        direct: false,
        allow_degraded: false,
    }
}

/// A RAID 5 of four members and md's journal on a fifth, in `dir`.
fn journaled(dir: &std::path::Path) -> Vec<String> {
    journaled_of(dir, 4)
}

/// A RAID 5 of `members` and md's journal after them, in `dir`.
fn journaled_of(dir: &std::path::Path, members: usize) -> Vec<String> {
    let specs: Vec<String> = (0..=members)
        .map(|i| dir.join(format!("m{i}")).display().to_string())
        .collect();
    let options = CreateOptions {
        level: Level::Raid5 {
            layout: ParityLayout::LeftSymmetric,
        },
        chunk_bytes: CHUNK,
        name: "cache".into(),
        size_bytes: Some(16 << 20),
        force: false,
        direct: false,
        bitmap: BitmapChoice::Journal,
    };
    let array = create(&specs, &options).unwrap();
    array.close().unwrap();
    specs
}

/// What a write cache does before it acknowledges: `pages` logged as
/// data-only units of md's journal (held until written back), and waited
/// for until durable. Each write's ticket, in order.
fn cache_logs(array: &nvraid_array::Array, pages: &[(u64, &AlignedBuf)]) -> Vec<u64> {
    let journal = array.md_journal().expect("a journal");
    let tickets: Vec<u64> = pages
        .iter()
        .map(|(offset, data)| {
            journal
                .enqueue_cached(array, *offset, data)
                .unwrap()
                .expect("taken")
        })
        .collect();
    let last = *tickets.last().expect("one page at least");
    while !journal.ready(array, last).unwrap() {}
    tickets
}

/// After the replay: `pages` read back as given, and no row's parity
/// differs from its data.
fn replayed_as(specs: &[String], pages: &[(u64, &AlignedBuf)]) {
    let array = assemble(specs, writable()).unwrap();
    let mut read = AlignedBuf::zeroed(PAGE);
    for (offset, want) in pages {
        array.read_at(&mut read, *offset).unwrap();
        assert!(read[..] == want[..], "array byte {offset} as acknowledged");
    }
    let found = scrub(&array, Mode::Check, &mut |_| {}).unwrap();
    assert_eq!(
        found.mismatch_sectors, 0,
        "parity differs from data after the replay: {:?}",
        found.regions
    );
    array.close().unwrap();
}

/// One page logged by the cache and written back: the write-back logs
/// nothing (the log holds the page), and a replay after the process dies
/// writes the row through the array, parity computed from its data.
#[test]
fn a_page_written_back_replays_from_its_logged_data() {
    let dir = tempfile::tempdir().unwrap();
    let specs = journaled(dir.path());
    let array = assemble(&specs, writable()).unwrap();
    let new = page(0x5c);
    cache_logs(&array, &[(8192, &new)]);
    array.write_at(&new, 8192, false).unwrap();
    drop(array);
    replayed_as(&specs, &[(8192, &new)]);
}

#[test]
fn a_row_written_back_in_part_replays_with_parity_that_matches() {
    let dir = tempfile::tempdir().unwrap();
    let specs = journaled(dir.path());
    let array = assemble(&specs, writable()).unwrap();
    // Two pages of one row: the first page of data chunks 0 and 1 sit at
    // the same offset on two members.
    let (x, y) = (0u64, CHUNK);
    let (at_x, at_y) = (array.geometry().locate(x, 0), array.geometry().locate(y, 0));
    assert_eq!(at_x.member_offset, at_y.member_offset, "one row");
    assert_ne!(at_x.member, at_y.member, "two members");
    let (new_x, new_y) = (page(0xa1), page(0xb2));
    // The cache logs both (data only) and waits until they are durable.
    cache_logs(&array, &[(x, &new_x), (y, &new_y)]);
    // It writes x back through the array (which reads y's old bytes from
    // its member for the parity), and the process dies before y.
    array.write_at(&new_x, x, false).unwrap();
    // Dropped without `close`: what a killed process leaves (the files
    // keep every write; nothing orderly happens).
    drop(array);
    replayed_as(&specs, &[(x, &new_x), (y, &new_y)]);
}

fn degraded() -> AssembleOptions {
    AssembleOptions {
        allow_degraded: true,
        ..writable()
    }
}

/// The child of [`a_torn_write_back_on_a_degraded_array_keeps_the_missing_members_data`]:
/// on the degraded array the cache logs two pages of one row, writes the
/// first back, and the process dies (a failpoint) between that round's
/// data write and its parity write.
fn torn_write_back(specs: &[String]) {
    let array = assemble(specs, degraded()).unwrap();
    assert!(array.is_degraded());
    let (new_x, new_y) = (page(0xa1), page(0xb2));
    cache_logs(&array, &[(0, &new_x), (CHUNK, &new_y)]);
    array.write_at(&new_x, 0, false).unwrap();
    unreachable!("the failpoint ends the process within the write");
}

/// The bad day of a write cache on md's journal: a member is missing, the
/// cache writes back one page of a row in which it holds another, and a
/// crash tears that write between the data and the parity. The row's
/// parity is not logged (it would not cover the held page), so the replay
/// rebuilds the row from its data, and the missing member's page must come
/// from the log, not from the torn parity.
#[test]
fn a_torn_write_back_on_a_degraded_array_keeps_the_missing_members_data() {
    if let Ok(dir) = std::env::var("JOURNAL_CACHE_CHILD") {
        let specs: Vec<String> = (0..5)
            .filter(|&i| i != 2)
            .map(|i| format!("{dir}/m{i}"))
            .collect();
        torn_write_back(&specs);
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let specs = journaled(dir.path());
    // Pages 0 of data chunks 0, 1 and 2 share a row; chunk 2 is on m2.
    let array = assemble(&specs, writable()).unwrap();
    let z = 2 * CHUNK;
    assert_eq!(array.geometry().locate(z, 0).member, 2, "chunk 2 on m2");
    let old_z = page(0x77);
    array.write_at(&old_z, z, false).unwrap();
    array.close().unwrap();
    let present: Vec<String> = specs
        .iter()
        .enumerate()
        .filter(|&(i, _)| i != 2)
        .map(|(_, s)| s.clone())
        .collect();
    let child = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "a_torn_write_back_on_a_degraded_array_keeps_the_missing_members_data",
            "--nocapture",
        ])
        .env("JOURNAL_CACHE_CHILD", dir.path())
        .env("NVRAID_FAILPOINT", "stripe-write:1")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&child.stderr);
    assert!(
        stderr.contains("failpoint stripe-write reached"),
        "the child did not die at the failpoint: {stderr}"
    );
    let array = assemble(&present, degraded()).unwrap();
    let mut read = AlignedBuf::zeroed(PAGE);
    for (offset, want) in [(0, page(0xa1)), (CHUNK, page(0xb2)), (z, old_z)] {
        array.read_at(&mut read, offset).unwrap();
        assert!(
            read[..] == want[..],
            "array byte {offset}: {:#x}, not {:#x}",
            read[0],
            want[0]
        );
    }
    array.close().unwrap();
}

/// The members of [`journaled`] but m2.
fn without_m2(specs: &[String]) -> Vec<String> {
    let mut present = specs.to_vec();
    present.remove(2);
    present
}

/// The cache's life on `specs`: each page of `pages` logged, then written
/// back through the array, in turn; then the process dies (the array is
/// dropped without `close`). Every page stays held in the log meanwhile,
/// so a write-back of a row where the cache holds another member's page
/// logs no parity there.
fn cache_writes_back(specs: &[String], options: AssembleOptions, pages: &[(u64, u8)]) {
    let array = assemble(specs, options).unwrap();
    for &(offset, byte) in pages {
        let data = page(byte);
        cache_logs(&array, &[(offset, &data)]);
        array.write_at(&data, offset, false).unwrap();
    }
    drop(array);
}

/// After the replay on the degraded array (m2 missing): each page reads as
/// given (those of m2 rebuilt from the others).
fn replayed_degraded_as(specs: &[String], pages: &[(u64, u8)]) {
    let array = assemble(&without_m2(specs), degraded()).unwrap();
    assert!(array.is_degraded());
    let mut read = AlignedBuf::zeroed(PAGE);
    for &(offset, want) in pages {
        array.read_at(&mut read, offset).unwrap();
        assert!(
            read.iter().all(|&b| b == want),
            "array byte {offset}: {:#x}, not {want:#x}",
            read[0]
        );
    }
    array.close().unwrap();
}

/// Row 0 holds chunk 0 on m0, chunk 1 on m1 and chunk 2 on m2.
const Z: u64 = 2 * CHUNK;

/// On a degraded array: the cache writes back m2's page of a row (the
/// round logs the row's parity: a complete stripe), then a page of m0 in
/// the same row while m2's is still held (that round logs no parity). The
/// replay puts the complete stripe's parity back, stale now; m2's page
/// must not be rebuilt from it. (It failed so in about one run of eight
/// of the cli's member-failure crash test.)
#[test]
fn a_degraded_write_back_after_a_complete_stripe_keeps_the_missing_members_data() {
    let dir = tempfile::tempdir().unwrap();
    let specs = journaled(dir.path());
    cache_writes_back(&without_m2(&specs), degraded(), &[(Z, 0xc3), (0, 0xa1)]);
    replayed_degraded_as(&specs, &[(Z, 0xc3), (0, 0xa1), (CHUNK, 0)]);
}

/// The same rounds on a healthy array, then m2 fails with the process:
/// the rounds logged no rebuilt pages, so the replay itself must take m2's
/// page from the log's complete stripe, not from its stale parity.
#[test]
fn a_member_lost_after_a_healthy_write_back_is_replayed_from_the_logs_copy() {
    let dir = tempfile::tempdir().unwrap();
    let specs = journaled(dir.path());
    cache_writes_back(&specs, writable(), &[(Z, 0xc3), (0, 0xa1)]);
    replayed_degraded_as(&specs, &[(Z, 0xc3), (0, 0xa1), (CHUNK, 0)]);
}

/// A complete stripe without m2's page, then a write-back that logs no
/// parity, then m2 is lost: the replay rebuilds m2's page from the members
/// as the crash left them, before it puts back the complete stripe's stale
/// parity.
#[test]
fn a_member_lost_after_a_healthy_write_back_is_rebuilt_before_stale_parity_returns() {
    let dir = tempfile::tempdir().unwrap();
    let specs = journaled(dir.path());
    let array = assemble(&specs, writable()).unwrap();
    array.write_at(&page(0x77), Z, false).unwrap();
    array.close().unwrap();
    cache_writes_back(&specs, writable(), &[(0, 0xa1), (CHUNK, 0xb2)]);
    replayed_degraded_as(&specs, &[(0, 0xa1), (CHUNK, 0xb2), (Z, 0x77)]);
}

/// A write-back of one cached page logs its row's parity (one unit after
/// the page's), on a RAID 5 of four and of five alike, as md does: the
/// kernel's replay then writes the row as logged, and never has to load
/// every row the cache wrote back into its stripe cache.
#[test]
fn a_write_back_logs_its_rows_parity() {
    for (members, units) in [(4, 2), (5, 2)] {
        let dir = tempfile::tempdir().unwrap();
        let specs = journaled_of(dir.path(), members);
        let array = assemble(&specs, writable()).unwrap();
        let journal = array.md_journal().unwrap();
        let before = journal.units_logged().unwrap();
        let data = page(0x3c);
        cache_logs(&array, &[(0, &data)]);
        array.write_at(&data, 0, false).unwrap();
        assert_eq!(
            journal.units_logged().unwrap() - before,
            units,
            "a RAID 5 of {members}: units logged for the cached page and its write-back"
        );
        drop(array);
        replayed_as(&specs, &[(0, &data)]);
    }
}

/// A row's parity is logged at a write-back only when it covers every
/// page the cache holds in the row, and a page stops being held when the
/// cache releases it. Here over a thousand rows are cached, written back
/// and released (most of their copies swept out of the log's table, the
/// last ones not yet), then, in a swept row and in one not swept: a page
/// written back alone in a row whose other page was released logs its
/// parity; one whose row holds a newer page of another member does not;
/// and the replay leaves every page as acknowledged, parity matching.
#[test]
fn released_pages_no_longer_hold_their_rows_parity_back() {
    let dir = tempfile::tempdir().unwrap();
    let specs = journaled(dir.path());
    let array = assemble(&specs, writable()).unwrap();
    let journal = array.md_journal().unwrap();
    // Data chunk 0 of 70 stripes, 16 pages each: 1120 rows, released a
    // stripe at a time (the cache's share of this small ring is less).
    let stripe = 3 * CHUNK;
    let chunk = {
        let mut buf = AlignedBuf::zeroed(CHUNK as usize);
        buf.fill(0x6e);
        buf
    };
    let one = page(0x6e);
    for s in 0..70u64 {
        let pages: Vec<(u64, &AlignedBuf)> = (0..16)
            .map(|p| (s * stripe + p * PAGE as u64, &one))
            .collect();
        let tickets = cache_logs(&array, &pages);
        array.write_at(&chunk, s * stripe, false).unwrap();
        journal.release_through(*tickets.last().unwrap());
    }
    let mut acknowledged = vec![(69 * stripe + 4096, page(0x6e))];
    for s in [0, 69] {
        // Page 0 of data chunk 1 shares a row with page 0 of chunk 0,
        // which is released: its write-back logs the row's parity (two
        // units: the cached page, then the parity).
        let (x, y) = (s * stripe, s * stripe + CHUNK);
        let new_y = page(0x71);
        let before = journal.units_logged().unwrap();
        cache_logs(&array, &[(y, &new_y)]);
        array.write_at(&new_y, y, false).unwrap();
        assert_eq!(
            journal.units_logged().unwrap() - before,
            2,
            "stripe {s}: the cached page and its row's parity"
        );
        // A newer x is cached and held: y's next write-back leaves the
        // parity out (it does not cover the new x).
        let (new_x, newer_y) = (page(0x72), page(0x73));
        let before = journal.units_logged().unwrap();
        cache_logs(&array, &[(x, &new_x), (y, &newer_y)]);
        array.write_at(&newer_y, y, false).unwrap();
        assert_eq!(
            journal.units_logged().unwrap() - before,
            1,
            "stripe {s}: the two cached pages only, no parity while the new x is held"
        );
        acknowledged.extend([(x, new_x), (y, newer_y)]);
    }
    drop(array);
    let pages: Vec<(u64, &AlignedBuf)> = acknowledged.iter().map(|(o, p)| (*o, p)).collect();
    replayed_as(&specs, &pages);
}

/// Groups written in one batch share meta blocks: three cached writes
/// (the last one over the first's page) logged together are one unit, not
/// three. While one group of that unit is still held the tail stays before
/// the unit, and a replay puts back the newest copy of the twice-written
/// page and the other page.
#[test]
fn cached_writes_logged_together_share_one_unit() {
    let dir = tempfile::tempdir().unwrap();
    let specs = journaled(dir.path());
    let array = assemble(&specs, writable()).unwrap();
    let journal = array.md_journal().unwrap();
    let before = journal.units_logged().unwrap();
    let (x, y) = (0u64, 3 * CHUNK + 8192);
    let (old_x, new_x, new_y) = (page(0x11), page(0x22), page(0x33));
    let tickets = cache_logs(&array, &[(x, &old_x), (y, &new_y), (x, &new_x)]);
    assert_eq!(
        journal.units_logged().unwrap() - before,
        1,
        "three cached writes written in one batch"
    );
    // The first two are written back and released; the third is still
    // held: the tail may not pass the unit it shares with them.
    journal.release_through(tickets[1]);
    journal.checkpoint(&array).unwrap();
    assert_eq!(journal.units_logged().unwrap() - before, 1);
    drop(array);
    replayed_as(&specs, &[(x, &new_x), (y, &new_y)]);
}

/// `--size` is the space used of each data member; md's write journal
/// takes all of an existing member (as mdadm's), and a journal file the
/// create makes is made at `--size`.
#[test]
fn the_journal_takes_all_of_an_existing_member() {
    for (existing, ring_mib) in [(Some(64u64 << 20), 63u64), (None, 15)] {
        let dir = tempfile::tempdir().unwrap();
        if let Some(bytes) = existing {
            std::fs::File::create(dir.path().join("m4"))
                .unwrap()
                .set_len(bytes)
                .unwrap();
        }
        // Four data members and the journal m4, created at 16 MiB each.
        let specs = journaled(dir.path());
        let array = assemble(&specs, writable()).unwrap();
        let journal = array.md_journal().unwrap();
        assert_eq!(
            journal.ring_sectors() * 512,
            ring_mib << 20,
            "journal member {existing:?}: its ring is all of it past the 1 MiB metadata area"
        );
        array.close().unwrap();
        for data in &specs[..4] {
            assert_eq!(std::fs::metadata(data).unwrap().len(), 16 << 20);
        }
        let journal_len = std::fs::metadata(&specs[4]).unwrap().len();
        assert_eq!(journal_len, existing.unwrap_or(16 << 20));
    }
}

/// Writes queued together on a worker's queue whose rounds reach the log
/// in one harvest of completions go to the log as one batch (one write,
/// one flush, their pages under shared meta blocks), not one batch per
/// round: eight 4 KiB writes to eight rows log one unit, not eight. They
/// read back, and a replay keeps them.
#[test]
fn rounds_reaching_the_log_together_share_one_batch() {
    use nvraid_io::queue::{OpKind, Target};
    let dir = tempfile::tempdir().unwrap();
    let specs = journaled(dir.path());
    let array = std::sync::Arc::new(assemble(&specs, writable()).unwrap());
    let journal = array.md_journal().unwrap();
    let before = journal.units_logged().unwrap();
    let target =
        nvraid_array::FanoutTarget::array(array.clone(), nvraid_io::engine::EngineKind::Psync);
    let mut queue = target.open_queue(8, 64 << 10).unwrap();
    // Eight rows: the first page of each of the first eight chunks of the
    // second stripe row onwards (each its own row of some member).
    let writes: Vec<(u64, AlignedBuf)> = (0..8u64)
        .map(|i| (i * 3 * CHUNK + 4096 * i, page(0x40 + i as u8)))
        .collect();
    for (slot, (offset, data)) in writes.iter().enumerate() {
        queue.buffer_mut(slot as u32)[..PAGE].copy_from_slice(data);
        queue
            .submit(slot as u32, OpKind::Write, *offset, PAGE as u32, false)
            .unwrap();
    }
    let mut done = Vec::new();
    while done.len() < writes.len() {
        queue.reap(1, &mut |c| done.push(c)).unwrap();
    }
    assert!(done.iter().all(|c| c.result == Ok(PAGE as u32)), "{done:?}");
    assert_eq!(
        array.md_journal().unwrap().units_logged().unwrap() - before,
        1,
        "eight rounds that reached the log together"
    );
    drop(queue);
    drop(target);
    let array = std::sync::Arc::try_unwrap(array).unwrap();
    drop(array);
    let pages: Vec<(u64, &AlignedBuf)> = writes.iter().map(|(o, d)| (*o, d)).collect();
    replayed_as(&specs, &pages);
}

/// Issue 29, item 5: a write cache keeps no more stripes (4 KiB rows of
/// the members) data-only in md's log than its bound, whatever the pages:
/// a page in a stripe it holds already is taken, one in a new stripe past
/// the bound is not (the cache must write back first), and once the held
/// pages are released the bound has room again.
#[test]
fn a_write_cache_keeps_no_more_data_only_stripes_than_its_bound() {
    let dir = tempfile::tempdir().unwrap();
    let specs = journaled(dir.path());
    let array = assemble(&specs, writable()).unwrap();
    let journal = array.md_journal().expect("a journal");
    journal.set_cached_stripes_max(16);
    let row = 3 * CHUNK; // RAID 5 of four: three data chunks a row
    let data = page(0x3c);
    let mut last = 0;
    // The first page of 16 rows: 16 stripes.
    for r in 0..16 {
        last = journal
            .enqueue_cached(&array, r * row, &data)
            .unwrap()
            .expect("room for 16 stripes");
    }
    // The same stripes through the other data members: no new stripe.
    for r in 0..16 {
        for d in 1..3 {
            last = journal
                .enqueue_cached(&array, r * row + d * CHUNK, &data)
                .unwrap()
                .expect("a stripe already held");
        }
    }
    // A 17th stripe (the second page of row 0) waits for room.
    assert_eq!(
        journal.enqueue_cached(&array, PAGE as u64, &data).unwrap(),
        None
    );
    assert!(journal.wants_room());
    let (held, share) = journal.held_share(&array);
    assert!(
        held >= share,
        "a full bound reads as a full share ({held} of {share})"
    );
    while !journal.ready(&array, last).unwrap() {}
    journal.release_through(last);
    assert!(journal
        .enqueue_cached(&array, PAGE as u64, &data)
        .unwrap()
        .is_some());
}

/// A journal whose log names a data page at a sector so large that its
/// byte offset does not fit 64 bits (a meta block with a valid checksum:
/// the log is the disk's to say) is refused at assembly with an error
/// naming the journal; no arithmetic on the location wraps or panics.
#[test]
fn a_logged_location_past_any_array_is_refused_by_name() {
    use nvraid_metadata::r5log::{uuid_checksum, MetaBlock, Payload};
    let dir = tempfile::tempdir().unwrap();
    let specs = journaled(dir.path());
    let array = assemble(&specs, writable()).unwrap();
    cache_logs(&array, &[(8192, &page(0x3d))]);
    drop(array);
    // The meta block that logged the page, in the journal member's ring.
    let journal = specs.last().unwrap();
    let mut bytes = std::fs::read(journal).unwrap();
    let sb = nvraid_metadata::Superblock::decode(&bytes[4096..8192]).unwrap();
    let seed = uuid_checksum(&sb.set_uuid);
    let ring = (sb.data_offset_sectors * 512) as usize;
    let mut found = 0;
    for at in (ring..bytes.len()).step_by(PAGE) {
        let Ok(mut block) = MetaBlock::decode(&bytes[at..at + PAGE], seed) else {
            continue;
        };
        let mut changed = false;
        for payload in &mut block.payloads {
            if let Payload::Data { location, .. } = payload {
                *location = u64::MAX / 256;
                changed = true;
            }
        }
        if changed {
            block.encode(&mut bytes[at..at + PAGE], seed).unwrap();
            found += 1;
        }
    }
    assert!(found > 0, "the log holds the page's meta block");
    std::fs::write(journal, &bytes).unwrap();
    let refused = assemble(&specs, writable()).expect_err("a log page past any array");
    let message = refused.to_string();
    assert!(
        message.contains("past the array's end") && message.contains(journal.as_str()),
        "the error names the journal and the page: {message}"
    );
}
