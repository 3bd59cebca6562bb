//! The 64-byte submission queue entry, the 16-byte completion entry, and
//! the commands nvraid sends: Fabrics (Connect, Property Get/Set), admin
//! (Identify, Keep Alive, Set Features) and I/O (Read, Write, Flush,
//! Write Zeroes, Dataset Management).
//!
//! Over Fabrics every command's data pointer is one SGL descriptor: data
//! inside the capsule (an offset descriptor) or data moved by the
//! transport (C2HData for reads, in-capsule or R2T/H2CData for writes).

use crate::bytes::{le16, le32, le64, need};
use crate::error::ParseError;

pub const SQE_BYTES: usize = 64;
pub const CQE_BYTES: usize = 16;
/// Fabrics Connect's data.
pub const CONNECT_DATA_BYTES: usize = 1024;
/// Longest NQN (including its terminating zero).
pub const NQN_BYTES: usize = 256;
/// Dataset Management range.
pub const DSM_RANGE_BYTES: usize = 16;
/// Most ranges in one Dataset Management command.
pub const DSM_MAX_RANGES: usize = 256;

/// Opcodes.
pub mod opcode {
    pub const FABRICS: u8 = 0x7f;
    // Admin.
    pub const GET_LOG_PAGE: u8 = 0x02;
    pub const IDENTIFY: u8 = 0x06;
    pub const SET_FEATURES: u8 = 0x09;
    pub const GET_FEATURES: u8 = 0x0a;
    pub const ASYNC_EVENT: u8 = 0x0c;
    pub const KEEP_ALIVE: u8 = 0x18;
    // I/O.
    pub const FLUSH: u8 = 0x00;
    pub const WRITE: u8 = 0x01;
    pub const READ: u8 = 0x02;
    pub const WRITE_ZEROES: u8 = 0x08;
    pub const DSM: u8 = 0x09;
}

/// Fabrics command types.
pub mod fctype {
    pub const PROPERTY_SET: u8 = 0x00;
    pub const CONNECT: u8 = 0x01;
    pub const PROPERTY_GET: u8 = 0x04;
    pub const DISCONNECT: u8 = 0x08;
}

/// Controller properties (offsets) and their bits.
pub mod property {
    pub const CAP: u32 = 0x00;
    pub const VS: u32 = 0x08;
    pub const CC: u32 = 0x14;
    pub const CSTS: u32 = 0x1c;
    pub const CC_EN: u32 = 1;
    /// I/O submission entries of 2^6 bytes, completion entries of 2^4.
    pub const CC_IOSQES_64: u32 = 6 << 16;
    pub const CC_IOCQES_16: u32 = 4 << 20;
    pub const CSTS_RDY: u32 = 1;
    pub const CSTS_CFS: u32 = 2;

    /// CAP.MQES: largest queue, 0's based.
    pub fn cap_mqes(cap: u64) -> u16 {
        cap as u16
    }
    /// CAP.TO: how long CSTS.RDY may take, in milliseconds.
    pub fn cap_timeout_ms(cap: u64) -> u64 {
        ((cap >> 24) & 0xff) * 500
    }
    /// CAP.MPSMIN: the smallest memory page, in bytes.
    pub fn cap_min_page_bytes(cap: u64) -> u64 {
        1 << (12 + ((cap >> 48) & 0xf))
    }
}

/// SGL descriptor types (type in the high nibble, subtype in the low).
pub mod sgl {
    /// Data block, offset into the capsule's in-capsule data.
    pub const IN_CAPSULE: u8 = 0x01;
    /// Transport data block: the transport moves the data.
    pub const TRANSPORT: u8 = 0x5a;
}

/// Command flags: PSDT = SGL (Fabrics commands always use SGLs).
const FLAGS_SGL: u8 = 0x40;

/// Read/Write/Write Zeroes control bits (cdw12).
const CDW12_FUA: u32 = 1 << 30;
const CDW12_DEAC: u32 = 1 << 25;
/// Dataset Management attribute: deallocate.
const DSM_AD: u32 = 1 << 2;

/// A submission queue entry, as sent.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Sqe(pub [u8; SQE_BYTES]);

impl Sqe {
    fn new(opcode: u8, cid: u16) -> Sqe {
        let mut b = [0u8; SQE_BYTES];
        b[0] = opcode;
        b[1] = FLAGS_SGL;
        b[2..4].copy_from_slice(&cid.to_le_bytes());
        Sqe(b)
    }

