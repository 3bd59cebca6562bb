//! mdadm's `--backup-file`: the critical section of a grow in place kept
//! in a file outside the array, in mdadm's format, both ways.
//!
//! | file bytes | what |
//! |---|---|
//! | `[0, 512)` | the record (`md_backup_data-1` or `-2`, the array's UUID, a time, the copy's sector in the file (8), its first array sector, its length in sectors, mdadm's checksum; a `-2` record a second copy too) |
//! | `[4096, 4096 + L)` | the section's `L` array bytes, in array order |
//! | `[4096 + L, 4096 + L + 512)` | the record again |
//!
//! - **Writing** (`nvraid grow --backup-file FILE`, a RAID 4/5/6 grown in
//!   place): the file is made (refused when it exists, as mdadm refuses
//!   it), the whole section's array bytes copied in, flushed, then both
//!   records, flushed; all before the superblocks record the reshape (an
//!   offline grow changes no array byte, so the copy stays right until
//!   the section is done). Forgotten (the record rewritten with length 0)
//!   before the first step past the section; removed when the grow ends.
//! - **Reading** (`nvraid grow --continue --backup-file FILE`): checked as
//!   mdadm's `Grow_restart` checks it (magic, checksums, the array's UUID,
//!   the time against the array's, the leading copy of the record, the
//!   position inside what it holds), each refusal naming the file, before
//!   anything is written; then its bytes are written in the new shape,
//!   with parity, and the position is taken to the end of what it holds.

use super::degraded::Failed;
use super::grow::Placed;
use super::step::{read_around, write_stripes, Unreadable};
use crate::error::{Error, Result};
use nvraid_io::AlignedBuf;
use nvraid_layout::{Direction, Reshape};
use nvraid_metadata::Timestamp;
use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

/// Where the section's bytes start in the file (mdadm's 8 sectors).
const DATA_AT: u64 = 4096;
/// A record's bytes.
const RECORD: usize = 512;
/// The most of the section read and written at once.
const PIECE: u64 = 16 << 20;

fn refuse(path: &Path, why: impl std::fmt::Display) -> Error {
    Error::BadOption {
        option: "--backup-file".into(),
        why: format!("{}: {why}", path.display()),
    }
}

/// A backup file a grow in place writes: the section `[0, end)`.
#[derive(Debug)]
pub(super) struct BackupFile {
    path: PathBuf,
    file: File,
    uuid: [u8; 16],
    end: u64,
}

impl BackupFile {
    /// Make the file for `reshape` (a forwards grow in place of a RAID
    /// 4/5/6 at position 0): refused, nothing made, when it exists or the
    /// section cannot be told.
    pub(super) fn create(path: &Path, uuid: [u8; 16], reshape: &Reshape) -> Result<BackupFile> {
        let Some(end) = super::md_backup::section_end(reshape)
            .filter(|&end| end <= reshape.old().array_bytes())
        else {
            return Err(refuse(
                path,
                "this array's critical section runs past its old end (an array this small has no section mdadm can restore)",
            ));
        };
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .open(path)
            .map_err(|e| refuse(path, format!("cannot create it ({e}); mdadm and nvraid make a new file, so name one that does not exist")))?;
        Ok(BackupFile {
            path: path.to_path_buf(),
            file,
            uuid,
            end,
        })
    }

    /// The section's end: where the grow forgets the file.
    pub(super) fn end(&self) -> u64 {
        self.end
    }

    pub(super) fn path(&self) -> &Path {
        &self.path
    }

    fn io(&self, e: std::io::Error) -> Error {
        refuse(&self.path, format!("cannot write it: {e}"))
    }

    /// Copy the section's array bytes (read through `reshape`'s map, the
    /// members `failed` read around) to the file, flushed, then both
    /// records, flushed.
    pub(super) fn write(
        &mut self,
        placed: &[Placed],
        failed: &Failed,
        reshape: &Reshape,
    ) -> Result<()> {
        let members: Vec<&nvraid_member::Member> = placed.iter().map(|p| &p.member).collect();
        let (old, new) = failed.unreadable();
        let unreadable = Unreadable { old: &old, new };
        let mut data = AlignedBuf::zeroed(PIECE.min(self.end) as usize);
        // mdadm's file starts zeroed: the record's place holds nothing
        // until the copy is whole.
        self.file.set_len(0).map_err(|e| self.io(e))?;
        self.file
            .set_len(DATA_AT + self.end + RECORD as u64)
            .map_err(|e| self.io(e))?;
        let mut at = 0;
        while at < self.end {
            let len = PIECE.min(self.end - at) as usize;
            read_around(reshape, &members, unreadable, &mut data[..len], at)
                .map_err(|f| f.error)?;
            self.write_at(&data[..len], DATA_AT + at)?;
            at += len as u64;
        }
        self.file.sync_all().map_err(|e| self.io(e))?;
        crate::failpoint::hit("reshape-backup-file");
        let record = record(&self.uuid, 0, self.end);
        self.write_at(&record, 0)?;
        self.write_at(&record, DATA_AT + self.end)?;
        self.file.sync_all().map_err(|e| self.io(e))?;
        crate::failpoint::hit("reshape-backup-file");
        Ok(())
    }

