//! `create`: validate everything, then write md v1.2 superblocks.
//!
//! Nothing is written, created or extended until every member has passed
//! every check, so a refused create leaves every byte of every member as it
//! was.

use crate::array::Array;
use crate::error::{Error, Result};
use crate::signature;
use crate::slot::{write_superblock, Slot};
use nvraid_layout::{Geometry, Level};
use nvraid_member::{Member, MemberError, MemberKind, OpenOptions};
use nvraid_metadata::bitmap::{self, BitmapHeader};
use nvraid_metadata::{
    features, Superblock, Timestamp, RESYNC_CLEAN, SUPER_OFFSET_BYTES, SUPER_OFFSET_SECTORS,
};
use std::path::{Path, PathBuf};

/// Where the data area starts on every member nvraid creates: 1 MiB, as
/// mdadm does for small devices; leaves room for the superblock at 4 KiB
/// and keeps data aligned for any drive's erase block.
pub const DATA_OFFSET_SECTORS: u64 = 2048;
/// Role-table entries nvraid writes (as mdadm does).
const MAX_DEV: u32 = 128;
/// Default chunk: md's default of 512 KiB suits large sequential transfers,
/// but nvraid targets NVMe random I/O too; 64 KiB keeps 4 KiB random I/O on
/// one member per request while a 1 MiB sequential request still spreads
/// over 16 chunks (every member of arrays up to 16 wide).
pub const CHUNK_BYTES_DEFAULT: u64 = 64 * 1024;

/// What to create.
#[derive(Clone, Debug)]
pub struct CreateOptions {
    pub level: Level,
    pub chunk_bytes: u64,
    pub name: String,
    /// How much of each member to use: missing files are created and
    /// smaller files extended to this size; larger members are used only up
    /// to it.
    pub size_bytes: Option<u64>,
    /// Overwrite existing signatures (filesystems, md superblocks).
    pub force: bool,
    /// Try O_DIRECT on files and devices.
    pub direct: bool,
    /// md's write-intent bitmap.
    pub bitmap: BitmapChoice,
}

/// Whether the array gets md's internal write-intent bitmap.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BitmapChoice {
    /// mdadm's default: an internal bitmap for RAID 1 and RAID 10, none for
    /// RAID 0.
    Auto,
    None,
    /// An internal bitmap; `chunk_bytes` per bit, or mdadm's default.
    Internal {
        chunk_bytes: Option<u64>,
    },
    /// No bitmap: md's partial parity log closes the write hole instead
    /// (RAID 5 only; mdadm's `--consistency-policy=ppl`).
    Ppl,
    /// No bitmap: md's write journal on a member of its own (RAID 4/5/6;
    /// mdadm's `--write-journal`). The last member given is the journal.
    Journal,
}

/// The smallest log a journal member may hold (beyond its metadata area).
pub const JOURNAL_LOG_MIN_BYTES: u64 = 4 << 20;

/// Where nvraid puts a partial parity log: right behind the superblock
/// (mdadm's offset), and as long as fits before the bad-block log, which
/// takes the last 4 KiB below the data at 1 MiB.
const PPL_AREA: nvraid_metadata::ppl::PplArea = nvraid_metadata::ppl::PplArea {
    offset_sectors: 8,
    size_sectors: (DATA_OFFSET_SECTORS
        - SUPER_OFFSET_SECTORS
        - 8
        - crate::badlog::LOG_SECTORS as u64) as u16,
};

/// Where nvraid puts an internal bitmap: 4 KiB after the superblock (8
/// sectors), as mdadm does for v1.2.
const BITMAP_OFFSET_SECTORS: i32 = 8;

/// The bitmap chunk for `options` over `geometry`, or `None` for no bitmap.
/// `check_space`: whether the bitmap must fit the metadata area (false for
/// the early check of the options, before the members' size is known).
fn bitmap_chunk(
    options: &CreateOptions,
    geometry: &Geometry,
    check_space: bool,
) -> Result<Option<u64>> {
    let Some(requested) = bitmap_wanted(options, geometry)? else {
        return Ok(None);
    };
    // What the bitmap counts bits over (md's: a member's data area for
    // RAID 4/5/6, the array for RAID 1 and 10).
    let space_bytes = geometry.bitmap_space_bytes();
    let chunk = match requested {
        None => bitmap::default_chunk_bytes(
            space_bytes,
            bitmap::default_room_bytes(geometry.member_used_bytes() / 512),
        ),
        Some(c) => checked_bitmap_chunk(c)?,
    };
    if check_space {
        check_bitmap_space(chunk, space_bytes)?;
    }
    Ok(Some(chunk))
}

