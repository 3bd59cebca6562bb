//! NVMe/TCP PDUs: the 8-byte common header every PDU starts with, the
//! PDU-specific headers, and encoders for the PDUs either side sends.
//!
//! A PDU is: common header (8 bytes) and the rest of its header (`hlen`
//! bytes in all), a header digest (4 bytes, when negotiated, not on
//! ICReq/ICResp/TermReq), padding up to the data offset `pdo`, the data,
//! and a data digest (4 bytes, when negotiated and there is data). `plen`
//! counts all of it. Integers are little-endian.

use crate::bytes::{le16, le32, need};
use crate::command::{Cqe, Sqe, CQE_BYTES, SQE_BYTES};
use crate::error::ParseError;

/// PDU types.
pub mod pdu_type {
    pub const IC_REQ: u8 = 0x00;
    pub const IC_RESP: u8 = 0x01;
    pub const H2C_TERM_REQ: u8 = 0x02;
    pub const C2H_TERM_REQ: u8 = 0x03;
    pub const CAPSULE_CMD: u8 = 0x04;
    pub const CAPSULE_RESP: u8 = 0x05;
    pub const H2C_DATA: u8 = 0x06;
    pub const C2H_DATA: u8 = 0x07;
    pub const R2T: u8 = 0x09;
}

/// Common header flags.
pub mod flags {
    /// A header digest follows the header.
    pub const HDGST: u8 = 0x01;
    /// A data digest follows the data.
    pub const DDGST: u8 = 0x02;
    /// H2CData/C2HData: the last data PDU of the command (or of the R2T).
    pub const LAST_PDU: u8 = 0x04;
    /// C2HData: the command succeeded; no CapsuleResp follows.
    pub const SUCCESS: u8 = 0x08;
}

/// ICReq/ICResp digest bits.
pub mod digest_bits {
    pub const HEADER: u8 = 0x01;
    pub const DATA: u8 = 0x02;
}

pub const COMMON_HEADER_BYTES: usize = 8;
pub const IC_BYTES: usize = 128;
/// CapsuleCmd header: common header and the submission queue entry.
pub const CAPSULE_CMD_HLEN: usize = COMMON_HEADER_BYTES + SQE_BYTES;
/// CapsuleResp header: common header and the completion entry.
pub const CAPSULE_RESP_HLEN: usize = COMMON_HEADER_BYTES + CQE_BYTES;
/// H2CData, C2HData, R2T, TermReq headers.
pub const DATA_HLEN: usize = 24;
pub const TERM_HLEN: usize = 24;
/// A TermReq carries at most this much of the PDU that caused it.
pub const TERM_MAX_DATA: usize = 128;
pub const DIGEST_BYTES: usize = 4;
/// The longest header (with its digest) the reader ever holds.
pub const MAX_HEADER_BYTES: usize = IC_BYTES;

/// The CRC32C of `bytes` (the digest NVMe/TCP uses: reflected, initial
/// and final value all ones).
pub fn crc32c(bytes: &[u8]) -> u32 {
    crc32c::crc32c(bytes)
}

/// Continue a CRC32C over more bytes (`crc` is a previous result; start
/// from 0).
pub fn crc32c_append(crc: u32, bytes: &[u8]) -> u32 {
    crc32c::crc32c_append(crc, bytes)
}

/// Which digests a connection negotiated.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Digests {
    pub header: bool,
    pub data: bool,
}

impl Digests {
    pub fn header_bytes(self) -> usize {
        if self.header {
            DIGEST_BYTES
        } else {
            0
        }
    }
    pub fn data_bytes(self) -> usize {
        if self.data {
            DIGEST_BYTES
        } else {
            0
        }
    }
    fn bits(self) -> u8 {
        (if self.header { digest_bits::HEADER } else { 0 })
            | (if self.data { digest_bits::DATA } else { 0 })
    }
    fn from_bits(bits: u8) -> Result<Digests, ParseError> {
        if bits & !(digest_bits::HEADER | digest_bits::DATA) != 0 {
            return Err(ParseError::Field {
                field: "digest bits",
                value: u64::from(bits),
            });
        }
        Ok(Digests {
            header: bits & digest_bits::HEADER != 0,
            data: bits & digest_bits::DATA != 0,
        })
    }
}

/// The common header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CommonHeader {
    pub pdu_type: u8,
    pub flags: u8,
    pub hlen: u8,
    pub pdo: u8,
    pub plen: u32,
}

impl CommonHeader {
    pub fn parse(b: &[u8]) -> Result<CommonHeader, ParseError> {
        need(b, COMMON_HEADER_BYTES)?;
        Ok(CommonHeader {
            pdu_type: b[0],
            flags: b[1],
            hlen: b[2],
            pdo: b[3],
            plen: le32(b, 4),
        })
    }

