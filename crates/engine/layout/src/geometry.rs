use crate::parity::{ParityLayout, StripeMap};
use std::fmt;
use std::sync::Arc;

/// Smallest chunk nvraid accepts (and md's smallest useful one on 4 KiB pages).
pub const CHUNK_BYTES_MIN: u64 = 4 * 1024;
/// Largest chunk nvraid accepts.
pub const CHUNK_BYTES_MAX: u64 = 4 * 1024 * 1024;
/// The most members an array may have (md v1.2 role table size used by nvraid).
pub const MEMBERS_MAX: u32 = 128;

/// A RAID level with its layout parameters.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Level {
    /// Striping without redundancy.
    Raid0,
    /// Mirroring: every member holds the whole array.
    Raid1,
    /// Striped mirrors, md "near" layout with `near` copies (md default 2).
    Raid10 {
        /// Number of copies of each chunk, on consecutive members.
        near: u32,
    },
    /// Striped mirrors, md "far" (`f2`) or "offset" (`o2`) layout: each
    /// copy on the next member, in a far band of the members (far) or in the
    /// next chunk row (offset).
    Raid10Far {
        /// Number of copies of each chunk.
        copies: u32,
        /// md's offset layout (`oN`) rather than far (`fN`).
        offset: bool,
    },
    /// Striping with one parity chunk per stripe (md `raid5`; RAID 4 is its
    /// parity-last layout).
    Raid5 { layout: ParityLayout },
    /// Striping with P and Q parity chunks per stripe (md `raid6`).
    Raid6 { layout: ParityLayout },
}

impl Level {
    /// A level as the command line names it: `0`, `1`, `10`, `4`, `5`, `6`
    /// (or `raid0`, ...), with its default layout (near-2; md's
    /// left-symmetric for RAID 5/6; RAID 4 is RAID 5's parity-last).
    pub fn parse(text: &str) -> Result<Level, String> {
        let layout = ParityLayout::LeftSymmetric;
        match text.trim_start_matches("raid") {
            "0" => Ok(Level::Raid0),
            "1" => Ok(Level::Raid1),
            "10" => Ok(Level::Raid10 { near: 2 }),
            "4" => Ok(Level::Raid5 {
                layout: ParityLayout::ParityLast,
            }),
            "5" => Ok(Level::Raid5 { layout }),
            "6" => Ok(Level::Raid6 { layout }),
            other => Err(format!(
                "unsupported level {other:?}: use 0, 1, 10, 4, 5 or 6"
            )),
        }
    }

    /// md's name for the level: `raid0`, `raid1`, `raid10`, `raid4` (RAID
    /// 5's parity-last layout), `raid5`, `raid6`.
    pub fn md_name(self) -> &'static str {
        match self {
            Level::Raid0 => "raid0",
            Level::Raid1 => "raid1",
            Level::Raid10 { .. } | Level::Raid10Far { .. } => "raid10",
            Level::Raid5 {
                layout: ParityLayout::ParityLast,
            } => "raid4",
            Level::Raid5 { .. } => "raid5",
            Level::Raid6 { .. } => "raid6",
        }
    }

    /// The md level number (0, 1, 10, 5 or 6; RAID 4 is md's raid5 with
    /// the parity-last layout).
    pub fn number(self) -> u32 {
        match self {
            Level::Raid0 => 0,
            Level::Raid1 => 1,
            Level::Raid10 { .. } | Level::Raid10Far { .. } => 10,
            Level::Raid5 { .. } => 5,
            Level::Raid6 { .. } => 6,
        }
    }

    /// Whether the level keeps redundancy (copies or parity): every level
    /// but RAID 0.
    pub fn is_redundant(self) -> bool {
        !matches!(self, Level::Raid0)
    }

    /// Parity chunks per stripe (0 for the mirroring and striping levels).
    pub fn parity_chunks(self) -> u32 {
        match self {
            Level::Raid5 { .. } => 1,
            Level::Raid6 { .. } => 2,
            _ => 0,
        }
    }

    /// The stripe map of a parity level.
    pub fn stripe_map(self, members: u32) -> Option<StripeMap> {
        match self {
            Level::Raid5 { layout } | Level::Raid6 { layout } => {
                StripeMap::new(members, self.parity_chunks(), layout).ok()
            }
            _ => None,
        }
    }

    /// Fewest members nvraid creates the level with (`create`).
    pub fn members_min(self) -> u32 {
        match self {
            Level::Raid0 => 1,
            Level::Raid1 => 2,
            Level::Raid10 { near } => near.max(2),
            Level::Raid10Far { copies, .. } => copies.max(2),
            Level::Raid5 { .. } => 3,
            Level::Raid6 { .. } => 4,
        }
    }

    /// Fewest members an array of the level runs with: as
    /// [`Level::members_min`], except a RAID 4/5 of two members, which md
    /// runs (its RAID 1 takeover makes one: the one data chunk of each
    /// stripe and its parity, a copy of it, on the two members) and nvraid
    /// lays out, but does not create.
    pub fn members_run_min(self) -> u32 {
        match self {
            Level::Raid5 { .. } => 2,
            other => other.members_min(),
        }
    }

    /// Whether the level stripes data in chunks.
    pub fn has_chunks(self) -> bool {
        !matches!(self, Level::Raid1)
    }

    /// How many copies of each byte an array of `members` members keeps
    /// (RAID 1: one per member; the parity levels: one, their redundancy
    /// is parity, not copies).
    pub fn copies(self, members: u32) -> u32 {
        match self {
            Level::Raid0 | Level::Raid5 { .. } | Level::Raid6 { .. } => 1,
            Level::Raid1 => members,
            Level::Raid10 { near } => near,
            Level::Raid10Far { copies, .. } => copies,
        }
    }
}