/// Whether the array gets an internal bitmap, and then the chunk asked for
/// (`None` for the default); a bitmap, PPL or journal the level cannot have
/// is refused by the option that asked for it.
fn bitmap_wanted(options: &CreateOptions, geometry: &Geometry) -> Result<Option<Option<u64>>> {
    let redundant = geometry.level().is_redundant();
    match options.bitmap {
        BitmapChoice::None => Ok(None),
        BitmapChoice::Ppl if geometry.level().parity_chunks() != 1 => Err(Error::BadOption {
            option: "--consistency-policy ppl".into(),
            why: format!(
                "a partial parity log on a {} is not supported (md keeps one for RAID 4/5 only)",
                geometry.level()
            ),
        }),
        BitmapChoice::Ppl => Ok(None),
        BitmapChoice::Journal if geometry.level().parity_chunks() == 0 => Err(Error::BadOption {
            option: "--write-journal".into(),
            why: format!(
                "a write journal on a {} is not supported (md journals RAID 4/5/6 only)",
                geometry.level()
            ),
        }),
        BitmapChoice::Journal => Ok(None),
        BitmapChoice::Auto if !redundant => Ok(None),
        BitmapChoice::Auto => Ok(Some(None)),
        BitmapChoice::Internal { .. } if !redundant => Err(Error::BadOption {
            option: "--bitmap internal".into(),
            why: "a write-intent bitmap on a raid0 is not supported (it has no copies to resync)"
                .into(),
        }),
        BitmapChoice::Internal { chunk_bytes } => Ok(Some(chunk_bytes)),
    }
}

/// A bitmap chunk given by the user: a power of two from 4 KiB to 2 GiB.
pub(crate) fn checked_bitmap_chunk(c: u64) -> Result<u64> {
    if c < 4096 || !c.is_power_of_two() || c > u64::from(u32::MAX / 2 + 1) {
        return Err(Error::BadOption {
            option: format!("--bitmap-chunk {c}"),
            why: format!(
                "a bitmap chunk of {c} bytes ({}) is not a power of two from 4 KiB to 2 GiB",
                nvraid_member::format_size(c)
            ),
        });
    }
    Ok(c)
}

/// The bitmap of `chunk` over `array_bytes` (its space: see
/// `Geometry::bitmap_space_bytes`) fits the metadata area.
fn check_bitmap_space(chunk: u64, array_bytes: u64) -> Result<()> {
    // Between the bitmap's start and the bad-block log below the data: the
    // data offset less the superblock's 4 KiB, the 4 KiB before it and the
    // log's 4 KiB.
    let space = DATA_OFFSET_SECTORS * 512
        - SUPER_OFFSET_BYTES
        - 4096
        - u64::from(crate::badlog::LOG_SECTORS) * 512;
    let need = bitmap::storage_bytes(bitmap::bits_for(array_bytes, chunk as u32));
    if need > space {
        return Err(Error::BadOption {
            option: "--bitmap-chunk".into(),
            why: format!(
                "a bitmap chunk of {} for {} is not supported: its bitmap needs {} and the metadata area holds {}; choose a larger chunk",
                nvraid_member::format_size(chunk),
                nvraid_member::format_size(array_bytes),
                nvraid_member::format_size(need),
                nvraid_member::format_size(space)
            ),
        });
    }
    Ok(())
}

/// One member as planned before anything is written.
struct Plan {
    spec: String,
    size_bytes: u64,
    /// Open read-only for the checks; `None` for a file still to be created.
    probe: Option<Member>,
}

/// Create an array over `specs` (in role order) and return it assembled.
pub fn create(specs: &[String], options: &CreateOptions) -> Result<Array> {
    create_with_spares(specs, 0, options)
}