    pub fn encode(&self, out: &mut [u8]) {
        out[0] = self.pdu_type;
        out[1] = self.flags;
        out[2] = self.hlen;
        out[3] = self.pdo;
        out[4..8].copy_from_slice(&self.plen.to_le_bytes());
    }
}

/// ICReq: the host opens the connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct IcReq {
    pub pfv: u16,
    /// Host PDU data alignment, in dwords, 0's based.
    pub hpda: u8,
    pub digests: Digests,
    /// Most R2Ts outstanding per command, 0's based.
    pub maxr2t: u32,
}

impl IcReq {
    pub fn encode(&self) -> [u8; IC_BYTES] {
        let mut b = [0u8; IC_BYTES];
        CommonHeader {
            pdu_type: pdu_type::IC_REQ,
            flags: 0,
            hlen: IC_BYTES as u8,
            pdo: 0,
            plen: IC_BYTES as u32,
        }
        .encode(&mut b);
        b[8..10].copy_from_slice(&self.pfv.to_le_bytes());
        b[10] = self.hpda;
        b[11] = self.digests.bits();
        b[12..16].copy_from_slice(&self.maxr2t.to_le_bytes());
        b
    }

    /// Parse a whole ICReq (128 bytes, common header included).
    pub fn parse(b: &[u8]) -> Result<IcReq, ParseError> {
        check_ic(b, pdu_type::IC_REQ)?;
        let pfv = le16(b, 8);
        if pfv != 0 {
            return Err(ParseError::Version(pfv));
        }
        let hpda = b[10];
        if hpda > 31 {
            return Err(ParseError::Field {
                field: "HPDA",
                value: u64::from(hpda),
            });
        }
        Ok(IcReq {
            pfv,
            hpda,
            digests: Digests::from_bits(b[11])?,
            maxr2t: le32(b, 12),
        })
    }
}

/// ICResp: the controller's answer to ICReq.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct IcResp {
    pub pfv: u16,
    /// Controller PDU data alignment, in dwords, 0's based.
    pub cpda: u8,
    pub digests: Digests,
    /// Most data bytes the controller takes in one H2CData PDU.
    pub maxh2cdata: u32,
}

impl IcResp {
    pub fn encode(&self) -> [u8; IC_BYTES] {
        let mut b = [0u8; IC_BYTES];
        CommonHeader {
            pdu_type: pdu_type::IC_RESP,
            flags: 0,
            hlen: IC_BYTES as u8,
            pdo: 0,
            plen: IC_BYTES as u32,
        }
        .encode(&mut b);
        b[8..10].copy_from_slice(&self.pfv.to_le_bytes());
        b[10] = self.cpda;
        b[11] = self.digests.bits();
        b[12..16].copy_from_slice(&self.maxh2cdata.to_le_bytes());
        b
    }

    /// Parse a whole ICResp (128 bytes, common header included).
    pub fn parse(b: &[u8]) -> Result<IcResp, ParseError> {
        check_ic(b, pdu_type::IC_RESP)?;
        let pfv = le16(b, 8);
        if pfv != 0 {
            return Err(ParseError::Version(pfv));
        }
        let cpda = b[10];
        if cpda > 31 {
            return Err(ParseError::Field {
                field: "CPDA",
                value: u64::from(cpda),
            });
        }
        let maxh2cdata = le32(b, 12);
        // The transport requires at least 4 KiB; nonzero multiple of 4.
        if maxh2cdata < 4096 || !maxh2cdata.is_multiple_of(4) {
            return Err(ParseError::Field {
                field: "MAXH2CDATA",
                value: u64::from(maxh2cdata),
            });
        }
        Ok(IcResp {
            pfv,
            cpda,
            digests: Digests::from_bits(b[11])?,
            maxh2cdata,
        })
    }
}

fn check_ic(b: &[u8], want: u8) -> Result<(), ParseError> {
    need(b, IC_BYTES)?;
    let ch = CommonHeader::parse(b)?;
    if ch.pdu_type != want {
        return Err(ParseError::UnexpectedType {
            pdu_type: ch.pdu_type,
        });
    }
    if usize::from(ch.hlen) != IC_BYTES {
        return Err(ParseError::HeaderLength {
            pdu_type: want,
            hlen: ch.hlen,
            expected: IC_BYTES as u8,
        });
    }
    if ch.flags != 0 {
        return Err(ParseError::Flags {
            pdu_type: want,
            flags: ch.flags,
        });
    }
    if ch.pdo != 0 || ch.plen != IC_BYTES as u32 {
        return Err(ParseError::PduLength {
            pdu_type: want,
            plen: ch.plen,
            max: IC_BYTES as u32,
        });
    }
    Ok(())
}