impl fmt::Display for Level {
    /// md's level name with the layout, as in `raid10 (near=2)` or `raid5
    /// (parity-last)`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "raid{}", self.number())?;
        match self.layout_name() {
            Some(layout) => write!(f, " ({layout})"),
            None => Ok(()),
        }
    }
}

/// Why a geometry was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum GeometryError {
    #[error("an array needs at least one member")]
    NoMembers,
    #[error("{level} needs at least {min} members, got {got}")]
    TooFewMembers { level: Level, min: u32, got: u32 },
    #[error("at most {max} members are supported, got {got}", max = MEMBERS_MAX)]
    TooManyMembers { got: u32 },
    #[error("chunk size {0} bytes is not a power of two")]
    ChunkNotPowerOfTwo(u64),
    #[error("chunk size {0} bytes is outside 4 KiB ..= 4 MiB")]
    ChunkOutOfRange(u64),
    #[error("raid10 with {near} copies needs at least 2 copies and at least as many members as copies, got {members} members")]
    BadCopies { near: u32, members: u32 },
    #[error("the array would be larger than 2^64 bytes")]
    TooLarge,
    #[error(
        "member data size {member_bytes} bytes holds less than one chunk of {chunk_bytes} bytes"
    )]
    MemberTooSmall { member_bytes: u64, chunk_bytes: u64 },
}

/// A validated array geometry. Construct with [`Geometry::new`] (members of
/// equal size) or [`Geometry::raid0_zones`]; every mapping function relies on
/// the invariants checked there (non-zero member count, power-of-two chunk,
/// at least one chunk per member).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Geometry {
    level: Level,
    members: u32,
    /// Chunk size; for RAID 1 (no chunks) this is the whole member.
    chunk_bytes: u64,
    chunk_shift: u32,
    /// Bytes of each member used for data (a whole number of chunks); for a
    /// multi-zone RAID 0, the smallest member's (zone 0's share).
    member_used_bytes: u64,
    array_bytes: u64,
    /// A RAID 0 over members of unequal size: md's zones (`None`: one zone).
    zones: Option<Arc<Zones>>,
    /// RAID 10 far/offset: chunk rows between one copy and the next on a
    /// member (md's stride: a far band, or 1 for the offset layout).
    stride_chunks: u64,
}

/// How md maps the zones after the first of a multi-zone RAID 0 (the
/// superblock's `layout` with the RAID0_LAYOUT feature).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Raid0Layout {
    /// md's original layout (1): a zone's member is chosen by the chunk's
    /// number counted from the start of the array.
    Original,
    /// md's alternate layout (2): counted from the start of the zone.
    Alternate,
}

/// One zone of a multi-zone RAID 0: the members larger than `dev_start`
/// stripe the zone's chunks among themselves, in role order.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Zone {
    /// First array byte of the zone.
    start: u64,
    /// First array byte after the zone.
    end: u64,
    /// Where the zone begins in each of its members' data areas.
    dev_start: u64,
    /// The zone's members, in role order.
    members: Vec<u32>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
struct Zones {
    layout: Raid0Layout,
    zones: Vec<Zone>,
    /// Bytes of each member's data area used (by role).
    used: Vec<u64>,
}

/// One piece of a request: a logical range that does not cross a chunk
/// boundary, so each of its copies is contiguous on one member.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Piece {
    /// Offset of the piece in the array.
    pub logical_offset: u64,
    /// Length of the piece.
    pub len: u64,
}

