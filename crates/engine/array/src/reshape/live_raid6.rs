//! A served RAID 5 of N becoming md's RAID 6 of N + 1 with a member added
//! (`nvraid grow --socket CTL --level 6 -n N+1 --add NEW`), as `add_q`
//! does offline: md's takeover to the `-6` layout of the same rotation
//! (or parity-last), which keeps every data chunk and P where the RAID 5
//! has them and puts Q on the new last member, then Q rebuilt there like
//! a member recovering.
//!
//! No byte of the first N members moves, so the served RAID 5 map stays
//! right for data and P (the array's own path reads and writes them, and
//! reads around a member that fails as a RAID 5 does); what the grow adds
//! is Q:
//!
//! - **The record.** Every superblock update of the running array records
//!   level 6, the `-6` layout and N + 1 members, the new member in role N;
//!   its own superblock is written in each update too, recovering
//!   (`RECOVERY_OFFSET`, its `recovery_offset` the rows whose Q is
//!   written), then in sync once the last row's Q is.
//! - **The route.** Reads go to the array. A write goes to the array
//!   (data and P), then, for its stripes below the position, Q is
//!   computed from the stripe's data as it now stands and written to the
//!   new member, under the stripe's lock taken after the data write (the
//!   last of two writes to one stripe to take the lock reads both).
//! - **A step** closes `[P, P')` to client requests, waits for those that
//!   started before it, reads the stripes' data through the array,
//!   writes their Q, flushes the new member, records `P'`, opens the
//!   window.
//!
//! The new member failing is recorded faulty (the array is then md's
//! RAID 6 with its Q role missing, which a later `nvraid add` fills); the
//! rebuild stops. A crash or a stop leaves md's RAID 6 with the Q member
//! part-way through its recovery, which the next `serve` (or md) goes on
//! rebuilding from its recovery offset.

use super::grow::{free_dev_numbers, new_member_superblock};
use super::live::{
    check_settled, open_added, write_added_superblock, GrowPace, LiveGrowOptions, LiveGrowStatus,
    Pacing, Progress, STRIPE_LOCKS,
};
use super::live_copy::LiveReshape;
use crate::array::{Array, LiveRoute};
use crate::error::{Error, Result};
use crate::members::{Companion, ReshapeRecord, Update};
use nvraid_io::queue::OpKind;
use nvraid_io::AlignedBuf;
use nvraid_layout::{Geometry, Level};
use nvraid_member::Member;
use nvraid_metadata::{features, Role, Superblock};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::thread::JoinHandle;
use std::time::Instant;

/// A served RAID 5 taking Q on an added member (see the module's text).
#[derive(Debug)]
pub struct LiveQ {
    old_members: u32,
    /// The RAID 6 the array becomes.
    raid6: Geometry,
    /// The new member (role `old_members`) and its superblock as first
    /// made (each update puts its state in).
    member: Member,
    sb: Mutex<Superblock>,
    failed: AtomicBool,
    /// Where its data starts on it.
    data_offset: u64,
    /// Its role table entry: (device, entry).
    table_entry: (usize, u16),
    /// The recorded position in array bytes (whole stripes), and whether
    /// the member is recorded in sync.
    record: Mutex<(u64, bool)>,
    gate: super::live::Gate,
    stripes: Vec<Mutex<()>>,
    progress: Mutex<Progress>,
    step_bytes: u64,
    pacing: Pacing,
}

