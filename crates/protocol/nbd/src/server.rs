//! The server side of the fixed newstyle handshake, as a state machine:
//! bytes from the client go in through [`ServerHandshake::receive`], bytes
//! for the client come out of [`ServerHandshake::take_output`], and events
//! tell the caller when to start TLS, when transmission begins, and when an
//! option was refused (for its log).
//!
//! The machine never consumes more input than the message it is decoding,
//! so bytes that follow the handshake (or a STARTTLS) stay with the caller.

use std::sync::Arc;

use crate::consts::{
    client_flags, handshake_flags, opt, rep, transmission_flags as tf, BASE_ALLOCATION,
    CLIENT_FLAGS_BYTES, EXPORT_NAME_ZEROES_BYTES, NBD_MAGIC, OPTION_HEADER_BYTES,
};
use crate::error::ProtocolError;
use crate::option::{
    encode_meta_context_data, encode_option_reply, encode_server_reply_data, BlockSizes, InfoReply,
    InfoRequest, InvalidOption, MetaContextRequest, OptionHeader, OptionRequest,
};
use crate::wire::{be_u32, put_u16, put_u64};

/// The context id this server gives `base:allocation`.
pub const BASE_ALLOCATION_ID: u32 = 1;

/// What the server offers under one name.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ExportInfo {
    pub name: String,
    pub description: String,
    pub size_bytes: u64,
    /// Transmission flags; HAS_FLAGS is added and SEND_DF is managed by the
    /// handshake (set only when structured replies are negotiated).
    pub transmission_flags: u16,
    pub block_sizes: BlockSizes,
    /// Whether `base:allocation` may be selected.
    pub base_allocation: bool,
}

/// How the server treats TLS.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TlsPolicy {
    /// No TLS: STARTTLS is refused with ERR_POLICY.
    Off,
    /// STARTTLS is accepted but not required.
    Optional,
    /// Every option but STARTTLS and ABORT is refused with ERR_TLS_REQD
    /// until TLS is running ("FORCEDTLS" in the protocol document).
    Required,
}

/// Handshake settings shared by all connections of a server.
#[derive(Clone, Debug)]
pub struct ServerConfig {
    /// The first export is the default (chosen by an empty name).
    pub exports: Vec<ExportInfo>,
    pub tls: TlsPolicy,
    /// Longest option payload accepted; longer ones disconnect.
    pub option_max_bytes: u32,
    /// Most options in one handshake; more disconnect.
    pub options_max: u32,
}

impl ServerConfig {
    pub fn new(exports: Vec<ExportInfo>) -> ServerConfig {
        ServerConfig {
            exports,
            tls: TlsPolicy::Off,
            option_max_bytes: 16 * 1024,
            options_max: 256,
        }
    }
}

/// What was agreed when transmission begins.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Negotiated {
    pub export_index: usize,
    pub transmission_flags: u16,
    pub structured_replies: bool,
    /// Ids of the selected metadata contexts (only [`BASE_ALLOCATION_ID`]).
    pub meta_context_ids: Vec<u32>,
    pub tls_active: bool,
    /// The client chose NBD_OPT_EXPORT_NAME rather than NBD_OPT_GO.
    pub via_export_name: bool,
    /// The client asked for NBD_INFO_BLOCK_SIZE with GO: it promised to
    /// honour the block sizes. One that did not may send requests of any
    /// alignment, which a server SHOULD serve (proto.md, "Block size
    /// constraints").
    pub block_sizes_requested: bool,
}

/// Something the caller must act on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ServerEvent {
    /// Send the pending output (the ACK), then run the TLS handshake on the
    /// transport and call [`ServerHandshake::tls_started`].
    StartTls,
    /// Send the pending output; the transmission phase begins.
    Ready(Negotiated),
    /// The client aborted; send the pending output and close.
    Aborted,
    /// An option was answered with an error reply (worth a log line).
    Refused {
        option: u32,
        reply: u32,
        reason: &'static str,
    },
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum State {
    ClientFlags,
    OptionHeader,
    OptionData(OptionHeader),
    AwaitTls,
    Done,
}

