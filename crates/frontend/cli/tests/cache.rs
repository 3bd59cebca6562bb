//! `serve --cache`: kill -9 at random points while clients write, then
//! serve again (replaying the journal) and check every write the server
//! acknowledged, block by block. (fio's verify state cannot do this over
//! its NBD engine: the engine spins on a connection whose server died, in
//! about one run of three, and its saved state counts writes that were in
//! flight. So the clients here are the test's own, on nvraid's NBD
//! client.) `none` and `journal` must keep them all;
//! `writeback` must keep everything a FLUSH covered. Plus the refusals of
//! bad journal members, each leaving every member's bytes as they were.

mod common;

use common::*;
use nvraid_remote::{RemoteExport, RemoteOptions};
use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

const BLOCK: usize = 4096;
/// Blocks each writer owns (its own region, so each has at most one write
/// in flight when the server dies).
const REGION_BLOCKS: u64 = 1024;
const WRITERS: u64 = 4;

/// Block `index` as written by write `seed`: its 8-byte words are
/// `seed ^ index` (a torn or misplaced block cannot pass for another).
fn block_data(seed: u64, index: u64) -> Vec<u8> {
    (seed ^ index)
        .to_le_bytes()
        .iter()
        .copied()
        .cycle()
        .take(BLOCK)
        .collect()
}

/// What the writers know: the seed of the last acknowledged write of each
/// block (absent: never written), and the write in flight of each writer.
#[derive(Default)]
struct Ledger {
    acked: HashMap<u64, u64>,
    /// Per writer: the writes since its last acknowledgment (one in
    /// flight; with FLUSHes, also those written but not yet flushed).
    in_flight: HashMap<u64, Vec<(u64, u64, u64)>>,
    acknowledged: u64,
}

fn uri(dir: &Path) -> String {
    format!("nbd+unix:///?socket={}", dir.join("md.sock").display())
}

fn connect(dir: &Path) -> RemoteExport {
    let options = RemoteOptions {
        request_timeout: Duration::from_secs(5),
        connect_timeout: Duration::from_secs(5),
    };
    RemoteExport::open(&uri(dir), true, false, options).unwrap()
}

/// A writer: random writes of 1-16 blocks in its region until one fails
/// (the server died); with `flush_every`, a FLUSH after that many writes,
/// and only what a FLUSH covered is recorded as acknowledged.
fn writer(dir: &Path, id: u64, ledger: Arc<Mutex<Ledger>>, flush_every: Option<u64>) {
    let export = connect(dir);
    let mut rng = id.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    let mut next = || {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng
    };
    let mut unflushed: Vec<(u64, u64, u64)> = Vec::new();
    for n in 1u64.. {
        let count = 1 + next() % 16;
        let first = id * REGION_BLOCKS + next() % (REGION_BLOCKS - count);
        let seed = (id << 40) | (std::process::id() as u64) << 20 | n;
        let data: Vec<u8> = (first..first + count)
            .flat_map(|b| block_data(seed, b))
            .collect();
        ledger
            .lock()
            .unwrap()
            .in_flight
            .entry(id)
            .or_default()
            .push((first, count, seed));
        if export.write_at(&data, first * BLOCK as u64).is_err() {
            return;
        }
        let mut done = vec![(first, count, seed)];
        if let Some(every) = flush_every {
            unflushed.push((first, count, seed));
            if n % every != 0 {
                continue;
            }
            if export.flush().is_err() {
                return;
            }
            done = std::mem::take(&mut unflushed);
        }
        let mut ledger = ledger.lock().unwrap();
        for (first, count, seed) in done {
            for block in first..first + count {
                ledger.acked.insert(block, seed);
            }
            ledger.acknowledged += 1;
        }
        ledger.in_flight.remove(&id);
    }
}

