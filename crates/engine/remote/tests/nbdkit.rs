//! The NBD client against real servers: nbdkit (memory, file, with its
//! error and delay filters) and qemu-nbd.

mod common;

use common::plain_op;
use nvraid_io::engine::{MemberOp, MemberOpKind};
use nvraid_io::remote::{Channel, RemoteFile};
use nvraid_remote::{ConnectError, RemoteError, RemoteExport, RemoteOptions};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// An NBD server child process on a unix socket, killed on drop.
struct Server {
    child: Child,
    socket: PathBuf,
    _dir: tempfile::TempDir,
}

impl Server {
    fn nbdkit(args: &[&str]) -> Server {
        let dir = tempfile::tempdir().unwrap();
        let socket = dir.path().join("nbd.sock");
        let child = Command::new("nbdkit")
            .arg("-f")
            .arg("-U")
            .arg(&socket)
            .args(args)
            .stdout(Stdio::null())
            .spawn()
            .expect("nbdkit is installed (./test.sh installs it)");
        // nbdkit binds its socket a moment before it listens: ready is a
        // connection taken (a probe qemu-nbd, which serves one client,
        // could not survive).
        let start = Instant::now();
        while std::os::unix::net::UnixStream::connect(&socket).is_err() {
            assert!(
                start.elapsed() < Duration::from_secs(20),
                "nbdkit did not start"
            );
            std::thread::sleep(Duration::from_millis(5));
        }
        Server::wait(child, socket, dir)
    }

    fn qemu_nbd(image: &Path, extra: &[&str]) -> Server {
        let dir = tempfile::tempdir().unwrap();
        let socket = dir.path().join("nbd.sock");
        let child = Command::new("qemu-nbd")
            .arg("-k")
            .arg(&socket)
            .args(["-f", "raw", "--cache=none", "--aio=threads"])
            .args(extra)
            .arg(image)
            .stdout(Stdio::null())
            .spawn()
            .expect("qemu-nbd is installed (./test.sh installs it)");
        Server::wait(child, socket, dir)
    }

