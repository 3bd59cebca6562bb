//! Little-endian fields of the wire's structures, and the length check
//! before them (shared by the PDUs, the commands and Identify).

use crate::error::ParseError;

pub(crate) fn need(b: &[u8], n: usize) -> Result<(), ParseError> {
    if b.len() < n {
        return Err(ParseError::Short {
            need: n,
            have: b.len(),
        });
    }
    Ok(())
}

pub(crate) fn le16(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([b[at], b[at + 1]])
}

pub(crate) fn le32(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

pub(crate) fn le64(b: &[u8], at: usize) -> u64 {
    u64::from(le32(b, at)) | (u64::from(le32(b, at + 4)) << 32)
}
