//! Several members' I/O in flight together (a reshape's step, a rebuild's
//! reads of the other members): [`run_together`].
//!
//! Files and block devices go through the calling thread's io_uring
//! (`nvraid_io::batch`), all at once. The rest are done in the calling
//! thread while those are in flight: RAM and null members (no device to
//! wait for), remote members (NBD, NVMe/TCP: their exports already keep
//! their own requests in flight on their connections, and a background
//! step is one request each), and an operation whose buffer or offset
//! O_DIRECT would refuse (the blocking path copies it through an aligned
//! buffer). A range past a member's end fails before anything is issued.

use crate::member::Member;
use nvraid_io::batch::{Batch, Path};
use std::cell::{Cell, RefCell};
use std::io;
use std::os::fd::AsFd;

/// What one operation does.
#[derive(Debug)]
pub enum Io<'a> {
    /// Fill all of the buffer from the member.
    Read(&'a mut [u8]),
    /// Write all of the buffer to the member.
    Write(&'a [u8]),
    /// Make the member's completed writes durable (`offset` unused).
    Flush,
}

/// One operation of [`run_together`].
#[derive(Debug)]
pub struct Transfer<'a> {
    pub member: &'a Member,
    pub offset: u64,
    pub io: Io<'a>,
}

thread_local! {
    static ONE_BY_ONE: Cell<bool> = const { Cell::new(false) };
}

/// Run `f` with this thread's [`run_together`] calls done one operation
/// after another, in order, through the blocking methods
/// ([`Member::read_at`] …): how background member I/O went before it was
/// batched, kept so that tests can compare the two.
pub fn one_by_one<R>(f: impl FnOnce() -> R) -> R {
    let before = ONE_BY_ONE.with(|o| o.replace(true));
    let out = f();
    ONE_BY_ONE.with(|o| o.set(before));
    out
}

