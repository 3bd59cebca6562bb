//! NVMe/TCP members against a scripted target (tests/common/nvme_target.rs,
//! built on nvraid-nvme-tcp's controller side): the data path (in-capsule
//! writes, R2T/H2CData, C2HData with and without SUCCESS, digests, Write
//! Zeroes, pipelining), and the hostile peer: a wrong subsystem NQN, an
//! ICResp with an unsupported PDU format version, a bad data digest, a
//! C2HData past the command or for a command never sent, a target that
//! stops answering, a connection dropped under a read or in the middle of
//! an R2T, a write answered before its data was sent, a target restarted
//! with its namespace shrunk, Keep Alive never answered. Each ends with a clear error or the data intact, and nothing
//! hangs.

mod common;
#[path = "common/nvme_target.rs"]
mod nvme_target;

use common::plain_op;
use nvme_target::{serve, Misbehave, BLOCK};
use nvraid_io::engine::MemberOpKind;
use nvraid_io::remote::{Channel, RemoteFile};
use nvraid_remote::nvme::{NvmeExport, NvmeOpenError};
use nvraid_remote::RemoteOptions;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

const SIZE: usize = 4 << 20;

fn options() -> RemoteOptions {
    RemoteOptions {
        request_timeout: Duration::from_millis(1500),
        connect_timeout: Duration::from_secs(3),
    }
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed) ^ (i >> 9) as u8)
        .collect()
}

fn roundtrip(query: &str) {
    let t = serve(SIZE, Misbehave::None);
    let export = NvmeExport::open(&t.uri(query), options()).unwrap();
    assert_eq!(export.info().size_bytes, SIZE as u64);
    assert_eq!(export.info().block_bytes, BLOCK as u32);
    // In the capsule (1 KiB), by R2T in several H2CData (96 KiB), and a
    // read of both in C2HData pieces.
    let small = pattern(1024, 1);
    let big = pattern(96 * 1024, 2);
    export.write_at(&small, 4096).unwrap();
    export.write_at(&big, 65536).unwrap();
    export.flush().unwrap();
    let mut back = vec![0u8; 96 * 1024];
    export.read_at(&mut back, 65536).unwrap();
    assert!(back == big, "the R2T write read back differently");
    let mut back = vec![0u8; 1024];
    export.read_at(&mut back, 4096).unwrap();
    assert_eq!(back, small);
    assert_eq!(&t.data.lock().unwrap()[65536..65536 + big.len()], &big[..]);
    // Write Zeroes.
    export.zero(65536, 8192).unwrap();
    assert!(t.data.lock().unwrap()[65536..65536 + 8192]
        .iter()
        .all(|&b| b == 0));
    assert_eq!(t.data.lock().unwrap()[65536 + 8192], big[8192]);
}

#[test]
fn an_nvme_member_writes_and_reads_through_capsules_and_r2t() {
    roundtrip("");
}

#[test]
fn an_nvme_member_with_header_and_data_digests_keeps_the_data() {
    roundtrip("?digest=header,data");
}

/// A worker's channel pipelines many commands (more than the queue's
/// depth) and every one lands where it was asked.
#[test]
fn a_worker_channel_pipelines_more_commands_than_its_queue_holds() {
    let t = serve(SIZE, Misbehave::None);
    let export = NvmeExport::open(&t.uri(""), options()).unwrap();
    let mut channel = export.open_channel().unwrap();
    let n = 300;
    let bufs: Vec<Vec<u8>> = (0..n).map(|i| pattern(8192, i as u8)).collect();
    for (i, b) in bufs.iter().enumerate() {
        let op = plain_op(
            MemberOpKind::Write,
            (i * 8192) as u64,
            b.as_ptr().cast_mut(),
            8192,
            i as u64,
        );
        unsafe { channel.push(&op) }.unwrap();
    }
    let results = wait(channel.as_mut(), n);
    assert!(results.iter().all(|&r| r == 8192), "{results:?}");
    let mut back: Vec<Vec<u8>> = (0..n).map(|_| vec![0u8; 8192]).collect();
    for (i, b) in back.iter_mut().enumerate() {
        let op = plain_op(
            MemberOpKind::Read,
            (i * 8192) as u64,
            b.as_mut_ptr(),
            8192,
            i as u64,
        );
        unsafe { channel.push(&op) }.unwrap();
    }
    let results = wait(channel.as_mut(), n);
    assert!(results.iter().all(|&r| r == 8192), "{results:?}");
    assert!(back == bufs, "pipelined reads returned other data");
}