    pub fn opcode(&self) -> u8 {
        self.0[0]
    }
    pub fn cid(&self) -> u16 {
        le16(&self.0, 2)
    }
    pub fn set_cid(&mut self, cid: u16) {
        self.0[2..4].copy_from_slice(&cid.to_le_bytes());
    }
    pub fn nsid(&self) -> u32 {
        le32(&self.0, 4)
    }
    /// Command dword `n` (10..=15 are command specific).
    pub fn cdw(&self, n: usize) -> u32 {
        le32(&self.0, n * 4)
    }
    fn set_cdw(&mut self, n: usize, v: u32) {
        self.0[n * 4..n * 4 + 4].copy_from_slice(&v.to_le_bytes());
    }
    fn set_u64(&mut self, at: usize, v: u64) {
        self.0[at..at + 8].copy_from_slice(&v.to_le_bytes());
    }
    /// The data pointer: one SGL descriptor of `len` bytes, in the capsule
    /// or moved by the transport.
    pub fn set_sgl(&mut self, len: u32, in_capsule: bool) {
        self.set_u64(24, 0);
        self.0[32..36].copy_from_slice(&len.to_le_bytes());
        self.0[36..39].fill(0);
        self.0[39] = if in_capsule {
            sgl::IN_CAPSULE
        } else {
            sgl::TRANSPORT
        };
    }
    /// The SGL descriptor's length and type.
    pub fn sgl(&self) -> (u32, u8) {
        (le32(&self.0, 32), self.0[39])
    }
    /// A Fabrics command's type.
    pub fn fctype(&self) -> u8 {
        self.0[4]
    }

    /// Fabrics Connect for queue `qid` with `sqsize` entries (0's based)
    /// and a keep-alive timeout (ms, admin queue); its 1 KiB data
    /// ([`ConnectData`]) follows in the capsule or by the transport.
    pub fn connect(cid: u16, qid: u16, sqsize: u16, kato_ms: u32, in_capsule: bool) -> Sqe {
        let mut s = Sqe::new(opcode::FABRICS, cid);
        s.0[4] = fctype::CONNECT;
        s.set_sgl(CONNECT_DATA_BYTES as u32, in_capsule);
        // recfmt 0.
        s.0[42..44].copy_from_slice(&qid.to_le_bytes());
        s.0[44..46].copy_from_slice(&sqsize.to_le_bytes());
        s.set_cdw(12, kato_ms);
        s
    }

    /// Property Get of `offset` (`eight`: an 8-byte property).
    pub fn property_get(cid: u16, offset: u32, eight: bool) -> Sqe {
        let mut s = Sqe::new(opcode::FABRICS, cid);
        s.0[4] = fctype::PROPERTY_GET;
        s.0[40] = u8::from(eight);
        s.set_cdw(11, offset);
        s
    }

    /// Property Set of the 4-byte property at `offset`.
    pub fn property_set(cid: u16, offset: u32, value: u32) -> Sqe {
        let mut s = Sqe::new(opcode::FABRICS, cid);
        s.0[4] = fctype::PROPERTY_SET;
        s.0[40] = 0;
        s.set_cdw(11, offset);
        s.set_u64(48, u64::from(value));
        s
    }

    /// Identify: `cns` 1 the controller, 0 namespace `nsid`; 4 KiB of data
    /// by the transport.
    pub fn identify(cid: u16, cns: u8, nsid: u32) -> Sqe {
        let mut s = Sqe::new(opcode::IDENTIFY, cid);
        s.0[4..8].copy_from_slice(&nsid.to_le_bytes());
        s.set_sgl(4096, false);
        s.set_cdw(10, u32::from(cns));
        s
    }

    pub fn keep_alive(cid: u16) -> Sqe {
        Sqe::new(opcode::KEEP_ALIVE, cid)
    }

    /// Set Features, Number of Queues: `count` I/O queues each way.
    pub fn set_queue_count(cid: u16, count: u16) -> Sqe {
        let mut s = Sqe::new(opcode::SET_FEATURES, cid);
        s.set_cdw(10, 0x07);
        let n = u32::from(count.saturating_sub(1));
        s.set_cdw(11, n | (n << 16));
        s
    }

    /// Read `blocks` logical blocks from `slba` (at most 65536).
    pub fn read(cid: u16, nsid: u32, slba: u64, blocks: u32, len: u32) -> Sqe {
        Sqe::rw(opcode::READ, cid, nsid, slba, blocks, len, false, false)
    }

    /// Write `blocks` blocks (`len` bytes) at `slba`, in the capsule or
    /// by R2T, with FUA when `fua`.
    pub fn write(
        cid: u16,
        nsid: u32,
        slba: u64,
        blocks: u32,
        len: u32,
        in_capsule: bool,
        fua: bool,
    ) -> Sqe {
        Sqe::rw(opcode::WRITE, cid, nsid, slba, blocks, len, in_capsule, fua)
    }