/// Do every operation of `ops`, all in flight together (see the module
/// docs), calling `done(index, result)` as each finishes, in the order they
/// finish. Returns once every one has finished, and how the files' and
/// block devices' operations were run ([`Path::OneByOne`] also inside
/// [`one_by_one`]).
pub fn run_together(ops: Vec<Transfer<'_>>, done: &mut dyn FnMut(usize, io::Result<()>)) -> Path {
    if ONE_BY_ONE.with(|o| o.get()) {
        for (i, op) in ops.into_iter().enumerate() {
            done(i, blocking(op));
        }
        return Path::OneByOne;
    }
    let done = RefCell::new(done);
    let report = |i: usize, result: io::Result<()>| (done.borrow_mut())(i, result);
    let mut batch = Batch::new();
    let mut later: Vec<(usize, Transfer<'_>)> = Vec::new();
    let mut guards = Vec::new();
    for (i, op) in ops.into_iter().enumerate() {
        let member = op.member;
        let len = match &op.io {
            Io::Read(buf) => buf.len(),
            Io::Write(buf) => buf.len(),
            Io::Flush => 0,
        };
        if !matches!(op.io, Io::Flush) {
            if let Err(e) = member.check_range(op.offset, len) {
                report(i, Err(e));
                continue;
            }
        }
        let Some(file) = member.local_file() else {
            later.push((i, op));
            continue;
        };
        match op.io {
            Io::Read(buf) if !member.needs_bounce(buf.as_ptr(), buf.len(), op.offset) => {
                guards.push(member.track());
                batch.read(i, file.as_fd(), buf, op.offset);
            }
            Io::Write(buf) if !member.needs_bounce(buf.as_ptr(), buf.len(), op.offset) => {
                guards.push(member.track());
                batch.write(i, file.as_fd(), buf, op.offset);
            }
            Io::Flush if member.flushes_file() => batch.flush(i, file.as_fd()),
            io => later.push((
                i,
                Transfer {
                    member,
                    offset: op.offset,
                    io,
                },
            )),
        }
    }
    let mut later = Some(later);
    let path = batch.run(
        &mut || {
            for (i, op) in later.take().into_iter().flatten() {
                report(i, blocking(op));
            }
        },
        &mut |i, result| report(i, result),
    );
    drop(guards);
    path
}

/// `op` through the member's blocking methods.
fn blocking(op: Transfer<'_>) -> io::Result<()> {
    match op.io {
        Io::Read(buf) => op.member.read_at(buf, op.offset),
        Io::Write(buf) => op.member.write_at(buf, op.offset),
        Io::Flush => op.member.flush(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::member::OpenOptions;
    use nvraid_io::AlignedBuf;
    use std::collections::BTreeMap;

    fn open(path: &std::path::Path, write: bool) -> Member {
        let options = OpenOptions {
            write,
            ..OpenOptions::default()
        };
        Member::open(path.to_str().unwrap(), options).unwrap()
    }

    /// Results by index, errors by kind.
    fn run(ops: Vec<Transfer<'_>>) -> (Path, BTreeMap<usize, Result<(), io::ErrorKind>>) {
        let mut results = BTreeMap::new();
        let path = run_together(ops, &mut |i, r| {
            assert!(
                results.insert(i, r.map_err(|e| e.kind())).is_none(),
                "reported twice"
            );
        });
        (path, results)
    }

    #[test]
    fn files_mem_and_null_members_move_their_bytes_together() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("a");
        std::fs::write(&path, vec![5u8; 1 << 20]).unwrap();
        let file = open(&path, true);
        let mem = Member::open("mem:1M", OpenOptions::default()).unwrap();
        let null = Member::open("null:1M", OpenOptions::default()).unwrap();
        let data = AlignedBuf::zeroed(64 << 10);
        let mut from_file = AlignedBuf::zeroed(64 << 10);
        let mut from_null = vec![7u8; 4096];
        let ops = vec![
            Transfer {
                member: &file,
                offset: 0,
                io: Io::Read(&mut from_file),
            },
            Transfer {
                member: &mem,
                offset: 4096,
                io: Io::Write(&data),
            },
            Transfer {
                member: &null,
                offset: 0,
                io: Io::Read(&mut from_null),
            },
            Transfer {
                member: &file,
                offset: 512 << 10,
                io: Io::Write(&data),
            },
            Transfer {
                member: &file,
                offset: 0,
                io: Io::Flush,
            },
        ];
        let (ran, results) = run(ops);
        assert_eq!(ran, Path::Ring);
        assert_eq!(results.len(), 5);
        assert!(results.values().all(|r| r.is_ok()), "{results:?}");
        assert!(from_file.iter().all(|&b| b == 5));
        assert!(from_null.iter().all(|&b| b == 0));
        let back = std::fs::read(&path).unwrap();
        assert!(back[512 << 10..(512 << 10) + (64 << 10)]
            .iter()
            .all(|&b| b == 0));
        assert_eq!(file.inflight(), 0);
    }

    #[test]
    fn a_failing_member_in_the_batch_fails_alone_as_it_failed_one_by_one() {
        let dir = tempfile::tempdir().unwrap();
        let good = dir.path().join("good");
        let ro = dir.path().join("ro");
        std::fs::write(&good, vec![1u8; 1 << 20]).unwrap();
        std::fs::write(&ro, vec![2u8; 1 << 20]).unwrap();
        let good = open(&good, true);
        // Opened read-only: the kernel refuses its writes (EBADF).
        let read_only = open(&ro, false);
        let data = AlignedBuf::zeroed(64 << 10);
        fn make<'a>(read_only: &'a Member, good: &'a Member, data: &'a [u8]) -> Vec<Transfer<'a>> {
            vec![
                Transfer {
                    member: read_only,
                    offset: 0,
                    io: Io::Write(data),
                },
                Transfer {
                    member: good,
                    offset: 0,
                    io: Io::Write(data),
                },
                // Past the end (1 MiB).
                Transfer {
                    member: good,
                    offset: 2 << 20,
                    io: Io::Write(data),
                },
            ]
        }
        let (ran, together) = run(make(&read_only, &good, &data));
        let (serial_ran, serial) = one_by_one(|| run(make(&read_only, &good, &data)));
        assert_eq!((ran, serial_ran), (Path::Ring, Path::OneByOne));
        // The same member fails the same way either way; past the end is
        // refused before any I/O.
        let kind = together[&0].unwrap_err();
        assert_eq!(serial[&0], Err(kind));
        assert_eq!(together[&1], Ok(()));
        assert_eq!(together[&2], Err(io::ErrorKind::InvalidInput));
        assert_eq!(serial, together);
        assert_eq!(
            std::fs::read(dir.path().join("ro")).unwrap(),
            vec![2u8; 1 << 20]
        );
    }
}
