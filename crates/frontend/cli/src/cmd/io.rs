//! `nvraid write` and `nvraid read`: copy bytes into and out of an array.
//!
//! Both stream through one page-aligned buffer of [`BLOCK_BYTES`], so member
//! I/O stays O_DIRECT-friendly. The whole range is checked before the first
//! byte moves: a write that would run past the end of the array is refused
//! with nothing written (input from a pipe is first spooled to an unnamed
//! temporary file to learn its length).

use super::size_arg;
use anyhow::{bail, Context, Result};
use clap::Args;
use nvraid_array::reshape::MidReshape;
use nvraid_array::{assemble, Array, AssembleOptions};
use nvraid_io::AlignedBuf;
use std::fs::File;
use std::io::{self, Read, Seek, SeekFrom, Write};

/// Transfer unit: large enough to keep every member of a wide RAID 0 busy.
const BLOCK_BYTES: usize = 4 << 20;

#[derive(Args, Debug)]
pub struct WriteArgs {
    /// Array offset to write at (a multiple of the array's sector size).
    #[arg(long, default_value = "0", value_parser = size_arg)]
    offset: u64,
    /// Read the data from this file instead of stdin.
    #[arg(long, short = 'i')]
    input: Option<String>,
    /// Make the data durable before exiting (flush every member).
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    sync: bool,
    /// Write even when members are missing or set aside (a RAID 1/10 that
    /// still has a copy of every block). Their roles are recorded as faulty
    /// on the members written, so they are never taken as in sync again.
    #[arg(long)]
    degraded: bool,
    /// Members of the array, in any order.
    #[arg(required = true)]
    members: Vec<String>,
}

#[derive(Args, Debug)]
pub struct ReadArgs {
    /// Array offset to read from.
    #[arg(long, default_value = "0", value_parser = size_arg)]
    offset: u64,
    /// Bytes to read (default: to the end of the array).
    #[arg(long, value_parser = size_arg)]
    length: Option<u64>,
    /// Write the data to this file instead of stdout.
    #[arg(long, short = 'o')]
    output: Option<String>,
    /// Members of the array, in any order.
    /// mdadm's backup file of a grow in place stopped inside its critical
    /// section (`nvraid grow --backup-file`, or mdadm's): the section's
    /// bytes read from it (checked as `grow --continue` checks it).
    #[arg(long = "backup-file", value_name = "FILE")]
    backup_file: Option<std::path::PathBuf>,
    #[arg(required = true)]
    members: Vec<String>,
}

/// Open the input as a seekable file with a known length. A regular file
/// is used as it is; anything else (a pipe, stdin, a character device such
/// as `/dev/zero`) is copied into a spool file, at most `room` bytes (what
/// the array holds from the offset): more is refused, naming the input,
/// before anything is written.
fn open_input(path: Option<&str>, room: u64) -> Result<(File, u64)> {
    let name = path.unwrap_or("stdin");
    let opened: Option<File> = match path {
        Some(p) => Some(File::open(p).with_context(|| format!("{p}: cannot open input"))?),
        None if std::fs::metadata("/proc/self/fd/0").is_ok_and(|m| m.is_file()) => {
            Some(File::open("/proc/self/fd/0").context("stdin: cannot reopen")?)
        }
        None => None,
    };
    let mut file = if let Some(file) = opened
        .as_ref()
        .filter(|f| f.metadata().is_ok_and(|m| m.is_file()))
    {
        file.try_clone().context("reopening the input")?
    } else {
        let mut spool = tempfile::tempfile().context("cannot create a spool file for the input")?;
        let source: Box<dyn Read> = match opened {
            Some(file) => Box::new(file),
            None => Box::new(io::stdin().lock()),
        };
        let copied = io::copy(&mut source.take(room.saturating_add(1)), &mut spool)
            .with_context(|| format!("{name}: reading the input"))?;
        if copied > room {
            bail!("{name}: more than the {room} bytes the array holds from the offset; nothing written");
        }
        spool
    };
    let len = file.seek(SeekFrom::End(0))?;
    file.seek(SeekFrom::Start(0))?;
    Ok((file, len))
}