    #[allow(clippy::too_many_arguments)]
    fn rw(
        op: u8,
        cid: u16,
        nsid: u32,
        slba: u64,
        blocks: u32,
        len: u32,
        in_capsule: bool,
        fua: bool,
    ) -> Sqe {
        assert!(
            (1..=65536).contains(&blocks),
            "invariant: a Read/Write covers 1..=65536 blocks"
        );
        let mut s = Sqe::new(op, cid);
        s.0[4..8].copy_from_slice(&nsid.to_le_bytes());
        s.set_sgl(len, in_capsule);
        s.set_u64(40, slba);
        s.set_cdw(12, (blocks - 1) | if fua { CDW12_FUA } else { 0 });
        s
    }

    pub fn flush(cid: u16, nsid: u32) -> Sqe {
        let mut s = Sqe::new(opcode::FLUSH, cid);
        s.0[4..8].copy_from_slice(&nsid.to_le_bytes());
        s
    }

    /// Write Zeroes over `blocks` blocks (at most 65536); `deallocate`
    /// lets the controller free them (reads still return zeros).
    pub fn write_zeroes(
        cid: u16,
        nsid: u32,
        slba: u64,
        blocks: u32,
        deallocate: bool,
        fua: bool,
    ) -> Sqe {
        assert!(
            (1..=65536).contains(&blocks),
            "invariant: a Write Zeroes covers 1..=65536 blocks"
        );
        let mut s = Sqe::new(opcode::WRITE_ZEROES, cid);
        s.0[4..8].copy_from_slice(&nsid.to_le_bytes());
        s.set_u64(40, slba);
        let mut cdw12 = blocks - 1;
        if deallocate {
            cdw12 |= CDW12_DEAC;
        }
        if fua {
            cdw12 |= CDW12_FUA;
        }
        s.set_cdw(12, cdw12);
        s
    }

    /// Dataset Management, deallocate, over `ranges` ranges (their
    /// [`DsmRange::encode`]d list is the command's data).
    pub fn dsm_deallocate(cid: u16, nsid: u32, ranges: usize, in_capsule: bool) -> Sqe {
        assert!(
            (1..=DSM_MAX_RANGES).contains(&ranges),
            "invariant: Dataset Management carries 1..=256 ranges"
        );
        let mut s = Sqe::new(opcode::DSM, cid);
        s.0[4..8].copy_from_slice(&nsid.to_le_bytes());
        s.set_sgl((ranges * DSM_RANGE_BYTES) as u32, in_capsule);
        s.set_cdw(10, (ranges - 1) as u32);
        s.set_cdw(11, DSM_AD);
        s
    }

    /// The starting block and block count of a Read/Write/Write Zeroes.
    pub fn lba_range(&self) -> (u64, u32) {
        (le64(&self.0, 40), (self.cdw(12) & 0xffff) + 1)
    }
}

/// One range of a Dataset Management command.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DsmRange {
    pub slba: u64,
    pub blocks: u32,
}

impl DsmRange {
    pub fn encode(&self) -> [u8; DSM_RANGE_BYTES] {
        let mut b = [0u8; DSM_RANGE_BYTES];
        b[4..8].copy_from_slice(&self.blocks.to_le_bytes());
        b[8..16].copy_from_slice(&self.slba.to_le_bytes());
        b
    }
}

/// Fabrics Connect's data: who connects, to what.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConnectData {
    pub host_id: [u8; 16],
    /// 0xffff on the admin queue (any controller); the admin queue's
    /// controller id on I/O queues.
    pub cntlid: u16,
    pub subnqn: String,
    pub hostnqn: String,
}

impl ConnectData {
    /// Encode; an NQN longer than 255 bytes or holding a NUL is refused.
    pub fn encode(&self) -> Result<[u8; CONNECT_DATA_BYTES], ParseError> {
        let mut b = [0u8; CONNECT_DATA_BYTES];
        b[0..16].copy_from_slice(&self.host_id);
        b[16..18].copy_from_slice(&self.cntlid.to_le_bytes());
        put_nqn(&mut b[256..512], &self.subnqn, "subsystem NQN")?;
        put_nqn(&mut b[512..768], &self.hostnqn, "host NQN")?;
        Ok(b)
    }

    pub fn parse(b: &[u8]) -> Result<ConnectData, ParseError> {
        need(b, CONNECT_DATA_BYTES)?;
        let mut host_id = [0u8; 16];
        host_id.copy_from_slice(&b[0..16]);
        Ok(ConnectData {
            host_id,
            cntlid: le16(b, 16),
            subnqn: get_nqn(&b[256..512], "subsystem NQN")?,
            hostnqn: get_nqn(&b[512..768], "host NQN")?,
        })
    }
}

