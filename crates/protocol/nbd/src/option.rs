//! Handshake messages: option requests (client to server) and option
//! replies (server to client), with their payloads.

use crate::consts::{info, opt, rep, IHAVEOPT, OPTION_REPLY_MAGIC};
use crate::error::ProtocolError;
use crate::wire::{be_u32, be_u64, put_string32, put_u16, put_u32, put_u64, Cursor};

/// The export and the information types asked for by NBD_OPT_INFO/GO.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InfoRequest {
    pub export: String,
    pub info_types: Vec<u16>,
}

/// NBD_OPT_LIST_META_CONTEXT / NBD_OPT_SET_META_CONTEXT payload.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MetaContextRequest {
    pub export: String,
    pub queries: Vec<String>,
}

/// One option request, decoded.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum OptionRequest {
    ExportName(String),
    Abort,
    List,
    StartTls,
    Info(InfoRequest),
    Go(InfoRequest),
    StructuredReply,
    ListMetaContext(MetaContextRequest),
    SetMetaContext(MetaContextRequest),
    /// An option this crate does not know; the server answers ERR_UNSUP.
    Unknown {
        option: u32,
        data: Vec<u8>,
    },
}

/// Header of an option request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OptionHeader {
    pub option: u32,
    pub length_bytes: u32,
}

impl OptionHeader {
    /// Decode the 16-byte header (IHAVEOPT, option, length).
    pub fn parse(bytes: &[u8; 16]) -> Result<OptionHeader, ProtocolError> {
        let magic = be_u64(bytes, 0);
        if magic != IHAVEOPT {
            return Err(ProtocolError::BadMagic {
                expected: IHAVEOPT,
                found: magic,
            });
        }
        Ok(OptionHeader {
            option: be_u32(bytes, 8),
            length_bytes: be_u32(bytes, 12),
        })
    }
}

/// Why an option's payload was refused (the server answers ERR_INVALID).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InvalidOption(pub &'static str);

impl OptionRequest {
    /// The option code.
    pub fn code(&self) -> u32 {
        match self {
            OptionRequest::ExportName(_) => opt::EXPORT_NAME,
            OptionRequest::Abort => opt::ABORT,
            OptionRequest::List => opt::LIST,
            OptionRequest::StartTls => opt::STARTTLS,
            OptionRequest::Info(_) => opt::INFO,
            OptionRequest::Go(_) => opt::GO,
            OptionRequest::StructuredReply => opt::STRUCTURED_REPLY,
            OptionRequest::ListMetaContext(_) => opt::LIST_META_CONTEXT,
            OptionRequest::SetMetaContext(_) => opt::SET_META_CONTEXT,
            OptionRequest::Unknown { option, .. } => *option,
        }
    }

    /// The whole request: header and payload.
    pub fn encode(&self) -> Vec<u8> {
        let data = self.encode_data();
        let mut out = Vec::with_capacity(16 + data.len());
        put_u64(&mut out, IHAVEOPT);
        put_u32(&mut out, self.code());
        put_u32(&mut out, data.len() as u32);
        out.extend_from_slice(&data);
        out
    }

    /// The payload only.
    pub fn encode_data(&self) -> Vec<u8> {
        let mut out = Vec::new();
        match self {
            OptionRequest::ExportName(name) => out.extend_from_slice(name.as_bytes()),
            OptionRequest::Info(request) | OptionRequest::Go(request) => {
                put_string32(&mut out, &request.export);
                put_u16(&mut out, request.info_types.len() as u16);
                request
                    .info_types
                    .iter()
                    .for_each(|t| put_u16(&mut out, *t));
            }
            OptionRequest::ListMetaContext(request) | OptionRequest::SetMetaContext(request) => {
                put_string32(&mut out, &request.export);
                put_u32(&mut out, request.queries.len() as u32);
                request
                    .queries
                    .iter()
                    .for_each(|q| put_string32(&mut out, q));
            }
            OptionRequest::Unknown { data, .. } => out.extend_from_slice(data),
            OptionRequest::Abort
            | OptionRequest::List
            | OptionRequest::StartTls
            | OptionRequest::StructuredReply => {}
        }
        out
    }