/// Create an array whose last `spares` members are hot spares: they carry
/// the array's superblock with the spare role (md's 0xffff) and hold no
/// data until a rebuild puts one into a missing role.
pub fn create_with_spares(
    specs: &[String],
    spares: usize,
    options: &CreateOptions,
) -> Result<Array> {
    if specs.is_empty() {
        return Err(Error::NoMembers);
    }
    check_options(options)?;
    let (specs, journal) = split_journal(specs, options)?;
    check_spares(specs, spares, options)?;
    let active = specs.len() - spares;
    if null_member_drops_bitmap(specs, options)? {
        let options = CreateOptions {
            bitmap: BitmapChoice::None,
            ..options.clone()
        };
        return create_with_spares(specs, spares, &options);
    }
    check_shape(specs, active, options)?;
    let mut plans = specs
        .iter()
        .map(|spec| plan_member(spec, options))
        .collect::<Result<Vec<_>>>()?;
    if let Some(journal) = &journal {
        plans.push(plan_journal(journal, options)?);
    }
    check_duplicates(&plans)?;
    if !options.force {
        check_signatures(&plans)?;
    }
    let journal_plan = journal.as_ref().and_then(|_| plans.pop());
    let data_bytes = check_sizes(&plans, options)?;
    if let Some(plan) = &journal_plan {
        check_journal_size(plan)?;
    }
    let journal_bytes = journal_plan.as_ref().map(|p| p.size_bytes);
    drop(journal_plan);
    let geometry = Geometry::new(
        options.level,
        active as u32,
        options.chunk_bytes,
        data_bytes,
    )?;
    drop(plans);
    let mut all = specs.to_vec();
    all.extend(journal);
    write_array(&all, options, geometry, data_bytes, journal_bytes)
}

/// The data (and spare) members, and the journal member: with a write
/// journal it is the last member given, planned apart from the rest.
fn split_journal<'s>(
    specs: &'s [String],
    options: &CreateOptions,
) -> Result<(&'s [String], Option<String>)> {
    if options.bitmap != BitmapChoice::Journal {
        return Ok((specs, None));
    }
    let [rest @ .., journal] = specs else {
        return Err(Error::NoMembers);
    };
    if rest.is_empty() {
        return Err(Error::NoMembers);
    }
    Ok((rest, Some(journal.clone())))
}

/// Spares need a level with copies to rebuild, and at least one active
/// member beside them.
fn check_spares(specs: &[String], spares: usize, options: &CreateOptions) -> Result<()> {
    if spares > 0 && options.level.number() == 0 {
        return Err(Error::Unsupported {
            spec: specs[specs.len().saturating_sub(spares)..].join(", "),
            what: "spares for a raid0 (it has no copies to rebuild)".into(),
        });
    }
    if spares >= specs.len() {
        return Err(Error::NotStartable(format!(
            "{spares} spares leave no active member among {} members",
            specs.len()
        )));
    }
    Ok(())
}

/// A null member keeps nothing, a bitmap neither: by default such an array
/// has none (true: create again without one), and one asked for is refused.
fn null_member_drops_bitmap(specs: &[String], options: &CreateOptions) -> Result<bool> {
    let Some(null) = specs.iter().find(|s| s.starts_with("null:")) else {
        return Ok(false);
    };
    match options.bitmap {
        BitmapChoice::Internal { .. } => Err(Error::Unsupported {
            spec: null.clone(),
            what: "a write-intent bitmap on a null member (it keeps no bytes)".into(),
        }),
        BitmapChoice::Auto => Ok(true),
        BitmapChoice::None | BitmapChoice::Ppl | BitmapChoice::Journal => Ok(false),
    }
}

/// Count, chunk, stripe width and bitmap options, judged before looking at
/// any member.
fn check_shape(specs: &[String], active: usize, options: &CreateOptions) -> Result<()> {
    // A two-member RAID 5 runs (md's RAID 1 takeover makes one) but is
    // not created: a RAID 1 is that array.
    let min = options.level.members_min();
    if (active as u32) < min && options.level.members_run_min() < min {
        return Err(nvraid_layout::GeometryError::TooFewMembers {
            level: options.level,
            min,
            got: active as u32,
        }
        .into());
    }
    let probe = Geometry::new(options.level, active as u32, options.chunk_bytes, 1 << 40)?;
    let parity = options.level.parity_chunks();
    if parity > 0 && active as u32 - parity > crate::parity::DATA_BLOCKS_MAX {
        return Err(Error::Unsupported {
            spec: specs.join(", "),
            what: format!(
                "a {} array of {active} members (nvraid writes at most {} data chunks per stripe)",
                options.level,
                crate::parity::DATA_BLOCKS_MAX
            ),
        });
    }
    bitmap_chunk(options, &probe, false)?;
    Ok(())
}

