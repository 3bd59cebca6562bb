//! The kernel's side of the contract: command numbers, flags and the
//! structures exchanged with ublk_drv, written from the uapi header
//! `include/uapi/linux/ublk_cmd.h`. Everything here is plain data; the
//! sizes are checked at compile time against the header's.
//!
//! Commands are always sent in their ioctl encoding (`_IOR`/`_IOWR` of
//! type `'u'`); the kernel reports that it understands it with
//! [`F_CMD_IOCTL_ENCODE`] and sets that flag on every device it adds.

use std::mem::size_of;

/// `_IOC_*` direction bits: user space writes the argument, reads it, or both.
const IOC_WRITE: u32 = 1;
const IOC_READ: u32 = 2;
/// The ioctl type letter of every ublk command.
const IOC_TYPE: u32 = b'u' as u32;

/// `_IOC(dir, 'u', nr, size)`: direction in bits 30-31, the argument's size
/// in bits 16-29, the type in bits 8-15, the number in bits 0-7.
pub const fn ioc(dir: u32, nr: u32, size: usize) -> u32 {
    (dir << 30) | ((size as u32) << 16) | (IOC_TYPE << 8) | nr
}

const fn ctrl_r(nr: u32) -> u32 {
    ioc(IOC_READ, nr, size_of::<CtrlCmd>())
}
const fn ctrl_rw(nr: u32) -> u32 {
    ioc(IOC_READ | IOC_WRITE, nr, size_of::<CtrlCmd>())
}
const fn io_rw(nr: u32) -> u32 {
    ioc(IOC_READ | IOC_WRITE, nr, size_of::<IoCmd>())
}

// Control commands (to /dev/ublk-control; the argument is a `CtrlCmd` in the SQE).
pub const U_CMD_GET_DEV_INFO: u32 = ctrl_r(0x02);
pub const U_CMD_ADD_DEV: u32 = ctrl_rw(0x04);
pub const U_CMD_DEL_DEV: u32 = ctrl_rw(0x05);
pub const U_CMD_START_DEV: u32 = ctrl_rw(0x06);
pub const U_CMD_STOP_DEV: u32 = ctrl_rw(0x07);
pub const U_CMD_SET_PARAMS: u32 = ctrl_rw(0x08);
pub const U_CMD_GET_PARAMS: u32 = ctrl_r(0x09);
pub const U_CMD_START_USER_RECOVERY: u32 = ctrl_rw(0x10);
pub const U_CMD_END_USER_RECOVERY: u32 = ctrl_rw(0x11);
pub const U_CMD_GET_DEV_INFO2: u32 = ctrl_r(0x12);
pub const U_CMD_GET_FEATURES: u32 = ctrl_r(0x13);
pub const U_CMD_DEL_DEV_ASYNC: u32 = ctrl_r(0x14);
/// A started device's size changed (`data[0]`: sectors); Linux 6.16 on,
/// announced by [`F_UPDATE_SIZE`] in the driver's features.
pub const U_CMD_UPDATE_SIZE: u32 = ctrl_rw(0x15);

// I/O commands (to /dev/ublkcN; the argument is an `IoCmd` in the SQE).
pub const U_IO_FETCH_REQ: u32 = io_rw(0x20);
pub const U_IO_COMMIT_AND_FETCH_REQ: u32 = io_rw(0x21);
pub const U_IO_NEED_GET_DATA: u32 = io_rw(0x22);

// What an I/O command's completion (cqe.res) says.
/// A request is waiting in the tag's descriptor.
pub const IO_RES_OK: i32 = 0;
/// (With [`F_NEED_GET_DATA`] only) a write wants its buffer first.
pub const IO_RES_NEED_GET_DATA: i32 = 1;
/// The device is going away (stopped, or the queue cancelled): the tag is
/// not to be fetched again.
pub const IO_RES_ABORT: i32 = -libc::ENODEV;

// Where the per-queue descriptor arrays are in /dev/ublkcN.
pub const CMD_BUF_OFFSET: u64 = 0;
pub const MAX_QUEUE_DEPTH: u16 = 4096;
pub const MAX_QUEUES: u16 = 4096;