impl LiveQ {
    /// Check that the served `array` (a whole RAID 5 of N, served
    /// writable, nothing recovering, no partial parity log or journal) can
    /// become a RAID 6 of N + 1 with `options.add`'s one member as Q,
    /// record it on every member (the new one first) and route client
    /// requests through it; Q's rebuild runs on a thread of its own, which
    /// is returned. Refused, with nothing written: the above, a RAID 4
    /// (md takes it over as RAID 5 first), a count other than N + 1 or
    /// other than one `--add`, a new member too small, carrying a
    /// signature or a member already.
    pub fn start(
        array: &Arc<Array>,
        options: &LiveGrowOptions,
    ) -> Result<(Arc<LiveQ>, JoinHandle<()>)> {
        let spec0 = array
            .slot(0)
            .map_or("(missing)", |s| s.member.spec())
            .to_string();
        let refuse = |what: String| Error::Unsupported {
            spec: spec0.clone(),
            what,
        };
        super::live::refuse_second(array, &spec0, "reshape")?;
        if !array.is_writable() {
            return Err(Error::ReadOnly);
        }
        let old = array.geometry().clone();
        let reference = array.superblock().clone();
        let Level::Raid5 { layout } = old.level() else {
            return Err(refuse(format!(
                "a served {} as a RAID 6 with a member added: md adds Q this way to a RAID 5 only",
                old.level()
            )));
        };
        if reference.level == 4 {
            return Err(refuse(
                "a RAID 4 (md level 4) as a RAID 6: md takes a RAID 4 over as RAID 5 first (`nvraid grow --socket CTL --level 5`)".into(),
            ));
        }
        if array.is_degraded() || (0..array.roles()).any(|r| !array.is_usable(r)) {
            return Err(Error::NotStartable(
                "the array is degraded; nvraid adds Q only to a whole RAID 5: rebuild it first"
                    .into(),
            ));
        }
        check_settled(array)?;
        if array.ppl.is_some() || array.md_journal.is_some() {
            return Err(refuse(
                "a RAID 5 with md's partial parity log or write journal as a RAID 6 (stop serve and drop it first)".into(),
            ));
        }
        let n = old.members();
        if options.add.len() != 1 || options.raid_devices != n + 1 {
            return Err(Error::BadOption {
                option: "--raid-devices".into(),
                why: format!(
                    "{} with {} member(s) added: a RAID 5 of {n} becomes a RAID 6 of {} with exactly one --add (its Q)",
                    options.raid_devices,
                    options.add.len(),
                    n + 1
                ),
            });
        }
        let new_layout =
            super::takeover::raid6_layout_for(layout).expect("RAID 5 layouts all have one");
        let raid6 = Geometry::new(
            Level::Raid6 { layout: new_layout },
            n + 1,
            old.chunk_bytes().expect("RAID 5 has chunks"),
            old.member_used_bytes(),
        )?;
        assert_eq!(
            raid6.array_bytes(),
            old.array_bytes(),
            "invariant: a takeover keeps the array's size"
        );
        let map = raid6.level().stripe_map(n + 1).expect("RAID 6");
        // The served RAID 5 map is the RAID 6's for data and P (checked
        // on the first stripes and the last, as `live_level` checks its
        // takeovers), and Q is on the new member.
        let old_map = old.level().stripe_map(n).expect("RAID 5");
        let stripes = old.member_used_bytes() / old.chunk_bytes().expect("chunks");
        for s in (0..2 * u64::from(n + 1)).chain(stripes.saturating_sub(1)..stripes) {
            let (a, b) = (old_map.stripe(s), map.stripe(s));
            assert!(
                a.data == b.data && a.p == b.p && b.q == Some(n),
                "invariant: md's -6 layout keeps the RAID 5's data and P (stripe {s})"
            );
        }
        let mut adding = open_added(array, options, &reference, &old)?;
        let member = adding.pop().expect("one --add");
        // Nothing written before this line.
        let dev = free_dev_numbers(&reference, 1)?[0];
        let mut sb = new_member_superblock(&member, &reference, dev)?;
        sb.level = 6;
        sb.layout = new_layout.to_md();
        sb.raid_disks = n + 1;
        super::live::ready_added(array, &member, &sb)?;
        let live = Arc::new(LiveQ {
            old_members: n,
            data_offset: sb.data_offset_sectors * 512,
            raid6,
            member,
            sb: Mutex::new(sb),
            failed: AtomicBool::new(false),
            table_entry: (dev as usize, Role::Active(n as u16).to_raw()),
            record: Mutex::new((0, false)),
            gate: super::live::Gate::default(),
            stripes: (0..STRIPE_LOCKS).map(|_| Mutex::new(())).collect(),
            progress: Mutex::new(Progress {
                state: "running",
                error: None,
                started: Instant::now(),
                start_position: 0,
            }),
            step_bytes: options.step_bytes,
            pacing: Pacing::new(options.min_bytes_per_sec, options.max_bytes_per_sec),
        });
        array.mark_dirty()?;
        // The new member first, one event ahead of the others until those
        // are written.
        live.write_member(array.events() + 1, None, &array.role_table_now())
            .map_err(|e| Error::io(live.member.spec(), e))?;
        if !array.set_reshape_record(live.clone()) {
            return Err(refuse("a second reshape on this served array".into()));
        }
        let thread = super::live::route_and_run(
            array,
            &live,
            "nvraid-add-q",
            "no rebuild thread",
            LiveQ::run,
            super::live::OnFailure::Forget {
                added: vec![&live.member],
            },
        )?;
        Ok((live, thread))
    }

    /// Array bytes per stripe.
    fn unit(&self) -> u64 {
        self.raid6.chunk_bytes().expect("chunks") * u64::from(self.old_members - 1)
    }

