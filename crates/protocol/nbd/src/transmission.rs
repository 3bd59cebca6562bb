//! Transmission phase: request headers, simple replies, structured reply
//! chunks, and the rules a request must obey before a server acts on it.

use crate::consts::{
    cmd, cmd_flags, reply_flags, reply_type, transmission_flags as tf, CHUNK_HEADER_BYTES,
    REQUEST_HEADER_BYTES, REQUEST_MAGIC, SIMPLE_REPLY_HEADER_BYTES, SIMPLE_REPLY_MAGIC,
    STRUCTURED_REPLY_MAGIC,
};
use crate::error::{ErrorCode, ProtocolError};
use crate::wire::{be_u16, be_u32, be_u64, put_u16, put_u32, put_u64};

/// A request's command.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Command {
    Read,
    Write,
    Disconnect,
    Flush,
    Trim,
    Cache,
    WriteZeroes,
    BlockStatus,
    Unknown(u16),
}

impl Command {
    pub fn from_code(code: u16) -> Command {
        match code {
            cmd::READ => Command::Read,
            cmd::WRITE => Command::Write,
            cmd::DISC => Command::Disconnect,
            cmd::FLUSH => Command::Flush,
            cmd::TRIM => Command::Trim,
            cmd::CACHE => Command::Cache,
            cmd::WRITE_ZEROES => Command::WriteZeroes,
            cmd::BLOCK_STATUS => Command::BlockStatus,
            other => Command::Unknown(other),
        }
    }

    pub fn code(self) -> u16 {
        match self {
            Command::Read => cmd::READ,
            Command::Write => cmd::WRITE,
            Command::Disconnect => cmd::DISC,
            Command::Flush => cmd::FLUSH,
            Command::Trim => cmd::TRIM,
            Command::Cache => cmd::CACHE,
            Command::WriteZeroes => cmd::WRITE_ZEROES,
            Command::BlockStatus => cmd::BLOCK_STATUS,
            Command::Unknown(code) => code,
        }
    }

    /// Whether the command changes the export's contents.
    pub fn modifies(self) -> bool {
        matches!(self, Command::Write | Command::Trim | Command::WriteZeroes)
    }
}

/// A request header (the payload of a WRITE follows it on the wire).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RequestHeader {
    pub flags: u16,
    pub command: Command,
    pub cookie: u64,
    pub offset: u64,
    pub length: u32,
}

impl RequestHeader {
    pub fn parse(bytes: &[u8; REQUEST_HEADER_BYTES]) -> Result<RequestHeader, ProtocolError> {
        let magic = be_u32(bytes, 0);
        if magic != REQUEST_MAGIC {
            return Err(ProtocolError::BadMagic {
                expected: REQUEST_MAGIC.into(),
                found: magic.into(),
            });
        }
        Ok(RequestHeader {
            flags: be_u16(bytes, 4),
            command: Command::from_code(be_u16(bytes, 6)),
            cookie: be_u64(bytes, 8),
            offset: be_u64(bytes, 16),
            length: be_u32(bytes, 24),
        })
    }

    pub fn encode(&self) -> [u8; REQUEST_HEADER_BYTES] {
        let mut out = Vec::with_capacity(REQUEST_HEADER_BYTES);
        put_u32(&mut out, REQUEST_MAGIC);
        put_u16(&mut out, self.flags);
        put_u16(&mut out, self.command.code());
        put_u64(&mut out, self.cookie);
        put_u64(&mut out, self.offset);
        put_u32(&mut out, self.length);
        out.try_into().expect("28 bytes")
    }

    /// Bytes of payload that follow this header on the wire.
    pub fn payload_bytes(&self) -> u32 {
        if self.command == Command::Write {
            self.length
        } else {
            0
        }
    }

    pub fn fua(&self) -> bool {
        self.flags & cmd_flags::FUA != 0
    }
}

/// A simple reply header; a successful simple READ reply is followed by
/// the data.
pub fn encode_simple_reply(
    cookie: u64,
    error: Option<ErrorCode>,
) -> [u8; SIMPLE_REPLY_HEADER_BYTES] {
    let mut out = [0u8; SIMPLE_REPLY_HEADER_BYTES];
    out[0..4].copy_from_slice(&SIMPLE_REPLY_MAGIC.to_be_bytes());
    out[4..8].copy_from_slice(&error.map_or(0, ErrorCode::value).to_be_bytes());
    out[8..16].copy_from_slice(&cookie.to_be_bytes());
    out
}