// Device flags (`DevInfo::flags`).
pub const F_SUPPORT_ZERO_COPY: u64 = 1 << 0;
pub const F_URING_CMD_COMP_IN_TASK: u64 = 1 << 1;
pub const F_NEED_GET_DATA: u64 = 1 << 2;
/// The device survives its server: I/O waits for a new one.
pub const F_USER_RECOVERY: u64 = 1 << 3;
/// With [`F_USER_RECOVERY`]: I/O the dead server held is issued again to
/// the new one (instead of failing).
pub const F_USER_RECOVERY_REISSUE: u64 = 1 << 4;
pub const F_UNPRIVILEGED_DEV: u64 = 1 << 5;
pub const F_CMD_IOCTL_ENCODE: u64 = 1 << 6;
pub const F_USER_COPY: u64 = 1 << 7;
pub const F_ZONED: u64 = 1 << 8;
pub const F_USER_RECOVERY_FAIL_IO: u64 = 1 << 9;
/// The driver takes [`U_CMD_UPDATE_SIZE`] (a feature bit of
/// GET_FEATURES; a device needs no flag for it).
pub const F_UPDATE_SIZE: u64 = 1 << 10;

// Device states (`DevInfo::state`).
pub const S_DEV_DEAD: u16 = 0;
pub const S_DEV_LIVE: u16 = 1;
pub const S_DEV_QUIESCED: u16 = 2;
pub const S_DEV_FAIL_IO: u16 = 3;

// Request operations (bits 0-7 of `IoDesc::op_flags`).
pub const IO_OP_READ: u8 = 0;
pub const IO_OP_WRITE: u8 = 1;
pub const IO_OP_FLUSH: u8 = 2;
pub const IO_OP_DISCARD: u8 = 3;
pub const IO_OP_WRITE_SAME: u8 = 4;
pub const IO_OP_WRITE_ZEROES: u8 = 5;

// Request flags (bits 8-31 of `IoDesc::op_flags`, kept in place).
pub const IO_F_FAILFAST_DEV: u32 = 1 << 8;
pub const IO_F_FAILFAST_TRANSPORT: u32 = 1 << 9;
pub const IO_F_FAILFAST_DRIVER: u32 = 1 << 10;
pub const IO_F_META: u32 = 1 << 11;
pub const IO_F_FUA: u32 = 1 << 13;
pub const IO_F_NOUNMAP: u32 = 1 << 15;
pub const IO_F_SWAP: u32 = 1 << 16;

// `ParamBasic::attrs`.
pub const ATTR_READ_ONLY: u32 = 1 << 0;
pub const ATTR_ROTATIONAL: u32 = 1 << 1;
/// The device has a write cache: the block layer sends FLUSH.
pub const ATTR_VOLATILE_CACHE: u32 = 1 << 2;
/// The device honours FUA on writes.
pub const ATTR_FUA: u32 = 1 << 3;

// `Params::types`: which parts of `Params` are filled in.
pub const PARAM_TYPE_BASIC: u32 = 1 << 0;
pub const PARAM_TYPE_DISCARD: u32 = 1 << 1;
pub const PARAM_TYPE_DEVT: u32 = 1 << 2;
pub const PARAM_TYPE_ZONED: u32 = 1 << 3;

/// The argument of a control command, carried in the SQE's command area
/// (`struct ublksrv_ctrl_cmd`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CtrlCmd {
    /// The device; `u32::MAX` asks ADD_DEV to choose one.
    pub dev_id: u32,
    /// `u16::MAX` unless the command is for one queue.
    pub queue_id: u16,
    /// Length of the buffer at `addr`.
    pub len: u16,
    /// A user buffer the command reads or fills (device info, parameters).
    pub addr: u64,
    /// Inline argument (START_DEV, END_USER_RECOVERY: the server's pid).
    pub data: [u64; 1],
    pub dev_path_len: u16,
    pub pad: u16,
    pub reserved: u32,
}

/// A device's description (`struct ublksrv_ctrl_dev_info`): what ADD_DEV
/// asks for and GET_DEV_INFO reports.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DevInfo {
    pub nr_hw_queues: u16,
    pub queue_depth: u16,
    /// One of `S_DEV_*`.
    pub state: u16,
    pub pad0: u16,
    pub max_io_buf_bytes: u32,
    pub dev_id: u32,
    pub ublksrv_pid: i32,
    pub pad1: u32,
    /// `F_*`.
    pub flags: u64,
    /// Free for the server; the kernel keeps it.
    pub ublksrv_flags: u64,
    pub owner_uid: u32,
    pub owner_gid: u32,
    pub reserved1: u64,
    pub reserved2: u64,
}