/// The server's handshake with one client.
#[derive(Debug)]
pub struct ServerHandshake {
    config: Arc<ServerConfig>,
    state: State,
    pending: Vec<u8>,
    output: Vec<u8>,
    no_zeroes: bool,
    structured: bool,
    tls_active: bool,
    block_sizes_requested: bool,
    meta: Option<(String, Vec<u32>)>,
    options_seen: u32,
}

type Step = Result<Option<ServerEvent>, ProtocolError>;

impl ServerHandshake {
    /// Start a handshake; the greeting is queued as output.
    pub fn new(config: Arc<ServerConfig>) -> ServerHandshake {
        let mut output = Vec::with_capacity(18);
        put_u64(&mut output, NBD_MAGIC);
        put_u64(&mut output, crate::consts::IHAVEOPT);
        put_u16(
            &mut output,
            handshake_flags::FIXED_NEWSTYLE | handshake_flags::NO_ZEROES,
        );
        ServerHandshake {
            config,
            state: State::ClientFlags,
            pending: Vec::new(),
            output,
            no_zeroes: false,
            structured: false,
            tls_active: false,
            block_sizes_requested: false,
            meta: None,
            options_seen: 0,
        }
    }

    /// Bytes to send to the client (empties the buffer).
    pub fn take_output(&mut self) -> Vec<u8> {
        std::mem::take(&mut self.output)
    }

    /// How many more bytes the current message needs (0 when the machine
    /// waits for TLS or is finished).
    pub fn bytes_wanted(&self) -> usize {
        let total = match self.state {
            State::ClientFlags => CLIENT_FLAGS_BYTES,
            State::OptionHeader => OPTION_HEADER_BYTES,
            State::OptionData(header) => header.length_bytes as usize,
            State::AwaitTls | State::Done => return 0,
        };
        total - self.pending.len()
    }

    /// Whether the handshake ended (transmission began or the client left).
    pub fn is_done(&self) -> bool {
        self.state == State::Done
    }

    /// The TLS handshake on the transport succeeded.
    pub fn tls_started(&mut self) {
        assert_eq!(self.state, State::AwaitTls);
        self.tls_active = true;
        self.state = State::OptionHeader;
    }

    /// Feed client bytes. Returns how many were consumed (never past the
    /// current message) and the event the message caused, if any.
    pub fn receive(&mut self, input: &[u8]) -> Result<(usize, Option<ServerEvent>), ProtocolError> {
        if matches!(self.state, State::AwaitTls | State::Done) {
            return Err(ProtocolError::HandshakeFinished);
        }
        let wanted = self.bytes_wanted();
        let taken = wanted.min(input.len());
        self.pending.extend_from_slice(&input[..taken]);
        if self.bytes_wanted() > 0 {
            return Ok((taken, None));
        }
        let message = std::mem::take(&mut self.pending);
        let event = self.process(&message)?;
        Ok((taken, event))
    }

    fn process(&mut self, message: &[u8]) -> Step {
        match self.state {
            State::ClientFlags => self.on_client_flags(be_u32(message, 0)),
            State::OptionHeader => {
                let header = OptionHeader::parse(message.try_into().expect("16 bytes"))?;
                self.on_option_header(header)
            }
            State::OptionData(header) => {
                self.state = State::OptionHeader;
                self.on_option(header.option, message)
            }
            State::AwaitTls | State::Done => Err(ProtocolError::HandshakeFinished),
        }
    }

    fn on_client_flags(&mut self, flags: u32) -> Step {
        let known = client_flags::FIXED_NEWSTYLE | client_flags::NO_ZEROES;
        if flags & !known != 0 {
            return Err(ProtocolError::UnknownClientFlags(flags));
        }
        self.no_zeroes = flags & client_flags::NO_ZEROES != 0;
        self.state = State::OptionHeader;
        Ok(None)
    }