    fn run(self: Arc<Self>, array: Weak<Array>) {
        let outcome = self.steps(&array);
        self.progress
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .ended(outcome, "stopped (the server is stopping); the Q member is recorded recovering, and its rebuild goes on when the array is served again");
    }

    fn steps(&self, array: &Weak<Array>) -> Result<bool> {
        let end = self.raid6.array_bytes();
        let unit = self.unit();
        let step = (self.step_bytes.min(4 << 20) / unit).max(1) * unit;
        let mut pace = GrowPace::open(&self.pacing);
        loop {
            let p = self.gate.position();
            if p >= end {
                break;
            }
            if !pace.may_step(&self.pacing) {
                return Ok(false);
            }
            let Some(array) = array.upgrade() else {
                return Ok(false);
            };
            let to = (p + step).min(end);
            self.gate.close_window(p, to);
            let written = self.write_q(&array, p / unit, to / unit).and_then(|()| {
                self.member
                    .flush()
                    .map_err(|e| Error::io(self.member.spec(), e))
            });
            if let Err(e) = written {
                let e = self.q_failed(&array, e);
                self.gate.open_window(None);
                return Err(e);
            }
            *self.record.lock().unwrap_or_else(|p| p.into_inner()) = (to, to >= end);
            if let Err(e) = array.rewrite_superblocks() {
                self.gate.open_window(None);
                return Err(e);
            }
            if self.failed.load(Ordering::Acquire) {
                self.gate.open_window(None);
                return Err(self.q_failed_error());
            }
            crate::failpoint::hit("reshape-superblock");
            self.gate.open_window(Some(to));
            pace.moved(&self.pacing, to - p);
        }
        Ok(true)
    }

    /// Q of stripes `[first, end)` computed from their data as the array
    /// reads it now, written to the new member (not flushed).
    fn write_q(&self, array: &Array, first: u64, end: u64) -> Result<()> {
        let unit = self.unit();
        let chunk = self.raid6.chunk_bytes().expect("chunks");
        let c = chunk as usize;
        let map = self
            .raid6
            .level()
            .stripe_map(self.raid6.members())
            .expect("RAID 6");
        let rows = (end - first) as usize;
        let mut data = AlignedBuf::zeroed(rows * unit as usize);
        array.read_at(&mut data, first * unit)?;
        let mut q = AlignedBuf::zeroed(rows * c);
        let mut p = vec![0u8; c];
        let kernel = nvraid_parity::Kernel::best();
        for (i, s) in (first..end).enumerate() {
            let stripe = &data[i * unit as usize..(i + 1) * unit as usize];
            let mut ordered: Vec<&[u8]> = vec![&[]; self.old_members as usize - 1];
            for d in 0..self.old_members - 1 {
                ordered[map.q_slot(s, d)] = &stripe[d as usize * c..(d as usize + 1) * c];
            }
            nvraid_parity::gen_pq(kernel, &ordered, &mut p, &mut q[i * c..(i + 1) * c]);
        }
        self.member
            .write_at(&q, self.data_offset + first * chunk)
            .map_err(|e| Error::io(self.member.spec(), e))
    }

    /// The new member's I/O failed with `error`: it is recorded faulty
    /// (the array is md's RAID 6 with its Q missing) and the error to stop
    /// the rebuild with returned.
    fn q_failed(&self, array: &Array, error: Error) -> Error {
        if !self.failed.swap(true, Ordering::AcqRel) {
            eprintln!("nvraid: {error}; the Q member is marked faulty");
            if let Err(e) = array.rewrite_superblocks() {
                eprintln!("nvraid: the superblocks recording it faulty: {e}");
            }
        }
        self.q_failed_error()
    }

    fn q_failed_error(&self) -> Error {
        Error::NotStartable(format!(
            "{} failed while Q was rebuilt on it and is recorded faulty: the array is a RAID 6 with its Q role missing (no data lost; `nvraid add` a member to rebuild it)",
            self.member.spec()
        ))
    }

    fn write(&self, array: &Array, offset: u64, buf: &[u8], fua: bool) -> Result<()> {
        let len = buf.len() as u64;
        let (epoch, position) = self.gate.enter(offset, len);
        let done = (|| {
            array.write_at(buf, offset, fua)?;
            let below = position.clamp(offset, offset + len);
            if below > offset && !self.failed.load(Ordering::Acquire) {
                let unit = self.unit();
                for s in offset / unit..=(below - 1) / unit {
                    let _lock = self.stripes[(s % STRIPE_LOCKS) as usize]
                        .lock()
                        .unwrap_or_else(|p| p.into_inner());
                    let mut written = self.write_q(array, s, s + 1);
                    if written.is_ok() && fua {
                        written = self
                            .member
                            .flush()
                            .map_err(|e| Error::io(self.member.spec(), e));
                    }
                    if let Err(e) = written {
                        // The client's data and P are written: its write
                        // stands, the array goes on without Q.
                        self.q_failed(array, e);
                        break;
                    }
                }
            }
            Ok(())
        })();
        self.gate.leave(epoch);
        done
    }