/// One request, as the kernel describes it in the queue's shared array,
/// indexed by tag (`struct ublksrv_io_desc`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct IoDescRaw {
    /// Operation in bits 0-7, `IO_F_*` flags above.
    pub op_flags: u32,
    pub nr_sectors: u32,
    pub start_sector: u64,
    /// The tag's buffer (as given with FETCH_REQ).
    pub addr: u64,
}

/// The argument of an I/O command (`struct ublksrv_io_cmd`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct IoCmd {
    pub q_id: u16,
    pub tag: u16,
    /// COMMIT_AND_FETCH_REQ: bytes done, or a negative errno.
    pub result: i32,
    /// FETCH_REQ (and COMMIT_AND_FETCH_REQ): the tag's buffer address.
    pub addr: u64,
}

/// `struct ublk_param_basic`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ParamBasic {
    /// `ATTR_*`.
    pub attrs: u32,
    pub logical_bs_shift: u8,
    pub physical_bs_shift: u8,
    pub io_opt_shift: u8,
    pub io_min_shift: u8,
    /// Largest request, in 512-byte sectors (at most max_io_buf_bytes / 512).
    pub max_sectors: u32,
    /// Requests never cross a multiple of this (sectors; 0: no boundary).
    pub chunk_sectors: u32,
    /// The device's size in 512-byte sectors.
    pub dev_sectors: u64,
    pub virt_boundary_mask: u64,
}

/// `struct ublk_param_discard` (also the limit of WRITE_ZEROES).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ParamDiscard {
    pub discard_alignment: u32,
    pub discard_granularity: u32,
    pub max_discard_sectors: u32,
    pub max_write_zeroes_sectors: u32,
    /// The kernel takes 1 only (one range per request).
    pub max_discard_segments: u16,
    pub reserved0: u16,
}

/// `struct ublk_param_devt`: read-only, the device numbers once started.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ParamDevt {
    pub char_major: u32,
    pub char_minor: u32,
    pub disk_major: u32,
    pub disk_minor: u32,
}

/// `struct ublk_param_zoned`: unused by nvraid, present so that the
/// parameter block has the kernel's layout.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ParamZoned {
    pub max_open_zones: u32,
    pub max_active_zones: u32,
    pub max_zone_append_sectors: u32,
    pub reserved: [u8; 20],
}

/// `struct ublk_params` as of Linux 6.12 (basic, discard, devt, zoned).
/// Later kernels append parts; `len` tells the kernel how much of the
/// block user space knows, and it reads or fills no more than that.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Params {
    pub len: u32,
    /// `PARAM_TYPE_*`.
    pub types: u32,
    pub basic: ParamBasic,
    pub discard: ParamDiscard,
    pub devt: ParamDevt,
    pub zoned: ParamZoned,
}

impl Default for Params {
    fn default() -> Self {
        Params {
            len: size_of::<Params>() as u32,
            types: 0,
            basic: ParamBasic::default(),
            discard: ParamDiscard::default(),
            devt: ParamDevt::default(),
            zoned: ParamZoned::default(),
        }
    }
}

// The header's sizes (counted by hand from its field lists).
const _: () = assert!(size_of::<CtrlCmd>() == 32);
const _: () = assert!(size_of::<DevInfo>() == 64);
const _: () = assert!(size_of::<IoDescRaw>() == 24);
const _: () = assert!(size_of::<IoCmd>() == 16);
const _: () = assert!(size_of::<ParamBasic>() == 32);
const _: () = assert!(size_of::<ParamDiscard>() == 20);
const _: () = assert!(size_of::<ParamDevt>() == 16);
const _: () = assert!(size_of::<ParamZoned>() == 32);
// 8 (len, types) + 32 + 20 + 16 + 32 = 108, padded to the u64 alignment of `basic`.
const _: () = assert!(size_of::<Params>() == 112);
// The command argument must fit the 80 bytes of an SQE128's command area.
const _: () = assert!(size_of::<CtrlCmd>() <= 80 && size_of::<IoCmd>() <= 80);

/// Bytes of one queue's descriptor array: `depth` descriptors, whole pages.
pub fn desc_array_bytes(depth: u16, page: usize) -> usize {
    (depth as usize * size_of::<IoDescRaw>()).next_multiple_of(page)
}