    fn wait(child: Child, socket: PathBuf, dir: tempfile::TempDir) -> Server {
        let start = Instant::now();
        while !socket.exists() {
            assert!(
                start.elapsed() < Duration::from_secs(20),
                "server did not start"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        Server {
            child,
            socket,
            _dir: dir,
        }
    }

    fn uri(&self, export: &str) -> String {
        format!("nbd+unix:///{export}?socket={}", self.socket.display())
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn pattern(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

fn options() -> RemoteOptions {
    RemoteOptions {
        request_timeout: Duration::from_secs(10),
        connect_timeout: Duration::from_secs(5),
    }
}

#[test]
fn simple_path_round_trips_on_nbdkit_memory() {
    let server = Server::nbdkit(&["memory", "size=16M"]);
    let export = RemoteExport::open(&server.uri(""), true, false, options()).unwrap();
    assert_eq!(export.info().size_bytes, 16 << 20);
    let data = pattern(3 << 20, 1);
    export.write_at(&data, 4096).unwrap();
    export.flush().unwrap();
    let mut back = vec![0u8; data.len()];
    export.read_at(&mut back, 4096).unwrap();
    assert!(back == data, "bytes differ after a round trip");
    export.zero(8192, 4096).unwrap();
    export.read_at(&mut back[..16384], 0).unwrap();
    assert!(back[8192..12288].iter().all(|&b| b == 0));
    assert_eq!(back[4096..8192], data[..4096]);
    let err = export.read_at(&mut back[..4096], 16 << 20).unwrap_err();
    assert!(err.to_string().contains("past the end"), "{err}");
}

/// Zeroing a range (what a discard on the array does to a remote member)
/// sends WRITE_ZEROES where the export takes it, and explicit zero writes
/// where it does not; either way the range reads as zeros and nothing
/// around it changes. nbdkit's log filter shows which commands arrived.
#[test]
fn zeroing_uses_write_zeroes_where_the_export_takes_it() {
    for (hide_zero, expect) in [(false, "Zero"), (true, "Write")] {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("requests.log");
        let logfile = format!("logfile={}", log.display());
        let mut args = vec!["--filter=log"];
        if hide_zero {
            args.push("--filter=nozero");
        }
        args.extend(["memory", "size=64M", &logfile]);
        let server = Server::nbdkit(&args);
        let export = RemoteExport::open(&server.uri(""), true, false, options()).unwrap();
        assert_eq!(export.info().can_write_zeroes(), !hide_zero);
        let data = pattern(48 << 20, 9);
        export.write_at(&data, 0).unwrap();
        let before = std::fs::read_to_string(&log).unwrap().len();
        // 40 MiB: more than one request of the server's maximum payload.
        export.zero(4 << 20, 40 << 20).unwrap();
        let mut back = vec![0u8; data.len()];
        export.read_at(&mut back, 0).unwrap();
        assert!(
            back[4 << 20..44 << 20].iter().all(|&b| b == 0),
            "not zeroed"
        );
        assert!(
            back[..4 << 20] == data[..4 << 20],
            "bytes before the range changed"
        );
        assert!(
            back[44 << 20..] == data[44 << 20..],
            "bytes after the range changed"
        );
        let text = std::fs::read_to_string(&log).unwrap();
        let zeroing: Vec<&str> = text[before..]
            .lines()
            .filter(|l| l.contains(" Zero ") || l.contains(" Write "))
            .collect();
        assert!(
            !zeroing.is_empty(),
            "no zeroing request in the log:\n{text}"
        );
        assert!(
            zeroing.iter().all(|l| l.contains(&format!(" {expect} "))),
            "expected only {expect} requests for the zeroing, got:\n{}",
            zeroing.join("\n")
        );
    }
}

/// Many operations in flight on one channel, split at the server's maximum
/// payload, vectored, completing out of order: each comes back whole.
#[test]
fn channel_pipelines_vectored_operations_and_matches_replies() {
    // The delay filter makes replies overtake each other.
    let server = Server::nbdkit(&[
        "--filter=blocksize",
        "--filter=delay",
        "memory",
        "size=64M",
        "maxdata=65536",
        "rdelay=0-3ms",
        "wdelay=0-3ms",
    ]);
    let export = RemoteExport::open(&server.uri(""), true, false, options()).unwrap();
    let mut channel = export.open_channel().unwrap();
    let n = 48usize;
    let len = 192 * 1024;
    let data: Vec<Vec<u8>> = (0..n).map(|i| pattern(len, i as u64 + 7)).collect();
    // Each write goes out as three iovecs of unequal length.
    let iovs: Vec<[libc::iovec; 3]> = data
        .iter()
        .map(|d| {
            let p = d.as_ptr() as *mut libc::c_void;
            [
                libc::iovec {
                    iov_base: p,
                    iov_len: 4096,
                },
                libc::iovec {
                    iov_base: p.wrapping_byte_add(4096),
                    iov_len: 65536,
                },
                libc::iovec {
                    iov_base: p.wrapping_byte_add(69632),
                    iov_len: len - 69632,
                },
            ]
        })
        .collect();
    for (i, iov) in iovs.iter().enumerate() {
        let op = MemberOp {
            kind: MemberOpKind::Write,
            file: 0,
            offset: (i * len) as u64,
            buf: std::ptr::null_mut(),
            len: 0,
            iov: iov.as_ptr(),
            iov_count: 3,
            buf_index: 0,
            dsync: i % 5 == 0,
            user_data: i as u64,
        };
        unsafe { channel.push(&op) }.unwrap();
    }
    let mut done = vec![false; n];
    drain(channel.as_mut(), &mut |user_data, result| {
        assert_eq!(result, len as i32, "write {user_data}");
        done[user_data as usize] = true;
    });
    assert!(done.iter().all(|&d| d));
    let mut back: Vec<Vec<u8>> = (0..n).map(|_| vec![0u8; len]).collect();
    for (i, b) in back.iter_mut().enumerate() {
        let op = plain_op(
            MemberOpKind::Read,
            (i * len) as u64,
            b.as_mut_ptr(),
            len as u32,
            1000 + i as u64,
        );
        unsafe { channel.push(&op) }.unwrap();
    }
    let mut reads = 0;
    drain(channel.as_mut(), &mut |_, result| {
        assert_eq!(result, len as i32);
        reads += 1;
    });
    assert_eq!(reads, n);
    for i in 0..n {
        assert!(back[i] == data[i], "read {i} differs");
    }
}

/// Reads pushed together that continue one another (a sequential stream
/// the array cut into chunks) reach the server as one request each run,
/// and each operation still gets exactly its own bytes: the pieces of one
/// operation split over two iovecs, a read that does not continue the run
/// and a write between two runs keep their own requests.
#[test]
fn contiguous_reads_pushed_together_go_as_one_request() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("requests.log");
    let logfile = format!("logfile={}", log.display());
    let server = Server::nbdkit(&["--filter=log", "memory", "size=64M", &logfile]);
    let export = RemoteExport::open(&server.uri(""), true, false, options()).unwrap();
    let data = pattern(8 << 20, 21);
    export.write_at(&data, 0).unwrap();
    let mut channel = export.open_channel().unwrap();
    let before = std::fs::read_to_string(&log).unwrap().len();
    let piece = 64 * 1024;
    // Run one: 6 reads from 1 MiB; the third has two iovecs.
    // Then a read elsewhere (4 MiB), a write (6 MiB), and run two: 3 reads
    // from 2 MiB.
    let mut bufs: Vec<Vec<u8>> = (0..10).map(|_| vec![0u8; piece]).collect();
    let fresh = pattern(piece, 22);
    let offsets: Vec<u64> = [1 << 20, (1 << 20) + piece as u64]
        .into_iter()
        .chain((2..6).map(|i| (1u64 << 20) + i * piece as u64))
        .chain([4 << 20])
        .chain((0..3).map(|i| (2u64 << 20) + i * piece as u64))
        .collect();
    let (left, right) = bufs[2].split_at_mut(4096);
    let split = [
        libc::iovec {
            iov_base: left.as_mut_ptr().cast(),
            iov_len: left.len(),
        },
        libc::iovec {
            iov_base: right.as_mut_ptr().cast(),
            iov_len: right.len(),
        },
    ];
    for (i, &offset) in offsets.iter().enumerate() {
        let mut op = plain_op(
            MemberOpKind::Read,
            offset,
            bufs[i].as_mut_ptr(),
            piece as u32,
            i as u64,
        );
        if i == 2 {
            op.buf = std::ptr::null_mut();
            op.len = 0;
            op.iov = split.as_ptr();
            op.iov_count = 2;
        }
        unsafe { channel.push(&op) }.unwrap();
        if i == 6 {
            let write = plain_op(
                MemberOpKind::Write,
                6 << 20,
                fresh.as_ptr().cast_mut(),
                piece as u32,
                100,
            );
            unsafe { channel.push(&write) }.unwrap();
        }
    }
    let mut results = std::collections::HashMap::new();
    drain(channel.as_mut(), &mut |user_data, result| {
        assert!(
            results.insert(user_data, result).is_none(),
            "{user_data} completed twice"
        );
    });
    assert_eq!(results.len(), offsets.len() + 1);
    assert!(results.values().all(|&r| r == piece as i32), "{results:?}");
    for (i, &offset) in offsets.iter().enumerate() {
        let at = offset as usize;
        assert!(
            bufs[i] == data[at..at + piece],
            "read {i} (offset {offset}) got other bytes"
        );
    }
    // The log is read before the check below adds a read of its own.
    let text = std::fs::read_to_string(&log).unwrap();
    let mut back = vec![0u8; piece];
    export.read_at(&mut back, 6 << 20).unwrap();
    assert!(back == fresh, "the write between the runs was lost");
    let reads: Vec<&str> = text[before..]
        .lines()
        .filter(|l| l.contains(" Read ") && l.contains("count="))
        .collect();
    // Each request as (offset, count), in offset order: nbdkit's threads
    // log requests in the order they take them, not as they were sent.
    let field = |l: &str, name: &str| {
        l.split(&format!(" {name}="))
            .nth(1)
            .and_then(|v| v.split_whitespace().next())
            .map(str::to_string)
    };
    let mut requests: Vec<(String, String)> = reads
        .iter()
        .filter_map(|l| Some((field(l, "offset")?, field(l, "count")?)))
        .collect();
    requests.sort_by_key(|(offset, _)| {
        u64::from_str_radix(offset.trim_start_matches("0x"), 16).unwrap()
    });
    // Run one is 6 x 64 KiB = 0x60000 from 1 MiB, run two 3 x 64 KiB =
    // 0x30000 from 2 MiB, and the stray read 0x10000 at 4 MiB.
    let expected = [
        ("0x100000", "0x60000"),
        ("0x200000", "0x30000"),
        ("0x400000", "0x10000"),
    ];
    assert_eq!(
        requests,
        expected.map(|(o, c)| (o.to_string(), c.to_string())),
        "reads the server saw:\n{}",
        reads.join("\n")
    );
}

fn drain(channel: &mut dyn Channel, on_complete: &mut dyn FnMut(u64, i32)) {
    let start = Instant::now();
    while channel.inflight() > 0 {
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "operations never completed"
        );
        if channel.progress(on_complete) == 0 {
            let mut fds: Vec<libc::pollfd> = Vec::new();
            channel.poll_fds(&mut fds);
            nvraid_io::sys::poll(&mut fds, 10);
        }
    }
}

#[test]
fn qemu_nbd_serves_as_a_member() {
    let dir = tempfile::tempdir().unwrap();
    let image = dir.path().join("disk.img");
    std::fs::File::create(&image)
        .unwrap()
        .set_len(8 << 20)
        .unwrap();
    let server = Server::qemu_nbd(&image, &[]);
    let export = RemoteExport::open(&server.uri(""), true, false, options()).unwrap();
    assert_eq!(export.info().size_bytes, 8 << 20);
    let data = pattern(1 << 20, 3);
    export.write_at(&data, 1 << 20).unwrap();
    export.flush().unwrap();
    drop(export);
    drop(server);
    let on_disk = std::fs::read(&image).unwrap();
    assert!(
        on_disk[1 << 20..2 << 20] == data[..],
        "qemu-nbd's file holds the bytes"
    );
}

#[test]
fn bad_exports_are_refused_by_name() {
    let missing = "nbd+unix:///x?socket=/nonexistent/nbd.sock";
    let err = RemoteExport::open(missing, false, false, options()).unwrap_err();
    assert!(
        matches!(err, RemoteError::Connect(ConnectError::Unreachable { .. })),
        "{err}"
    );
    assert!(err.to_string().starts_with(missing), "{err}");

    let server = Server::nbdkit(&[
        "--filter=exportname",
        "memory",
        "size=1M",
        "exportname=disk",
        "exportname-strict=true",
    ]);
    let err = RemoteExport::open(&server.uri("other"), false, false, options()).unwrap_err();
    assert!(
        err.to_string().contains("no export named \"other\""),
        "{err}"
    );

    let ro = Server::nbdkit(&["-r", "memory", "size=1M"]);
    let err = RemoteExport::open(&ro.uri(""), true, false, options()).unwrap_err();
    assert!(err.to_string().contains("read-only"), "{err}");
    RemoteExport::open(&ro.uri(""), false, false, options()).unwrap();

    // The eval plugin with no flush script advertises no FLUSH.
    let noflush = Server::nbdkit(&[
        "eval",
        "get_size=echo 1048576",
        "pread=dd if=/dev/zero count=$3 iflag=count_bytes status=none",
        "pwrite=cat >/dev/null",
    ]);
    let err = RemoteExport::open(&noflush.uri(""), true, false, options()).unwrap_err();
    assert!(matches!(err, RemoteError::NoFlush { .. }), "{err}");
    assert!(err.to_string().contains("--unsafe-no-flush"), "{err}");
    let export = RemoteExport::open(&noflush.uri(""), true, true, options()).unwrap();
    assert!(!export.info().can_flush());
    export.write_at(&[7u8; 4096], 0).unwrap();
    export.flush().unwrap();
}

/// A server without CAN_MULTI_CONN that also takes one client at a time
/// (nbdkit's multi-conn and limit filters): every user of the member, the
/// simple path and several workers on their own threads, shares one
/// pipelined connection (a second one would be refused), and every
/// operation comes back right.
#[test]
fn a_server_without_multi_conn_gets_one_shared_connection() {
    let server = Server::nbdkit(&[
        "--filter=limit",
        "--filter=multi-conn",
        "memory",
        "size=32M",
        "multi-conn-mode=disable",
        "limit=1",
    ]);
    let export = RemoteExport::open(&server.uri(""), true, false, options()).unwrap();
    assert!(!export.info().can_multi_conn());
    assert!(export.shares_one_connection());
    let export = std::sync::Arc::new(export);
    let len = 64 * 1024;
    let workers: Vec<_> = (0..3u64)
        .map(|w| {
            let export = std::sync::Arc::clone(&export);
            std::thread::spawn(move || {
                let mut channel = export.open_channel().unwrap();
                let data: Vec<Vec<u8>> = (0..24).map(|i| pattern(len, w * 100 + i)).collect();
                for (i, d) in data.iter().enumerate() {
                    let op = plain_op(
                        MemberOpKind::Write,
                        ((w as usize * 32 + i) * len) as u64,
                        d.as_ptr() as *mut u8,
                        len as u32,
                        i as u64,
                    );
                    unsafe { channel.push(&op) }.unwrap();
                }
                let mut done = 0;
                drain(channel.as_mut(), &mut |_, r| {
                    assert_eq!(r, len as i32);
                    done += 1;
                });
                assert_eq!(done, 24);
                let mut back: Vec<Vec<u8>> = (0..24).map(|_| vec![0u8; len]).collect();
                for (i, b) in back.iter_mut().enumerate() {
                    let op = plain_op(
                        MemberOpKind::Read,
                        ((w as usize * 32 + i) * len) as u64,
                        b.as_mut_ptr(),
                        len as u32,
                        1000 + i as u64,
                    );
                    unsafe { channel.push(&op) }.unwrap();
                }
                drain(channel.as_mut(), &mut |_, r| assert_eq!(r, len as i32));
                for i in 0..24 {
                    assert!(back[i] == data[i], "worker {w} read {i} differs");
                }
            })
        })
        .collect();
    // The simple path, meanwhile, on the same connection.
    let mine = pattern(len, 999);
    export.write_at(&mine, 31 << 20).unwrap();
    export.flush().unwrap();
    for worker in workers {
        worker.join().unwrap();
    }
    let mut back = vec![0u8; len];
    export.read_at(&mut back, 31 << 20).unwrap();
    assert!(back == mine);
    // Queues come and go (a server opens some per client): a dropped
    // handle gives back its place and its eventfd.
    let fds = || std::fs::read_dir("/proc/self/fd").unwrap().count();
    let before = fds();
    for _ in 0..200 {
        drop(export.open_channel().unwrap());
    }
    assert!(
        fds() < before + 20,
        "{} descriptors before, {} after",
        before,
        fds()
    );
}

extern "C" fn ignore_signal(_: libc::c_int) {}

/// A thread that is woken while it waits in the handshake goes on waiting.
///
/// The io_uring of a thread's batches (`nvraid_io::batch`) runs its task
/// work by marking the thread as signalled; a blocking socket read with a
/// timeout, such as the handshake's, then returns EINTR rather than being
/// restarted by the kernel (seen in CI: a test thread that had run a
/// rebuild failed its next NBD connect with "Interrupted system call").
/// Here a real signal, caught by a handler installed with SA_RESTART, takes
/// the same path through the kernel: the server's first bytes are held back
/// by a relay while the connecting thread is signalled again and again.
#[test]
fn a_handshake_interrupted_by_a_wake_up_of_its_thread_goes_on() {
    use std::os::unix::net::{UnixListener, UnixStream};
    use std::os::unix::thread::JoinHandleExt;

    let server = Server::nbdkit(&["memory", "1M"]);
    // SIGUSR2 is caught and ignored: its only effect is to interrupt.
    unsafe {
        let mut action: libc::sigaction = std::mem::zeroed();
        action.sa_sigaction = ignore_signal as *const () as usize;
        action.sa_flags = libc::SA_RESTART;
        assert_eq!(
            libc::sigaction(libc::SIGUSR2, &action, std::ptr::null_mut()),
            0
        );
    }
    let dir = tempfile::tempdir().unwrap();
    let relay_socket = dir.path().join("relay.sock");
    let listener = UnixListener::bind(&relay_socket).unwrap();
    let upstream = server.socket.clone();
    let relay = std::thread::spawn(move || {
        let (client, _) = listener.accept().unwrap();
        // The client now waits for the server's greeting.
        std::thread::sleep(Duration::from_millis(600));
        let nbd = UnixStream::connect(&upstream).unwrap();
        let (mut c2, mut n2) = (client.try_clone().unwrap(), nbd.try_clone().unwrap());
        let back = std::thread::spawn(move || {
            let _ = std::io::copy(&mut n2, &mut c2);
        });
        let (mut c1, mut n1) = (client, nbd);
        let _ = std::io::copy(&mut c1, &mut n1);
        let _ = n1.shutdown(std::net::Shutdown::Both);
        let _ = back.join();
    });

    let uri = format!("nbd+unix:///?socket={}", relay_socket.display());
    let connecting = std::thread::spawn(move || {
        let export = RemoteExport::open(&uri, true, false, options());
        export
            .map(|e| e.info().size_bytes)
            .map_err(|e| e.to_string())
    });
    let pthread = connecting.as_pthread_t();
    let mut sent = 0;
    let start = Instant::now();
    // Signals only while the handshake waits for the relay's greeting.
    while !connecting.is_finished() && start.elapsed() < Duration::from_millis(500) {
        unsafe { libc::pthread_kill(pthread, libc::SIGUSR2) };
        sent += 1;
        std::thread::sleep(Duration::from_millis(20));
    }
    let size = connecting.join().unwrap();
    assert_eq!(
        size,
        Ok(1 << 20),
        "the connect did not survive {sent} wake-ups"
    );
    assert!(sent > 5, "only {sent} signals sent");
    relay.join().unwrap();
}
