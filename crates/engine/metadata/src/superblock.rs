use serde::Serialize;

/// md superblock magic number.
pub const MAGIC: u32 = 0xa92b_4efc;
/// Sector of the v1.2 superblock on each member.
pub const SUPER_OFFSET_SECTORS: u64 = 8;
/// Byte offset of the v1.2 superblock on each member.
pub const SUPER_OFFSET_BYTES: u64 = SUPER_OFFSET_SECTORS * 512;
/// `resync_offset` of an array that is in sync (md's `MaxSector`).
pub const RESYNC_CLEAN: u64 = u64::MAX;
/// Fixed part of the superblock, before the role table.
const FIXED_BYTES: usize = 256;
/// md caps the role table so that the superblock fits in 4 KiB.
const MAX_DEV_LIMIT: u32 = (4096 - FIXED_BYTES as u32) / 2;
/// The largest encoded superblock (fixed part + largest role table).
pub const SUPERBLOCK_BYTES_MAX: usize = 4096;

/// Reserved byte ranges of the fixed part (md's pad0 and pad3).
const RESERVED: [std::ops::Range<usize>; 2] = [12..16, 224..256];

const ROLE_SPARE: u16 = 0xffff;
const ROLE_FAULTY: u16 = 0xfffe;
const ROLE_JOURNAL: u16 = 0xfffd;

/// Role of one device slot in the role table.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    /// Active member holding role N of the array.
    Active(u16),
    /// A spare (md also uses this value for unused slots).
    Spare,
    /// A member that failed.
    Faulty,
    /// A raid5/6 journal device.
    Journal,
}

impl Role {
    pub fn from_raw(raw: u16) -> Role {
        match raw {
            ROLE_SPARE => Role::Spare,
            ROLE_FAULTY => Role::Faulty,
            ROLE_JOURNAL => Role::Journal,
            n => Role::Active(n),
        }
    }

    pub fn to_raw(self) -> u16 {
        match self {
            Role::Active(n) => n,
            Role::Spare => ROLE_SPARE,
            Role::Faulty => ROLE_FAULTY,
            Role::Journal => ROLE_JOURNAL,
        }
    }
}

/// md's time encoding: seconds in the low 40 bits, microseconds above.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct Timestamp {
    pub seconds: u64,
    pub micros: u32,
}

impl Timestamp {
    pub fn from_raw(raw: u64) -> Timestamp {
        Timestamp {
            seconds: raw & ((1 << 40) - 1),
            micros: (raw >> 40) as u32,
        }
    }

    pub fn to_raw(self) -> u64 {
        (self.seconds & ((1 << 40) - 1)) | (u64::from(self.micros) << 40)
    }

    /// The current time in whole seconds. The field's layout leaves room
    /// for microseconds, but the kernel's md driver and mdadm write plain
    /// seconds and the kernel reads the whole 64-bit word as seconds: a
    /// non-zero microsecond part makes the kernel see a time past 2106,
    /// and then `mdadm --detail` cannot match the array to its superblock
    /// (it compares the kernel's creation time with the superblock's).
    pub fn now() -> Timestamp {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default();
        Timestamp {
            seconds: now.as_secs(),
            micros: 0,
        }
    }
}

/// Why bytes are not a valid v1.2 superblock.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum DecodeError {
    #[error("no md superblock (magic {found:#010x}, expected {MAGIC:#010x})")]
    BadMagic { found: u32 },
    #[error("md superblock major version {0} is not supported (only version 1)")]
    UnsupportedVersion(u32),
    #[error("md superblock role table of {0} entries is larger than md allows")]
    BadMaxDev(u32),
    #[error("md superblock checksum mismatch: stored {stored:#010x}, computed {computed:#010x}")]
    BadChecksum { stored: u32, computed: u32 },
    #[error("md superblock is at sector {found}, not at sector 8 as version 1.2 requires")]
    NotVersion12 { found: u64 },
    #[error("md superblock dev_number {dev_number} is outside its role table of {max_dev}")]
    BadDevNumber { dev_number: u32, max_dev: u32 },
    #[error("buffer of {0} bytes is too short for the superblock")]
    Short(usize),
    #[error("md superblock has feature bits the kernel does not define: {0:#x}")]
    UnknownFeatures(u32),
    #[error("md superblock reserved byte at offset {0} is not zero (the kernel refuses such a superblock)")]
    ReservedNotZero(usize),
    #[error("md superblock field {field} is {sectors} sectors: more bytes than 64 bits count (the superblock is damaged)")]
    SectorsOverflow { field: &'static str, sectors: u64 },
    #[error("md superblock fields data_offset ({data_offset}) and data_size ({data_size}) end past 2^64 bytes (the superblock is damaged)")]
    DataAreaOverflow { data_offset: u64, data_size: u64 },
    #[error("md superblock field data_offset ({data_offset}) puts the data inside the superblock, which ends at sector {superblock_end} (the kernel refuses it)")]
    DataOverlapsSuperblock {
        data_offset: u64,
        superblock_end: u64,
    },
}