/// Plan the journal member. md's write journal takes all of its member:
/// --size is the space used of each data member (as mdadm's), and only
/// sizes a journal file this create makes.
fn plan_journal(journal: &str, options: &CreateOptions) -> Result<Plan> {
    let whole = CreateOptions {
        size_bytes: None,
        ..options.clone()
    };
    match plan_member(journal, &whole) {
        Err(Error::MissingMember { .. }) if options.size_bytes.is_some() => {
            plan_member(journal, options)
        }
        other => other,
    }
}

/// A journal member holds the metadata area and the smallest log.
fn check_journal_size(plan: &Plan) -> Result<()> {
    let min_bytes = DATA_OFFSET_SECTORS * 512 + JOURNAL_LOG_MIN_BYTES;
    if plan.size_bytes < min_bytes {
        return Err(Error::TooSmall {
            spec: plan.spec.clone(),
            size_bytes: plan.size_bytes,
            min_bytes,
            reason: format!(
                "1 MiB of metadata area plus a log of {}",
                nvraid_member::format_size(JOURNAL_LOG_MIN_BYTES)
            ),
        });
    }
    Ok(())
}

/// The options that need no member to judge: a name md's superblock
/// holds, a size a member can have.
fn check_options(options: &CreateOptions) -> Result<()> {
    if options.name.len() > nvraid_metadata::NAME_BYTES_MAX {
        let e = nvraid_metadata::NameTooLong {
            name: options.name.clone(),
        };
        return Err(Error::BadOption {
            option: "--name".into(),
            why: e.to_string(),
        });
    }
    if let Some(size) = options.size_bytes {
        // Linux counts file and device offsets in a signed 64-bit off_t.
        let max = i64::MAX as u64;
        if size > max {
            return Err(Error::BadOption {
                option: format!("--size {size}"),
                why: format!(
                    "{size} bytes is more than any member can hold (Linux sizes files and \
                     devices in signed 64-bit offsets: at most {max} bytes, 8 EiB)"
                ),
            });
        }
    }
    Ok(())
}

fn plan_member(spec: &str, options: &CreateOptions) -> Result<Plan> {
    let probe_options = OpenOptions {
        write: false,
        create_bytes: None,
        direct: options.direct,
        ..Default::default()
    };
    match Member::open(spec, probe_options) {
        Ok(member) => {
            // Held by a running nvraid: refused before anything changes.
            member.check_claimable()?;
            let size_bytes = match (member.kind(), options.size_bytes) {
                (_, None) => member.size_bytes(),
                // A file grows to --size; any larger member is used up to it.
                (MemberKind::File, Some(size)) => size,
                (_, Some(size)) if member.size_bytes() >= size => size,
                (_, Some(size)) => {
                    return Err(Error::TooSmall {
                        spec: spec.into(),
                        size_bytes: member.size_bytes(),
                        min_bytes: size,
                        reason:
                            "--size asks for that much of every member, and only files can grow"
                                .into(),
                    })
                }
            };
            Ok(Plan {
                spec: spec.into(),
                size_bytes,
                probe: Some(member),
            })
        }
        Err(MemberError::Missing { .. }) => match options.size_bytes {
            Some(size) => Ok(Plan {
                spec: spec.into(),
                size_bytes: size,
                probe: None,
            }),
            None => Err(Error::MissingMember { spec: spec.into() }),
        },
        Err(e) => Err(e.into()),
    }
}

/// A file to be created is identified by its canonical parent and name.
fn future_path(spec: &str) -> PathBuf {
    let path = Path::new(spec);
    let parent = path
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let parent = parent
        .canonicalize()
        .unwrap_or_else(|_| parent.to_path_buf());
    parent.join(path.file_name().unwrap_or_default())
}