/// Where one copy of a piece lives.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Location {
    /// The member's role (index in the array).
    pub member: u32,
    /// Offset in the member's data area.
    pub member_offset: u64,
}

impl Geometry {
    /// Validate a geometry for `members` members of `member_data_bytes`
    /// usable bytes each. `chunk_bytes` is ignored for RAID 1. The member data
    /// size is rounded down to a whole number of chunks, as md does.
    pub fn new(
        level: Level,
        members: u32,
        chunk_bytes: u64,
        member_data_bytes: u64,
    ) -> Result<Geometry, GeometryError> {
        Self::check_members(level, members)?;
        let chunk_bytes = if level.has_chunks() {
            Self::check_chunk(chunk_bytes)?;
            chunk_bytes
        } else {
            // RAID 1 has no chunks: one "chunk" spans the whole member, kept a
            // power of two so the shift arithmetic stays uniform.
            member_data_bytes
                .max(1)
                .checked_next_power_of_two()
                .unwrap_or(1 << 63)
        };
        let member_chunks = member_data_bytes / chunk_bytes;
        if level.has_chunks() && member_chunks == 0 {
            return Err(GeometryError::MemberTooSmall {
                member_bytes: member_data_bytes,
                chunk_bytes,
            });
        }
        let (member_used_bytes, array_bytes) = match level {
            Level::Raid0 => {
                let used = member_chunks * chunk_bytes;
                (
                    used,
                    used.checked_mul(u64::from(members))
                        .ok_or(GeometryError::TooLarge)?,
                )
            }
            Level::Raid1 => (member_data_bytes, member_data_bytes),
            Level::Raid5 { .. } | Level::Raid6 { .. } => {
                if level.stripe_map(members).is_none() {
                    return Err(GeometryError::TooFewMembers {
                        level,
                        min: level.members_run_min(),
                        got: members,
                    });
                }
                let used = member_chunks * chunk_bytes;
                let data_members = u64::from(members - level.parity_chunks());
                (
                    used,
                    used.checked_mul(data_members)
                        .ok_or(GeometryError::TooLarge)?,
                )
            }
            Level::Raid10Far { copies, .. } => {
                // md's calc_sectors with one near copy: each member holds
                // `copies` bands of member_chunks / copies chunks.
                let band = member_chunks / u64::from(copies);
                if band == 0 {
                    return Err(GeometryError::MemberTooSmall {
                        member_bytes: member_data_bytes,
                        chunk_bytes: chunk_bytes * u64::from(copies),
                    });
                }
                let array_bytes = band
                    .checked_mul(u64::from(members))
                    .and_then(|c| c.checked_mul(chunk_bytes))
                    .ok_or(GeometryError::TooLarge)?;
                (band * u64::from(copies) * chunk_bytes, array_bytes)
            }
            Level::Raid10 { near } => {
                // md: array chunks = member chunks * members / copies (rounded down).
                let slots = member_chunks
                    .checked_mul(u64::from(members))
                    .ok_or(GeometryError::TooLarge)?;
                let array_chunks = slots / u64::from(near);
                let array_bytes = array_chunks
                    .checked_mul(chunk_bytes)
                    .ok_or(GeometryError::TooLarge)?;
                (member_chunks * chunk_bytes, array_bytes)
            }
        };
        let stride_chunks = match level {
            Level::Raid10Far { offset: true, .. } => 1,
            Level::Raid10Far { copies, .. } => member_used_bytes / chunk_bytes / u64::from(copies),
            _ => 0,
        };
        let geometry = Geometry {
            level,
            members,
            chunk_bytes,
            chunk_shift: chunk_bytes.trailing_zeros(),
            member_used_bytes,
            array_bytes,
            zones: None,
            stride_chunks,
        };
        debug_assert!(geometry.chunk_bytes.is_power_of_two());
        Ok(geometry)
    }

