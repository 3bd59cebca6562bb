//! The pages a write cache holds in the log, as a table by row (a page's
//! sector on the members), and what it does to the array's own rounds: a
//! round writing a cached page back does not log it again, logs a row's
//! parity only where it covers every copy the cache holds in the row, and
//! logs the lost members' pages it rebuilt unless the cache holds newer
//! ones (see [`MdJournal::enqueue`]).
//!
//! Not here: the cache's calls that fill and release the table
//! (`cache.rs`), the queueing and writing of rounds (`commit.rs`).

#[cfg(doc)]
use super::MdJournal;
use super::Writer;
use crate::members::Members;
use nvraid_metadata::r5log::{Payload, PAGE_BYTES};

/// A page's row (its sector on the members) and member.
pub(super) type Row = (u64, u32);

/// Per row (a page's sector on the members), the copies a cache holds
/// there: member, checksum and group.
pub(super) type HeldRows = std::collections::HashMap<u64, Copies, RowHash>;

/// A page's row on the members and its member (array byte `offset`).
pub(super) fn row_of(array: &Members, offset: u64) -> Row {
    let at = array.geometry().locate(offset, 0);
    (at.member_offset / 512, at.member)
}

/// A round's `payloads` and `pages` as logged (see [`MdJournal::enqueue`]):
/// trimmed for a write cache's copies in the log (`held`), with the lost
/// members' pages the round rebuilt (`rebuilt`) before its parity; and the
/// newest cache group whose copies the round left out (it must wait until
/// that group is durable).
pub(super) fn trim_for_cache(
    array: &Members,
    held: Held<'_>,
    payloads: Vec<Payload>,
    pages: Vec<u8>,
    rebuilt: (Vec<Payload>, Vec<u8>),
) -> (Vec<Payload>, Vec<u8>, u64) {
    let (rebuilt, rebuilt_pages) = rebuilt;
    if held.rows.is_empty() && rebuilt.is_empty() {
        return (payloads, pages, 0);
    }
    // The (row, member) pages this round writes (a round is a few pages:
    // a list is cheaper than a map).
    let mut written: Vec<Row> = Vec::with_capacity(payloads.len());
    let mut logged = Vec::with_capacity(payloads.len());
    let mut waits = 0;
    for payload in &payloads {
        let mut already = false;
        if let Payload::Data {
            location, checksum, ..
        } = payload
        {
            let (row, member) = row_of(array, location * 512);
            if let Some(&(_, _, group)) = held.newest(row, member).filter(|c| c.1 == *checksum) {
                already = true;
                waits = waits.max(group);
            }
            written.push((row, member));
        }
        logged.push(already);
    }
    // A row's parity is logged wherever it covers every copy the cache
    // holds in the row (as md does). Left out, every row written back
    // would be data-only at a replay, and the kernel's replay loads every
    // data-only row into md's stripe cache at once: in a CI run that
    // left them out, mdadm hung in the kernel assembling a cache-killed
    // array (md itself never logs more data-only stripes than its stripe
    // cache holds).
    let parity_logged = |row: u64| {
        written.iter().any(|w| w.0 == row)
            && held.rows.get(&row).is_none_or(|copies| {
                copies
                    .live(held.released)
                    .all(|c| written.contains(&(row, c.0)))
            })
    };
    let mut kept = Vec::with_capacity(payloads.len() + rebuilt.len());
    let mut kept_pages = Vec::with_capacity(pages.len() + rebuilt_pages.len());
    // The rebuilt pages go after the data and before the first parity
    // page: a data page after its row's parity would begin a new stripe.
    let mut rebuilt = Some((rebuilt, rebuilt_pages));
    let mut at = 0usize;
    for (payload, already) in payloads.into_iter().zip(logged) {
        let n = payload.pages() * PAGE_BYTES;
        if matches!(payload, Payload::Parity { .. }) {
            keep_rebuilt(array, held, &mut rebuilt, &mut kept, &mut kept_pages);
        }
        let drop = already
            || matches!(&payload, Payload::Parity { location, .. } if !parity_logged(*location));
        if !drop {
            kept_pages.extend_from_slice(&pages[at..at + n]);
            kept.push(payload);
        }
        at += n;
    }
    keep_rebuilt(array, held, &mut rebuilt, &mut kept, &mut kept_pages);
    (kept, kept_pages, waits)
}

/// Appends the lost members' pages a round rebuilt (taken from `rebuilt`,
/// once), but for those where a write cache holds a newer version (its
/// checksum differs: the member lacks it, and the log has it after the
/// row's last parity).
fn keep_rebuilt(
    array: &Members,
    held: Held<'_>,
    rebuilt: &mut Option<(Vec<Payload>, Vec<u8>)>,
    kept: &mut Vec<Payload>,
    kept_pages: &mut Vec<u8>,
) {
    let Some((rebuilt, rebuilt_pages)) = rebuilt.take() else {
        return;
    };
    for (i, payload) in rebuilt.into_iter().enumerate() {
        let Payload::Data {
            location, checksum, ..
        } = &payload
        else {
            continue;
        };
        let (row, member) = row_of(array, location * 512);
        let newer = held.newest(row, member).is_some_and(|c| c.1 != *checksum);
        if !newer {
            kept.push(payload);
            kept_pages.extend_from_slice(&rebuilt_pages[i * PAGE_BYTES..(i + 1) * PAGE_BYTES]);
        }
    }
}