/// Reads pushed together that continue one another on the namespace (the
/// array's chunks of one sequential read) go as one Read command, and the
/// data is spread over their buffers in order.
#[test]
fn contiguous_reads_pushed_together_go_as_one_command() {
    let t = serve(SIZE, Misbehave::None);
    let data = pattern(16 * 8192, 5);
    t.data.lock().unwrap()[65536..65536 + data.len()].copy_from_slice(&data);
    let export = NvmeExport::open(&t.uri(""), options()).unwrap();
    let mut channel = export.open_channel().unwrap();
    let before = t.read_commands.load(Ordering::SeqCst);
    let mut back: Vec<Vec<u8>> = (0..16).map(|_| vec![0u8; 8192]).collect();
    for (i, b) in back.iter_mut().enumerate() {
        let op = plain_op(
            MemberOpKind::Read,
            65536 + (i * 8192) as u64,
            b.as_mut_ptr(),
            8192,
            i as u64,
        );
        unsafe { channel.push(&op) }.unwrap();
    }
    let results = wait(channel.as_mut(), 16);
    assert!(results.iter().all(|&r| r == 8192), "{results:?}");
    assert!(back.concat() == data, "merged reads returned other data");
    assert_eq!(t.read_commands.load(Ordering::SeqCst) - before, 1);
}

fn wait(channel: &mut dyn Channel, n: usize) -> Vec<i32> {
    let start = Instant::now();
    let mut results: Vec<Option<i32>> = vec![None; n];
    while results.iter().any(Option::is_none) {
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "operations never completed"
        );
        channel.progress(&mut |user_data, r| {
            let slot = &mut results[user_data as usize];
            assert!(slot.is_none(), "operation {user_data} completed twice");
            *slot = Some(r);
        });
        nvraid_io::remote::wait_for(std::iter::once(&*channel), Some(Duration::from_millis(5)));
    }
    results.into_iter().map(Option::unwrap).collect()
}

#[test]
fn a_wrong_subsystem_nqn_is_refused_naming_it() {
    let t = serve(SIZE, Misbehave::None);
    let uri = format!("nvme+tcp://127.0.0.1:{}/nqn.2026-11.test:other", t.port);
    let err = NvmeExport::open(&uri, options()).unwrap_err().to_string();
    assert!(
        err.contains("nqn.2026-11.test:other") && err.contains("invalid parameters"),
        "{err}"
    );
}

#[test]
fn an_icresp_with_an_unsupported_pdu_format_version_is_refused() {
    let t = serve(SIZE, Misbehave::BadPfv);
    let err = NvmeExport::open(&t.uri(""), options()).unwrap_err();
    assert!(matches!(err, NvmeOpenError::Connect(_)));
    let err = err.to_string();
    assert!(err.contains("PDU format version 1"), "{err}");
}

#[test]
fn a_missing_namespace_is_refused_naming_it() {
    let t = serve(SIZE, Misbehave::None);
    let uri = format!("nvme+tcp://127.0.0.1:{}/{}/2", t.port, t.nqn);
    let err = NvmeExport::open(&uri, options()).unwrap_err().to_string();
    assert!(err.contains("no namespace 2"), "{err}");
}

/// A read the target answers badly: it fails (after one retry on a new
/// connection), with the reason kept, and the buffer outside the read is
/// untouched.
fn refused_read(how: Misbehave, query: &str, reason: &str) {
    let t = serve(SIZE, how);
    let export = NvmeExport::open(&t.uri(query), options()).unwrap();
    let mut channel = export.open_channel().unwrap();
    let mut buf = vec![0x11u8; 3 * 4096];
    let op = plain_op(MemberOpKind::Read, 8192, buf[4096..].as_mut_ptr(), 4096, 0);
    let start = Instant::now();
    unsafe { channel.push(&op) }.unwrap();
    let results = wait(channel.as_mut(), 1);
    assert!(results[0] < 0, "{how:?}: the read succeeded");
    assert!(buf[..4096].iter().all(|&b| b == 0x11));
    assert!(buf[8192..].iter().all(|&b| b == 0x11));
    assert!(start.elapsed() < Duration::from_secs(5));
    // The sync path reports the reason in words.
    let mut b = vec![0u8; 4096];
    let err = export.read_at(&mut b, 8192).unwrap_err().to_string();
    assert!(err.contains(reason), "{how:?}: {err}");
}