fn check_duplicates(plans: &[Plan]) -> Result<()> {
    for (i, a) in plans.iter().enumerate() {
        for b in &plans[..i] {
            let same_object = match (&a.probe, &b.probe) {
                (Some(ma), Some(mb)) => ma.identity().is_some() && ma.identity() == mb.identity(),
                (None, None) => future_path(&a.spec) == future_path(&b.spec),
                _ => false,
            };
            if same_object {
                return Err(Error::Duplicate {
                    spec: a.spec.clone(),
                    other: b.spec.clone(),
                    what: "file or device",
                });
            }
        }
    }
    Ok(())
}

fn check_signatures(plans: &[Plan]) -> Result<()> {
    for plan in plans {
        let Some(member) = &plan.probe else { continue };
        if matches!(member.kind(), MemberKind::Mem | MemberKind::Null) {
            continue;
        }
        if let Some(what) = signature::detect(member).map_err(|e| Error::io(&plan.spec, e))? {
            return Err(Error::InUse {
                spec: plan.spec.clone(),
                what,
            });
        }
    }
    Ok(())
}

/// Every member must hold the metadata area plus at least one chunk; the
/// array uses the smallest member's data size on all of them.
fn check_sizes(plans: &[Plan], options: &CreateOptions) -> Result<u64> {
    let data_offset_bytes = DATA_OFFSET_SECTORS * 512;
    let data_min_bytes = if options.level.has_chunks() {
        options.chunk_bytes
    } else {
        64 * 1024
    };
    let min_bytes = data_offset_bytes + data_min_bytes;
    for plan in plans {
        if plan.size_bytes < min_bytes {
            return Err(Error::TooSmall {
                spec: plan.spec.clone(),
                size_bytes: plan.size_bytes,
                min_bytes,
                reason: format!("1 MiB of metadata area plus {data_min_bytes} bytes of data"),
            });
        }
    }
    let (Some(smallest), Some(largest)) = (
        plans.iter().min_by_key(|p| p.size_bytes),
        plans.iter().max_by_key(|p| p.size_bytes),
    ) else {
        panic!("invariant: create plans at least one member (it refuses an empty member list)")
    };
    // Members of unequal size: the array uses the smallest on all of them.
    // Like mdadm, more than 1% of difference needs the user's say-so, here
    // an explicit --size (which also caps every larger member).
    if options.size_bytes.is_none()
        && largest.size_bytes > smallest.size_bytes + smallest.size_bytes / 100
    {
        let lost_bytes = plans
            .iter()
            .map(|p| p.size_bytes - smallest.size_bytes)
            .sum();
        return Err(Error::UnequalSizes {
            small: smallest.spec.clone(),
            small_bytes: smallest.size_bytes,
            large: largest.spec.clone(),
            large_bytes: largest.size_bytes,
            lost_bytes,
        });
    }
    // Data size in whole 4 KiB blocks.
    Ok((smallest.size_bytes - data_offset_bytes) & !4095)
}

fn write_array(
    specs: &[String],
    options: &CreateOptions,
    geometry: Geometry,
    data_bytes: u64,
    journal_bytes: Option<u64>,
) -> Result<Array> {
    let mut undo = Vec::with_capacity(specs.len());
    let written = write_members(
        specs,
        options,
        &geometry,
        data_bytes,
        journal_bytes,
        &mut undo,
    );
    match written {
        Ok((mut slots, journal_seq)) => {
            let journal = match journal_bytes {
                Some(_) => {
                    let Some(Some(slot)) = slots.pop() else {
                        panic!("invariant: write_members returns the journal's slot last")
                    };
                    let journal = crate::parity::journal::MdJournal::new(slot)?;
                    // The new log: its empty block at position 0.
                    journal.activate(0, journal_seq);
                    Some(journal)
                }
                None => None,
            };
            // The spares' superblocks are written; the array holds the
            // active members only.
            slots.truncate(geometry.members() as usize);
            let mut array = Array::new(geometry, slots, true);
            if let Some(journal) = journal {
                array.attach_md_journal(journal);
            }
            // Read back the bitmap (or the partial parity log) just
            // written, decoded and checked as any assembly checks it.
            array.load_bitmap()?;
            if array.parity_shape().is_some() {
                array.load_ppl(true)?;
            }
            Ok(array)
        }
        Err(e) => {
            // Put back what this command changed, newest first: a refused
            // or failed create leaves every member as it found it.
            while let Some(step) = undo.pop() {
                step.revert();
            }
            Err(e)
        }
    }
}