/// Files the copies listed in `w.unfiled` into `w.held_rows` (those of
/// groups released already are dropped).
pub(super) fn file_copies(array: &Members, w: &mut Writer) {
    let released = w.released;
    for (offset, checksum, id) in w.unfiled.drain(..) {
        if id <= released {
            continue;
        }
        let (row, member) = row_of(array, offset);
        let copy = (member, checksum, id);
        match w.held_rows.entry(row) {
            std::collections::hash_map::Entry::Occupied(mut e) => e.get_mut().add(copy, released),
            std::collections::hash_map::Entry::Vacant(e) => {
                e.insert(Copies::new(copy));
            }
        }
    }
}

/// What a write cache holds in the log: the row table, read with the log's
/// `released` (copies of groups up to it are no longer held, see
/// [`Copies`]).
#[derive(Clone, Copy)]
pub(super) struct Held<'a> {
    pub(super) rows: &'a HeldRows,
    pub(super) released: u64,
}

impl<'a> Held<'a> {
    /// The newest copy the cache holds of `member`'s page in `row`.
    fn newest(self, row: u64, member: u32) -> Option<&'a (u32, u32, u64)> {
        self.rows
            .get(&row)?
            .live(self.released)
            .rev()
            .find(|c| c.0 == member)
    }
}

/// The copies a write cache logged in one row, oldest first: member,
/// checksum and group. Most rows hold one, kept without an allocation.
///
/// A copy whose group is released (the group is at most the log's
/// `released`) is no longer held. It is not removed at the release, which
/// would cost a lookup per page released: it is left out when the row is
/// looked at, dropped when the row gets a new copy, and swept out with the
/// others once they are a fifth of the table ([`MdJournal::release_through`]).
///
/// Kept small (32 bytes, 40 with its key in the table: a row's other copies
/// behind one pointer): the table is probed at random once per page cached
/// and once per page written back, and its size decides how many of those
/// probes miss the processor's caches.
#[derive(Debug)]
pub(super) struct Copies {
    first: (u32, u32, u64),
    more: Option<Box<[(u32, u32, u64)]>>,
}

impl Copies {
    fn new(first: (u32, u32, u64)) -> Copies {
        Copies { first, more: None }
    }

    fn more(&self) -> &[(u32, u32, u64)] {
        self.more.as_deref().unwrap_or(&[])
    }

    fn iter(&self) -> impl DoubleEndedIterator<Item = &(u32, u32, u64)> {
        std::iter::once(&self.first).chain(self.more().iter())
    }

    /// The copies still held when groups up to `released` are released.
    fn live(&self, released: u64) -> impl DoubleEndedIterator<Item = &(u32, u32, u64)> {
        self.iter().filter(move |c| c.2 > released)
    }

    /// Drops the copies released; true when none is left.
    pub(super) fn purge(&mut self, released: u64) -> bool {
        // Groups are released oldest first: released copies lead the list.
        let dead = self.iter().take_while(|c| c.2 <= released).count();
        if dead == 0 {
            return false;
        }
        if dead > self.more().len() {
            return true;
        }
        let Some(more) = self.more.take() else {
            panic!("invariant: the copies past the first are in `more`");
        };
        self.first = more[dead - 1];
        if dead < more.len() {
            self.more = Some(more[dead..].into());
        }
        false
    }

    /// Adds a newer copy, dropping those released.
    fn add(&mut self, copy: (u32, u32, u64), released: u64) {
        if self.purge(released) {
            self.first = copy;
            self.more = None;
        } else {
            // (Rare: a row with copies of more than one page.)
            let mut more = self.more.take().map(Vec::from).unwrap_or_default();
            more.push(copy);
            self.more = Some(more.into_boxed_slice());
        }
    }
}

/// Hashes a row (a member sector) for [`HeldRows`]: a mix of every bit
/// (splitmix64's finalizer) under a per-journal random key, much cheaper
/// than the default hasher on the write path, and not predictable by a
/// client choosing where to write.
#[derive(Clone, Debug, Default)]
pub(super) struct RowHash(pub(super) u64);

impl std::hash::BuildHasher for RowHash {
    type Hasher = RowHasher;
    fn build_hasher(&self) -> RowHasher {
        RowHasher(self.0)
    }
}

pub(super) struct RowHasher(u64);