/// Checks every block of the writers' regions against the ledger: the last
/// acknowledged write, or (for a block that a write in flight or not yet
/// flushed covered) anything that write or an earlier one could leave.
/// Returns the blocks checked strictly.
fn verify(dir: &Path, ledger: &Ledger, strict_only: bool) -> usize {
    let export = connect(dir);
    let mut strict = 0;
    let mut data = vec![0u8; (REGION_BLOCKS as usize) * BLOCK];
    for id in 0..WRITERS {
        export
            .read_at(&mut data, id * REGION_BLOCKS * BLOCK as u64)
            .unwrap();
        let loose = ledger.in_flight.get(&id).cloned().unwrap_or_default();
        for i in 0..REGION_BLOCKS {
            let block = id * REGION_BLOCKS + i;
            let got = &data[i as usize * BLOCK..(i as usize + 1) * BLOCK];
            let expected = match ledger.acked.get(&block) {
                Some(&seed) => block_data(seed, block),
                None => vec![0u8; BLOCK],
            };
            if got == expected {
                strict += 1;
                continue;
            }
            if strict_only {
                panic!("block {block}: the acknowledged write is missing");
            }
            let from_in_flight = loose.iter().any(|&(first, count, seed)| {
                (first..first + count).contains(&block) && got == block_data(seed, block)
            });
            let word = |i: usize| u64::from_le_bytes(got[i * 8..i * 8 + 8].try_into().unwrap());
            let uniform = (0..BLOCK / 8).all(|i| word(i) == word(0));
            assert!(
                from_in_flight,
                "block {block}: holds neither its last acknowledged write (seed {:#x}) nor the \
                 write in flight; it holds {} (first word's seed {:#x})",
                ledger.acked.get(&block).copied().unwrap_or(0),
                if uniform {
                    "a whole block of some write"
                } else {
                    "mixed bytes"
                },
                word(0) ^ block
            );
        }
    }
    strict
}

/// Rounds of: serve with `extra`, writers, kill -9 after a random delay,
/// serve again, verify.
fn crash_rounds(level: &str, extra: &[&str], flush_every: Option<u64>, rounds: u32) {
    crash_rounds_on(level, &["--bitmap", "none"], extra, flush_every, rounds)
}

/// [`crash_rounds`] over an array created with `create_extra`; with
/// `--write-journal j` the journal member `j` is served with the others.
fn crash_rounds_on(
    level: &str,
    create_extra: &[&str],
    extra: &[&str],
    flush_every: Option<u64>,
    rounds: u32,
) {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let mut members: Vec<String> = (0..4).map(|i| format!("m{i}")).collect();
    let mut create = vec!["create", "--level", level, "--size", "32M"];
    create.extend_from_slice(create_extra);
    create.extend(members.iter().map(String::as_str));
    ok(&create, d);
    if create_extra.contains(&"--write-journal") {
        members.push("j".to_string());
    } else {
        std::fs::write(d.join("j"), vec![0u8; 24 << 20]).unwrap();
    }
    // md's journal: created with the array, or added by the first serve
    // (`--journal` on RAID 4/5/6).
    let md_log = create_extra.contains(&"--write-journal")
        || (["4", "5", "6"].contains(&level) && extra.contains(&"--journal"));
    let ledger = Arc::new(Mutex::new(Ledger::default()));
    let mut delays = 0x2545_f491_4f6c_dd1du64;
    for round in 0..rounds {
        let mut server = serve_with(d, &members, extra);
        let writers: Vec<_> = (0..WRITERS)
            .map(|id| {
                let (dir, ledger) = (d.to_path_buf(), ledger.clone());
                std::thread::spawn(move || writer(&dir, id, ledger, flush_every))
            })
            .collect();
        delays ^= delays << 13;
        delays ^= delays >> 7;
        delays ^= delays << 17;
        std::thread::sleep(Duration::from_millis(150 + delays % 600));
        server.kill().unwrap();
        server.wait().unwrap();
        for w in writers {
            w.join().unwrap();
        }
        let mut server = serve_with(d, &members, extra);
        let log = std::fs::read_to_string(d.join("serve.log")).unwrap();
        if md_log && extra.contains(&"--cache") {
            assert!(log.contains("on md's write journal"), "{log}");
        }
        {
            let mut ledger = ledger.lock().unwrap();
            assert!(
                ledger.acknowledged > 0,
                "round {round}: no write was acknowledged"
            );
            let strict = verify(d, &ledger, false);
            eprintln!(
                "round {round}: {} writes acknowledged so far, {strict} blocks as acknowledged; {}",
                ledger.acknowledged,
                log.lines()
                    .find(|l| l.contains("replayed"))
                    .unwrap_or("nothing replayed")
            );
            // What the checked state now is, for the next round.
            let unsure: Vec<(u64, u64, u64)> =
                ledger.in_flight.drain().flat_map(|(_, w)| w).collect();
            for (first, count, seed) in unsure {
                let export = connect(d);
                let mut data = vec![0u8; count as usize * BLOCK];
                export.read_at(&mut data, first * BLOCK as u64).unwrap();
                for (i, block) in (first..first + count).enumerate() {
                    if data[i * BLOCK..(i + 1) * BLOCK] == block_data(seed, block)[..] {
                        ledger.acked.insert(block, seed);
                    }
                }
            }
        }
        server.kill().unwrap();
        server.wait().unwrap();
        if md_log {
            // md's journal closes the write hole: after its replay every
            // stripe's parity matches its data, whatever the kill cut.
            let mut with_journal = members.clone();
            if !with_journal.iter().any(|m| m == "j") {
                with_journal.push("j".to_string());
            }
            assert_checks_clean(
                d,
                &with_journal,
                &format!("round {round}: parity differs from data after the replay"),
            );
        }
    }
}

