//! The client side of the fixed newstyle handshake, as a state machine
//! (the NBD member reuses it). It asks, in order: STARTTLS (if wanted),
//! STRUCTURED_REPLY (if wanted), SET_META_CONTEXT (if contexts are wanted
//! and structured replies were agreed), then GO with a request for block
//! sizes; a server that does not know GO gets EXPORT_NAME instead.

use crate::consts::{
    client_flags, handshake_flags, info, opt, rep, EXPORT_NAME_REPLY_BYTES,
    EXPORT_NAME_ZEROES_BYTES, GREETING_BYTES, IHAVEOPT, NBD_MAGIC, OPTION_REPLY_HEADER_BYTES,
};
use crate::error::ProtocolError;
use crate::option::{
    is_error_reply, parse_meta_context_data, BlockSizes, InfoReply, InfoRequest,
    MetaContextRequest, OptionReplyHeader, OptionRequest,
};
use crate::wire::{be_u16, be_u64, put_u32};

/// What the client wants.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClientConfig {
    pub export: String,
    pub tls: bool,
    pub structured_replies: bool,
    /// Metadata contexts to select, e.g. `base:allocation`.
    pub meta_contexts: Vec<String>,
}

/// What the server agreed to.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ClientNegotiated {
    pub size_bytes: u64,
    pub transmission_flags: u16,
    pub block_sizes: Option<BlockSizes>,
    pub structured_replies: bool,
    pub meta_contexts: Vec<(u32, String)>,
}

/// Something the caller must act on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ClientEvent {
    /// Run the TLS handshake on the transport, then call
    /// [`ClientHandshake::tls_started`].
    StartTls,
    /// The transmission phase begins.
    Ready(ClientNegotiated),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Expect {
    Greeting,
    ReplyHeader,
    ReplyData(OptionReplyHeader),
    ExportNameReply,
    AwaitTls,
    Done,
}

/// The client's handshake with one server.
#[derive(Debug)]
pub struct ClientHandshake {
    config: ClientConfig,
    expect: Expect,
    pending: Vec<u8>,
    output: Vec<u8>,
    no_zeroes: bool,
    option: u32,
    result: ClientNegotiated,
    have_export_info: bool,
}

type Step = Result<Option<ClientEvent>, ProtocolError>;

/// Longest option reply payload the client accepts.
const REPLY_MAX_BYTES: u32 = 64 * 1024;

impl ClientHandshake {
    pub fn new(config: ClientConfig) -> ClientHandshake {
        ClientHandshake {
            config,
            expect: Expect::Greeting,
            pending: Vec::new(),
            output: Vec::new(),
            no_zeroes: false,
            option: 0,
            result: ClientNegotiated::default(),
            have_export_info: false,
        }
    }

    /// Bytes to send to the server (empties the buffer).
    pub fn take_output(&mut self) -> Vec<u8> {
        std::mem::take(&mut self.output)
    }

    /// How many more bytes the current message needs.
    pub fn bytes_wanted(&self) -> usize {
        let total = match self.expect {
            Expect::Greeting => GREETING_BYTES,
            Expect::ReplyHeader => OPTION_REPLY_HEADER_BYTES,
            Expect::ReplyData(header) => header.length_bytes as usize,
            Expect::ExportNameReply if self.no_zeroes => EXPORT_NAME_REPLY_BYTES,
            Expect::ExportNameReply => EXPORT_NAME_REPLY_BYTES + EXPORT_NAME_ZEROES_BYTES,
            Expect::AwaitTls | Expect::Done => return 0,
        };
        total - self.pending.len()
    }

    pub fn is_done(&self) -> bool {
        self.expect == Expect::Done
    }

    /// TLS is running; the handshake goes on.
    pub fn tls_started(&mut self) {
        assert_eq!(self.expect, Expect::AwaitTls);
        self.after_starttls();
    }

    /// Feed server bytes; returns how many were consumed and any event.
    pub fn receive(&mut self, input: &[u8]) -> Result<(usize, Option<ClientEvent>), ProtocolError> {
        if matches!(self.expect, Expect::AwaitTls | Expect::Done) {
            return Err(ProtocolError::HandshakeFinished);
        }
        let taken = self.bytes_wanted().min(input.len());
        self.pending.extend_from_slice(&input[..taken]);
        if self.bytes_wanted() > 0 {
            return Ok((taken, None));
        }
        let message = std::mem::take(&mut self.pending);
        let event = self.process(&message)?;
        Ok((taken, event))
    }

    fn process(&mut self, message: &[u8]) -> Step {
        match self.expect {
            Expect::Greeting => self.on_greeting(message),
            Expect::ReplyHeader => {
                let header = OptionReplyHeader::parse(message.try_into().expect("20 bytes"))?;
                self.on_reply_header(header)
            }
            Expect::ReplyData(header) => self.on_reply(header, message),
            Expect::ExportNameReply => Ok(Some(self.on_export_name_reply(message))),
            Expect::AwaitTls | Expect::Done => Err(ProtocolError::HandshakeFinished),
        }
    }