    /// A RAID 0 over members whose data areas hold `member_data_bytes` (by
    /// role), in md's zones: each member's size is rounded down to whole
    /// chunks; zone 0 stripes over every member up to the smallest size,
    /// each following zone over the members still larger, from where the
    /// previous zone stopped on them. Members of equal size give one zone,
    /// the same geometry as [`Geometry::new`] (and then `layout` does not
    /// matter).
    pub fn raid0_zones(
        member_data_bytes: &[u64],
        chunk_bytes: u64,
        layout: Raid0Layout,
    ) -> Result<Geometry, GeometryError> {
        let members = member_data_bytes.len() as u32;
        Self::check_members(Level::Raid0, members)?;
        Self::check_chunk(chunk_bytes)?;
        let used: Vec<u64> = member_data_bytes
            .iter()
            .map(|b| b / chunk_bytes * chunk_bytes)
            .collect();
        let smallest = *used.iter().min().expect("members");
        if smallest == 0 {
            return Err(GeometryError::MemberTooSmall {
                member_bytes: *member_data_bytes.iter().min().expect("members"),
                chunk_bytes,
            });
        }
        if used.iter().all(|&u| u == smallest) {
            return Self::new(Level::Raid0, members, chunk_bytes, smallest);
        }
        let mut zones = Vec::new();
        let (mut dev_start, mut start) = (0u64, 0u64);
        loop {
            let in_zone: Vec<u32> = (0..members)
                .filter(|&m| used[m as usize] > dev_start)
                .collect();
            let Some(next) = in_zone.iter().map(|&m| used[m as usize]).min() else {
                break;
            };
            let end = (next - dev_start)
                .checked_mul(in_zone.len() as u64)
                .and_then(|bytes| bytes.checked_add(start))
                .ok_or(GeometryError::TooLarge)?;
            zones.push(Zone {
                start,
                end,
                dev_start,
                members: in_zone,
            });
            start = end;
            dev_start = next;
        }
        Ok(Geometry {
            level: Level::Raid0,
            members,
            chunk_bytes,
            chunk_shift: chunk_bytes.trailing_zeros(),
            member_used_bytes: smallest,
            array_bytes: start,
            zones: Some(Arc::new(Zones {
                layout,
                zones,
                used,
            })),
            stride_chunks: 0,
        })
    }

    /// How many zones a RAID 0 has (1 for every other level).
    pub fn zone_count(&self) -> usize {
        self.zones.as_ref().map_or(1, |z| z.zones.len())
    }

    /// Bytes of member `member`'s data area that hold array data.
    pub fn member_used_bytes_of(&self, member: u32) -> u64 {
        match &self.zones {
            Some(zones) => zones.used[member as usize],
            None => self.member_used_bytes,
        }
    }

    fn check_members(level: Level, members: u32) -> Result<(), GeometryError> {
        if members == 0 {
            return Err(GeometryError::NoMembers);
        }
        if members > MEMBERS_MAX {
            return Err(GeometryError::TooManyMembers { got: members });
        }
        if let Level::Raid10 { near: copies } | Level::Raid10Far { copies, .. } = level {
            if copies < 2 || copies > members {
                return Err(GeometryError::BadCopies {
                    near: copies,
                    members,
                });
            }
        }
        let min = level.members_run_min();
        if members < min {
            return Err(GeometryError::TooFewMembers {
                level,
                min,
                got: members,
            });
        }
        Ok(())
    }

    fn check_chunk(chunk_bytes: u64) -> Result<(), GeometryError> {
        if !chunk_bytes.is_power_of_two() {
            return Err(GeometryError::ChunkNotPowerOfTwo(chunk_bytes));
        }
        if !(CHUNK_BYTES_MIN..=CHUNK_BYTES_MAX).contains(&chunk_bytes) {
            return Err(GeometryError::ChunkOutOfRange(chunk_bytes));
        }
        Ok(())
    }

    pub fn level(&self) -> Level {
        self.level
    }

    pub fn members(&self) -> u32 {
        self.members
    }

    /// The chunk size, or `None` for RAID 1.
    pub fn chunk_bytes(&self) -> Option<u64> {
        self.level.has_chunks().then_some(self.chunk_bytes)
    }

    /// Usable size of the array.
    pub fn array_bytes(&self) -> u64 {
        self.array_bytes
    }

    /// Bytes of each member's data area that hold array data.
    pub fn member_used_bytes(&self) -> u64 {
        self.member_used_bytes
    }

    /// RAID 4/5/6: the chunk and the array bytes of one stripe's data
    /// (`None` for the other levels, whose md bitmap and resync position
    /// count array bytes).
    fn parity_stripe(&self) -> Option<(u64, u64)> {
        let parity = self.level.parity_chunks();
        (parity > 0).then(|| {
            let data_columns = u64::from(self.members - parity);
            (self.chunk_bytes, self.chunk_bytes * data_columns)
        })
    }

    /// The space md's write-intent bitmap counts its bits in, in bytes:
    /// for RAID 4/5/6 each member's data area (md's bit `k` stands for the
    /// same member rows on every member, so for every stripe with a row
    /// there), for RAID 1 and 10 the array.
    pub fn bitmap_space_bytes(&self) -> u64 {
        match self.parity_stripe() {
            Some(_) => self.member_used_bytes,
            None => self.array_bytes,
        }
    }