    fn on_option_header(&mut self, header: OptionHeader) -> Step {
        self.options_seen += 1;
        if self.options_seen > self.config.options_max {
            return Err(ProtocolError::TooManyOptions(self.config.options_max));
        }
        if header.length_bytes > self.config.option_max_bytes {
            return Err(ProtocolError::OptionTooLong {
                option: header.option,
                length_bytes: header.length_bytes,
                max_bytes: self.config.option_max_bytes,
            });
        }
        if header.length_bytes == 0 {
            return self.on_option(header.option, &[]);
        }
        self.state = State::OptionData(header);
        Ok(None)
    }

    fn on_option(&mut self, option: u32, data: &[u8]) -> Step {
        let request = match OptionRequest::parse(option, data) {
            Ok(request) => request,
            Err(_) if option == opt::EXPORT_NAME => {
                return Err(ProtocolError::Malformed("export name"))
            }
            Err(InvalidOption(reason)) => return Ok(self.refuse(option, rep::ERR_INVALID, reason)),
        };
        let tls_missing = self.config.tls == TlsPolicy::Required && !self.tls_active;
        if tls_missing && !matches!(request, OptionRequest::StartTls | OptionRequest::Abort) {
            if option == opt::EXPORT_NAME {
                return Err(ProtocolError::TlsRequired);
            }
            return Ok(self.refuse(option, rep::ERR_TLS_REQD, "TLS is required"));
        }
        self.dispatch(request)
    }

    fn dispatch(&mut self, request: OptionRequest) -> Step {
        match request {
            OptionRequest::ExportName(name) => self.on_export_name(&name),
            OptionRequest::Abort => {
                self.reply(opt::ABORT, rep::ACK, &[]);
                self.state = State::Done;
                Ok(Some(ServerEvent::Aborted))
            }
            OptionRequest::List => Ok(self.on_list()),
            OptionRequest::StartTls => Ok(self.on_starttls()),
            OptionRequest::Info(request) => Ok(self.on_info(opt::INFO, &request)),
            OptionRequest::Go(request) => Ok(self.on_info(opt::GO, &request)),
            OptionRequest::StructuredReply => {
                self.structured = true;
                self.reply(opt::STRUCTURED_REPLY, rep::ACK, &[]);
                Ok(None)
            }
            OptionRequest::ListMetaContext(request) => Ok(self.on_meta(false, &request)),
            OptionRequest::SetMetaContext(request) => Ok(self.on_meta(true, &request)),
            OptionRequest::Unknown { option, .. } => {
                Ok(self.refuse(option, rep::ERR_UNSUP, "unsupported option"))
            }
        }
    }

    fn reply(&mut self, option: u32, reply_type: u32, data: &[u8]) {
        encode_option_reply(&mut self.output, option, reply_type, data);
    }

    fn refuse(&mut self, option: u32, reply: u32, reason: &'static str) -> Option<ServerEvent> {
        self.reply(option, reply, reason.as_bytes());
        Some(ServerEvent::Refused {
            option,
            reply,
            reason,
        })
    }

    fn find_export(&self, name: &str) -> Option<usize> {
        if name.is_empty() && !self.config.exports.is_empty() {
            return Some(0);
        }
        self.config.exports.iter().position(|e| e.name == name)
    }

    fn transmission_flags(&self, export: &ExportInfo) -> u16 {
        let flags = export.transmission_flags | tf::HAS_FLAGS;
        if self.structured {
            flags | tf::SEND_DF
        } else {
            flags & !tf::SEND_DF
        }
    }

    fn negotiated(&mut self, export_index: usize, via_export_name: bool) -> ServerEvent {
        let export = &self.config.exports[export_index];
        let meta_context_ids = match &self.meta {
            Some((name, ids)) if self.find_export(name) == Some(export_index) => ids.clone(),
            _ => Vec::new(),
        };
        self.state = State::Done;
        ServerEvent::Ready(Negotiated {
            export_index,
            transmission_flags: self.transmission_flags(export),
            structured_replies: self.structured,
            meta_context_ids,
            tls_active: self.tls_active,
            via_export_name,
            block_sizes_requested: self.block_sizes_requested,
        })
    }

