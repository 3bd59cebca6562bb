//! Why bytes from the peer were refused. Each error names the field at
//! fault; [`ParseError::fes`] is the fatal error status a TermReq would
//! carry for it.

/// A PDU or structure that cannot be accepted. A peer that sends one is
/// disconnected (after a TermReq, where the transport allows one).
#[derive(Clone, Debug, thiserror::Error, PartialEq, Eq)]
#[non_exhaustive]
pub enum ParseError {
    #[error("need {need} bytes, have {have}")]
    Short { need: usize, have: usize },
    #[error("PDU type {0:#04x} is unknown")]
    UnknownType(u8),
    #[error("PDU type {pdu_type:#04x} is not one this side receives")]
    UnexpectedType { pdu_type: u8 },
    #[error("PDU type {pdu_type:#04x}: header length {hlen}, expected {expected}")]
    HeaderLength {
        pdu_type: u8,
        hlen: u8,
        expected: u8,
    },
    #[error("PDU type {pdu_type:#04x}: flags {flags:#04x} not allowed")]
    Flags { pdu_type: u8, flags: u8 },
    #[error(
        "PDU type {pdu_type:#04x}: data offset {pdo} invalid (header {hlen}, PDU {plen} bytes)"
    )]
    DataOffset {
        pdu_type: u8,
        pdo: u8,
        hlen: u8,
        plen: u32,
    },
    #[error("PDU type {pdu_type:#04x}: PDU length {plen} invalid (at most {max})")]
    PduLength { pdu_type: u8, plen: u32, max: u32 },
    #[error("PDU type {pdu_type:#04x}: data length {data_len} does not match its PDU ({carried} bytes carried)")]
    DataLength {
        pdu_type: u8,
        data_len: u32,
        carried: u32,
    },
    #[error("header digest mismatch: PDU says {found:#010x}, computed {computed:#010x}")]
    HeaderDigest { found: u32, computed: u32 },
    #[error("data digest mismatch: PDU says {found:#010x}, computed {computed:#010x}")]
    DataDigest { found: u32, computed: u32 },
    #[error("PDU format version {0} is not supported (only 0)")]
    Version(u16),
    #[error("{field} {value} is invalid")]
    Field { field: &'static str, value: u64 },
    #[error("{pdu} for command id {cid}, which is not in flight")]
    UnknownCommand { pdu: &'static str, cid: u16 },
    #[error(
        "{pdu} for command id {cid}: bytes {offset}+{len} are outside the command's {limit} bytes"
    )]
    OutOfRange {
        pdu: &'static str,
        cid: u16,
        offset: u32,
        len: u32,
        limit: u32,
    },
    #[error(
        "{pdu} for command id {cid} at offset {offset}, expected {expected} (data out of order)"
    )]
    OutOfOrder {
        pdu: &'static str,
        cid: u16,
        offset: u32,
        expected: u32,
    },
    #[error("peer ended the connection: {0}")]
    Terminated(String),
}

/// Fatal error status values of H2CTermReq/C2HTermReq.
pub mod fes {
    pub const INVALID_HEADER_FIELD: u16 = 0x01;
    pub const PDU_SEQUENCE_ERROR: u16 = 0x02;
    pub const HEADER_DIGEST_ERROR: u16 = 0x03;
    pub const DATA_OUT_OF_RANGE: u16 = 0x04;
    pub const DATA_LIMIT_EXCEEDED: u16 = 0x05;
    pub const UNSUPPORTED_PARAMETER: u16 = 0x06;
}

impl ParseError {
    /// The fatal error status a TermReq reports for this error.
    pub fn fes(&self) -> u16 {
        match self {
            ParseError::HeaderDigest { .. } => fes::HEADER_DIGEST_ERROR,
            ParseError::UnexpectedType { .. }
            | ParseError::UnknownCommand { .. }
            | ParseError::OutOfOrder { .. } => fes::PDU_SEQUENCE_ERROR,
            ParseError::OutOfRange { .. } => fes::DATA_OUT_OF_RANGE,
            ParseError::Version(_) => fes::UNSUPPORTED_PARAMETER,
            _ => fes::INVALID_HEADER_FIELD,
        }
    }
}