    /// The new member's superblock with `events` (and the update's resync
    /// offset and time once known), recovering behind the position until
    /// it is recorded in sync.
    fn write_member(
        &self,
        events: u64,
        update: Option<&Update<'_>>,
        table: &[u16],
    ) -> std::io::Result<()> {
        if self.failed.load(Ordering::Acquire) {
            return Ok(());
        }
        let (position, finished) = *self.record.lock().unwrap_or_else(|p| p.into_inner());
        let mut written = self.sb.lock().unwrap_or_else(|p| p.into_inner()).clone();
        if finished {
            written.feature_map &= !features::RECOVERY_OFFSET;
            written.recovery_offset = 0;
        } else {
            let chunk = self.raid6.chunk_bytes().expect("chunks");
            written.feature_map |= features::RECOVERY_OFFSET;
            written.recovery_offset = position / self.unit() * chunk / 512;
        }
        written.roles_raw = table.to_vec();
        self.role_table(&mut written.roles_raw);
        write_added_superblock(&self.member, &mut written, events, update)
    }
}

impl LiveReshape for LiveQ {
    fn stop(&self) {
        self.pacing.stop();
    }

    fn status(&self) -> LiveGrowStatus {
        let position = self.gate.position();
        let end = self.raid6.array_bytes();
        let progress = self.progress.lock().unwrap_or_else(|p| p.into_inner());
        let secs = progress.started.elapsed().as_secs_f64();
        let moved = position.saturating_sub(progress.start_position);
        let rate = if secs > 0.0 {
            (moved as f64 / secs) as u64
        } else {
            0
        };
        LiveGrowStatus {
            kind: "add-q",
            state: progress.state,
            raid_disks_before: self.old_members,
            raid_disks: self.raid6.members(),
            position_bytes: position,
            end_bytes: end,
            bytes_per_sec: rate,
            eta_seconds: (rate > 0 && progress.state == "running")
                .then(|| (end - position.min(end)) / rate),
            error: progress.error.clone(),
            new_size_bytes: end,
        }
    }
}

impl LiveRoute for LiveQ {
    fn io(
        &self,
        array: &Array,
        op: OpKind,
        offset: u64,
        buf: &mut [u8],
        fua: bool,
    ) -> std::result::Result<(), i32> {
        let errno = |e: Error| match e {
            Error::Io { source, .. } => source.raw_os_error().unwrap_or(libc::EIO),
            _ => libc::EIO,
        };
        let _busy = self.pacing.request();
        match op {
            OpKind::Read => array.read_at(buf, offset).map_err(errno),
            OpKind::Write => self.write(array, offset, buf, fua).map_err(errno),
            OpKind::Flush => {
                array.flush().map_err(errno)?;
                if !self.failed.load(Ordering::Acquire) {
                    if let Err(e) = self.member.flush() {
                        self.q_failed(array, Error::io(self.member.spec(), e));
                    }
                }
                Ok(())
            }
            // A discard may leave the old data (the Target's contract).
            OpKind::Discard => Ok(()),
        }
    }
}

impl Companion for LiveQ {
    fn after_superblocks(&self, update: &Update<'_>) -> Result<()> {
        if let Err(e) = self.write_member(update.events, Some(update), update.roles_raw) {
            // The RAID 5's members hold every byte: the Q member is let go
            // (recorded faulty by the next update) and the update stands.
            self.failed.store(true, Ordering::Release);
            eprintln!(
                "nvraid: {}: {e} while its superblock was written; the Q member is marked faulty",
                self.member.spec()
            );
        }
        Ok(())
    }

    fn role_table(&self, table: &mut [u16]) {
        let (dev, entry) = self.table_entry;
        if let Some(slot) = table.get_mut(dev) {
            *slot = if self.failed.load(Ordering::Acquire) {
                Role::Faulty.to_raw()
            } else {
                entry
            };
        }
    }
}

impl ReshapeRecord for LiveQ {
    fn apply(&self, _role: usize, sb: &mut Superblock) {
        sb.level = 6;
        sb.layout = match self.raid6.level() {
            Level::Raid6 { layout } => layout.to_md(),
            _ => unreachable!("a RAID 6"),
        };
        sb.raid_disks = self.raid6.members();
    }
}