/// The longest array name md's superblock holds (`set_name`, 32 bytes).
pub const NAME_BYTES_MAX: usize = 32;

/// An array name longer than md's superblock holds.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("the array name is {} bytes; md's superblock holds at most {NAME_BYTES_MAX}", name.len())]
pub struct NameTooLong {
    pub name: String,
}

/// A decoded md v1.2 superblock. Field names follow md's.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Superblock {
    pub feature_map: u32,
    #[serde(serialize_with = "ser_uuid")]
    pub set_uuid: [u8; 16],
    #[serde(serialize_with = "ser_name")]
    pub set_name: [u8; 32],
    pub ctime: Timestamp,
    pub level: i32,
    pub layout: u32,
    pub size_sectors: u64,
    pub chunk_sectors: u32,
    pub raid_disks: u32,
    pub bitmap_offset: u32,
    pub new_level: u32,
    pub reshape_position: u64,
    pub delta_disks: u32,
    pub new_layout: u32,
    pub new_chunk: u32,
    pub new_offset: u32,
    pub data_offset_sectors: u64,
    pub data_size_sectors: u64,
    pub super_offset_sectors: u64,
    pub recovery_offset: u64,
    pub dev_number: u32,
    pub cnt_corrected_read: u32,
    #[serde(serialize_with = "ser_uuid")]
    pub device_uuid: [u8; 16],
    pub devflags: u8,
    pub bblog_shift: u8,
    pub bblog_size: u16,
    pub bblog_offset: u32,
    pub utime: Timestamp,
    pub events: u64,
    pub resync_offset: u64,
    pub max_dev: u32,
    #[serde(skip)]
    pub roles_raw: Vec<u16>,
}

fn ser_uuid<S: serde::Serializer>(uuid: &[u8; 16], s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(&format_uuid(uuid))
}

fn ser_name<S: serde::Serializer>(name: &[u8; 32], s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(&name_to_string(name))
}

/// md's UUID notation: four groups of 8 hex digits separated by colons.
pub fn format_uuid(uuid: &[u8; 16]) -> String {
    let hex: Vec<String> = uuid
        .chunks(4)
        .map(|g| g.iter().map(|b| format!("{b:02x}")).collect())
        .collect();
    hex.join(":")
}

fn name_to_string(name: &[u8; 32]) -> String {
    let end = name.iter().position(|&b| b == 0).unwrap_or(name.len());
    String::from_utf8_lossy(&name[..end]).into_owned()
}

fn le32(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().expect("4 bytes"))
}

fn le64(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().expect("8 bytes"))
}

fn le16(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes(b[at..at + 2].try_into().expect("2 bytes"))
}

/// md's v1 checksum over `bytes` (the fixed part and the role table), taken
/// with the checksum field counted as zero: the little-endian 32-bit words
/// summed into 64 bits, then the two halves added.
pub fn checksum(bytes: &[u8]) -> u32 {
    let mut sum: u64 = 0;
    let mut words = bytes.chunks_exact(4);
    for (index, word) in words.by_ref().enumerate() {
        if index * 4 == 216 {
            continue; // sb_csum itself
        }
        sum += u64::from(u32::from_le_bytes(word.try_into().expect("4 bytes")));
    }
    let rest = words.remainder();
    if rest.len() >= 2 {
        sum += u64::from(u16::from_le_bytes([rest[0], rest[1]]));
    }
    ((sum & 0xffff_ffff) + (sum >> 32)) as u32
}

impl Superblock {
    /// Encoded length: the fixed part plus two bytes per role-table entry.
    pub fn encoded_len(&self) -> usize {
        FIXED_BYTES + 2 * self.max_dev as usize
    }

    /// The array name as text (mdadm stores `host:name`).
    pub fn name(&self) -> String {
        name_to_string(&self.set_name)
    }