    /// Decode an option's payload.
    pub fn parse(option: u32, data: &[u8]) -> Result<OptionRequest, InvalidOption> {
        let empty = |request: OptionRequest| {
            if data.is_empty() {
                Ok(request)
            } else {
                Err(InvalidOption("this option carries no data"))
            }
        };
        match option {
            opt::EXPORT_NAME => crate::wire::valid_string(data)
                .map(OptionRequest::ExportName)
                .ok_or(InvalidOption("export name is not a valid string")),
            opt::ABORT => empty(OptionRequest::Abort),
            opt::LIST => empty(OptionRequest::List),
            opt::STARTTLS => empty(OptionRequest::StartTls),
            opt::STRUCTURED_REPLY => empty(OptionRequest::StructuredReply),
            opt::INFO => parse_info(data).map(OptionRequest::Info),
            opt::GO => parse_info(data).map(OptionRequest::Go),
            opt::LIST_META_CONTEXT => parse_meta(data).map(OptionRequest::ListMetaContext),
            opt::SET_META_CONTEXT => parse_meta(data).map(OptionRequest::SetMetaContext),
            _ => Ok(OptionRequest::Unknown {
                option,
                data: data.to_vec(),
            }),
        }
    }
}

fn parse_info(data: &[u8]) -> Result<InfoRequest, InvalidOption> {
    let mut cursor = Cursor::new(data);
    let bad = InvalidOption("malformed NBD_OPT_INFO/GO payload");
    let name_bytes = cursor.u32().ok_or(bad.clone())? as usize;
    let export = cursor.string(name_bytes).ok_or(bad.clone())?;
    let count = cursor.u16().ok_or(bad.clone())? as usize;
    if cursor.remaining() != count * 2 {
        return Err(bad);
    }
    let info_types = (0..count).filter_map(|_| cursor.u16()).collect();
    Ok(InfoRequest { export, info_types })
}

fn parse_meta(data: &[u8]) -> Result<MetaContextRequest, InvalidOption> {
    let mut cursor = Cursor::new(data);
    let bad = InvalidOption("malformed meta context payload");
    let name_bytes = cursor.u32().ok_or(bad.clone())? as usize;
    let export = cursor.string(name_bytes).ok_or(bad.clone())?;
    let count = cursor.u32().ok_or(bad.clone())?;
    let mut queries = Vec::new();
    for _ in 0..count {
        let length_bytes = cursor.u32().ok_or(bad.clone())? as usize;
        queries.push(cursor.string(length_bytes).ok_or(bad.clone())?);
    }
    if cursor.remaining() != 0 {
        return Err(bad);
    }
    Ok(MetaContextRequest { export, queries })
}

/// Block size constraints (NBD_INFO_BLOCK_SIZE).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlockSizes {
    /// Requests must be aligned to this (a power of two, 1..=64 KiB).
    pub minimum_bytes: u32,
    /// Requests this size and aligned are efficient (a power of two).
    pub preferred_bytes: u32,
    /// Largest READ/WRITE payload the server accepts.
    pub maximum_bytes: u32,
}

impl BlockSizes {
    /// Whether the three values obey the protocol's rules.
    pub fn is_valid(&self) -> bool {
        let min = self.minimum_bytes;
        let pref = self.preferred_bytes;
        let max = self.maximum_bytes;
        min.is_power_of_two()
            && min <= 65536
            && pref.is_power_of_two()
            && pref >= min.max(512)
            && (max == u32::MAX || (max.is_multiple_of(min) && max >= pref))
    }
}

/// One NBD_REP_INFO payload.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum InfoReply {
    Export {
        size_bytes: u64,
        transmission_flags: u16,
    },
    Name(String),
    Description(String),
    BlockSize(BlockSizes),
    Unknown {
        info_type: u16,
        data: Vec<u8>,
    },
}

impl InfoReply {
    pub fn encode_data(&self) -> Vec<u8> {
        let mut out = Vec::new();
        match self {
            InfoReply::Export {
                size_bytes,
                transmission_flags,
            } => {
                put_u16(&mut out, info::EXPORT);
                put_u64(&mut out, *size_bytes);
                put_u16(&mut out, *transmission_flags);
            }
            InfoReply::Name(name) => text_info(&mut out, info::NAME, name),
            InfoReply::Description(text) => text_info(&mut out, info::DESCRIPTION, text),
            InfoReply::BlockSize(sizes) => {
                put_u16(&mut out, info::BLOCK_SIZE);
                put_u32(&mut out, sizes.minimum_bytes);
                put_u32(&mut out, sizes.preferred_bytes);
                put_u32(&mut out, sizes.maximum_bytes);
            }
            InfoReply::Unknown { info_type, data } => {
                put_u16(&mut out, *info_type);
                out.extend_from_slice(data);
            }
        }
        out
    }