    /// Where array bytes `[offset, offset + len)` lie in the bitmap's space
    /// ([`Geometry::bitmap_space_bytes`]): for RAID 4/5/6 the member rows of
    /// every stripe they touch (whole chunk rows: a write changes its
    /// stripe's parity), otherwise the same bytes.
    pub fn bitmap_range(&self, offset: u64, len: u64) -> std::ops::Range<u64> {
        let Some((chunk, width)) = self.parity_stripe() else {
            return offset..offset + len;
        };
        let first = offset / width;
        if len == 0 {
            return first * chunk..first * chunk;
        }
        let end = (offset + len - 1) / width + 1;
        first * chunk..end * chunk
    }

    /// md's resync position (`resync_offset`) in the space it counts in
    /// (the bitmap's: member rows for RAID 4/5/6), for array byte
    /// `offset`: the start of its stripe's rows, so that nothing before it
    /// is left out.
    pub fn sync_position_of(&self, offset: u64) -> u64 {
        match self.parity_stripe() {
            Some((chunk, width)) => offset / width * chunk,
            None => offset,
        }
    }

    /// The array byte md's resync position `position` (bytes in the
    /// bitmap's space, see [`Geometry::sync_position_of`]) stands for: the
    /// first byte of the stripe whose rows it is in.
    pub fn array_offset_of_sync(&self, position: u64) -> u64 {
        match self.parity_stripe() {
            Some((chunk, width)) => (position / chunk).saturating_mul(width),
            None => position,
        }
    }

    /// The array bytes a walk through the array (a resync) steps by so that
    /// each step covers whole bits of a bitmap of `bitmap_chunk` bytes: the
    /// chunk itself, or for RAID 4/5/6 the stripes whose rows one bit (at
    /// least one chunk row) covers.
    pub fn bitmap_step_bytes(&self, bitmap_chunk: u64) -> u64 {
        match self.parity_stripe() {
            Some((chunk, width)) => bitmap_chunk.max(chunk).div_ceil(chunk) * width,
            None => bitmap_chunk,
        }
    }

    /// How many copies of each byte the array keeps (parity levels: one;
    /// their redundancy is parity, not copies).
    pub fn copies(&self) -> u32 {
        self.level.copies(self.members)
    }

    /// Whether the members marked in `present` (by role; one entry per
    /// member) hold every byte of the array: RAID 0 needs them all, RAID 1
    /// any one, RAID 4/5/6 all but as many as a stripe has parity chunks,
    /// RAID 10 at least one copy of every chunk.
    pub fn has_every_byte(&self, present: &[bool]) -> bool {
        let missing = present.iter().filter(|&&p| !p).count();
        match self.level {
            Level::Raid0 => missing == 0,
            Level::Raid1 => missing < present.len(),
            Level::Raid5 { .. } | Level::Raid6 { .. } => {
                missing <= self.level.parity_chunks() as usize
            }
            // Which members hold a chunk's copies repeats every n chunks
            // (near: slot c*k mod n; far and offset: c mod n), so the first
            // n chunks' copy sets decide.
            Level::Raid10 { .. } | Level::Raid10Far { .. } => {
                let chunks = (self.array_bytes >> self.chunk_shift).min(u64::from(self.members));
                (0..chunks).all(|c| {
                    (0..self.copies()).any(|copy| {
                        present[self.locate(c << self.chunk_shift, copy).member as usize]
                    })
                })
            }
        }
    }

    /// Split `[offset, offset + len)` into pieces that do not cross chunk
    /// boundaries. The range must lie inside the array (checked by callers;
    /// a debug assertion here).
    #[inline]
    pub fn pieces(&self, offset: u64, len: u64) -> Pieces {
        debug_assert!(offset
            .checked_add(len)
            .is_some_and(|end| end <= self.array_bytes));
        Pieces {
            chunk_mask: self.chunk_bytes - 1,
            next: offset,
            end: offset + len,
        }
    }