/// One change create made to a member, and how to take it back.
enum Undo {
    /// The file did not exist: remove it.
    Created(PathBuf),
    /// The file was this long: truncate it back.
    Extended(PathBuf, u64),
}

impl Undo {
    fn revert(self) {
        // Best effort: the error that led here is what the user sees.
        match self {
            Undo::Created(path) => {
                let _ = std::fs::remove_file(path);
            }
            Undo::Extended(path, len) => {
                let _ = std::fs::File::options()
                    .write(true)
                    .open(path)
                    .and_then(|f| f.set_len(len));
            }
        }
    }
}

/// Open (creating or extending files as needed) every member, write the
/// array's metadata to each, and return their slots and the journal's
/// first sequence number.
fn write_members(
    specs: &[String],
    options: &CreateOptions,
    geometry: &Geometry,
    data_bytes: u64,
    journal_bytes: Option<u64>,
    undo: &mut Vec<Undo>,
) -> Result<(Vec<Option<Slot>>, u64)> {
    let journal_at = journal_bytes.map(|_| specs.len() - 1);
    let (members, all_zero) = open_members(specs, options, journal_at, undo)?;
    let template = array_superblock(options, geometry, data_bytes, all_zero, journal_at)?;
    let image = bitmap_chunk(options, geometry, true)?
        .map(|chunk| bitmap_image(&template, geometry, chunk));
    let layout = MetadataLayout {
        template: &template,
        bitmap_image: image.as_ref(),
        journal_at,
        journal_bytes,
        ppl: options.bitmap == BitmapChoice::Ppl,
    };
    let mut saved = Saved::default();
    let mut superblocks = Vec::with_capacity(members.len());
    let mut journal_seq = 0;
    let result = (|| {
        for (role, member) in members.iter().enumerate() {
            let (sb, seq) = write_member_metadata(member, role, &layout, &mut saved)?;
            journal_seq = seq.unwrap_or(journal_seq);
            superblocks.push(sb);
        }
        for member in &members {
            member.flush().map_err(|e| Error::io(member.spec(), e))?;
        }
        Ok(())
    })();
    if let Err(e) = result {
        saved.restore(&members);
        return Err(e);
    }
    let slots = members
        .into_iter()
        .zip(superblocks)
        .map(|(member, sb)| Slot::new(member, sb).map(Some))
        .collect::<Result<Vec<_>>>()?;
    Ok((slots, journal_seq))
}

/// Open every member for writing, recording in `undo` each file this
/// create makes or extends; also whether every member starts as zeros
/// (files this create makes, RAM members): then the parity of a RAID 4/5/6
/// already agrees with its data.
fn open_members(
    specs: &[String],
    options: &CreateOptions,
    journal_at: Option<usize>,
    undo: &mut Vec<Undo>,
) -> Result<(Vec<Member>, bool)> {
    let open = OpenOptions {
        write: true,
        create_bytes: options.size_bytes,
        direct: options.direct,
        ..Default::default()
    };
    let mut members = Vec::with_capacity(specs.len());
    let mut all_zero = true;
    for (index, spec) in specs.iter().enumerate() {
        let is_path = !spec.starts_with("mem:") && !spec.starts_with("null:");
        let before = if is_path {
            std::fs::metadata(spec).ok()
        } else {
            None
        };
        // What the journal held does not matter to the parity.
        all_zero &= before.is_none() || journal_at == Some(index);
        // An existing journal member is used whole (see `create`).
        let whole_journal = journal_at == Some(index) && before.is_some();
        let opened = if whole_journal {
            Member::open(
                spec,
                OpenOptions {
                    create_bytes: None,
                    ..open
                },
            )
        } else {
            Member::open(spec, open)
        };
        if is_path && options.size_bytes.is_some() && !whole_journal {
            match &before {
                None => undo.push(Undo::Created(PathBuf::from(spec))),
                Some(meta) if meta.is_file() && Some(meta.len()) < options.size_bytes => {
                    undo.push(Undo::Extended(PathBuf::from(spec), meta.len()))
                }
                Some(_) => {}
            }
        }
        members.push(opened?);
    }
    Ok((members, all_zero))
}

