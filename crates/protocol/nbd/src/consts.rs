//! Numbers on the wire, named as in the NBD protocol document
//! (NetworkBlockDevice/nbd, doc/proto.md). Everything is big-endian.

/// First 8 bytes the server sends: ASCII `NBDMAGIC`.
pub const NBD_MAGIC: u64 = 0x4e42_444d_4147_4943;
/// Second 8 bytes of the newstyle greeting, and the prefix of every
/// option request: ASCII `IHAVEOPT`.
pub const IHAVEOPT: u64 = 0x4948_4156_454f_5054;
/// Prefix of every option reply.
pub const OPTION_REPLY_MAGIC: u64 = 0x0003_e889_0455_65a9;
/// Prefix of every transmission request.
pub const REQUEST_MAGIC: u32 = 0x2560_9513;
/// Prefix of a simple reply.
pub const SIMPLE_REPLY_MAGIC: u32 = 0x6744_6698;
/// Prefix of a structured reply chunk.
pub const STRUCTURED_REPLY_MAGIC: u32 = 0x668e_33ef;

/// Greeting: magic, IHAVEOPT, handshake flags.
pub const GREETING_BYTES: usize = 18;
/// Client flags after the greeting.
pub const CLIENT_FLAGS_BYTES: usize = 4;
/// IHAVEOPT, option, length.
pub const OPTION_HEADER_BYTES: usize = 16;
/// Magic, option, reply type, length.
pub const OPTION_REPLY_HEADER_BYTES: usize = 20;
/// Reply to NBD_OPT_EXPORT_NAME without the reserved zeroes.
pub const EXPORT_NAME_REPLY_BYTES: usize = 10;
/// Reserved zeroes after the NBD_OPT_EXPORT_NAME reply unless NO_ZEROES.
pub const EXPORT_NAME_ZEROES_BYTES: usize = 124;
/// Request header (magic, flags, type, cookie, offset, length).
pub const REQUEST_HEADER_BYTES: usize = 28;
/// Simple reply header (magic, error, cookie).
pub const SIMPLE_REPLY_HEADER_BYTES: usize = 16;
/// Structured reply chunk header (magic, flags, type, cookie, length).
pub const CHUNK_HEADER_BYTES: usize = 20;
/// Longest string (export name, message) the protocol allows.
pub const STRING_MAX_BYTES: usize = 4096;
/// The one metadata context the protocol defines.
pub const BASE_ALLOCATION: &str = "base:allocation";

/// Handshake flags (16 bits, server to client).
pub mod handshake_flags {
    pub const FIXED_NEWSTYLE: u16 = 1 << 0;
    pub const NO_ZEROES: u16 = 1 << 1;
}

/// Client flags (32 bits, client to server).
pub mod client_flags {
    pub const FIXED_NEWSTYLE: u32 = 1 << 0;
    pub const NO_ZEROES: u32 = 1 << 1;
}

/// Transmission flags (16 bits, per export).
pub mod transmission_flags {
    pub const HAS_FLAGS: u16 = 1 << 0;
    pub const READ_ONLY: u16 = 1 << 1;
    pub const SEND_FLUSH: u16 = 1 << 2;
    pub const SEND_FUA: u16 = 1 << 3;
    pub const ROTATIONAL: u16 = 1 << 4;
    pub const SEND_TRIM: u16 = 1 << 5;
    pub const SEND_WRITE_ZEROES: u16 = 1 << 6;
    pub const SEND_DF: u16 = 1 << 7;
    pub const CAN_MULTI_CONN: u16 = 1 << 8;
    pub const SEND_RESIZE: u16 = 1 << 9;
    pub const SEND_CACHE: u16 = 1 << 10;
    pub const SEND_FAST_ZERO: u16 = 1 << 11;
}

/// Option codes.
pub mod opt {
    pub const EXPORT_NAME: u32 = 1;
    pub const ABORT: u32 = 2;
    pub const LIST: u32 = 3;
    pub const STARTTLS: u32 = 5;
    pub const INFO: u32 = 6;
    pub const GO: u32 = 7;
    pub const STRUCTURED_REPLY: u32 = 8;
    pub const LIST_META_CONTEXT: u32 = 9;
    pub const SET_META_CONTEXT: u32 = 10;
    pub const EXTENDED_HEADERS: u32 = 11;
}

/// Option reply types. Errors have bit 31 set.
pub mod rep {
    pub const ACK: u32 = 1;
    pub const SERVER: u32 = 2;
    pub const INFO: u32 = 3;
    pub const META_CONTEXT: u32 = 4;
    pub const ERROR_BIT: u32 = 1 << 31;
    pub const ERR_UNSUP: u32 = ERROR_BIT | 1;
    pub const ERR_POLICY: u32 = ERROR_BIT | 2;
    pub const ERR_INVALID: u32 = ERROR_BIT | 3;
    pub const ERR_PLATFORM: u32 = ERROR_BIT | 4;
    pub const ERR_TLS_REQD: u32 = ERROR_BIT | 5;
    pub const ERR_UNKNOWN: u32 = ERROR_BIT | 6;
    pub const ERR_SHUTDOWN: u32 = ERROR_BIT | 7;
    pub const ERR_BLOCK_SIZE_REQD: u32 = ERROR_BIT | 8;
    pub const ERR_TOO_BIG: u32 = ERROR_BIT | 9;
}

/// Information types in NBD_OPT_INFO / NBD_OPT_GO.
pub mod info {
    pub const EXPORT: u16 = 0;
    pub const NAME: u16 = 1;
    pub const DESCRIPTION: u16 = 2;
    pub const BLOCK_SIZE: u16 = 3;
}

/// Command codes.
pub mod cmd {
    pub const READ: u16 = 0;
    pub const WRITE: u16 = 1;
    pub const DISC: u16 = 2;
    pub const FLUSH: u16 = 3;
    pub const TRIM: u16 = 4;
    pub const CACHE: u16 = 5;
    pub const WRITE_ZEROES: u16 = 6;
    pub const BLOCK_STATUS: u16 = 7;
}

/// Command flags.
pub mod cmd_flags {
    pub const FUA: u16 = 1 << 0;
    pub const NO_HOLE: u16 = 1 << 1;
    pub const DF: u16 = 1 << 2;
    pub const REQ_ONE: u16 = 1 << 3;
    pub const FAST_ZERO: u16 = 1 << 4;
}

/// Structured reply chunk flags.
pub mod reply_flags {
    pub const DONE: u16 = 1 << 0;
}

/// Structured reply chunk types. Errors have bit 15 set.
pub mod reply_type {
    pub const NONE: u16 = 0;
    pub const OFFSET_DATA: u16 = 1;
    pub const OFFSET_HOLE: u16 = 2;
    pub const BLOCK_STATUS: u16 = 5;
    pub const ERROR: u16 = (1 << 15) | 1;
    pub const ERROR_OFFSET: u16 = (1 << 15) | 2;
}

/// Status flags of the `base:allocation` context.
pub mod allocation {
    pub const HOLE: u32 = 1 << 0;
    pub const ZERO: u32 = 1 << 1;
}