/// RAID 5 with `--journal j`: the first serve adds `j` to the array as
/// md's write journal, and every round logs there in md's format.
#[test]
fn journal_keeps_every_acknowledged_write_through_kill_9() {
    crash_rounds("5", &["--cache", "journal", "--journal", "j"], None, 4);
}

/// RAID 10 with `--journal j`: nvraid's own journal format (md journals
/// RAID 4/5/6 only).
#[test]
fn nvraid_journal_keeps_every_acknowledged_write_on_raid10_through_kill_9() {
    crash_rounds("10", &["--cache", "journal", "--journal", "j"], None, 3);
}

/// The same with md's write journal (RAID 5 created with
/// `--write-journal`): the cache's writes are acknowledged once durable in
/// it as data-only units (md's write-back mode), and the assembly after the
/// kill replays them.
#[test]
fn md_journal_cache_keeps_every_acknowledged_write_through_kill_9() {
    crash_rounds_on(
        "5",
        &["--write-journal", "j"],
        &["--cache", "journal"],
        None,
        4,
    );
}

/// The bad day on md's journal under the cache: a member fails while
/// clients write (the cache goes on over the degraded array), then the
/// server is killed. The next assembly replays the log without that
/// member, and every acknowledged block reads back, those of the failed
/// member rebuilt from the others and parity.
#[test]
fn md_journal_cache_keeps_every_acknowledged_write_when_a_member_fails_then_the_server_dies() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let mut members: Vec<String> = (0..4).map(|i| format!("m{i}")).collect();
    let mut create = vec!["create", "--level", "5", "--size", "32M"];
    create.extend(["--write-journal", "j"]);
    create.extend(members.iter().map(String::as_str));
    ok(&create, d);
    members.push("j".to_string());
    let ledger = Arc::new(Mutex::new(Ledger::default()));
    let mut server = serve_with(d, &members, &["--cache", "journal"]);
    let writers: Vec<_> = (0..WRITERS)
        .map(|id| {
            let (dir, ledger) = (d.to_path_buf(), ledger.clone());
            std::thread::spawn(move || writer(&dir, id, ledger, None))
        })
        .collect();
    std::thread::sleep(Duration::from_millis(300));
    let control = d.join("md.ctl");
    ok(
        &[
            "fail",
            "--socket",
            control.to_str().unwrap(),
            "--member",
            "m2",
        ],
        d,
    );
    let before = ledger.lock().unwrap().acknowledged;
    std::thread::sleep(Duration::from_millis(400));
    server.kill().unwrap();
    server.wait().unwrap();
    for w in writers {
        w.join().unwrap();
    }
    let ledger = ledger.lock().unwrap();
    assert!(
        ledger.acknowledged > before,
        "no write was acknowledged after the failure ({before} before)"
    );
    // Degraded now: served without the cache (refused there); the
    // assembly replays md's journal all the same.
    let mut server = serve_with(d, &members, &[]);
    let log = std::fs::read_to_string(d.join("serve.log")).unwrap();
    assert!(log.contains("replayed"), "{log}");
    let strict = verify(d, &ledger, false);
    eprintln!(
        "{} writes acknowledged ({before} before the failure), {strict} blocks as acknowledged",
        ledger.acknowledged
    );
    server.kill().unwrap();
    server.wait().unwrap();
}