    /// Rewrite the record with length 0 (mdadm's way of saying the
    /// section is done), flushed.
    pub(super) fn forget(&mut self) -> Result<()> {
        let record = record(&self.uuid, 0, 0);
        self.write_at(&record, 0)?;
        self.file.sync_all().map_err(|e| self.io(e))?;
        crate::failpoint::hit("reshape-backup-file");
        Ok(())
    }

    fn write_at(&mut self, buf: &[u8], at: u64) -> Result<()> {
        self.file
            .seek(SeekFrom::Start(at))
            .and_then(|_| self.file.write_all(buf))
            .map_err(|e| self.io(e))
    }
}

/// A record in mdadm's format for a copy of `len` array bytes from
/// `arraystart` at the file's byte 4096.
fn record(uuid: &[u8; 16], arraystart: u64, len: u64) -> [u8; RECORD] {
    let mut r = [0u8; RECORD];
    r[0..16].copy_from_slice(b"md_backup_data-1");
    r[16..32].copy_from_slice(uuid);
    r[32..40].copy_from_slice(&Timestamp::now().seconds.to_le_bytes());
    r[40..48].copy_from_slice(&(DATA_AT / 512).to_le_bytes());
    r[48..56].copy_from_slice(&(arraystart / 512).to_le_bytes());
    r[56..64].copy_from_slice(&(len / 512).to_le_bytes());
    r[64..68].copy_from_slice(&super::md_backup::checksum(64).to_le_bytes());
    r
}

fn le64(r: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(r[at..at + 8].try_into().expect("8 bytes"))
}

fn le32(r: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(r[at..at + 4].try_into().expect("4 bytes"))
}

/// One copy a record describes: array bytes `[start, start + len)` at
/// file byte `at`.
#[derive(Clone, Copy, Debug)]
struct Copy {
    at: u64,
    start: u64,
    len: u64,
}

/// Whether `reshape` is a grow in place still inside its critical
/// section, where the old rows the next steps overwrite are kept nowhere
/// but in a backup.
pub(super) fn inside_section(reshape: &Reshape) -> bool {
    reshape.direction() == Direction::Forwards
        && reshape.new_shape().members() > reshape.old().members()
        && reshape.new_shape().level().parity_chunks() > 0
        && (0..reshape.old().members()).all(|r| {
            reshape.data_offset(nvraid_layout::Shape::Old, r)
                == reshape.data_offset(nvraid_layout::Shape::New, r)
        })
        && super::md_backup::section_end(reshape).is_some_and(|end| reshape.position() < end)
}

/// Restore the critical section of `reshape` from the backup file at
/// `path`, as mdadm's `Grow_restart` does: every check first (each
/// refusal names the file; nothing is written), then the copy's bytes
/// written in the new shape with their parity. Returns the position the
/// copy takes the reshape to, or `None` when the file holds nothing the
/// position needs (mdadm's "not needed"; refused when the position is
/// inside the critical section, which then needs it). `utime` is the
/// array's last update.
pub(super) fn restore(
    path: &Path,
    placed: &[Placed],
    failed: &Failed,
    reshape: &Reshape,
    uuid: &[u8; 16],
    utime: Timestamp,
) -> Result<Option<u64>> {
    let Some(mut checked) = check(path, reshape, uuid, utime)? else {
        return Ok(None);
    };
    let (file, copies, unit) = (&mut checked.file, &checked.copies, checked.unit);
    // Every check passed: the bytes written in the new shape.
    let members: Vec<&nvraid_member::Member> = placed.iter().map(|p| &p.member).collect();
    let (_, new_failed) = failed.unreadable();
    let kernel = nvraid_parity::Kernel::best();
    for c in copies {
        let mut done = 0;
        while done < c.len {
            let len = (PIECE / unit * unit).max(unit).min(c.len - done);
            let mut data = AlignedBuf::zeroed(len as usize);
            file.seek(SeekFrom::Start(c.at + done))
                .and_then(|_| file.read_exact(&mut data))
                .map_err(|e| refuse(path, format!("cannot read its copy: {e}")))?;
            write_stripes(
                reshape,
                &members,
                (c.start + done) / unit,
                &data,
                new_failed,
                kernel,
                &|| crate::failpoint::hit("reshape-write"),
            )
            .map_err(|f| f.error)?;
            done += len;
        }
    }
    // The position as mdadm sets it: past the copies when it lies in them.
    let position = reshape.position();
    let lo = copies.iter().map(|c| c.start).min().expect("a copy");
    let hi = copies
        .iter()
        .map(|c| c.start + c.len)
        .max()
        .expect("a copy");
    if position < lo || position > hi {
        return Ok(Some(position));
    }
    Ok(Some(hi))
}

/// A backup file that passed mdadm's checks: its copies (none empty).
pub(super) struct Checked {
    file: File,
    copies: Vec<Copy>,
    unit: u64,
}