/// H2CData, C2HData and R2T share one header layout after the common
/// header: command id, transfer tag (R2T/H2CData), offset and length.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DataHeader {
    pub cid: u16,
    pub ttag: u16,
    pub offset: u32,
    pub length: u32,
}

impl DataHeader {
    fn parse(b: &[u8]) -> DataHeader {
        DataHeader {
            cid: le16(b, 8),
            ttag: le16(b, 10),
            offset: le32(b, 12),
            length: le32(b, 16),
        }
    }
    fn encode(&self, b: &mut [u8]) {
        b[8..10].copy_from_slice(&self.cid.to_le_bytes());
        b[10..12].copy_from_slice(&self.ttag.to_le_bytes());
        b[12..16].copy_from_slice(&self.offset.to_le_bytes());
        b[16..20].copy_from_slice(&self.length.to_le_bytes());
    }
}

/// A TermReq: fatal error status and its information.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TermReq {
    pub fes: u16,
    pub fei: u32,
    /// The start of the offending PDU, as the peer quoted it.
    pub data: Vec<u8>,
}

impl std::fmt::Display for TermReq {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let what = match self.fes {
            0x01 => "invalid PDU header field",
            0x02 => "PDU sequence error",
            0x03 => "header digest error",
            0x04 => "data transfer out of range",
            0x05 => "data transfer limit exceeded",
            0x06 => "unsupported parameter",
            _ => "unknown fatal error",
        };
        write!(
            f,
            "{what} (status {:#x}, information {:#x})",
            self.fes, self.fei
        )
    }
}

/// Where data starts in a PDU whose header is `hlen` bytes, with the
/// given digests and the receiver's alignment (`pda`, dwords, 0's based;
/// 0: no alignment).
pub fn data_offset(hlen: usize, digests: Digests, pda: u8) -> usize {
    let end = hlen + digests.header_bytes();
    if pda == 0 {
        return end;
    }
    let align = (usize::from(pda) + 1) * 4;
    end.div_ceil(align) * align
}

/// The bytes before a PDU's data (header, header digest, padding), and
/// the PDU's total length, for a PDU of `data_len` data bytes.
#[allow(clippy::too_many_arguments)]
fn frame(
    buf: &mut Vec<u8>,
    pdu_type: u8,
    mut flag_bits: u8,
    hlen: usize,
    data_len: usize,
    digests: Digests,
    pda: u8,
    fill: impl FnOnce(&mut [u8]),
) -> usize {
    let pdo = if data_len > 0 {
        data_offset(hlen, digests, pda)
    } else {
        0
    };
    if digests.header {
        flag_bits |= flags::HDGST;
    }
    if digests.data && data_len > 0 {
        flag_bits |= flags::DDGST;
    }
    let plen = if data_len > 0 {
        pdo + data_len + digests.data_bytes()
    } else {
        hlen + digests.header_bytes()
    };
    let start = buf.len();
    buf.resize(start + hlen, 0);
    CommonHeader {
        pdu_type,
        flags: flag_bits,
        hlen: hlen as u8,
        pdo: pdo as u8,
        plen: plen as u32,
    }
    .encode(&mut buf[start..]);
    fill(&mut buf[start..start + hlen]);
    if digests.header {
        let d = crc32c(&buf[start..start + hlen]);
        buf.extend_from_slice(&d.to_le_bytes());
    }
    if data_len > 0 {
        buf.resize(start + pdo, 0);
    }
    plen
}

/// Append a CapsuleCmd's header (with header digest and padding) for `sqe`
/// carrying `data_len` bytes of in-capsule data, which the caller sends
/// next, followed by [`data_digest_trailer`] when data digests are on.
pub fn encode_capsule_cmd(
    buf: &mut Vec<u8>,
    sqe: &Sqe,
    data_len: usize,
    digests: Digests,
    cpda: u8,
) {
    frame(
        buf,
        pdu_type::CAPSULE_CMD,
        0,
        CAPSULE_CMD_HLEN,
        data_len,
        digests,
        cpda,
        |b| b[8..8 + SQE_BYTES].copy_from_slice(&sqe.0),
    );
}

/// Append a CapsuleResp for `cqe`.
pub fn encode_capsule_resp(buf: &mut Vec<u8>, cqe: &Cqe, digests: Digests) {
    frame(
        buf,
        pdu_type::CAPSULE_RESP,
        0,
        CAPSULE_RESP_HLEN,
        0,
        digests,
        0,
        |b| b[8..8 + CQE_BYTES].copy_from_slice(&cqe.encode()),
    );
}