/// md's write journal with no cache (md's write-through mode): each
/// round's data and parity are logged before the members are written.
#[test]
fn md_journal_keeps_every_acknowledged_write_through_kill_9() {
    crash_rounds_on("5", &["--write-journal", "j"], &[], None, 3);
}

#[test]
fn no_cache_keeps_every_acknowledged_write_through_kill_9() {
    crash_rounds("10", &[], None, 3);
}

#[test]
fn writeback_keeps_every_flushed_write_through_kill_9() {
    crash_rounds("0", &["--cache", "writeback"], Some(8), 3);
}

fn array_of_three(d: &Path) -> Vec<String> {
    let members: Vec<String> = (0..3).map(|i| format!("m{i}")).collect();
    let mut create = vec!["create", "--level", "1", "--size", "32M"];
    create.extend(members.iter().map(String::as_str));
    ok(&create, d);
    members
}

fn serve_args<'a>(members: &'a [String], extra: &[&'a str]) -> Vec<&'a str> {
    let mut args = vec!["serve", "--listen", "unix:md.sock"];
    args.extend_from_slice(extra);
    args.extend(members.iter().map(String::as_str));
    args
}

#[test]
fn bad_journal_members_are_refused_and_nothing_changes() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let members = array_of_three(d);
    std::fs::write(d.join("small"), vec![0u8; 1 << 20]).unwrap();
    std::fs::write(d.join("fs"), vec![0u8; 24 << 20]).unwrap();
    let mkfs = std::process::Command::new("mkfs.ext4")
        .args(["-q", "-F"])
        .arg(d.join("fs"))
        .status()
        .unwrap();
    assert!(mkfs.success());
    // `refused` checks that no byte of any file in the directory changed.
    let cases: [(&[&str], &[&str]); 6] = [
        (
            &["--cache", "journal", "--journal", "small"],
            &["small", "too small", "16777216"],
        ),
        (
            &["--cache", "journal", "--journal", "m1"],
            &["m1", "a member of the array"],
        ),
        (
            &["--cache", "journal", "--journal", "fs"],
            &["fs", "filesystem", "--force"],
        ),
        (
            &["--cache", "journal", "--journal", "missing"],
            &["missing"],
        ),
        (&["--cache", "journal"], &["--journal"]),
        (&["--journal", "fs"], &["--cache journal"]),
    ];
    for (extra, needles) in cases {
        refused(&serve_args(&members, extra), d, needles);
    }
    refused(
        &serve_args(&members, &["--cache", "writeback", "--read-only"]),
        d,
        &["--cache writeback", "read-only"],
    );
    refused(
        &serve_args(
            &members,
            &["--cache", "writeback", "--cache-dirty-max", "64k"],
        ),
        d,
        &["--cache-dirty-max 65536", "at least 1 MiB"],
    );
}

/// md's write-back journal on a degraded array is refused before anything
/// is written (a replay could not compute a logged row's parity without the
/// missing member); the same array is served without the cache.
#[test]
fn md_journal_cache_on_a_degraded_array_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    ok(
        &[
            "create",
            "--level",
            "5",
            "--size",
            "32M",
            "--write-journal",
            "j",
            "m0",
            "m1",
            "m2",
            "m3",
        ],
        d,
    );
    let present: Vec<String> = ["m0", "m1", "m3", "j"].map(String::from).to_vec();
    refused(
        &serve_args(&present, &["--cache", "journal"]),
        d,
        &["--cache journal", "degraded"],
    );
    let mut server = serve_with(d, &present, &[]);
    let export = connect(d);
    export
        .write_at(&block_data(7, 3), 3 * BLOCK as u64)
        .unwrap();
    drop(export);
    nix_term(&mut server);
}

#[test]
fn a_journal_of_another_array_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let members = array_of_three(d);
    std::fs::write(d.join("j"), vec![0u8; 24 << 20]).unwrap();
    // The journal is formatted for this array, which then shuts down.
    let mut server = serve_with(d, &members, &["--cache", "journal", "--journal", "j"]);
    nix_term(&mut server);
    let other: Vec<String> = (0..2).map(|i| format!("o{i}")).collect();
    ok(&["create", "--level", "1", "--size", "32M", "o0", "o1"], d);
    refused(
        &serve_args(&other, &["--cache", "journal", "--journal", "j"]),
        d,
        &["j", "another array"],
    );
}