    fn on_greeting(&mut self, message: &[u8]) -> Step {
        let magic = be_u64(message, 0);
        if magic != NBD_MAGIC {
            return Err(ProtocolError::BadMagic {
                expected: NBD_MAGIC,
                found: magic,
            });
        }
        let second = be_u64(message, 8);
        if second != IHAVEOPT {
            return Err(ProtocolError::BadMagic {
                expected: IHAVEOPT,
                found: second,
            });
        }
        let flags = be_u16(message, 16);
        if flags & handshake_flags::FIXED_NEWSTYLE == 0 {
            return Err(ProtocolError::Malformed(
                "server does not speak fixed newstyle",
            ));
        }
        self.no_zeroes = flags & handshake_flags::NO_ZEROES != 0;
        let mut ours = client_flags::FIXED_NEWSTYLE;
        if self.no_zeroes {
            ours |= client_flags::NO_ZEROES;
        }
        put_u32(&mut self.output, ours);
        if self.config.tls {
            self.send(OptionRequest::StartTls);
        } else {
            self.after_starttls();
        }
        Ok(None)
    }

    fn send(&mut self, request: OptionRequest) {
        self.option = request.code();
        self.output.extend_from_slice(&request.encode());
        self.expect = match request {
            OptionRequest::ExportName(_) => Expect::ExportNameReply,
            _ => Expect::ReplyHeader,
        };
    }

    fn after_starttls(&mut self) {
        if self.config.structured_replies {
            self.send(OptionRequest::StructuredReply);
        } else {
            self.after_structured();
        }
    }

    fn after_structured(&mut self) {
        if self.result.structured_replies && !self.config.meta_contexts.is_empty() {
            let export = self.config.export.clone();
            let queries = self.config.meta_contexts.clone();
            self.send(OptionRequest::SetMetaContext(MetaContextRequest {
                export,
                queries,
            }));
        } else {
            self.send_go();
        }
    }

    fn send_go(&mut self) {
        let export = self.config.export.clone();
        let info_types = vec![info::BLOCK_SIZE];
        self.send(OptionRequest::Go(InfoRequest { export, info_types }));
    }

    fn on_reply_header(&mut self, header: OptionReplyHeader) -> Step {
        if header.option != self.option {
            return Err(ProtocolError::UnexpectedReply {
                option: header.option,
                reply: header.reply_type,
            });
        }
        if header.length_bytes > REPLY_MAX_BYTES {
            return Err(ProtocolError::Malformed("option reply too long"));
        }
        if header.length_bytes == 0 {
            return self.on_reply(header, &[]);
        }
        self.expect = Expect::ReplyData(header);
        Ok(None)
    }

    fn on_reply(&mut self, header: OptionReplyHeader, data: &[u8]) -> Step {
        self.expect = Expect::ReplyHeader;
        let reply = header.reply_type;
        match header.option {
            opt::STARTTLS if reply == rep::ACK => {
                self.expect = Expect::AwaitTls;
                Ok(Some(ClientEvent::StartTls))
            }
            opt::STRUCTURED_REPLY if reply == rep::ACK || is_error_reply(reply) => {
                self.result.structured_replies = reply == rep::ACK;
                self.after_structured();
                Ok(None)
            }
            opt::SET_META_CONTEXT => self.on_meta_reply(reply, data),
            opt::GO => self.on_go_reply(reply, data),
            option => Err(refused(option, reply, data)),
        }
    }

    fn on_meta_reply(&mut self, reply: u32, data: &[u8]) -> Step {
        match reply {
            rep::META_CONTEXT => self
                .result
                .meta_contexts
                .push(parse_meta_context_data(data)?),
            rep::ACK => self.send_go(),
            r if is_error_reply(r) => {
                self.result.meta_contexts.clear();
                self.send_go();
            }
            r => {
                return Err(ProtocolError::UnexpectedReply {
                    option: opt::SET_META_CONTEXT,
                    reply: r,
                })
            }
        }
        Ok(None)
    }

    fn on_go_reply(&mut self, reply: u32, data: &[u8]) -> Step {
        match reply {
            rep::INFO => self.on_info(InfoReply::parse(data)?),
            rep::ACK if self.have_export_info => {
                self.expect = Expect::Done;
                return Ok(Some(ClientEvent::Ready(self.result.clone())));
            }
            rep::ACK => {
                return Err(ProtocolError::Malformed(
                    "GO acknowledged without export info",
                ))
            }
            rep::ERR_UNSUP => self.send(OptionRequest::ExportName(self.config.export.clone())),
            r => return Err(refused(opt::GO, r, data)),
        }
        Ok(None)
    }

    fn on_info(&mut self, reply: InfoReply) {
        match reply {
            InfoReply::Export {
                size_bytes,
                transmission_flags,
            } => {
                self.result.size_bytes = size_bytes;
                self.result.transmission_flags = transmission_flags;
                self.have_export_info = true;
            }
            InfoReply::BlockSize(sizes) => self.result.block_sizes = Some(sizes),
            _ => {}
        }
    }

    fn on_export_name_reply(&mut self, message: &[u8]) -> ClientEvent {
        self.result.size_bytes = be_u64(message, 0);
        self.result.transmission_flags = be_u16(message, 8);
        self.expect = Expect::Done;
        ClientEvent::Ready(self.result.clone())
    }
}

fn refused(option: u32, reply: u32, data: &[u8]) -> ProtocolError {
    ProtocolError::Refused {
        option,
        reply,
        message: String::from_utf8_lossy(data).into_owned(),
    }
}