impl std::hash::Hasher for RowHasher {
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0 ^ u64::from(b)).wrapping_mul(0x100_0000_01b3);
        }
    }
    fn write_u64(&mut self, x: u64) {
        self.0 ^= x;
    }
    fn finish(&self) -> u64 {
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A write-back's round is trimmed against the copies a cache holds,
    /// and a copy whose group is released counts as not held: the page is
    /// logged again (the tail may have passed its copy), and the row's
    /// parity is logged although the released page is not in the round.
    #[test]
    fn a_released_copy_neither_stands_for_the_page_nor_holds_parity_back() {
        let dir = tempfile::tempdir().unwrap();
        let specs: Vec<String> = (0..5)
            .map(|i| dir.path().join(format!("m{i}")).display().to_string())
            .collect();
        let options = crate::CreateOptions {
            level: nvraid_layout::Level::Raid5 {
                layout: nvraid_layout::parity::ParityLayout::LeftSymmetric,
            },
            chunk_bytes: 64 << 10,
            name: "trim".into(),
            size_bytes: Some(16 << 20),
            force: false,
            direct: false,
            bitmap: crate::BitmapChoice::Journal,
        };
        let array = crate::create(&specs, &options).unwrap();
        // Page 0 of data chunks 0 (x) and 1 (y): one row, two members.
        let ((row, x), (_, y)) = (row_of(&array, 0), row_of(&array, 64 << 10));
        let round = |checksum_x| {
            let payloads = vec![
                Payload::Data {
                    flags: 0,
                    location: 0,
                    checksum: checksum_x,
                },
                Payload::Parity {
                    flags: 0,
                    location: row,
                    checksums: vec![9],
                },
            ];
            (payloads, vec![0u8; 2 * PAGE_BYTES])
        };
        let mut held = HeldRows::with_hasher(RowHash(1));
        // The cache holds x (checksum 5, group 3) and y (group 4).
        held.insert(
            row,
            Copies {
                first: (x, 5, 3),
                more: Some(vec![(y, 6, 4)].into()),
            },
        );
        let view = |released| Held {
            rows: &held,
            released,
        };
        let kinds = |kept: &[Payload]| {
            kept.iter()
                .map(|p| matches!(p, Payload::Parity { .. }))
                .collect::<Vec<_>>()
        };
        // Nothing released: x's page is in the log already (the round
        // waits for group 3), and y, held and not in the round, keeps the
        // parity out.
        let (payloads, pages) = round(5);
        let (kept, _, waits) = trim_for_cache(&array, view(0), payloads, pages, (vec![], vec![]));
        assert_eq!((kinds(&kept), waits), (vec![], 3));
        // Group 3 released (groups are released oldest first): x's copy
        // no longer stands for the page, which is logged again; y still
        // holds the parity back.
        let (payloads, pages) = round(5);
        let (kept, _, waits) = trim_for_cache(&array, view(3), payloads, pages, (vec![], vec![]));
        assert_eq!((kinds(&kept), waits), (vec![false], 0));
        // Group 4 released too: nothing is held, page and parity are logged.
        let (payloads, pages) = round(5);
        let (kept, _, waits) = trim_for_cache(&array, view(4), payloads, pages, (vec![], vec![]));
        assert_eq!((kinds(&kept), waits), (vec![false, true], 0));
        array.close().unwrap();
    }

    /// A row's copies come back oldest first; those of released groups are
    /// left out of `live`, dropped by `purge` (which says when none is
    /// left) and by `add`, which then keeps the rest in order.
    #[test]
    fn a_rows_released_copies_drop_out_in_order() {
        let mut copies = Copies {
            first: (0, 1, 1),
            more: Some(vec![(1, 2, 2), (0, 3, 3)].into()),
        };
        let all = |c: &Copies| c.iter().copied().collect::<Vec<_>>();
        let live = |c: &Copies, r| c.live(r).copied().collect::<Vec<_>>();
        assert_eq!(all(&copies), [(0, 1, 1), (1, 2, 2), (0, 3, 3)]);
        assert_eq!(live(&copies, 0), all(&copies));
        assert_eq!(live(&copies, 2), [(0, 3, 3)]);
        assert_eq!(copies.live(1).next_back(), Some(&(0, 3, 3)));
        assert!(!copies.purge(0), "nothing released: nothing changes");
        assert_eq!(all(&copies), [(0, 1, 1), (1, 2, 2), (0, 3, 3)]);
        assert!(!copies.purge(1));
        assert_eq!(all(&copies), [(1, 2, 2), (0, 3, 3)]);
        copies.add((2, 4, 5), 2);
        assert_eq!(all(&copies), [(0, 3, 3), (2, 4, 5)]);
        assert!(copies.purge(5), "every copy released");
        copies.add((1, 6, 7), 5);
        assert_eq!(all(&copies), [(1, 6, 7)], "a new copy over released ones");
        assert_eq!(live(&copies, 7), []);
    }
}