    fn on_export_name(&mut self, name: &str) -> Step {
        let index = self
            .find_export(name)
            .ok_or_else(|| ProtocolError::UnknownExport(name.to_string()))?;
        let export = &self.config.exports[index];
        let flags = self.transmission_flags(export);
        put_u64(&mut self.output, export.size_bytes);
        put_u16(&mut self.output, flags);
        if !self.no_zeroes {
            self.output
                .extend_from_slice(&[0u8; EXPORT_NAME_ZEROES_BYTES]);
        }
        Ok(Some(self.negotiated(index, true)))
    }

    fn on_list(&mut self) -> Option<ServerEvent> {
        let config = Arc::clone(&self.config);
        for export in &config.exports {
            let data = encode_server_reply_data(&export.name, "");
            self.reply(opt::LIST, rep::SERVER, &data);
        }
        self.reply(opt::LIST, rep::ACK, &[]);
        None
    }

    fn on_starttls(&mut self) -> Option<ServerEvent> {
        if self.config.tls == TlsPolicy::Off {
            return self.refuse(opt::STARTTLS, rep::ERR_POLICY, "TLS is not configured");
        }
        if self.tls_active {
            return self.refuse(opt::STARTTLS, rep::ERR_INVALID, "TLS is already running");
        }
        self.reply(opt::STARTTLS, rep::ACK, &[]);
        self.state = State::AwaitTls;
        Some(ServerEvent::StartTls)
    }

    fn on_info(&mut self, option: u32, request: &InfoRequest) -> Option<ServerEvent> {
        let Some(index) = self.find_export(&request.export) else {
            return self.refuse(option, rep::ERR_UNKNOWN, "no such export");
        };
        let export = self.config.exports[index].clone();
        let flags = self.transmission_flags(&export);
        let mut infos = vec![InfoReply::Export {
            size_bytes: export.size_bytes,
            transmission_flags: flags,
        }];
        if request.info_types.contains(&crate::consts::info::NAME) {
            infos.push(InfoReply::Name(export.name.clone()));
        }
        let wants_description = request
            .info_types
            .contains(&crate::consts::info::DESCRIPTION);
        if wants_description && !export.description.is_empty() {
            infos.push(InfoReply::Description(export.description.clone()));
        }
        // Sent whether asked for or not: the protocol allows it, and clients
        // that honour it never send a request this server must refuse.
        infos.push(InfoReply::BlockSize(export.block_sizes));
        if option == opt::GO {
            self.block_sizes_requested = request
                .info_types
                .contains(&crate::consts::info::BLOCK_SIZE);
        }
        for info in infos {
            self.reply(option, rep::INFO, &info.encode_data());
        }
        self.reply(option, rep::ACK, &[]);
        (option == opt::GO).then(|| self.negotiated(index, false))
    }

    fn on_meta(&mut self, select: bool, request: &MetaContextRequest) -> Option<ServerEvent> {
        let option = if select {
            opt::SET_META_CONTEXT
        } else {
            opt::LIST_META_CONTEXT
        };
        if !self.structured {
            return self.refuse(
                option,
                rep::ERR_INVALID,
                "structured replies not negotiated",
            );
        }
        let Some(index) = self.find_export(&request.export) else {
            return self.refuse(option, rep::ERR_UNKNOWN, "no such export");
        };
        let offered = self.config.exports[index].base_allocation;
        let matched = offered && meta_query_matches(select, &request.queries);
        let context_id = if select { BASE_ALLOCATION_ID } else { 0 };
        if matched {
            let data = encode_meta_context_data(context_id, BASE_ALLOCATION);
            self.reply(option, rep::META_CONTEXT, &data);
        }
        if select {
            let ids = if matched {
                vec![BASE_ALLOCATION_ID]
            } else {
                Vec::new()
            };
            self.meta = Some((request.export.clone(), ids));
        }
        self.reply(option, rep::ACK, &[]);
        None
    }
}

/// Whether the queries select `base:allocation`. Listing with no query, or
/// with the namespace `base:`, lists every context; selecting needs the
/// full name.
fn meta_query_matches(select: bool, queries: &[String]) -> bool {
    if !select && queries.is_empty() {
        return true;
    }
    queries
        .iter()
        .any(|q| q == BASE_ALLOCATION || (!select && q == "base:"))
}