/// SIGTERM, and wait for the orderly stop.
/// An nbdkit memory export of `size` on `journal.sock` in `d` whose writes
/// fail with EIO once the returned trigger file exists (its error filter):
/// the process, the export's URI and the trigger.
fn failing_export(d: &Path, size: &str) -> (std::process::Child, String, std::path::PathBuf) {
    let socket = d.join("journal.sock");
    let trigger = d.join("journal-fails");
    let nbdkit = std::process::Command::new("nbdkit")
        .arg("-f")
        .arg("-U")
        .arg(&socket)
        .args([
            "--filter=error",
            "memory",
            size,
            "error-pwrite-rate=100%",
            "error-pwrite=EIO",
        ])
        .arg(format!("error-pwrite-file={}", trigger.display()))
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("nbdkit (./test.sh installs it)");
    for _ in 0..400 {
        if socket.exists() {
            break;
        }
        std::thread::sleep(Duration::from_millis(25));
    }
    (
        nbdkit,
        format!("nbd+unix:///?socket={}", socket.display()),
        trigger,
    )
}

fn nix_term(server: &mut std::process::Child) {
    let status = std::process::Command::new("kill")
        .args(["-TERM", &server.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    let exit = server.wait().unwrap();
    assert!(exit.success(), "serve did not stop cleanly: {exit:?}");
}

/// The journal lives on an NBD export (nbdkit's memory plugin) whose
/// writes start failing on command (its error filter, armed by creating a
/// file): writes are refused from then on and the status says why, reads go
/// on, and every write acknowledged before is on the members after the
/// stop.
#[test]
fn a_journal_that_fails_stops_writes_and_loses_nothing_acknowledged() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let members = array_of_three(d);
    let (mut nbdkit, journal, trigger) = failing_export(d, "32M");
    let mut server = serve_with(d, &members, &["--cache", "journal", "--journal", &journal]);
    let export = connect(d);
    let mut acknowledged = Vec::new();
    for i in 0..16u64 {
        let data: Vec<u8> = (0..16)
            .flat_map(|b| block_data(1000 + i, i * 16 + b))
            .collect();
        export.write_at(&data, i * 16 * BLOCK as u64).unwrap();
        acknowledged.push(data);
    }
    std::fs::write(&trigger, b"").unwrap();
    let refused = export.write_at(&vec![7u8; BLOCK], 1 << 20);
    assert!(
        refused.is_err(),
        "a write was acknowledged after the journal failed"
    );
    assert!(export.write_at(&vec![7u8; BLOCK], 2 << 20).is_err());
    let status = ok(&["status", "--socket", "md.ctl", "--json"], d);
    let status: serde_json::Value = serde_json::from_str(&status).unwrap();
    let failure = status["array"]["cache"]["failure"]
        .as_str()
        .unwrap_or_default();
    assert!(
        failure.contains("journal.sock"),
        "status does not say why: {status}"
    );
    // Reads go on and see every acknowledged write.
    let mut back = vec![0u8; 16 * 16 * BLOCK];
    export.read_at(&mut back, 0).unwrap();
    assert!(back == acknowledged.concat());
    drop(export);
    nix_term(&mut server);
    let _ = nbdkit.kill();
    let _ = nbdkit.wait();
    let log = std::fs::read_to_string(d.join("serve.log")).unwrap();
    assert!(log.contains("takes no more writes"), "{log}");
    // The journal is gone with nbdkit: the members alone hold the data.
    let mut read = vec!["read", "--length", "1M"];
    read.extend(members.iter().map(String::as_str));
    let on_members = ok_bytes(&read, d);
    assert!(
        on_members == acknowledged.concat(),
        "an acknowledged write is not on the members"
    );
}

/// md's write journal (RAID 5, `create --write-journal`) on an NBD export
/// whose writes start failing on command: writes are refused from then on
/// (md's rule: no write reaches the members unlogged), `status` names the
/// journal as faulty and why, reads go on, and every write acknowledged
/// before is on the members after an orderly stop.
#[test]
fn an_md_write_journal_that_fails_stops_writes_and_loses_nothing_acknowledged() {
    md_journal_fails(&[]);
}

/// The same under `--cache journal`: the cache's acknowledged writes were
/// only in the log and in RAM when the journal failed; the cache writes
/// them to the members without the log, and the array is recorded dirty.
#[test]
fn an_md_write_journal_that_fails_under_the_cache_loses_nothing_acknowledged() {
    md_journal_fails(&["--cache", "journal"]);
}

/// Write `rows` rows of 16 blocks (data from `seed`) and keep them as
/// acknowledged; then make the journal fail (`trigger`) and check that the
/// next write is refused. The rows acknowledged, in order.
fn acknowledge_then_fail_journal(
    export: &RemoteExport,
    trigger: &Path,
    rows: u64,
    seed: u64,
) -> Vec<Vec<u8>> {
    let mut acknowledged = Vec::new();
    for i in 0..rows {
        let data: Vec<u8> = (0..16)
            .flat_map(|b| block_data(seed + i, i * 16 + b))
            .collect();
        export.write_at(&data, i * 16 * BLOCK as u64).unwrap();
        acknowledged.push(data);
    }
    std::fs::write(trigger, b"").unwrap();
    assert!(
        export.write_at(&vec![7u8; BLOCK], 1 << 20).is_err(),
        "a write was acknowledged after the journal failed"
    );
    acknowledged
}

/// A RAID 5 of three 16 MiB members with md's journal on an nbdkit export
/// whose writes fail while `trigger` exists: the server, the trigger, the
/// data members, and every member (the journal last).
fn raid5_with_a_failing_journal(
    d: &Path,
) -> (
    std::process::Child,
    std::path::PathBuf,
    Vec<String>,
    Vec<String>,
) {
    let (nbdkit, journal, trigger) = failing_export(d, "16M");
    let data_members: Vec<String> = (0..3).map(|i| format!("m{i}")).collect();
    let mut create = vec![
        "create",
        "--level",
        "5",
        "--size",
        "16M",
        "--write-journal",
        &journal,
    ];
    create.extend(data_members.iter().map(String::as_str));
    ok(&create, d);
    let mut members = data_members.clone();
    members.push(journal);
    (nbdkit, trigger, data_members, members)
}

fn md_journal_fails(extra: &[&str]) {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let (mut nbdkit, trigger, data_members, members) = raid5_with_a_failing_journal(d);
    let mut server = serve_with(d, &members, extra);
    let export = connect(d);
    let acknowledged = acknowledge_then_fail_journal(&export, &trigger, 16, 1000);
    assert!(export.write_at(&vec![7u8; BLOCK], 2 << 20).is_err());
    let status = ok(&["status", "--socket", "md.ctl", "--json"], d);
    let status: serde_json::Value = serde_json::from_str(&status).unwrap();
    let text = status.to_string();
    assert!(
        text.contains("journal failed") && text.contains("journal.sock"),
        "status does not say why: {status}"
    );
    let mut back = vec![0u8; 16 * 16 * BLOCK];
    export.read_at(&mut back, 0).unwrap();
    assert!(back == acknowledged.concat());
    drop(export);
    nix_term(&mut server);
    let _ = nbdkit.kill();
    let _ = nbdkit.wait();
    let log = std::fs::read_to_string(d.join("serve.log")).unwrap();
    assert!(log.contains("refuses writes from now on"), "{log}");
    if !extra.is_empty() {
        assert!(
            log.contains("every acknowledged write is on the array"),
            "{log}"
        );
    }
    // The journal is gone with nbdkit: the members alone hold the data.
    let mut read = vec!["read", "--length", "1M"];
    read.extend(data_members.iter().map(String::as_str));
    let on_members = ok_bytes(&read, d);
    assert!(
        on_members == acknowledged.concat(),
        "an acknowledged write is not on the members"
    );
}

/// md's write journal fails under load and the server is killed (no orderly
/// stop): the members record the journal faulty (md's role 0xfffe), so a
/// writable `serve` is refused naming the failure and the way back, with
/// or without the old journal; `add-journal --journal NEW` (mdadm's
/// `--add-journal` for an array that lost its journal) gives the array a
/// new one, after which writable `serve` works and every write
/// acknowledged before the failure and after the new journal is there.
#[test]
fn a_failed_md_journal_is_recorded_faulty_and_add_journal_replaces_it() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let (mut nbdkit, trigger, data_members, members) = raid5_with_a_failing_journal(d);
    let mut server = serve(d, &members);
    let export = connect(d);
    let acknowledged = acknowledge_then_fail_journal(&export, &trigger, 8, 2000);
    drop(export);
    server.kill().unwrap();
    server.wait().unwrap();
    // The old journal works again, but its members recorded it faulty.
    std::fs::remove_file(&trigger).unwrap();
    let mut serve_args = vec!["serve", "--listen", "unix:md.sock"];
    serve_args.extend(members.iter().map(String::as_str));
    let why = refusal(&serve_args, d);
    assert!(
        why.contains("write journal failed") && why.contains("add-journal"),
        "{why}"
    );
    let _ = nbdkit.kill();
    let _ = nbdkit.wait();
    // Without the old journal: the same.
    let mut serve_args = vec!["serve", "--listen", "unix:md.sock"];
    serve_args.extend(data_members.iter().map(String::as_str));
    let why = refusal(&serve_args, d);
    assert!(why.contains("write journal failed"), "{why}");
    // mdadm's way back: a new journal.
    std::fs::write(d.join("j2"), vec![0u8; 16 << 20]).unwrap();
    let mut add = vec!["add-journal", "--journal", "j2"];
    add.extend(data_members.iter().map(String::as_str));
    ok(&add, d);
    let mut members = data_members.clone();
    members.push("j2".into());
    let mut server = serve(d, &members);
    let export = connect(d);
    let mut back = vec![0u8; 8 * 16 * BLOCK];
    export.read_at(&mut back, 0).unwrap();
    assert!(
        back == acknowledged.concat(),
        "an acknowledged write is lost"
    );
    let after: Vec<u8> = (0..16).flat_map(|b| block_data(3000, b)).collect();
    export.write_at(&after, 4 << 20).unwrap();
    drop(export);
    nix_term(&mut server);
    let log = std::fs::read_to_string(d.join("serve.log")).unwrap();
    assert!(!log.contains("refuses writes"), "{log}");
    let mut read = vec!["read", "--offset", "4194304", "--length", "65536"];
    read.extend(data_members.iter().map(String::as_str));
    assert!(
        ok_bytes(&read, d) == after,
        "the write after the new journal"
    );
    let mut detail = vec!["detail", "--json"];
    detail.extend(members.iter().map(String::as_str));
    let detail = ok(&detail, d);
    assert!(detail.contains("\"journal\""), "{detail}");
    // The kernel's md takes the array with its new journal (the old one's
    // slot faulty) and reads what nvraid reads.
    let mut read = vec!["read"];
    read.extend(data_members.iter().map(String::as_str));
    let ours = sha(&ok_bytes(&read, d));
    let images: Vec<std::path::PathBuf> = members.iter().map(|m| d.join(m)).collect();
    kernel_reads(&images, &[ours]);
}

/// `create --write-journal` over members that held other bytes asks for
/// md's initial resync; the first `serve` runs it and says so, not that
/// the array was shut down uncleanly (a journaled array never is recorded
/// dirty).
#[test]
fn the_first_serve_of_a_new_journaled_array_does_not_call_it_uncleanly_shut_down() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let mut members: Vec<String> = (0..3).map(|i| format!("m{i}")).collect();
    for m in &members {
        std::fs::write(d.join(m), vec![0x5au8; 16 << 20]).unwrap();
    }
    std::fs::write(d.join("j"), vec![0u8; 16 << 20]).unwrap();
    let mut create = vec!["create", "--level", "5", "--write-journal", "j"];
    create.extend(members.iter().map(String::as_str));
    ok(&create, d);
    members.push("j".into());
    let mut server = serve(d, &members);
    nix_term(&mut server);
    let log = std::fs::read_to_string(d.join("serve.log")).unwrap();
    assert!(!log.contains("not shut down cleanly"), "{log}");
    assert!(
        log.contains("created over members that held other bytes"),
        "{log}"
    );
}
