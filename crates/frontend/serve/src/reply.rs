//! The bytes of a reply that come before its data (a simple reply header,
//! or a structured chunk), built without allocating for every reply but
//! errors with long messages.

use nvraid_nbd::server::BASE_ALLOCATION_ID;
use nvraid_nbd::transmission::{
    encode_block_status_chunk, encode_error_chunk, encode_none_chunk, encode_offset_data_header,
    encode_simple_reply, Extent,
};
use nvraid_nbd::{Command, ErrorCode};

const SHORT: usize = 48;

/// A reply's head: on the stack when it fits.
pub(crate) enum Head {
    Short([u8; SHORT], u8),
    Long(Vec<u8>),
}

impl Head {
    fn from_slice(bytes: &[u8]) -> Head {
        if bytes.len() <= SHORT {
            let mut short = [0u8; SHORT];
            short[..bytes.len()].copy_from_slice(bytes);
            Head::Short(short, bytes.len() as u8)
        } else {
            Head::Long(bytes.to_vec())
        }
    }

    pub(crate) fn as_slice(&self) -> &[u8] {
        match self {
            Head::Short(bytes, len) => &bytes[..usize::from(*len)],
            Head::Long(bytes) => bytes,
        }
    }
}

/// The head of the reply to `command`: for a successful READ, the data
/// (`data_bytes` long) follows it on the wire.
pub(crate) fn data_reply_head(
    structured: bool,
    cookie: u64,
    command: Command,
    offset: u64,
    data_bytes: u32,
    result: Result<(), (ErrorCode, &str)>,
) -> Head {
    match (result, structured) {
        (Ok(()), false) => Head::from_slice(&encode_simple_reply(cookie, None)),
        (Ok(()), true) if command == Command::Read => {
            Head::from_slice(&encode_offset_data_header(cookie, offset, data_bytes, true))
        }
        (Ok(()), true) => Head::from_slice(&encode_none_chunk(cookie)),
        (Err((code, _)), false) => Head::from_slice(&encode_simple_reply(cookie, Some(code))),
        (Err((code, reason)), true) => Head::from_slice(&encode_error_chunk(cookie, code, reason)),
    }
}

/// The whole reply to BLOCK_STATUS. The target cannot tell holes from
/// data, so every block is reported as allocated with unknown contents
/// (status 0), which the protocol defines as always correct.
pub(crate) fn block_status_head(cookie: u64, length: u32) -> Head {
    let extents = [Extent {
        length_bytes: length,
        flags: 0,
    }];
    Head::from_slice(&encode_block_status_chunk(
        cookie,
        BASE_ALLOCATION_ID,
        &extents,
        true,
    ))
}