/// The superblock every member gets (before its own device number and
/// uuid): resync state, bitmap or PPL, bad-block log and journal role.
fn array_superblock(
    options: &CreateOptions,
    geometry: &Geometry,
    data_bytes: u64,
    all_zero: bool,
    journal_at: Option<usize>,
) -> Result<Superblock> {
    let mut template = template_superblock(options, geometry, data_bytes)?;
    if geometry.level().parity_chunks() > 0 && !all_zero {
        // Members that held other bytes: parity must be computed before it
        // can rebuild anything (md's initial resync). The array is created
        // needing a resync; `serve` runs it in the background, `repair`
        // in the foreground.
        template.resync_offset = 0;
    }
    if bitmap_chunk(options, geometry, true)?.is_some() {
        template.feature_map |= features::BITMAP_OFFSET;
        template.bitmap_offset = BITMAP_OFFSET_SECTORS as u32;
    }
    if options.bitmap == BitmapChoice::Ppl {
        template.feature_map |= features::PPL;
        template.bitmap_offset = PPL_AREA.to_raw();
    }
    // RAID 4/5/6 records the stripes a failed write left inconsistent in
    // md's bad-block log (see `badlog`): every member gets an empty one.
    if geometry.level().parity_chunks() > 0 {
        if let Some(offset) = crate::badlog::nvraid_place(&template) {
            template.bblog_offset = offset;
            template.bblog_size = crate::badlog::LOG_SECTORS;
            template.bblog_shift = 0;
        }
    }
    // The journal is the last member, with the next device number, md's
    // journal role in every member's table, and the rest of its space as
    // the log.
    if let Some(dev) = journal_at {
        template.feature_map |= features::JOURNAL;
        if template.roles_raw.len() <= dev {
            template.roles_raw.resize(dev + 1, 0xffff);
            template.max_dev = template.roles_raw.len() as u32;
        }
        template.roles_raw[dev] = nvraid_metadata::Role::Journal.to_raw();
    }
    Ok(template)
}

/// The new bitmap's image: its header, and every bit set when the whole
/// array needs its resync.
fn bitmap_image(template: &Superblock, geometry: &Geometry, chunk: u64) -> nvraid_io::AlignedBuf {
    let header = BitmapHeader::new(
        template.set_uuid,
        0,
        geometry.bitmap_space_bytes() / 512,
        chunk as u32,
    );
    let mut image = nvraid_io::AlignedBuf::zeroed(bitmap::storage_bytes(header.bits()) as usize);
    header.encode(&mut image);
    if template.resync_offset == 0 {
        // The whole array needs its resync: every bit set (as mdadm
        // creates it), or the resync would visit nothing.
        for bit in 0..header.bits() {
            bitmap::put_bit(&mut image, bit, true);
        }
    }
    image
}

/// What every member's metadata is made of.
struct MetadataLayout<'a> {
    template: &'a Superblock,
    bitmap_image: Option<&'a nvraid_io::AlignedBuf>,
    /// The journal member's index, with a write journal.
    journal_at: Option<usize>,
    journal_bytes: Option<u64>,
    /// Whether the array keeps a partial parity log.
    ppl: bool,
}

/// The bytes create's metadata writes overwrote on the members opened (and
/// claimed), to put back if a later step fails while they are still open.
#[derive(Default)]
struct Saved {
    /// Each member's bytes from the superblock on (superblock and bitmap).
    superblocks: Vec<(usize, nvraid_io::AlignedBuf)>,
    /// The bad-block log's bytes below the data.
    logs: Vec<(usize, u64, nvraid_io::AlignedBuf)>,
}

impl Saved {
    /// Put back what was overwritten, newest first. Best effort: the error
    /// that led here is what the user sees.
    fn restore(&self, members: &[Member]) {
        for (role, at, old) in self.logs.iter().rev() {
            let _ = members[*role].write_at(old, *at);
        }
        for (role, old) in self.superblocks.iter().rev() {
            let _ = members[*role].write_at(old, SUPER_OFFSET_BYTES);
            let _ = members[*role].flush();
        }
    }
}