    pub fn parse(data: &[u8]) -> Result<InfoReply, ProtocolError> {
        let bad = ProtocolError::Malformed("NBD_REP_INFO payload");
        let mut cursor = Cursor::new(data);
        let info_type = cursor.u16().ok_or(bad.clone())?;
        let reply = match info_type {
            info::EXPORT if data.len() == 12 => InfoReply::Export {
                size_bytes: cursor.u64().ok_or(bad.clone())?,
                transmission_flags: cursor.u16().ok_or(bad.clone())?,
            },
            info::NAME => InfoReply::Name(cursor.rest_string().ok_or(bad)?),
            info::DESCRIPTION => InfoReply::Description(cursor.rest_string().ok_or(bad)?),
            info::BLOCK_SIZE if data.len() == 14 => InfoReply::BlockSize(BlockSizes {
                minimum_bytes: cursor.u32().ok_or(bad.clone())?,
                preferred_bytes: cursor.u32().ok_or(bad.clone())?,
                maximum_bytes: cursor.u32().ok_or(bad.clone())?,
            }),
            info::EXPORT | info::BLOCK_SIZE => return Err(bad),
            _ => InfoReply::Unknown {
                info_type,
                data: data[2..].to_vec(),
            },
        };
        Ok(reply)
    }
}

fn text_info(out: &mut Vec<u8>, info_type: u16, text: &str) {
    put_u16(out, info_type);
    out.extend_from_slice(text.as_bytes());
}

/// Header of an option reply.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OptionReplyHeader {
    pub option: u32,
    pub reply_type: u32,
    pub length_bytes: u32,
}

impl OptionReplyHeader {
    pub fn parse(bytes: &[u8; 20]) -> Result<OptionReplyHeader, ProtocolError> {
        let magic = be_u64(bytes, 0);
        if magic != OPTION_REPLY_MAGIC {
            return Err(ProtocolError::BadMagic {
                expected: OPTION_REPLY_MAGIC,
                found: magic,
            });
        }
        Ok(OptionReplyHeader {
            option: be_u32(bytes, 8),
            reply_type: be_u32(bytes, 12),
            length_bytes: be_u32(bytes, 16),
        })
    }
}

/// Append one option reply (header and payload) to `out`.
pub fn encode_option_reply(out: &mut Vec<u8>, option: u32, reply_type: u32, data: &[u8]) {
    put_u64(out, OPTION_REPLY_MAGIC);
    put_u32(out, option);
    put_u32(out, reply_type);
    put_u32(out, data.len() as u32);
    out.extend_from_slice(data);
}

/// NBD_REP_SERVER payload: the export name (and optional details).
pub fn encode_server_reply_data(name: &str, details: &str) -> Vec<u8> {
    let mut out = Vec::new();
    put_string32(&mut out, name);
    out.extend_from_slice(details.as_bytes());
    out
}

/// NBD_REP_META_CONTEXT payload: context id and name.
pub fn encode_meta_context_data(context_id: u32, name: &str) -> Vec<u8> {
    let mut out = Vec::new();
    put_u32(&mut out, context_id);
    out.extend_from_slice(name.as_bytes());
    out
}

/// Decode an NBD_REP_META_CONTEXT payload.
pub fn parse_meta_context_data(data: &[u8]) -> Result<(u32, String), ProtocolError> {
    let bad = ProtocolError::Malformed("NBD_REP_META_CONTEXT payload");
    let mut cursor = Cursor::new(data);
    let context_id = cursor.u32().ok_or(bad.clone())?;
    let name = cursor.rest_string().ok_or(bad)?;
    Ok((context_id, name))
}

/// Whether a reply type is an error.
pub fn is_error_reply(reply_type: u32) -> bool {
    reply_type & rep::ERROR_BIT != 0
}
