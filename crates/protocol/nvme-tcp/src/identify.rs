//! The parts of Identify Controller (CNS 1) and Identify Namespace (CNS 0)
//! nvraid needs, parsed from their 4 KiB data.

use crate::bytes::{le16, le32, le64, need};
use crate::error::ParseError;

pub const IDENTIFY_BYTES: usize = 4096;

/// Optional NVM command support (ONCS) bits.
pub mod oncs {
    pub const DSM: u16 = 1 << 2;
    pub const WRITE_ZEROES: u16 = 1 << 3;
}

/// Identify Controller, the fields nvraid uses.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Controller {
    pub vid: u16,
    pub serial: String,
    pub model: String,
    pub firmware: String,
    /// Maximum data transfer, a power of two in units of the smallest
    /// memory page (CAP.MPSMIN); 0: no limit.
    pub mdts: u8,
    pub cntlid: u16,
    pub version: u32,
    pub maxcmd: u16,
    /// Number of namespaces (the highest valid NSID).
    pub nn: u32,
    pub oncs: u16,
    /// Volatile write cache present.
    pub vwc: bool,
    pub sgls: u32,
    pub subnqn: String,
    /// I/O command capsule size, in 16-byte units (SQE included).
    pub ioccsz: u32,
    /// I/O response capsule size, in 16-byte units.
    pub iorcsz: u32,
    pub icdoff: u16,
}

impl Controller {
    pub fn parse(b: &[u8]) -> Result<Controller, ParseError> {
        need(b, IDENTIFY_BYTES)?;
        Ok(Controller {
            vid: le16(b, 0),
            serial: text(&b[4..24]),
            model: text(&b[24..64]),
            firmware: text(&b[64..72]),
            mdts: b[77],
            cntlid: le16(b, 78),
            version: le32(b, 80),
            maxcmd: le16(b, 514),
            nn: le32(b, 516),
            oncs: le16(b, 520),
            vwc: b[525] & 1 != 0,
            sgls: le32(b, 536),
            subnqn: text(&b[768..1024]),
            ioccsz: le32(b, 1792),
            iorcsz: le32(b, 1796),
            icdoff: le16(b, 1800),
        })
    }

    /// Most bytes of in-capsule data an I/O command may carry (0: none).
    pub fn in_capsule_bytes(&self) -> u32 {
        if self.icdoff != 0 {
            // Data not right after the SQE: nvraid does not place it.
            return 0;
        }
        self.ioccsz.saturating_mul(16).saturating_sub(64)
    }

    /// Most bytes one command may move, for a controller whose smallest
    /// page is `min_page` bytes (None: no limit).
    pub fn max_transfer_bytes(&self, min_page: u64) -> Option<u64> {
        if self.mdts == 0 {
            return None;
        }
        Some(
            min_page
                .checked_shl(u32::from(self.mdts))
                .unwrap_or(u64::MAX),
        )
    }

    pub fn supports_write_zeroes(&self) -> bool {
        self.oncs & oncs::WRITE_ZEROES != 0
    }

    pub fn supports_dsm(&self) -> bool {
        self.oncs & oncs::DSM != 0
    }
}

/// Identify Namespace, the fields nvraid uses.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Namespace {
    /// Size, in logical blocks.
    pub nsze: u64,
    pub ncap: u64,
    /// The LBA format in use.
    pub lba_format: u8,
    /// Logical block size, bytes.
    pub block_bytes: u32,
    /// Metadata bytes per block (nvraid needs 0).
    pub metadata_bytes: u16,
    /// Preferred write granularity and alignment, in blocks (0's based;
    /// valid when `nsfeat` bit 4).
    pub npwg: u16,
    pub nsfeat: u8,
    pub nguid: [u8; 16],
    pub eui64: [u8; 8],
}

impl Namespace {
    pub fn parse(b: &[u8]) -> Result<Namespace, ParseError> {
        need(b, IDENTIFY_BYTES)?;
        let nlbaf = b[25];
        let flbas = b[26];
        let index = (flbas & 0x0f) | ((flbas >> 1) & 0x30);
        if index > nlbaf || index >= 64 {
            return Err(ParseError::Field {
                field: "FLBAS (LBA format index)",
                value: u64::from(index),
            });
        }
        let lbaf = 128 + usize::from(index) * 4;
        let lbads = b[lbaf + 2];
        if !(9..=16).contains(&lbads) {
            return Err(ParseError::Field {
                field: "LBADS (logical block size shift)",
                value: u64::from(lbads),
            });
        }
        let mut nguid = [0u8; 16];
        nguid.copy_from_slice(&b[104..120]);
        let mut eui64 = [0u8; 8];
        eui64.copy_from_slice(&b[120..128]);
        Ok(Namespace {
            nsze: le64(b, 0),
            ncap: le64(b, 8),
            lba_format: index,
            block_bytes: 1 << lbads,
            metadata_bytes: le16(b, lbaf),
            npwg: le16(b, 64),
            nsfeat: b[24],
            nguid,
            eui64,
        })
    }

    /// Size in bytes (None: it does not fit in 64 bits).
    pub fn size_bytes(&self) -> Option<u64> {
        self.nsze.checked_mul(u64::from(self.block_bytes))
    }
}

/// An ASCII field, trailing spaces and NULs dropped.
fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b)
        .trim_end_matches([' ', '\0'])
        .to_string()
}