/// Where queue `q_id`'s descriptor array is in /dev/ublkcN. The kernel
/// spaces the arrays by the size of the largest possible one
/// ([`MAX_QUEUE_DEPTH`] descriptors), whatever the device's depth.
pub fn desc_array_offset(q_id: u16, page: usize) -> u64 {
    CMD_BUF_OFFSET + q_id as u64 * desc_array_bytes(MAX_QUEUE_DEPTH, page) as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each command number, worked out by hand from the header:
    /// `_IOR` is direction 2, `_IOWR` 3 (bits 30-31); the size of
    /// `ublksrv_ctrl_cmd` is 32 = 0x20 and of `ublksrv_io_cmd` 16 = 0x10
    /// (bits 16-29); 'u' is 0x75 (bits 8-15); then the number.
    #[test]
    fn command_numbers_are_the_headers_ioctl_encoding() {
        assert_eq!(U_CMD_GET_DEV_INFO, 0x8020_7502);
        assert_eq!(U_CMD_ADD_DEV, 0xc020_7504);
        assert_eq!(U_CMD_DEL_DEV, 0xc020_7505);
        assert_eq!(U_CMD_START_DEV, 0xc020_7506);
        assert_eq!(U_CMD_STOP_DEV, 0xc020_7507);
        assert_eq!(U_CMD_SET_PARAMS, 0xc020_7508);
        assert_eq!(U_CMD_GET_PARAMS, 0x8020_7509);
        assert_eq!(U_CMD_START_USER_RECOVERY, 0xc020_7510);
        assert_eq!(U_CMD_END_USER_RECOVERY, 0xc020_7511);
        assert_eq!(U_CMD_GET_DEV_INFO2, 0x8020_7512);
        assert_eq!(U_CMD_GET_FEATURES, 0x8020_7513);
        assert_eq!(U_CMD_DEL_DEV_ASYNC, 0x8020_7514);
        assert_eq!(U_CMD_UPDATE_SIZE, 0xc020_7515);
        assert_eq!(U_IO_FETCH_REQ, 0xc010_7520);
        assert_eq!(U_IO_COMMIT_AND_FETCH_REQ, 0xc010_7521);
        assert_eq!(U_IO_NEED_GET_DATA, 0xc010_7522);
    }

    #[test]
    fn flags_and_codes_are_the_headers() {
        assert_eq!(F_USER_RECOVERY, 8);
        assert_eq!(F_USER_RECOVERY_REISSUE, 16);
        assert_eq!(F_CMD_IOCTL_ENCODE, 64);
        assert_eq!(F_UPDATE_SIZE, 0x400);
        assert_eq!(IO_RES_ABORT, -19);
        assert_eq!(IO_F_FUA, 0x2000);
        assert_eq!(Params::default().len, 112);
    }

    /// Field offsets the kernel reads at fixed places.
    #[test]
    fn fields_sit_where_the_header_puts_them() {
        use std::mem::offset_of;
        assert_eq!(offset_of!(CtrlCmd, addr), 8);
        assert_eq!(offset_of!(CtrlCmd, data), 16);
        assert_eq!(offset_of!(CtrlCmd, dev_path_len), 24);
        assert_eq!(offset_of!(DevInfo, max_io_buf_bytes), 8);
        assert_eq!(offset_of!(DevInfo, ublksrv_pid), 16);
        assert_eq!(offset_of!(DevInfo, flags), 24);
        assert_eq!(offset_of!(DevInfo, owner_uid), 40);
        assert_eq!(offset_of!(IoDescRaw, start_sector), 8);
        assert_eq!(offset_of!(IoDescRaw, addr), 16);
        assert_eq!(offset_of!(IoCmd, result), 4);
        assert_eq!(offset_of!(IoCmd, addr), 8);
        assert_eq!(offset_of!(ParamBasic, max_sectors), 8);
        assert_eq!(offset_of!(ParamBasic, dev_sectors), 16);
        assert_eq!(offset_of!(Params, basic), 8);
        assert_eq!(offset_of!(Params, discard), 40);
        assert_eq!(offset_of!(Params, devt), 60);
        assert_eq!(offset_of!(Params, zoned), 76);
    }

    /// The kernel spaces queue arrays by a 4096-deep array (24 pages of
    /// 4 KiB), not by the device's depth.
    #[test]
    fn queue_arrays_are_spaced_by_the_deepest_queue() {
        assert_eq!(desc_array_bytes(128, 4096), 4096);
        assert_eq!(desc_array_bytes(171, 4096), 8192);
        assert_eq!(desc_array_offset(0, 4096), 0);
        assert_eq!(desc_array_offset(1, 4096), 24 * 4096);
        assert_eq!(desc_array_offset(3, 4096), 3 * 24 * 4096);
    }
}