#[test]
fn a_c2h_data_with_a_bad_data_digest_fails_the_read() {
    refused_read(
        Misbehave::BadDataDigest,
        "?digest=data",
        "data digest mismatch",
    );
}

#[test]
fn a_c2h_data_past_the_commands_length_fails_the_read() {
    refused_read(Misbehave::C2HPastLength, "", "outside the command");
}

#[test]
fn a_c2h_data_for_a_command_never_sent_fails_the_read() {
    refused_read(Misbehave::C2HUnknownCid, "", "not in flight");
}

#[test]
fn a_target_that_stops_answering_times_out() {
    refused_read(Misbehave::Silent, "", "no completion within");
}

/// The connection dropped under a read: the read goes again on a new I/O
/// queue (a new queue id) and returns the data.
#[test]
fn a_read_whose_connection_drops_is_read_again_on_a_new_queue() {
    let t = serve(SIZE, Misbehave::DropFirstRead);
    t.data.lock().unwrap()[8192..12288].copy_from_slice(&pattern(4096, 9));
    let export = NvmeExport::open(&t.uri(""), options()).unwrap();
    let mut channel = export.open_channel().unwrap();
    let mut buf = vec![0u8; 4096];
    let op = plain_op(MemberOpKind::Read, 8192, buf.as_mut_ptr(), 4096, 0);
    unsafe { channel.push(&op) }.unwrap();
    assert_eq!(wait(channel.as_mut(), 1), vec![4096]);
    assert_eq!(buf, pattern(4096, 9));
    assert_eq!(t.io_connects.load(Ordering::SeqCst), 2);
    // The admin queue and the two I/O queues.
    assert_eq!(t.connections.load(Ordering::SeqCst), 3);
}

#[test]
fn an_unaligned_operation_is_refused_without_touching_the_target() {
    let t = serve(SIZE, Misbehave::None);
    let export = NvmeExport::open(&t.uri(""), options()).unwrap();
    let err = export.write_at(&[1u8; 100], 4096).unwrap_err().to_string();
    assert!(err.contains("whole 512-byte blocks"), "{err}");
    let err = export
        .read_at(&mut [0u8; 512], SIZE as u64)
        .unwrap_err()
        .to_string();
    assert!(err.contains("not inside the namespace"), "{err}");
    assert!(t.data.lock().unwrap().iter().all(|&b| b == 0));
}

/// The target sends R2T for a write and closes the connection instead of
/// taking the data: the write fails with the reason (a sent write is not
/// retried), at once, and the bytes on the target are unchanged.
#[test]
fn a_target_that_drops_the_connection_mid_r2t_fails_the_write() {
    let t = serve(SIZE, Misbehave::DropMidR2T);
    let export = NvmeExport::open(&t.uri(""), options()).unwrap();
    let start = Instant::now();
    let err = export
        .write_at(&pattern(65536, 3), 65536)
        .unwrap_err()
        .to_string();
    assert!(err.contains("closed the connection"), "{err}");
    assert!(start.elapsed() < Duration::from_secs(3));
    assert!(t.data.lock().unwrap().iter().all(|&b| b == 0));
}

/// The target answers a write (R2T for all of it and a successful
/// CapsuleResp in one segment) before it could have had a byte of its
/// data: the write fails naming that (its data was still queued to send,
/// from the caller's buffer, which must stay in use until it is sent),
/// and nothing reached the target.
#[test]
fn a_write_answered_before_its_data_was_sent_fails() {
    let t = serve(SIZE, Misbehave::AnswerBeforeData);
    let export = NvmeExport::open(&t.uri(""), options()).unwrap();
    let err = export
        .write_at(&pattern(65536, 4), 65536)
        .unwrap_err()
        .to_string();
    assert!(err.contains("answered before all of it was sent"), "{err}");
    assert!(t.data.lock().unwrap().iter().all(|&b| b == 0));
}

