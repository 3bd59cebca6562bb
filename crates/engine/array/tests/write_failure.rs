//! A write that fails on a member a parity array cannot lose (issue 29,
//! item 2). A RAID 5 with one member missing (a RAID 6 with two) has no
//! member to spare: when a write then fails on another member, that member
//! stays and the request fails with EIO. The write may have reached the
//! parity and not the data (or the reverse), so the stripe no longer agrees
//! with itself, and a block rebuilt from it (the missing member's) would be
//! bytes nobody wrote. These tests attack exactly that, with a real failing
//! peer: the member is served by nbdkit behind its `error` filter, whose
//! writes fail while a trigger file exists.
//!
//! A ledger holds, for every 4 KiB block of the array, the contents it may
//! read back: the last acknowledged write's, plus those of later writes that
//! failed (a failed write may or may not have landed). Every read must give
//! one of them, or fail; a failure is allowed only in a stripe row a failed
//! write touched. That is checked with the fault on, after it is gone,
//! after the array is stopped and assembled again (the bad ranges are on
//! disk, in md's bad-block log), and after a new member is rebuilt in the
//! missing role (the rows with nothing true to rebuild are recorded bad on
//! it too). Every RAID 4/5/6 layout, with a bitmap, md's partial parity log
//! (RAID 5) and md's write journal, on both data paths.
//!
//! Needs nbdkit (`./test.sh` installs it).

mod common;

use common::Rng;
use nvraid_array::recovery;
use nvraid_array::{assemble, create, Array, AssembleOptions, BitmapChoice, CreateOptions};
use nvraid_array::{Error, FanoutTarget};
use nvraid_io::engine::EngineKind;
use nvraid_io::queue::{OpKind, Queue, Target};
use nvraid_layout::parity::ParityLayout;
use nvraid_layout::Level;
use nvraid_member::{Member, OpenOptions};
use nvraid_testing::nbdkit::Nbdkit;
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;

const BLOCK: u64 = 4096;
const CHUNK: u64 = 16 << 10;
const MEMBER_BYTES: u64 = 6 << 20;

/// nbdkit serving one file, its writes failing while `trigger` exists.
struct FailingPeer {
    server: Nbdkit,
    trigger: PathBuf,
}

impl FailingPeer {
    fn start(dir: &Path, file: &Path) -> FailingPeer {
        let trigger = dir.join("writes-fail");
        let server = Nbdkit::start(
            &dir.join("victim.sock"),
            [
                "--filter=error".to_string(),
                "file".to_string(),
                format!("file={}", file.display()),
                "error-pwrite=EIO".to_string(),
                "error-pwrite-rate=100%".to_string(),
                format!("error-pwrite-file={}", trigger.display()),
            ],
        );
        FailingPeer { server, trigger }
    }

    fn uri(&self) -> String {
        self.server.uri()
    }