    /// Set the array name; a name longer than md's 32 bytes is refused
    /// (never cut short: two long names could become one).
    pub fn set_name(&mut self, name: &str) -> Result<(), NameTooLong> {
        let bytes = name.as_bytes();
        if bytes.len() > NAME_BYTES_MAX {
            return Err(NameTooLong { name: name.into() });
        }
        self.set_name = [0; 32];
        self.set_name[..bytes.len()].copy_from_slice(bytes);
        Ok(())
    }

    /// This member's role.
    pub fn role(&self) -> Role {
        Role::from_raw(
            self.roles_raw
                .get(self.dev_number as usize)
                .copied()
                .unwrap_or(ROLE_SPARE),
        )
    }

    /// Whether the array was shut down cleanly.
    pub fn is_clean(&self) -> bool {
        self.resync_offset == RESYNC_CLEAN
    }

    /// Check the invariants nvraid relies on; called before every encode and
    /// after every decode.
    pub fn validate(&self) -> Result<(), DecodeError> {
        if self.max_dev > MAX_DEV_LIMIT {
            return Err(DecodeError::BadMaxDev(self.max_dev));
        }
        if self.super_offset_sectors != SUPER_OFFSET_SECTORS {
            return Err(DecodeError::NotVersion12 {
                found: self.super_offset_sectors,
            });
        }
        if self.feature_map & !crate::features::ALL != 0 {
            return Err(DecodeError::UnknownFeatures(
                self.feature_map & !crate::features::ALL,
            ));
        }
        if self.roles_raw.len() != self.max_dev as usize {
            return Err(DecodeError::BadMaxDev(self.max_dev));
        }
        if self.dev_number >= self.max_dev {
            return Err(DecodeError::BadDevNumber {
                dev_number: self.dev_number,
                max_dev: self.max_dev,
            });
        }
        // Every sector count must be a byte count too: whoever multiplies
        // one by 512 may then do it without overflow.
        for (field, sectors) in [
            ("size", self.size_sectors),
            ("data_offset", self.data_offset_sectors),
            ("data_size", self.data_size_sectors),
        ] {
            if sectors > u64::MAX / 512 {
                return Err(DecodeError::SectorsOverflow { field, sectors });
            }
        }
        if self
            .data_offset_sectors
            .checked_add(self.data_size_sectors)
            .is_none_or(|end| end > u64::MAX / 512)
        {
            return Err(DecodeError::DataAreaOverflow {
                data_offset: self.data_offset_sectors,
                data_size: self.data_size_sectors,
            });
        }
        // The kernel's super_1_load: the data starts behind the superblock
        // and its role table (a write to the data must never overwrite it).
        let superblock_end = self.super_offset_sectors + (self.encoded_len() as u64).div_ceil(512);
        if self.data_offset_sectors < superblock_end {
            return Err(DecodeError::DataOverlapsSuperblock {
                data_offset: self.data_offset_sectors,
                superblock_end,
            });
        }
        Ok(())
    }

    /// Decode and verify a superblock read from 4 KiB into a member.
    pub fn decode(bytes: &[u8]) -> Result<Superblock, DecodeError> {
        if bytes.len() < FIXED_BYTES {
            return Err(DecodeError::Short(bytes.len()));
        }
        let magic = le32(bytes, 0);
        if magic != MAGIC {
            return Err(DecodeError::BadMagic { found: magic });
        }
        let version = le32(bytes, 4);
        if version != 1 {
            return Err(DecodeError::UnsupportedVersion(version));
        }
        let max_dev = le32(bytes, 220);
        if max_dev > MAX_DEV_LIMIT {
            return Err(DecodeError::BadMaxDev(max_dev));
        }
        let len = FIXED_BYTES + 2 * max_dev as usize;
        if bytes.len() < len {
            return Err(DecodeError::Short(bytes.len()));
        }
        let stored = le32(bytes, 216);
        let computed = checksum(&bytes[..len]);
        if stored != computed {
            return Err(DecodeError::BadChecksum { stored, computed });
        }
        // The kernel's super_1_load refuses a non-zero pad0 or pad3.
        if let Some(at) = RESERVED
            .iter()
            .flat_map(|r| r.clone())
            .find(|&at| bytes[at] != 0)
        {
            return Err(DecodeError::ReservedNotZero(at));
        }
        let sb = Self::decode_fields(bytes, max_dev);
        sb.validate()?;
        Ok(sb)
    }