/// The header of one structured reply chunk.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ChunkHeader {
    pub flags: u16,
    pub reply_type: u16,
    pub cookie: u64,
    pub length_bytes: u32,
}

impl ChunkHeader {
    pub fn encode(&self) -> [u8; CHUNK_HEADER_BYTES] {
        let mut out = [0u8; CHUNK_HEADER_BYTES];
        out[0..4].copy_from_slice(&STRUCTURED_REPLY_MAGIC.to_be_bytes());
        out[4..6].copy_from_slice(&self.flags.to_be_bytes());
        out[6..8].copy_from_slice(&self.reply_type.to_be_bytes());
        out[8..16].copy_from_slice(&self.cookie.to_be_bytes());
        out[16..20].copy_from_slice(&self.length_bytes.to_be_bytes());
        out
    }

    pub fn is_done(&self) -> bool {
        self.flags & reply_flags::DONE != 0
    }
}

fn done_flag(done: bool) -> u16 {
    if done {
        reply_flags::DONE
    } else {
        0
    }
}

/// Chunk header plus offset of an OFFSET_DATA chunk; `data_bytes` of data
/// follow it.
pub fn encode_offset_data_header(
    cookie: u64,
    offset: u64,
    data_bytes: u32,
    done: bool,
) -> [u8; 28] {
    let header = ChunkHeader {
        flags: done_flag(done),
        reply_type: reply_type::OFFSET_DATA,
        cookie,
        length_bytes: data_bytes + 8,
    };
    let mut out = [0u8; 28];
    out[..CHUNK_HEADER_BYTES].copy_from_slice(&header.encode());
    out[CHUNK_HEADER_BYTES..].copy_from_slice(&offset.to_be_bytes());
    out
}

/// The final NONE chunk.
pub fn encode_none_chunk(cookie: u64) -> [u8; CHUNK_HEADER_BYTES] {
    ChunkHeader {
        flags: reply_flags::DONE,
        reply_type: reply_type::NONE,
        cookie,
        length_bytes: 0,
    }
    .encode()
}

/// A final ERROR chunk with a message for humans.
pub fn encode_error_chunk(cookie: u64, code: ErrorCode, message: &str) -> Vec<u8> {
    let message = truncate_utf8(message, 4096);
    let header = ChunkHeader {
        flags: reply_flags::DONE,
        reply_type: reply_type::ERROR,
        cookie,
        length_bytes: 6 + message.len() as u32,
    };
    let mut out = header.encode().to_vec();
    put_u32(&mut out, code.value());
    put_u16(&mut out, message.len() as u16);
    out.extend_from_slice(message.as_bytes());
    out
}

fn truncate_utf8(text: &str, max_bytes: usize) -> &str {
    let mut end = text.len().min(max_bytes);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

/// One block status descriptor.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Extent {
    pub length_bytes: u32,
    pub flags: u32,
}

/// A BLOCK_STATUS chunk for one context.
pub fn encode_block_status_chunk(
    cookie: u64,
    context_id: u32,
    extents: &[Extent],
    done: bool,
) -> Vec<u8> {
    let header = ChunkHeader {
        flags: done_flag(done),
        reply_type: reply_type::BLOCK_STATUS,
        cookie,
        length_bytes: 4 + 8 * extents.len() as u32,
    };
    let mut out = header.encode().to_vec();
    put_u32(&mut out, context_id);
    for extent in extents {
        put_u32(&mut out, extent.length_bytes);
        put_u32(&mut out, extent.flags);
    }
    out
}

/// A reply header as a client reads it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReplyHeader {
    Simple { error: u32, cookie: u64 },
    Chunk(ChunkHeader),
}

impl ReplyHeader {
    /// Bytes the header needs, known from its first four bytes.
    pub fn header_bytes(magic: u32) -> Result<usize, ProtocolError> {
        match magic {
            SIMPLE_REPLY_MAGIC => Ok(SIMPLE_REPLY_HEADER_BYTES),
            STRUCTURED_REPLY_MAGIC => Ok(CHUNK_HEADER_BYTES),
            other => Err(ProtocolError::BadMagic {
                expected: SIMPLE_REPLY_MAGIC.into(),
                found: other.into(),
            }),
        }
    }