/// Append an H2CData header for `header.length` bytes, which the caller
/// sends next (then the data digest, if on).
pub fn encode_h2c_data(
    buf: &mut Vec<u8>,
    header: &DataHeader,
    last: bool,
    digests: Digests,
    cpda: u8,
) {
    frame(
        buf,
        pdu_type::H2C_DATA,
        if last { flags::LAST_PDU } else { 0 },
        DATA_HLEN,
        header.length as usize,
        digests,
        cpda,
        |b| header.encode(b),
    );
}

/// Append a C2HData header (the controller's side).
pub fn encode_c2h_data(
    buf: &mut Vec<u8>,
    header: &DataHeader,
    last: bool,
    success: bool,
    digests: Digests,
    hpda: u8,
) {
    let mut f = if last { flags::LAST_PDU } else { 0 };
    if success {
        f |= flags::SUCCESS;
    }
    frame(
        buf,
        pdu_type::C2H_DATA,
        f,
        DATA_HLEN,
        header.length as usize,
        digests,
        hpda,
        |b| DataHeader { ttag: 0, ..*header }.encode(b),
    );
}

/// Append an R2T (the controller's side).
pub fn encode_r2t(buf: &mut Vec<u8>, header: &DataHeader, digests: Digests) {
    frame(buf, pdu_type::R2T, 0, DATA_HLEN, 0, digests, 0, |b| {
        header.encode(b)
    });
}

/// Append a TermReq (`h2c`: the host's, else the controller's). Never
/// digested; at most [`TERM_MAX_DATA`] bytes of `data` are quoted.
pub fn encode_term_req(buf: &mut Vec<u8>, h2c: bool, fes: u16, fei: u32, data: &[u8]) {
    let data = &data[..data.len().min(TERM_MAX_DATA)];
    let start = buf.len();
    buf.resize(start + TERM_HLEN, 0);
    CommonHeader {
        pdu_type: if h2c {
            pdu_type::H2C_TERM_REQ
        } else {
            pdu_type::C2H_TERM_REQ
        },
        flags: 0,
        hlen: TERM_HLEN as u8,
        pdo: if data.is_empty() { 0 } else { TERM_HLEN as u8 },
        plen: (TERM_HLEN + data.len()) as u32,
    }
    .encode(&mut buf[start..]);
    buf[start + 8..start + 10].copy_from_slice(&fes.to_le_bytes());
    buf[start + 10..start + 14].copy_from_slice(&fei.to_le_bytes());
    buf.extend_from_slice(data);
}

/// The data digest that ends a PDU carrying `data`.
pub fn data_digest_trailer(data: &[&[u8]]) -> [u8; 4] {
    let mut crc = 0;
    for piece in data {
        crc = crc32c_append(crc, piece);
    }
    crc.to_le_bytes()
}

/// A parsed PDU header (what follows, if anything, is data or TermReq
/// information the reader delivers separately).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Header {
    CapsuleCmd {
        sqe: Sqe,
    },
    CapsuleResp {
        cqe: Cqe,
    },
    H2CData {
        data: DataHeader,
        last: bool,
    },
    C2HData {
        data: DataHeader,
        last: bool,
        success: bool,
    },
    R2T {
        data: DataHeader,
    },
    /// The peer's TermReq (its data is read after the header).
    TermReq {
        fes: u16,
        fei: u32,
    },
}

impl Header {
    /// Parse the PDU-specific part of a header (`b` is the whole header,
    /// `hlen` bytes, common header included, already checked).
    pub(crate) fn parse(ch: &CommonHeader, b: &[u8]) -> Header {
        match ch.pdu_type {
            pdu_type::CAPSULE_CMD => {
                let mut sqe = [0u8; SQE_BYTES];
                sqe.copy_from_slice(&b[8..8 + SQE_BYTES]);
                Header::CapsuleCmd { sqe: Sqe(sqe) }
            }
            pdu_type::CAPSULE_RESP => Header::CapsuleResp {
                cqe: Cqe::parse(&b[8..8 + CQE_BYTES]),
            },
            pdu_type::H2C_DATA => Header::H2CData {
                data: DataHeader::parse(b),
                last: ch.flags & flags::LAST_PDU != 0,
            },
            pdu_type::C2H_DATA => Header::C2HData {
                data: DataHeader::parse(b),
                last: ch.flags & flags::LAST_PDU != 0,
                success: ch.flags & flags::SUCCESS != 0,
            },
            pdu_type::R2T => Header::R2T {
                data: DataHeader::parse(b),
            },
            _ => Header::TermReq {
                fes: le16(b, 8),
                fei: le32(b, 10),
            },
        }
    }
}