    /// Where copy `copy` (0-based, `< copies()`) of the byte at
    /// `logical_offset` lives. Within a [`Piece`], the copy is contiguous, so
    /// the piece's start locates the whole piece.
    #[inline]
    pub fn locate(&self, logical_offset: u64, copy: u32) -> Location {
        debug_assert!(logical_offset < self.array_bytes);
        debug_assert!(copy < self.copies());
        if let Some(zones) = &self.zones {
            return self.locate_in_zones(zones, logical_offset);
        }
        let chunk = logical_offset >> self.chunk_shift;
        let in_chunk = logical_offset & (self.chunk_bytes - 1);
        let n = u64::from(self.members);
        let (member, row) = match self.level {
            Level::Raid0 => (chunk % n, chunk / n),
            Level::Raid5 { .. } | Level::Raid6 { .. } => {
                let map = self.level.stripe_map(self.members).expect("checked by new");
                let (stripe, member) = map.locate_chunk(chunk);
                (u64::from(member), stripe)
            }
            Level::Raid1 => (u64::from(copy), 0),
            Level::Raid10 { near } => {
                let slot = chunk * u64::from(near) + u64::from(copy);
                (slot % n, slot / n)
            }
            // md's __raid10_find_phys with one near copy and the original
            // far set (all members): copy f is on the next member f times
            // over, f strides further down.
            Level::Raid10Far { copies, offset } => {
                let stripe = chunk / n;
                let first_row = if offset {
                    stripe * u64::from(copies)
                } else {
                    stripe
                };
                (
                    (chunk % n + u64::from(copy)) % n,
                    first_row + u64::from(copy) * self.stride_chunks,
                )
            }
        };
        Location {
            member: member as u32,
            member_offset: (row << self.chunk_shift) + in_chunk,
        }
    }

    /// The inverse of [`Geometry::locate`]: which array byte (and which copy
    /// of it) member `member` holds at `member_offset`, or `None` if that
    /// member byte holds no array data.
    pub fn logical_of(&self, member: u32, member_offset: u64) -> Option<(u64, u32)> {
        if let Some(zones) = &self.zones {
            return self.logical_in_zones(zones, member, member_offset);
        }
        if member >= self.members || member_offset >= self.member_used_bytes {
            return None;
        }
        let row = member_offset >> self.chunk_shift;
        let in_chunk = member_offset & (self.chunk_bytes - 1);
        let n = u64::from(self.members);
        let (chunk, copy) = match self.level {
            Level::Raid0 => (row * n + u64::from(member), 0),
            Level::Raid5 { .. } | Level::Raid6 { .. } => {
                // A parity chunk holds no array byte.
                let map = self.level.stripe_map(self.members).expect("checked by new");
                let d = map.stripe(row).data.iter().position(|m| *m == member)?;
                (row * u64::from(map.data_per_stripe()) + d as u64, 0)
            }
            Level::Raid1 => (0, member),
            Level::Raid10 { near } => {
                let slot = row * n + u64::from(member);
                (slot / u64::from(near), (slot % u64::from(near)) as u32)
            }
            Level::Raid10Far { copies, offset } => {
                let copies = u64::from(copies);
                let (copy, stripe) = if offset {
                    (row % copies, row / copies)
                } else {
                    (row / self.stride_chunks, row % self.stride_chunks)
                };
                if copy >= copies {
                    return None;
                }
                let first_member = (u64::from(member) + n - copy % n) % n;
                (stripe * n + first_member, copy as u32)
            }
        };
        let logical = (chunk << self.chunk_shift) + in_chunk;
        (logical < self.array_bytes).then_some((logical, copy))
    }
}

impl Geometry {
    /// md's raid0 `find_zone` + `map_sector`: the zone holding the byte; in
    /// it, the row is the chunk's number within the zone over the zone's
    /// member count, and the member is the chunk's number (from the array's
    /// start in the original layout, from the zone's in the alternate one)
    /// modulo that count.
    fn locate_in_zones(&self, zones: &Zones, logical_offset: u64) -> Location {
        let zone = zones
            .zones
            .iter()
            .find(|z| logical_offset < z.end)
            .expect("offset inside the array");
        let n = zone.members.len() as u64;
        let in_zone = logical_offset - zone.start;
        let numbered = match zones.layout {
            Raid0Layout::Original => logical_offset,
            Raid0Layout::Alternate => in_zone,
        };
        let index = (numbered >> self.chunk_shift) % n;
        let row = (in_zone >> self.chunk_shift) / n;
        Location {
            member: zone.members[index as usize],
            member_offset: zone.dev_start
                + (row << self.chunk_shift)
                + (logical_offset & (self.chunk_bytes - 1)),
        }
    }

    fn logical_in_zones(
        &self,
        zones: &Zones,
        member: u32,
        member_offset: u64,
    ) -> Option<(u64, u32)> {
        if member >= self.members || member_offset >= zones.used[member as usize] {
            return None;
        }
        let zone = zones
            .zones
            .iter()
            .rev()
            .find(|z| member_offset >= z.dev_start)?;
        let index = zone.members.iter().position(|&m| m == member)? as u64;
        let n = zone.members.len() as u64;
        let row = (member_offset - zone.dev_start) >> self.chunk_shift;
        let first = match zones.layout {
            Raid0Layout::Original => (zone.start >> self.chunk_shift) % n,
            Raid0Layout::Alternate => 0,
        };
        let chunk_in_zone = row * n + (index + n - first) % n;
        let logical = zone.start
            + (chunk_in_zone << self.chunk_shift)
            + (member_offset & (self.chunk_bytes - 1));
        (logical < zone.end).then_some((logical, 0))
    }
}