impl Checked {
    /// Put the array bytes the copies hold over `buf` (array bytes from
    /// `offset`).
    pub(super) fn overlay(&self, buf: &mut [u8], offset: u64) -> Result<()> {
        use std::os::unix::fs::FileExt;
        let end = offset + buf.len() as u64;
        for c in &self.copies {
            let (from, to) = (offset.max(c.start), end.min(c.start + c.len));
            if from < to {
                let part = &mut buf[(from - offset) as usize..(to - offset) as usize];
                self.file
                    .read_exact_at(part, c.at + from - c.start)
                    .map_err(|e| Error::io("--backup-file", e))?;
            }
        }
        Ok(())
    }
}

/// mdadm's checks of the backup file at `path` for `reshape` (see
/// [`restore`]); `None` when the position does not need it.
pub(super) fn check(
    path: &Path,
    reshape: &Reshape,
    uuid: &[u8; 16],
    utime: Timestamp,
) -> Result<Option<Checked>> {
    let needed = inside_section(reshape);
    let mut file = match File::open(path) {
        Ok(f) => f,
        Err(e) if !needed && e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(refuse(path, format!("cannot open it: {e}"))),
    };
    let mut r = [0u8; RECORD];
    file.read_exact(&mut r)
        .map_err(|e| refuse(path, format!("cannot read its record: {e}")))?;
    let two = match &r[0..16] {
        b"md_backup_data-1" => false,
        b"md_backup_data-2" => true,
        _ => {
            return Err(refuse(
                path,
                "no mdadm backup record (md_backup_data-1/-2) at its start",
            ))
        }
    };
    use super::md_backup::checksum;
    if le32(&r, 64) != checksum(64) || (two && le32(&r, 96) != checksum(96)) {
        return Err(refuse(path, "its record's checksum is wrong"));
    }
    if &r[16..32] != uuid {
        return Err(refuse(
            path,
            format!(
                "it is the backup of array {}, not of this array {}",
                nvraid_metadata::format_uuid(r[16..32].try_into().expect("16 bytes")),
                nvraid_metadata::format_uuid(uuid)
            ),
        ));
    }
    // mdadm's window: the array updated at most two hours after the copy
    // was made, or ten minutes before (MDADM_GROW_ALLOW_OLD lifts it).
    let mtime = le64(&r, 32) as i64;
    let u = utime.seconds as i64;
    if (u > mtime + 2 * 60 * 60 || u < mtime - 10 * 60)
        && std::env::var_os("MDADM_GROW_ALLOW_OLD").is_none()
    {
        return Err(refuse(
            path,
            format!("its time ({mtime}) is too far from the array's last update ({u}), as mdadm judges it: an older backup of this array (export MDADM_GROW_ALLOW_OLD=1 to take it anyway)"),
        ));
    }
    let devstart = le64(&r, 40) * 512;
    let mut copies = vec![Copy {
        at: devstart,
        start: le64(&r, 48) * 512,
        len: le64(&r, 56) * 512,
    }];
    if two {
        copies.push(Copy {
            at: devstart + le64(&r, 72) * 512,
            start: le64(&r, 80) * 512,
            len: le64(&r, 88) * 512,
        });
    }
    copies.retain(|c| c.len > 0);
    let position = reshape.position();
    let stale = copies.iter().all(|c| c.start + c.len < position);
    if copies.is_empty() || stale || reshape.direction() != Direction::Forwards {
        if needed {
            return Err(refuse(
                path,
                format!(
                    "it holds {} and the reshape, at {position} bytes, is inside its critical section: that needs the file the grow wrote last (of this position), not an older one",
                    match copies.first() {
                        None => "no copy (its section was done)".to_string(),
                        Some(c) => format!("array bytes [{}, {})", c.start, c.start + c.len),
                    }
                ),
            ));
        }
        return Ok(None);
    }
    // The leading copy of the record, 4 KiB before the bytes.
    let mut lead = [0u8; RECORD];
    file.seek(SeekFrom::Start(devstart.saturating_sub(4096)))
        .and_then(|_| file.read_exact(&mut lead))
        .map_err(|e| refuse(path, format!("cannot read its leading record: {e}")))?;
    let compared = if two { 100 } else { 68 };
    if devstart < 4096 || lead[..compared] != r[..compared] {
        return Err(refuse(path, "its leading record differs from its record"));
    }
    let new = reshape.new_shape();
    let unit =
        new.chunk_bytes().unwrap_or(0) * u64::from(new.members() - new.level().parity_chunks());
    let file_len = file.metadata().map(|m| m.len()).unwrap_or(0);
    for c in &copies {
        if unit == 0
            || c.start % unit != 0
            || c.len % unit != 0
            || c.start + c.len > new.array_bytes()
        {
            return Err(refuse(
                path,
                format!(
                    "its copy of array bytes [{}, {}) is not whole stripes of the new shape",
                    c.start,
                    c.start + c.len
                ),
            ));
        }
        if c.at + c.len > file_len {
            return Err(refuse(
                path,
                format!(
                    "it is cut short ({file_len} bytes; its copy ends at {})",
                    c.at + c.len
                ),
            ));
        }
    }
    Ok(Some(Checked { file, copies, unit }))
}