    fn writes_fail(&self, on: bool) {
        if on {
            std::fs::write(&self.trigger, b"").unwrap();
        } else {
            let _ = std::fs::remove_file(&self.trigger);
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Policy {
    Bitmap,
    Ppl,
    Journal,
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum DataPath {
    Simple,
    Fast,
}

/// What each block may read back, and the stripe rows a failed write
/// touched (the only places a read may fail).
struct Ledger {
    allowed: Vec<Vec<u64>>,
    failed_rows: BTreeSet<u64>,
    row_bytes: u64,
}

impl Ledger {
    fn written(&mut self, offset: u64, len: u64, tag: u64, ok: bool) {
        for block in offset / BLOCK..(offset + len) / BLOCK {
            let allowed = &mut self.allowed[block as usize];
            if ok {
                allowed.clear();
            }
            allowed.push(tag);
        }
        if !ok {
            let rows = offset / self.row_bytes..=(offset + len - 1) / self.row_bytes;
            self.failed_rows.extend(rows);
        }
    }
}

/// A block's contents for write `tag`: the tag and the block number in its
/// first 16 bytes, a pattern of both after.
fn fill(tag: u64, block: u64, out: &mut [u8]) {
    out[..8].copy_from_slice(&tag.to_le_bytes());
    out[8..16].copy_from_slice(&block.to_le_bytes());
    for (i, b) in out[16..].iter_mut().enumerate() {
        *b = (tag.wrapping_mul(131) ^ block.wrapping_mul(7) ^ i as u64) as u8;
    }
}

/// The data paths, over one assembled array.
struct Client {
    array: Arc<Array>,
    queue: Option<Box<dyn Queue>>,
}

impl Client {
    fn new(array: Arc<Array>, path: DataPath) -> Client {
        let queue = (path == DataPath::Fast).then(|| {
            FanoutTarget::array(Arc::clone(&array), EngineKind::Psync)
                .open_queue(1, 256 << 10)
                .unwrap()
        });
        Client { array, queue }
    }

    /// The array alone again (its queue closed).
    fn into_array(self) -> Array {
        drop(self.queue);
        Arc::try_unwrap(self.array).unwrap_or_else(|_| panic!("the array is still shared"))
    }

    fn write(&mut self, offset: u64, data: &[u8]) -> bool {
        match &mut self.queue {
            None => self.array.write_at(data, offset, false).is_ok(),
            Some(queue) => {
                queue.buffer_mut(0)[..data.len()].copy_from_slice(data);
                queue
                    .submit(0, OpKind::Write, offset, data.len() as u32, false)
                    .unwrap();
                reap_one(queue).is_ok()
            }
        }
    }

    fn read(&mut self, offset: u64, out: &mut [u8]) -> bool {
        match &mut self.queue {
            None => match self.array.read_at(out, offset) {
                Ok(()) => true,
                Err(Error::Unreadable { .. } | Error::NotStartable(_) | Error::Io { .. }) => false,
                Err(e) => panic!("read at {offset}: {e}"),
            },
            Some(queue) => {
                queue
                    .submit(0, OpKind::Read, offset, out.len() as u32, false)
                    .unwrap();
                let ok = reap_one(queue).is_ok();
                out.copy_from_slice(&queue.buffer_mut(0)[..out.len()]);
                ok
            }
        }
    }
}

fn reap_one(queue: &mut Box<dyn Queue>) -> Result<u32, i32> {
    let mut result = None;
    while result.is_none() {
        queue.reap(1, &mut |c| result = Some(c.result)).unwrap();
    }
    result.unwrap()
}

/// Every block reads as the ledger allows, or fails inside a row a failed
/// write touched. Returns how many blocks failed.
fn verify(client: &mut Client, ledger: &Ledger, what: &str) -> usize {
    let mut got = vec![0u8; BLOCK as usize];
    let mut expect = vec![0u8; BLOCK as usize];
    let mut unreadable = 0;
    for (block, allowed) in ledger.allowed.iter().enumerate() {
        let block = block as u64;
        let offset = block * BLOCK;
        if !client.read(offset, &mut got) {
            assert!(
                ledger.failed_rows.contains(&(offset / ledger.row_bytes)),
                "{what}: block {block} (byte {offset}) fails to read, though no failed write touched its row"
            );
            unreadable += 1;
            continue;
        }
        let matches = allowed.iter().any(|&tag| {
            fill(tag, block, &mut expect);
            got == expect
        });
        assert!(
            matches,
            "{what}: block {block} (byte {offset}) read back bytes nobody wrote (first bytes {:02x?}; allowed writes {allowed:?})",
            &got[..16]
        );
    }
    unreadable
}

fn case(level: Level, members: usize, policy: Policy, path: DataPath, seed: u64) {
    let what = format!("{level} x{members} {policy:?} {path:?}");
    let dir = tempfile::tempdir().unwrap();
    let journal = usize::from(policy == Policy::Journal);
    let files: Vec<PathBuf> = (0..members + journal)
        .map(|i| dir.path().join(format!("m{i}")))
        .collect();
    let specs: Vec<String> = files.iter().map(|f| f.display().to_string()).collect();
    create(
        &specs,
        &CreateOptions {
            level,
            chunk_bytes: CHUNK,
            name: "bad-day".into(),
            size_bytes: Some(MEMBER_BYTES),
            force: false,
            direct: false,
            bitmap: match policy {
                Policy::Bitmap => BitmapChoice::Internal { chunk_bytes: None },
                Policy::Ppl => BitmapChoice::Ppl,
                Policy::Journal => BitmapChoice::Journal,
            },
        },
    )
    .unwrap_or_else(|e| panic!("{what}: create: {e}"))
    .close()
    .unwrap();
    // Role 2 is the member whose writes will fail; roles 1 (and 3 on
    // RAID 6) go missing first.
    let victim = 2;
    let missing: Vec<usize> = if level.parity_chunks() == 2 {
        vec![1, 3]
    } else {
        vec![1]
    };
    let peer = FailingPeer::start(dir.path(), &files[victim]);
    let mut specs = specs;
    specs[victim] = peer.uri();
    let options = AssembleOptions {
        writable: true,
        allow_degraded: true,
        ..Default::default()
    };
    let array = Arc::new(assemble(&specs, options).unwrap_or_else(|e| panic!("{what}: {e}")));
    let size = array.size_bytes();
    let row_bytes = CHUNK * (members as u64 - level.parity_chunks() as u64);
    let mut ledger = Ledger {
        allowed: vec![vec![0]; (size / BLOCK) as usize],
        failed_rows: BTreeSet::new(),
        row_bytes,
    };
    // Zeros are what a fresh array reads (tag 0 is not zeros: start from
    // a full write of every block).
    let mut client = Client::new(Arc::clone(&array), path);
    let mut data = vec![0u8; 256 << 10];
    let mut tag = 1;
    for offset in (0..size).step_by(data.len()) {
        let len = (data.len() as u64).min(size - offset);
        for (i, block) in data[..len as usize].chunks_mut(BLOCK as usize).enumerate() {
            fill(tag, offset / BLOCK + i as u64, block);
        }
        assert!(
            client.write(offset, &data[..len as usize]),
            "{what}: initial write"
        );
        ledger.written(offset, len, tag, true);
    }
    let eio = std::io::Error::from_raw_os_error(libc::EIO);
    for &role in &missing {
        array.fail_member(role, &eio).unwrap();
    }
    // The attack: writes fail on the victim; random writes of 1-12 blocks,
    // some into rows already hit.
    peer.writes_fail(true);
    let mut rng = Rng(seed | 1);
    let mut failed = 0;
    for _ in 0..48 {
        tag += 1;
        let blocks = 1 + rng.below(12);
        let offset = rng.below(size / BLOCK - blocks) * BLOCK;
        let len = blocks * BLOCK;
        for (i, block) in data[..len as usize].chunks_mut(BLOCK as usize).enumerate() {
            fill(tag, offset / BLOCK + i as u64, block);
        }
        let ok = client.write(offset, &data[..len as usize]);
        failed += usize::from(!ok);
        ledger.written(offset, len, tag, ok);
    }
    assert!(
        failed > 0,
        "{what}: no write failed: the attack did not happen"
    );
    assert!(
        !array.is_faulty(victim),
        "{what}: the victim holds the only copy of some data and stays"
    );
    let during = verify(&mut client, &ledger, &format!("{what}, fault on"));
    peer.writes_fail(false);
    let after = verify(&mut client, &ledger, &format!("{what}, fault gone"));
    assert!(
        during > 0 && after > 0,
        "{what}: no row was left unreadable"
    );
    drop(array);
    let array = client.into_array();
    array
        .close()
        .unwrap_or_else(|e| panic!("{what}: close: {e}"));

    // Stopped and assembled again: the bad ranges come back from disk.
    let array = assemble(&specs, options).unwrap_or_else(|e| panic!("{what}: {e}"));
    // The log is md's: mdadm lists the same sectors nvraid assembled.
    for (role, file) in files.iter().enumerate().take(members) {
        let ours: u64 = array.slot(role).map_or(0, |s| {
            s.read_limit
                .bad_ranges()
                .iter()
                .map(|(a, b)| (b - a) / 512)
                .sum()
        });
        assert_eq!(
            mdadm_bad_sectors(file),
            ours,
            "{what}: role {role}: mdadm --examine-badblocks disagrees"
        );
    }
    let mut client = Client::new(Arc::new(array), path);
    verify(&mut client, &ledger, &format!("{what}, assembled again"));
    let array = client.into_array();

    // A new member in each missing role, rebuilt: what can be rebuilt is,
    // the rest is recorded bad on it as well.
    let mut array = array;
    for &role in &missing {
        if array.slot(role).is_some() {
            array.remove_member(role).unwrap();
        }
        let path = dir.path().join(format!("new{role}"));
        let new = Member::open(
            &path.display().to_string(),
            OpenOptions {
                write: true,
                create_bytes: Some(MEMBER_BYTES),
                ..Default::default()
            },
        )
        .unwrap();
        let (next, _) =
            recovery::add_member(array, new).unwrap_or_else(|e| panic!("{what}: add: {e}"));
        array = next;
        specs[role] = path.display().to_string();
    }
    recovery::rebuild(&array, None, &mut |_| {}).unwrap_or_else(|e| panic!("{what}: rebuild: {e}"));
    assert!(!array.is_degraded(), "{what}: rebuilt");
    let mut client = Client::new(Arc::new(array), path);
    verify(&mut client, &ledger, &format!("{what}, rebuilt"));
    let array = client.into_array();
    array.close().unwrap();
    let array = assemble(&specs, options).unwrap_or_else(|e| panic!("{what}: {e}"));
    let mut client = Client::new(Arc::new(array), path);
    verify(
        &mut client,
        &ledger,
        &format!("{what}, rebuilt and assembled again"),
    );
}

/// The sectors mdadm's `--examine-badblocks` lists for a member.
fn mdadm_bad_sectors(file: &Path) -> u64 {
    let out = Command::new("mdadm")
        .arg("--examine-badblocks")
        .arg(file)
        .output()
        .expect("mdadm is installed (./test.sh installs it)");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "mdadm --examine-badblocks {}: {text}",
        file.display()
    );
    text.lines()
        .filter_map(|line| {
            let words: Vec<&str> = line.split_whitespace().collect();
            match words[..] {
                [_, "for", n, "sectors"] => n.parse::<u64>().ok(),
                _ => None,
            }
        })
        .sum()
}

fn cases() -> Vec<(Level, usize, Policy)> {
    let raid5 = [
        ParityLayout::LeftAsymmetric,
        ParityLayout::RightAsymmetric,
        ParityLayout::LeftSymmetric,
        ParityLayout::RightSymmetric,
        ParityLayout::ParityFirst,
        ParityLayout::ParityLast,
    ];
    let mut out = Vec::new();
    for (i, layout) in raid5.into_iter().enumerate() {
        let level = Level::Raid5 { layout };
        out.push((level, 4, Policy::Bitmap));
        // md's PPL and journal on some layouts each (every layout shares
        // the same write path; the policies differ in what they log).
        if i % 2 == 0 {
            out.push((level, 4, Policy::Ppl));
        } else {
            out.push((level, 4, Policy::Journal));
        }
    }
    for layout in [
        ParityLayout::LeftSymmetric,
        ParityLayout::RightAsymmetric,
        ParityLayout::ParityFirst,
    ] {
        out.push((Level::Raid6 { layout }, 5, Policy::Bitmap));
    }
    out.push((
        Level::Raid6 {
            layout: ParityLayout::LeftAsymmetric,
        },
        5,
        Policy::Journal,
    ));
    out
}

#[test]
fn a_failed_write_on_the_last_copy_never_returns_bytes_nobody_wrote_simple_path() {
    for (i, (level, members, policy)) in cases().into_iter().enumerate() {
        case(level, members, policy, DataPath::Simple, 1000 + i as u64);
    }
}

#[test]
fn a_failed_write_on_the_last_copy_never_returns_bytes_nobody_wrote_fast_path() {
    for (i, (level, members, policy)) in cases().into_iter().enumerate() {
        case(level, members, policy, DataPath::Fast, 2000 + i as u64);
    }
}