/// Iterator over the [`Piece`]s of a request. Allocation free.
#[derive(Clone, Debug)]
pub struct Pieces {
    chunk_mask: u64,
    next: u64,
    end: u64,
}

impl Iterator for Pieces {
    type Item = Piece;

    #[inline]
    fn next(&mut self) -> Option<Piece> {
        if self.next >= self.end {
            return None;
        }
        let chunk_end = (self.next | self.chunk_mask).saturating_add(1);
        let piece_end = chunk_end.min(self.end);
        let piece = Piece {
            logical_offset: self.next,
            len: piece_end - self.next,
        };
        self.next = piece_end;
        Some(piece)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::parity::ParityLayout;

    const CHUNK: u64 = 64 * 1024;

    fn geometry(level: Level, members: u32) -> Geometry {
        Geometry::new(level, members, CHUNK, 40 * CHUNK).unwrap()
    }

    /// `present` for `members` members with those in `missing` absent.
    fn present(members: u32, missing: &[u32]) -> Vec<bool> {
        (0..members).map(|m| !missing.contains(&m)).collect()
    }

    #[test]
    fn a_parity_bitmap_counts_member_rows_and_a_mirror_bitmap_array_bytes() {
        let layout = ParityLayout::LeftSymmetric;
        // RAID 5 of 4 (3 data chunks per stripe), 40 chunks per member.
        let raid5 = geometry(Level::Raid5 { layout }, 4);
        assert_eq!(raid5.bitmap_space_bytes(), 40 * CHUNK);
        assert_eq!(raid5.array_bytes(), 120 * CHUNK);
        // Any byte of stripe 5 (array bytes 15..18 chunks) is row 5.
        assert_eq!(raid5.bitmap_range(15 * CHUNK, 1), 5 * CHUNK..6 * CHUNK);
        assert_eq!(
            raid5.bitmap_range(18 * CHUNK - 512, 512),
            5 * CHUNK..6 * CHUNK
        );
        // Across stripes 5 and 6.
        assert_eq!(
            raid5.bitmap_range(17 * CHUNK, 2 * CHUNK),
            5 * CHUNK..7 * CHUNK
        );
        assert_eq!(
            raid5.bitmap_range(120 * CHUNK - 1, 1),
            39 * CHUNK..40 * CHUNK
        );
        // md's resync position counts member rows too.
        assert_eq!(raid5.sync_position_of(17 * CHUNK + 512), 5 * CHUNK);
        assert_eq!(raid5.array_offset_of_sync(5 * CHUNK + 4096), 15 * CHUNK);
        assert_eq!(
            raid5.array_offset_of_sync(raid5.sync_position_of(18 * CHUNK)),
            18 * CHUNK
        );
        // One bit of 4 chunk rows is 4 stripes of the array; a bit smaller
        // than a chunk still steps a whole stripe.
        assert_eq!(raid5.bitmap_step_bytes(4 * CHUNK), 12 * CHUNK);
        assert_eq!(raid5.bitmap_step_bytes(CHUNK / 4), 3 * CHUNK);
        let raid6 = geometry(Level::Raid6 { layout }, 5);
        assert_eq!(
            raid6.bitmap_range(6 * CHUNK, 3 * CHUNK),
            2 * CHUNK..3 * CHUNK
        );
        assert_eq!(raid6.bitmap_space_bytes(), 40 * CHUNK);
        // RAID 1 and 10: the array's own bytes.
        for mirror in [
            geometry(Level::Raid1, 2),
            geometry(Level::Raid10 { near: 2 }, 4),
        ] {
            assert_eq!(mirror.bitmap_space_bytes(), mirror.array_bytes());
            assert_eq!(mirror.bitmap_range(12345, 678), 12345..13023);
            assert_eq!(mirror.bitmap_step_bytes(1 << 20), 1 << 20);
            assert_eq!(mirror.sync_position_of(12345), 12345);
            assert_eq!(mirror.array_offset_of_sync(12345), 12345);
        }
    }

    #[test]
    fn raid0_needs_every_member_and_raid1_any_one() {
        let raid0 = geometry(Level::Raid0, 3);
        assert!(raid0.has_every_byte(&present(3, &[])));
        assert!(!raid0.has_every_byte(&present(3, &[1])));
        let raid1 = geometry(Level::Raid1, 3);
        assert!(raid1.has_every_byte(&present(3, &[0, 2])));
        assert!(!raid1.has_every_byte(&present(3, &[0, 1, 2])));
    }

    #[test]
    fn parity_levels_lose_as_many_members_as_they_have_parity_chunks() {
        let layout = ParityLayout::LeftSymmetric;
        let raid5 = geometry(Level::Raid5 { layout }, 4);
        assert!(raid5.has_every_byte(&present(4, &[2])));
        assert!(!raid5.has_every_byte(&present(4, &[0, 2])));
        let raid4 = geometry(
            Level::Raid5 {
                layout: ParityLayout::ParityLast,
            },
            3,
        );
        assert!(raid4.has_every_byte(&present(3, &[0])));
        assert!(!raid4.has_every_byte(&present(3, &[0, 2])));
        let raid6 = geometry(Level::Raid6 { layout }, 5);
        assert!(raid6.has_every_byte(&present(5, &[1, 3])));
        assert!(!raid6.has_every_byte(&present(5, &[0, 1, 3])));
    }

    #[test]
    fn raid10_survives_while_every_chunk_keeps_a_copy() {
        // n2 over 4: members 0+1 and 2+3 are mirror pairs.
        let near = geometry(Level::Raid10 { near: 2 }, 4);
        assert!(near.has_every_byte(&present(4, &[0, 2])));
        assert!(!near.has_every_byte(&present(4, &[2, 3])));
        // n2 over 3: every pair of members shares a chunk.
        let odd = geometry(Level::Raid10 { near: 2 }, 3);
        assert!(odd.has_every_byte(&present(3, &[1])));
        assert!(!odd.has_every_byte(&present(3, &[0, 2])));
        // n3 over 3: one member is enough.
        let three = geometry(Level::Raid10 { near: 3 }, 3);
        assert!(three.has_every_byte(&present(3, &[0, 2])));
        // f2 and o2 over 4: chunk c on members c and c+1 (mod 4).
        for offset in [false, true] {
            let far = geometry(Level::Raid10Far { copies: 2, offset }, 4);
            assert!(far.has_every_byte(&present(4, &[0, 2])));
            assert!(!far.has_every_byte(&present(4, &[3, 0])));
        }
    }

    /// The RAID 10 rule looks at the first `members` chunks only; every
    /// set of present members gives the answer a walk over every chunk of
    /// the array gives.
    #[test]
    fn raid10s_rule_agrees_with_every_chunk() {
        let mut levels = Vec::new();
        for copies in 2..=4 {
            levels.push(Level::Raid10 { near: copies });
            levels.push(Level::Raid10Far {
                copies,
                offset: false,
            });
            levels.push(Level::Raid10Far {
                copies,
                offset: true,
            });
        }
        for level in levels {
            for members in level.members_min()..=7 {
                let g = geometry(level, members);
                for mask in 0u32..(1 << members) {
                    let present: Vec<bool> = (0..members).map(|m| mask & (1 << m) != 0).collect();
                    let walked = (0..g.array_bytes() / CHUNK).all(|c| {
                        (0..g.copies())
                            .any(|copy| present[g.locate(c * CHUNK, copy).member as usize])
                    });
                    assert_eq!(
                        g.has_every_byte(&present),
                        walked,
                        "{level} over {members}, present {present:?}"
                    );
                }
            }
        }
    }

    #[test]
    fn level_copies_agree_with_the_geometrys() {
        assert_eq!(Level::Raid1.copies(3), 3);
        assert_eq!(Level::Raid10 { near: 3 }.copies(5), 3);
        assert_eq!(geometry(Level::Raid1, 4).copies(), 4);
        assert_eq!(
            geometry(
                Level::Raid6 {
                    layout: ParityLayout::LeftSymmetric
                },
                4
            )
            .copies(),
            1
        );
    }

    #[test]
    fn display_names_the_level_and_its_layout() {
        assert_eq!(Level::Raid0.to_string(), "raid0");
        assert_eq!(Level::Raid1.to_string(), "raid1");
        assert_eq!(Level::Raid10 { near: 2 }.to_string(), "raid10 (near=2)");
        let far = |offset| Level::Raid10Far { copies: 3, offset }.to_string();
        assert_eq!(far(false), "raid10 (far=3)");
        assert_eq!(far(true), "raid10 (offset=3)");
        let raid5 = Level::Raid5 {
            layout: ParityLayout::ParityLast,
        };
        assert_eq!(raid5.to_string(), "raid5 (parity-last)");
        let raid6 = Level::Raid6 {
            layout: ParityLayout::LeftSymmetric,
        };
        assert_eq!(raid6.to_string(), "raid6 (left-symmetric)");
    }
}
