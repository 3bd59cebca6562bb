//! The RAID 5 write hole, closed by md's partial parity log: the server
//! dies while clients' partial-stripe writes are in flight, between the
//! write of a data block and the write of its stripe's parity (a crash
//! point, `NVRAID_FAILPOINT=stripe-write:N`: the process aborts there, as
//! SIGKILL or a power cut would stop it; the psync engine makes each member
//! write happen when it is issued), then a member is lost, then the array
//! is read. With the log, every write the server acknowledged is there,
//! every byte nobody wrote since is what it was (even where it is rebuilt
//! from the parity of the torn stripe), and the writes cut short hold their
//! old or their new bytes. Without it (md's resync policy), the same crash
//! loses bytes nobody was writing: the hole the log closes.

mod common;

use common::*;
use nvraid_nbd::client::{ClientConfig, ClientEvent, ClientHandshake};
use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;

const MEMBERS: usize = 4;
const SLOT: u64 = 32 * 1024;

/// A minimal NBD client: the newstyle handshake (nvraid's own client state
/// machine), then writes with FUA, several in flight, simple replies.
struct Client {
    sock: UnixStream,
}

impl Client {
    fn connect(path: &Path) -> Client {
        let mut sock = UnixStream::connect(path).unwrap();
        let mut hs = ClientHandshake::new(ClientConfig {
            export: String::new(),
            tls: false,
            structured_replies: false,
            meta_contexts: Vec::new(),
        });
        loop {
            sock.write_all(&hs.take_output()).unwrap();
            if hs.is_done() {
                break;
            }
            let mut buf = vec![0u8; hs.bytes_wanted()];
            sock.read_exact(&mut buf).unwrap();
            let (_, event) = hs.receive(&buf).unwrap();
            if let Some(ClientEvent::Ready(_)) = event {
                sock.write_all(&hs.take_output()).unwrap();
                break;
            }
        }
        Client { sock }
    }

    fn send_write(&mut self, cookie: u64, offset: u64, data: &[u8]) -> std::io::Result<()> {
        let mut req = Vec::with_capacity(28 + data.len());
        req.extend_from_slice(&0x2560_9513u32.to_be_bytes());
        req.extend_from_slice(&1u16.to_be_bytes()); // FUA
        req.extend_from_slice(&1u16.to_be_bytes()); // WRITE
        req.extend_from_slice(&cookie.to_be_bytes());
        req.extend_from_slice(&offset.to_be_bytes());
        req.extend_from_slice(&(data.len() as u32).to_be_bytes());
        req.extend_from_slice(data);
        self.sock.write_all(&req)
    }

    /// The next reply: (cookie, error).
    fn reply(&mut self) -> std::io::Result<(u64, u32)> {
        let mut r = [0u8; 16];
        self.sock.read_exact(&mut r)?;
        assert_eq!(u32::from_be_bytes(r[0..4].try_into().unwrap()), 0x6744_6698);
        Ok((
            u64::from_be_bytes(r[8..16].try_into().unwrap()),
            u32::from_be_bytes(r[4..8].try_into().unwrap()),
        ))
    }
}

/// Bytes of write `n` (distinct for every write).
fn fill(n: u64, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (n.wrapping_mul(131) as usize + i * 7) as u8 | 1)
        .collect()
}