/// The target restarts (its controllers forgotten) with the namespace at
/// half its size: the next I/O queue finds its controller id refused,
/// connects a new admin queue, sees the namespace shrank and refuses it;
/// the read fails naming that, and nothing is read from it.
#[test]
fn a_namespace_that_shrank_across_a_target_restart_is_refused() {
    let t = serve(SIZE, Misbehave::RestartSmaller);
    let export = NvmeExport::open(&t.uri(""), options()).unwrap();
    let mut b = vec![0x11u8; 4096];
    let err = export.read_at(&mut b, 8192).unwrap_err().to_string();
    assert!(
        err.contains("the namespace shrank from 4194304 to 2097152 bytes"),
        "{err}"
    );
    assert!(b.iter().all(|&x| x == 0x11));
    assert_eq!(t.generation.load(Ordering::SeqCst), 1);
}

/// A controller that stops answering Keep Alive is taken as gone: the
/// admin queue is dropped and the I/O queue connected to it ends, so the
/// next read goes on a new controller (new admin queue, new I/O queue) and
/// still returns the data.
#[test]
fn a_target_that_never_answers_keep_alive_is_left_for_a_new_controller() {
    let t = serve(SIZE, Misbehave::NoKeepAlive);
    t.data.lock().unwrap()[8192..12288].copy_from_slice(&pattern(4096, 5));
    let export = NvmeExport::open(&t.uri(""), options()).unwrap();
    let mut b = vec![0u8; 4096];
    export.read_at(&mut b, 8192).unwrap();
    assert_eq!(t.io_connects.load(Ordering::SeqCst), 1);
    // Keep Alive goes every 0.75 s (half the request timeout), its answer
    // due within as long.
    std::thread::sleep(Duration::from_millis(2000));
    let mut b = vec![0u8; 4096];
    export.read_at(&mut b, 8192).unwrap();
    assert_eq!(b, pattern(4096, 5));
    assert_eq!(t.io_connects.load(Ordering::SeqCst), 2);
    assert!(t.connections.load(Ordering::SeqCst) >= 4);
}

/// What the array gives a member: every new connection must show 0xab in
/// bytes 4096..4608 (a stand-in for the member's superblock).
#[derive(Debug)]
struct Marked;

impl nvraid_io::remote::IdentityCheck for Marked {
    fn probe(&self) -> (u64, usize) {
        (4096, 512)
    }
    fn verify(&self, bytes: &[u8]) -> Result<(), String> {
        match bytes.iter().all(|&b| b == 0xab) {
            true => Ok(()),
            false => Err("the mark is missing: another device answered".into()),
        }
    }
}

/// A namespace that does not carry the member's identity is refused on
/// every new I/O queue before any other command is sent on it: the
/// operation fails with ENXIO and the reason, nothing is written; the
/// member's own data back at the address is accepted again.
#[test]
fn a_stranger_behind_an_nvme_members_address_is_refused() {
    let t = serve(SIZE, Misbehave::None);
    let export = NvmeExport::open(&t.uri(""), options()).unwrap();
    export.set_identity_check(std::sync::Arc::new(Marked));
    let err = export.write_at(&pattern(4096, 7), 65536).unwrap_err();
    assert_eq!(err.raw_os_error(), None, "the reason is kept: {err}");
    assert!(err.to_string().contains("the mark is missing"), "{err}");
    assert_eq!(
        export.identity_refused().as_deref(),
        Some("the mark is missing: another device answered")
    );
    assert!(t.data.lock().unwrap().iter().all(|&b| b == 0));
    // A worker's channel is refused the same way.
    let mut channel = export.open_channel().unwrap();
    let b = pattern(4096, 7);
    let op = plain_op(MemberOpKind::Write, 65536, b.as_ptr().cast_mut(), 4096, 0);
    unsafe { channel.push(&op) }.unwrap();
    assert_eq!(wait(channel.as_mut(), 1), vec![-libc::ENXIO]);
    assert!(t.data.lock().unwrap().iter().all(|&b| b == 0));
    // The member's own bytes: accepted (after the backoff).
    t.data.lock().unwrap()[4096..4608].fill(0xab);
    std::thread::sleep(Duration::from_millis(600));
    export.write_at(&pattern(4096, 7), 65536).unwrap();
    assert_eq!(export.identity_refused(), None);
    assert_eq!(
        &t.data.lock().unwrap()[65536..65536 + 4096],
        &pattern(4096, 7)[..]
    );
}