    fn decode_fields(b: &[u8], max_dev: u32) -> Superblock {
        Superblock {
            feature_map: le32(b, 8),
            set_uuid: b[16..32].try_into().expect("16 bytes"),
            set_name: b[32..64].try_into().expect("32 bytes"),
            ctime: Timestamp::from_raw(le64(b, 64)),
            level: le32(b, 72) as i32,
            layout: le32(b, 76),
            size_sectors: le64(b, 80),
            chunk_sectors: le32(b, 88),
            raid_disks: le32(b, 92),
            bitmap_offset: le32(b, 96),
            new_level: le32(b, 100),
            reshape_position: le64(b, 104),
            delta_disks: le32(b, 112),
            new_layout: le32(b, 116),
            new_chunk: le32(b, 120),
            new_offset: le32(b, 124),
            data_offset_sectors: le64(b, 128),
            data_size_sectors: le64(b, 136),
            super_offset_sectors: le64(b, 144),
            recovery_offset: le64(b, 152),
            dev_number: le32(b, 160),
            cnt_corrected_read: le32(b, 164),
            device_uuid: b[168..184].try_into().expect("16 bytes"),
            devflags: b[184],
            bblog_shift: b[185],
            bblog_size: le16(b, 186),
            bblog_offset: le32(b, 188),
            utime: Timestamp::from_raw(le64(b, 192)),
            events: le64(b, 200),
            resync_offset: le64(b, 208),
            max_dev,
            roles_raw: (0..max_dev as usize)
                .map(|i| le16(b, FIXED_BYTES + 2 * i))
                .collect(),
        }
    }

    /// Encode into `out` (at least [`Superblock::encoded_len`] bytes; the
    /// rest of `out` is zeroed), computing the checksum.
    pub fn encode(&self, out: &mut [u8]) -> Result<(), DecodeError> {
        self.validate()?;
        let len = self.encoded_len();
        if out.len() < len {
            return Err(DecodeError::Short(out.len()));
        }
        out.fill(0);
        self.encode_fields(out);
        let csum = checksum(&out[..len]);
        out[216..220].copy_from_slice(&csum.to_le_bytes());
        // Paired with decode's checks: what is written must read back as
        // exactly this superblock (kept in release builds; superblock writes
        // are rare and a wrong one loses the array).
        assert_eq!(
            Superblock::decode(out).as_ref(),
            Ok(self),
            "encoded superblock does not decode to itself"
        );
        Ok(())
    }

    fn encode_fields(&self, b: &mut [u8]) {
        let mut put32 = |at: usize, v: u32| b[at..at + 4].copy_from_slice(&v.to_le_bytes());
        put32(0, MAGIC);
        put32(4, 1);
        put32(8, self.feature_map);
        put32(72, self.level as u32);
        put32(76, self.layout);
        put32(88, self.chunk_sectors);
        put32(92, self.raid_disks);
        put32(96, self.bitmap_offset);
        put32(100, self.new_level);
        put32(112, self.delta_disks);
        put32(116, self.new_layout);
        put32(120, self.new_chunk);
        put32(124, self.new_offset);
        put32(160, self.dev_number);
        put32(164, self.cnt_corrected_read);
        put32(188, self.bblog_offset);
        put32(220, self.max_dev);
        let mut put64 = |at: usize, v: u64| b[at..at + 8].copy_from_slice(&v.to_le_bytes());
        put64(64, self.ctime.to_raw());
        put64(80, self.size_sectors);
        put64(104, self.reshape_position);
        put64(128, self.data_offset_sectors);
        put64(136, self.data_size_sectors);
        put64(144, self.super_offset_sectors);
        put64(152, self.recovery_offset);
        put64(192, self.utime.to_raw());
        put64(200, self.events);
        put64(208, self.resync_offset);
        b[16..32].copy_from_slice(&self.set_uuid);
        b[32..64].copy_from_slice(&self.set_name);
        b[168..184].copy_from_slice(&self.device_uuid);
        b[184] = self.devflags;
        b[185] = self.bblog_shift;
        b[186..188].copy_from_slice(&self.bblog_size.to_le_bytes());
        for (i, role) in self.roles_raw.iter().enumerate() {
            b[FIXED_BYTES + 2 * i..FIXED_BYTES + 2 * i + 2].copy_from_slice(&role.to_le_bytes());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Timestamp;

    #[test]
    fn now_is_whole_seconds_as_the_kernel_reads_them() {
        // The kernel takes the whole 64-bit word as seconds.
        let raw = Timestamp::now().to_raw();
        assert!(
            raw < u64::from(u32::MAX),
            "{raw:#x} is past 2106 to the kernel"
        );
        assert!(raw > 1_700_000_000, "{raw} is not the current time");
    }
}