#[test]
fn acknowledged_writes_survive_a_crash_then_a_lost_member() {
    let wrong = crash_then_lose_a_member("ppl");
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

/// md's write journal closes the hole too: every round's data and parity
/// pages are durable in the journal before any member write, and the first
/// writable assembly after the crash writes the logged stripes back whole.
#[test]
fn with_the_write_journal_acknowledged_writes_survive_a_crash_then_a_lost_member() {
    let wrong = crash_then_lose_a_member("journal");
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

#[test]
fn without_the_log_the_same_crash_loses_bytes_nobody_wrote() {
    let wrong = crash_then_lose_a_member("resync");
    assert!(
        !wrong.is_empty(),
        "the crash tore no stripe: the test would prove nothing about the log"
    );
}

/// The run with md's consistency `policy`; returns what was read wrong.
fn crash_then_lose_a_member(policy: &str) -> Vec<String> {
    let dir = tempfile::tempdir().unwrap();
    let members: Vec<String> = (0..MEMBERS).map(|i| format!("m{i}.img")).collect();
    let mut create = vec![
        "create",
        "--level",
        "5",
        "--consistency-policy",
        policy,
        "--chunk",
        "16K",
        "--size",
        "16M",
    ];
    // The journal member goes with the array everywhere (it is not one
    // of the members lost below).
    let journal: Vec<String> = if policy == "journal" {
        create.extend(["--write-journal", "j.img"]);
        vec!["j.img".to_string()]
    } else {
        Vec::new()
    };
    create.extend(members.iter().map(String::as_str));
    ok(&create, dir.path());
    let all: Vec<String> = members.iter().chain(&journal).cloned().collect();
    // The bytes before: every sector says where it is.
    let mut detail = vec!["detail", "--json"];
    detail.extend(all.iter().map(String::as_str));
    let d: serde_json::Value = serde_json::from_str(&ok(&detail, dir.path())).unwrap();
    let size = d["size_bytes"].as_u64().unwrap() as usize;
    let before: Vec<u8> = (0..size).map(|i| ((i / 512) as u8) ^ 0x5a).collect();
    std::fs::write(dir.path().join("before.bin"), &before).unwrap();
    let mut write = vec!["write", "--input", "before.bin"];
    write.extend(all.iter().map(String::as_str));
    ok(&write, dir.path());

    // Writes of 1 to 12 KiB (whole sectors), each in its own 32 KiB slot
    // (so none overlaps another), at odd places: partial stripes, across
    // chunks.
    let slots = size as u64 / SLOT;
    let mut order: Vec<u64> = (0..slots).collect();
    let mut rng = 0x9e37_79b9_7f4a_7c15u64;
    let mut next = || {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng
    };
    for i in (1..order.len()).rev() {
        order.swap(i, (next() % (i as u64 + 1)) as usize);
    }
    // A journaled array takes 4 KiB sectors (md logs whole pages).
    let sector: u64 = if policy == "journal" { 4096 } else { 512 };
    let writes: Vec<(u64, usize)> = order
        .iter()
        .map(|&slot| {
            let len = (1 + next() % (12288 / sector)) as usize * sector as usize;
            let at = slot * SLOT + (next() % ((SLOT - len as u64) / sector)) * sector;
            (at, len)
        })
        .collect();

    // About halfway through the writes (each is two or three member
    // writes), the server aborts between two member writes of a stripe.
    let crash = format!("stripe-write:{}", writes.len());
    let mut server = serve_env(
        dir.path(),
        &all,
        &["--engine", "psync"],
        &[("NVRAID_FAILPOINT", crash.as_str())],
    );
    let mut client = Client::connect(&dir.path().join("md.sock"));
    let depth = 16;
    let mut acked = vec![false; writes.len()];
    let (mut sent, mut done) = (0usize, 0usize);
    loop {
        while sent < writes.len() && sent - done < depth {
            let (at, len) = writes[sent];
            if client
                .send_write(sent as u64, at, &fill(sent as u64, len))
                .is_err()
            {
                break;
            }
            sent += 1;
        }
        match client.reply() {
            Ok((cookie, 0)) => {
                acked[cookie as usize] = true;
                done += 1;
            }
            Ok((cookie, error)) => panic!("write {cookie} failed with {error}"),
            Err(_) => break, // the server is gone
        }
        if done == writes.len() {
            break;
        }
    }
    let status = server.wait().unwrap();
    let log = std::fs::read_to_string(dir.path().join("serve.log")).unwrap();
    assert!(
        !status.success() && log.contains("failpoint stripe-write reached"),
        "the server crashed at the crash point: {status:?}\n{log}"
    );
    let acked_count = acked.iter().filter(|&&a| a).count();
    assert!(
        acked_count > writes.len() / 4 && acked_count < writes.len(),
        "{acked_count} of {} acknowledged",
        writes.len()
    );
    let mut wrong = Vec::new();

    // Each member lost in turn, on a copy of the crashed members: the first
    // assembly (writable, degraded) replays the logs, then the array is
    // read whole.
    for lost in 0..MEMBERS {
        let copy = dir.path().join(format!("lost{lost}"));
        std::fs::create_dir(&copy).unwrap();
        let kept: Vec<String> = (0..MEMBERS)
            .filter(|&m| m != lost)
            .map(|m| members[m].clone())
            .chain(journal.iter().cloned())
            .inspect(|name| {
                std::fs::copy(dir.path().join(name), copy.join(name)).unwrap();
            })
            .collect();
        let mut repair = vec!["repair"];
        repair.extend(kept.iter().map(String::as_str));
        let out = nvraid(&repair, &copy);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let mut read = vec!["read"];
        read.extend(kept.iter().map(String::as_str));
        let after = ok_bytes(&read, &copy);
        assert_eq!(after.len(), size);
        let mut expect_old = before.clone();
        let mut written_at = vec![None::<usize>; size / 512];
        for (n, &(at, len)) in writes.iter().enumerate().take(sent) {
            written_at[at as usize / 512..(at as usize + len) / 512].fill(Some(n));
            if acked[n] {
                expect_old[at as usize..at as usize + len].copy_from_slice(&fill(n as u64, len));
            }
        }
        for (s, sector) in after.chunks(512).enumerate() {
            let old = &expect_old[s * 512..][..512];
            if sector == old {
                continue;
            }
            // Only a write cut short may have put its new bytes there.
            let cut_short = written_at[s].filter(|&n| !acked[n]).map(|n| {
                let (at, len) = writes[n];
                fill(n as u64, len)[s * 512 - at as usize..][..512].to_vec()
            });
            if cut_short.is_none_or(|new| new != sector) {
                wrong.push(format!(
                    "member {lost} lost: sector {s} holds neither its acknowledged bytes nor a \
                     write cut short (written by {:?}, acknowledged {:?})",
                    written_at[s],
                    written_at[s].map(|n| acked[n])
                ));
            }
        }
    }
    wrong
}