/// Write member `role`'s superblock, empty bad-block log, and its journal
/// log, PPL area or bitmap, saving first what they overwrite; returns its
/// superblock, and the journal's first sequence number if it is the journal.
fn write_member_metadata(
    member: &Member,
    role: usize,
    layout: &MetadataLayout,
    saved: &mut Saved,
) -> Result<(Superblock, Option<u64>)> {
    let mut sb = layout.template.clone();
    sb.dev_number = role as u32;
    sb.device_uuid = random_uuid()?;
    let is_journal = layout.journal_at == Some(role);
    if let (true, Some(bytes)) = (is_journal, layout.journal_bytes) {
        let log = (bytes - DATA_OFFSET_SECTORS * 512) / 4096 * 4096;
        sb.data_size_sectors = log / 512;
    }
    if member.is_persistent() {
        let touched_bytes = 4096 + layout.bitmap_image.map_or(0, |i| i.len());
        let mut old = nvraid_io::AlignedBuf::zeroed(touched_bytes);
        member
            .read_at(&mut old, SUPER_OFFSET_BYTES)
            .map_err(|e| Error::io(member.spec(), e))?;
        saved.superblocks.push((role, old));
    }
    if let (true, Some((at, len))) = (member.is_persistent(), crate::badlog::place(&sb)) {
        let mut old = nvraid_io::AlignedBuf::zeroed(len.next_multiple_of(4096));
        member
            .read_at(&mut old[..len], at)
            .map_err(|e| Error::io(member.spec(), e))?;
        saved.logs.push((role, at, old));
    }
    write_superblock(member, &sb)?;
    crate::badlog::write_empty(member, &sb)?;
    let mut journal_seq = None;
    if is_journal {
        journal_seq = Some(crate::parity::journal::write_empty_log(member, &sb)?);
    }
    if layout.ppl {
        crate::parity::ppl::reset_area(member, &sb, &PPL_AREA)?;
    }
    if let (Some(image), false) = (layout.bitmap_image, is_journal) {
        let at = SUPER_OFFSET_BYTES as i64 + i64::from(sb.bitmap_offset as i32) * 512;
        member
            .write_at(image, at as u64)
            .map_err(|e| Error::io(member.spec(), e))?;
    }
    Ok((sb, journal_seq))
}

fn template_superblock(
    options: &CreateOptions,
    geometry: &Geometry,
    data_bytes: u64,
) -> Result<Superblock> {
    let now = Timestamp::now();
    let members = geometry.members();
    let mut roles_raw = vec![0xffffu16; MAX_DEV.max(members) as usize];
    for (role, entry) in roles_raw.iter_mut().enumerate().take(members as usize) {
        *entry = role as u16;
    }
    let mut sb = Superblock {
        feature_map: 0,
        set_uuid: random_uuid()?,
        set_name: [0; 32],
        ctime: now,
        level: options.level.number() as i32,
        layout: options.level.md_layout(),
        size_sectors: match options.level {
            Level::Raid0 => 0,
            _ => geometry.member_used_bytes() / 512,
        },
        chunk_sectors: geometry.chunk_bytes().map_or(0, |c| (c / 512) as u32),
        raid_disks: members,
        bitmap_offset: 0,
        new_level: 0,
        reshape_position: 0,
        delta_disks: 0,
        new_layout: 0,
        new_chunk: 0,
        new_offset: 0,
        data_offset_sectors: DATA_OFFSET_SECTORS,
        data_size_sectors: data_bytes / 512,
        super_offset_sectors: SUPER_OFFSET_SECTORS,
        recovery_offset: 0,
        dev_number: 0,
        cnt_corrected_read: 0,
        device_uuid: [0; 16],
        devflags: 0,
        bblog_shift: 0,
        bblog_size: 0,
        bblog_offset: 0,
        utime: now,
        events: 0,
        // Like `mdadm --assume-clean`: nvraid does not resync at create; new
        // sparse files are equal (all zeros) on every copy.
        resync_offset: RESYNC_CLEAN,
        max_dev: roles_raw.len() as u32,
        roles_raw,
    };
    sb.set_name(&options.name).map_err(|e| Error::BadOption {
        option: "--name".into(),
        why: e.to_string(),
    })?;
    Ok(sb)
}

/// 16 random bytes from the kernel.
pub(crate) fn random_uuid() -> Result<[u8; 16]> {
    nvraid_io::random::uuid().map_err(|e| Error::io("/dev/urandom", e))
}