fn put_nqn(out: &mut [u8], nqn: &str, field: &'static str) -> Result<(), ParseError> {
    if nqn.is_empty() || nqn.len() >= NQN_BYTES || nqn.bytes().any(|c| c == 0) {
        return Err(ParseError::Field {
            field,
            value: nqn.len() as u64,
        });
    }
    out[..nqn.len()].copy_from_slice(nqn.as_bytes());
    Ok(())
}

fn get_nqn(b: &[u8], field: &'static str) -> Result<String, ParseError> {
    let len = b.iter().position(|&c| c == 0).ok_or(ParseError::Field {
        field,
        value: b.len() as u64,
    })?;
    String::from_utf8(b[..len].to_vec()).map_err(|_| ParseError::Field {
        field,
        value: len as u64,
    })
}

/// A completion queue entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Cqe {
    /// Command specific result (dwords 0 and 1).
    pub result: u64,
    pub sq_head: u16,
    pub sq_id: u16,
    pub cid: u16,
    pub status: Status,
}

impl Cqe {
    pub fn parse(b: &[u8]) -> Cqe {
        Cqe {
            result: le64(b, 0),
            sq_head: le16(b, 8),
            sq_id: le16(b, 10),
            cid: le16(b, 12),
            // Bit 0 is the phase tag, meaningless over Fabrics.
            status: Status(le16(b, 14) >> 1),
        }
    }

    pub fn encode(&self) -> [u8; CQE_BYTES] {
        let mut b = [0u8; CQE_BYTES];
        b[0..8].copy_from_slice(&self.result.to_le_bytes());
        b[8..10].copy_from_slice(&self.sq_head.to_le_bytes());
        b[10..12].copy_from_slice(&self.sq_id.to_le_bytes());
        b[12..14].copy_from_slice(&self.cid.to_le_bytes());
        b[14..16].copy_from_slice(&(self.status.0 << 1).to_le_bytes());
        b
    }
}

/// A completion's status field (without the phase tag): status code in
/// bits 7:0, its type in 10:8, retry delay 12:11, more 13, do-not-retry 14.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct Status(pub u16);

impl Status {
    pub const SUCCESS: Status = Status(0);

    pub fn is_success(self) -> bool {
        self.code() == 0 && self.code_type() == 0
    }
    pub fn code(self) -> u8 {
        self.0 as u8
    }
    pub fn code_type(self) -> u8 {
        ((self.0 >> 8) & 7) as u8
    }
    pub fn do_not_retry(self) -> bool {
        self.0 & (1 << 14) != 0
    }
    pub fn new(code_type: u8, code: u8, dnr: bool) -> Status {
        Status(u16::from(code) | (u16::from(code_type & 7) << 8) | (u16::from(dnr) << 14))
    }

    /// The errno a failed command maps to for the array above.
    pub fn errno(self) -> i32 {
        const EIO: i32 = 5;
        const EINVAL: i32 = 22;
        const ENOSPC: i32 = 28;
        const EOPNOTSUPP: i32 = 95;
        const EROFS: i32 = 30;
        const ENODATA: i32 = 61;
        match (self.code_type(), self.code()) {
            (0, 0) => 0,
            (0, 0x01) => EOPNOTSUPP,
            (0, 0x02) | (0, 0x0b) => EINVAL,
            (0, 0x80) => ENOSPC,
            (0, 0x81) => ENOSPC,
            (0, 0x20) => EROFS,
            (2, _) => ENODATA,
            _ => EIO,
        }
    }
}

impl std::fmt::Display for Status {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let name = match (self.code_type(), self.code()) {
            (0, 0x00) => "success",
            (0, 0x01) => "invalid command opcode",
            (0, 0x02) => "invalid field in command",
            (0, 0x03) => "command id conflict",
            (0, 0x04) => "data transfer error",
            (0, 0x06) => "internal error",
            (0, 0x07) => "command abort requested",
            (0, 0x0b) => "invalid namespace or format",
            (0, 0x80) => "LBA out of range",
            (0, 0x81) => "capacity exceeded",
            (0, 0x82) => "namespace not ready",
            (1, 0x80) => "Connect: incompatible format",
            (1, 0x81) => "Connect: controller busy",
            (1, 0x82) => "Connect: invalid parameters (subsystem NQN, controller id or queue)",
            (1, 0x84) => "Connect: host not allowed",
            (2, _) => "media error",
            _ => "error",
        };
        write!(
            f,
            "{name} (status type {:#x}, code {:#04x})",
            self.code_type(),
            self.code()
        )
    }
}