pub fn write(args: &WriteArgs, direct: bool) -> Result<u8> {
    // The array's size bounds what is read from a stream (a read-only
    // assembly: it writes nothing).
    let room = assemble(&args.members, super::read_only(direct))?
        .size_bytes()
        .saturating_sub(args.offset);
    let (mut input, len) = open_input(args.input.as_deref(), room)?;
    let array = assemble(
        &args.members,
        AssembleOptions {
            writable: true,
            direct,
            allow_degraded: args.degraded,
        },
    )
    .map_err(|e| match e {
        nvraid_array::Error::NotStartable(why) if !args.degraded && why.contains("degraded") => {
            anyhow::anyhow!(
                "array cannot start: {why}; give --degraded to write anyway (the missing roles are then recorded as faulty)"
            )
        }
        e => e.into(),
    })?;
    let size = array.size_bytes();
    let sector = u64::from(array.sector_bytes());
    if !args.offset.is_multiple_of(sector) {
        bail!(
            "offset {} is not a multiple of the array's {sector}-byte sector",
            args.offset
        );
    }
    if args.offset.checked_add(len).is_none_or(|end| end > size) {
        bail!("writing {len} bytes at offset {} would pass the end of the array ({size} bytes); nothing written", args.offset);
    }
    copy_in(&array, &mut input, args.offset, len)?;
    if args.sync {
        array.flush()?;
    }
    array.close()?;
    eprintln!("nvraid: wrote {len} bytes at offset {}", args.offset);
    Ok(0)
}

fn copy_in(array: &Array, input: &mut File, offset: u64, len: u64) -> Result<()> {
    let sector = array.sector_bytes() as usize;
    let mut buf = AlignedBuf::zeroed(BLOCK_BYTES);
    let mut done = 0u64;
    while done < len {
        let want = (len - done).min(BLOCK_BYTES as u64) as usize;
        input
            .read_exact(&mut buf[..want])
            .context("reading input")?;
        let padded = want.next_multiple_of(sector);
        if padded != want {
            // The tail is not a whole sector: read-modify-write the last one.
            let tail_start = padded - sector;
            let mut old = vec![0u8; sector];
            array.read_at(&mut old, offset + done + tail_start as u64)?;
            buf[want..padded].copy_from_slice(&old[want - tail_start..]);
        }
        array.write_at(&buf[..padded], offset + done, false)?;
        done += want as u64;
    }
    Ok(())
}

pub fn read(args: &ReadArgs, direct: bool) -> Result<u8> {
    // An array part-way through a reshape is read through its reshape's map.
    let mid = match &args.backup_file {
        Some(file) => MidReshape::open_with_backup_file(&args.members, direct, file)?,
        None => MidReshape::open(&args.members, direct)?,
    };
    if let Some(mid) = mid {
        let read = |buf: &mut [u8], at: u64| mid.read_at(buf, at);
        return read_out(args, mid.size_bytes(), mid.sector_bytes(), &read);
    }
    let array = assemble(&args.members, super::read_only(direct))?;
    let read = |buf: &mut [u8], at: u64| array.read_at(buf, at);
    read_out(args, array.size_bytes(), array.sector_bytes(), &read)
}

/// How `read` reads the array: `buf.len()` bytes at an array offset.
type ReadFn<'a> = dyn Fn(&mut [u8], u64) -> nvraid_array::Result<()> + 'a;

fn read_out(args: &ReadArgs, size: u64, sector_bytes: u32, read: &ReadFn) -> Result<u8> {
    if args.offset > size {
        bail!(
            "offset {} is past the end of the array ({size} bytes)",
            args.offset
        );
    }
    let len = args.length.unwrap_or(size - args.offset);
    if args.offset.checked_add(len).is_none_or(|end| end > size) {
        bail!(
            "reading {len} bytes at offset {} would pass the end of the array ({size} bytes)",
            args.offset
        );
    }
    let mut out: Box<dyn Write> = match &args.output {
        Some(path) => {
            Box::new(File::create(path).with_context(|| format!("{path}: cannot create output"))?)
        }
        None => Box::new(io::stdout().lock()),
    };
    copy_out(read, sector_bytes, &mut out, args.offset, len)?;
    out.flush()?;
    Ok(0)
}

fn copy_out(
    read: &ReadFn,
    sector_bytes: u32,
    out: &mut dyn Write,
    offset: u64,
    len: u64,
) -> Result<()> {
    let sector = u64::from(sector_bytes);
    // Read whole sectors around an unaligned range, and hand out the part asked for.
    let start = offset / sector * sector;
    let end = (offset + len).next_multiple_of(sector);
    let mut buf = AlignedBuf::zeroed(BLOCK_BYTES);
    let mut at = start;
    while at < end {
        let n = (end - at).min(BLOCK_BYTES as u64) as usize;
        read(&mut buf[..n], at)?;
        let from = offset.saturating_sub(at).min(n as u64) as usize;
        let to = ((offset + len).min(at + n as u64) - at) as usize;
        out.write_all(&buf[from..to]).context("writing output")?;
        at += n as u64;
    }
    Ok(())
}