    /// Decode a header; `Ok(None)` when more bytes are needed.
    pub fn parse(bytes: &[u8]) -> Result<Option<(ReplyHeader, usize)>, ProtocolError> {
        if bytes.len() < 4 {
            return Ok(None);
        }
        let size = ReplyHeader::header_bytes(be_u32(bytes, 0))?;
        if bytes.len() < size {
            return Ok(None);
        }
        let header = if size == SIMPLE_REPLY_HEADER_BYTES {
            ReplyHeader::Simple {
                error: be_u32(bytes, 4),
                cookie: be_u64(bytes, 8),
            }
        } else {
            ReplyHeader::Chunk(ChunkHeader {
                flags: be_u16(bytes, 4),
                reply_type: be_u16(bytes, 6),
                cookie: be_u64(bytes, 8),
                length_bytes: be_u32(bytes, 16),
            })
        };
        Ok(Some((header, size)))
    }
}

/// What a server accepts in the transmission phase.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RequestRules {
    pub size_bytes: u64,
    /// Offsets and lengths of data commands must be multiples of this.
    pub minimum_block_bytes: u32,
    /// Longest READ or WRITE.
    pub maximum_payload_bytes: u32,
    /// Flags sent to the client (READ_ONLY, SEND_FUA, SEND_DF, ...).
    pub transmission_flags: u16,
    /// Whether any metadata context was selected.
    pub block_status: bool,
    /// Data commands may have any alignment (the client negotiated no
    /// block sizes; the server serves unaligned requests itself).
    pub any_alignment: bool,
}

/// Why a request was refused: the error value and a reason for the log.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Rejection {
    pub code: ErrorCode,
    pub reason: &'static str,
}

fn reject(code: ErrorCode, reason: &'static str) -> Result<(), Rejection> {
    Err(Rejection { code, reason })
}

impl RequestRules {
    /// Check a request before acting on it. A refused WRITE's payload must
    /// still be read (and dropped) to stay in step with the client.
    pub fn check(&self, request: &RequestHeader) -> Result<(), Rejection> {
        if let Command::Unknown(_) = request.command {
            return reject(ErrorCode::Invalid, "unknown command");
        }
        self.check_flags(request)?;
        let read_only = self.transmission_flags & tf::READ_ONLY != 0;
        if read_only && request.command.modifies() {
            return reject(ErrorCode::NotPermitted, "export is read-only");
        }
        match request.command {
            Command::Disconnect => Ok(()),
            Command::Flush if request.offset != 0 || request.length != 0 => {
                reject(ErrorCode::Invalid, "flush with offset or length")
            }
            Command::Flush => Ok(()),
            _ => self.check_range(request),
        }
    }

    fn check_flags(&self, request: &RequestHeader) -> Result<(), Rejection> {
        let mut allowed = 0;
        if self.transmission_flags & tf::SEND_FUA != 0 {
            allowed |= cmd_flags::FUA;
        }
        match request.command {
            Command::Read if self.transmission_flags & tf::SEND_DF != 0 => allowed |= cmd_flags::DF,
            Command::WriteZeroes => allowed |= cmd_flags::NO_HOLE,
            Command::BlockStatus => allowed |= cmd_flags::REQ_ONE,
            _ => {}
        }
        if request.flags & !allowed != 0 {
            return reject(ErrorCode::Invalid, "command flag not allowed");
        }
        if request.command == Command::BlockStatus && !self.block_status {
            return reject(ErrorCode::Invalid, "no metadata context selected");
        }
        Ok(())
    }

    fn check_range(&self, request: &RequestHeader) -> Result<(), Rejection> {
        if request.length == 0 {
            return reject(ErrorCode::Invalid, "zero length");
        }
        let end = request.offset.checked_add(u64::from(request.length));
        if end.is_none_or(|end| end > self.size_bytes) {
            let code = if request.command.modifies() {
                ErrorCode::NoSpace
            } else {
                ErrorCode::Invalid
            };
            return reject(code, "range past the end of the export");
        }
        let data_command = !matches!(request.command, Command::BlockStatus | Command::Cache);
        let block = u64::from(self.minimum_block_bytes);
        let aligned =
            request.offset.is_multiple_of(block) && u64::from(request.length).is_multiple_of(block);
        if data_command && !aligned && !self.any_alignment {
            return reject(ErrorCode::Invalid, "not aligned to the minimum block size");
        }
        let payload = matches!(request.command, Command::Read | Command::Write);
        if payload && request.length > self.maximum_payload_bytes {
            return reject(ErrorCode::Overflow, "longer than the maximum block size");
        }
        Ok(())
    }
}
