//! nvraid-metadata: the Linux md v1.2 superblock, byte for byte.
//!
//! nvraid stores its array metadata in md's own format so the kernel's md
//! driver and `mdadm` understand nvraid's members, and nvraid understands
//! theirs. Version 1.2 places the superblock 4 KiB (8 sectors) from the start
//! of each member. Layout (all little-endian; offsets in bytes from the start
//! of the superblock):
//!
//! | offset | size | field | meaning |
//! |---|---|---|---|
//! | 0 | 4 | magic | `0xa92b4efc` |
//! | 4 | 4 | major_version | 1 |
//! | 8 | 4 | feature_map | optional features ([`features`]) |
//! | 16 | 16 | set_uuid | array UUID |
//! | 32 | 32 | set_name | array name, NUL padded (`host:name` by mdadm) |
//! | 64 | 8 | ctime | creation: seconds (low 40 bits), microseconds (high 24) |
//! | 72 | 4 | level | 0, 1, 10 … (-1 linear) |
//! | 76 | 4 | layout | level specific (raid10 near2 = 0x102) |
//! | 80 | 8 | size | sectors of each member used (0 for raid0) |
//! | 88 | 4 | chunksize | sectors |
//! | 92 | 4 | raid_disks | number of active roles |
//! | 128 | 8 | data_offset | sector where data starts on this member |
//! | 136 | 8 | data_size | sectors available for data on this member |
//! | 144 | 8 | super_offset | sector of this superblock (8) |
//! | 160 | 4 | dev_number | index of this member in dev_roles |
//! | 168 | 16 | device_uuid | member UUID |
//! | 185 | 1 | bblog_shift | bad-block log granularity |
//! | 186 | 2 | bblog_size | bad-block log sectors |
//! | 188 | 4 | bblog_offset | bad-block log, sectors from the superblock |
//! | 192 | 8 | utime | last update, encoded like ctime |
//! | 200 | 8 | events | update counter |
//! | 208 | 8 | resync_offset | `u64::MAX` = clean, 0 = dirty |
//! | 216 | 4 | sb_csum | checksum (see [`checksum`]) |
//! | 220 | 4 | max_dev | entries in dev_roles |
//! | 256 | 2·max_dev | dev_roles | role of each dev_number |
//!
//! Fields nvraid does not use (reshape, bitmap, journal, recovery) are
//! preserved on decode and re-encode so rewriting a kernel-made superblock
//! keeps them. The reserved bytes (4 at offset 12, 32 at offset 224) must be
//! zero and `feature_map` may hold only bits the kernel defines; the kernel
//! refuses anything else, and so does [`Superblock::decode`]. [`features`]
//! lists the bits and which of them nvraid honours.

pub mod badblocks;
pub mod bitmap;
pub mod features;
pub mod ppl;
pub mod r5log;
mod superblock;

pub use superblock::{
    checksum, format_uuid, DecodeError, NameTooLong, Role, Superblock, Timestamp, MAGIC,
    NAME_BYTES_MAX, RESYNC_CLEAN, SUPERBLOCK_BYTES_MAX, SUPER_OFFSET_BYTES, SUPER_OFFSET_SECTORS,
};
