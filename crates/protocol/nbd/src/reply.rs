//! The client's reply reader: transmission-phase replies (simple, and
//! structured when negotiated) as a sans-IO state machine.
//!
//! The reader never buffers payload: it says what it wants next
//! ([`ReplyReader::want`]). Header and chunk fields go into its own small
//! buffer; a read's data is described as [`Want::Data`] (so many bytes for
//! request `cookie` at this offset of the request), which the caller moves
//! straight from the socket into the request's buffer. Every length from
//! the wire is checked against what the client asked for before it is
//! used: a reply for an unknown cookie, data past a request's range, a
//! chunk type the client cannot have caused, or an oversized error message
//! is a [`ProtocolError`] (the connection cannot be trusted afterwards).

use crate::consts::{
    reply_flags, reply_type, CHUNK_HEADER_BYTES, SIMPLE_REPLY_HEADER_BYTES, SIMPLE_REPLY_MAGIC,
    STRING_MAX_BYTES, STRUCTURED_REPLY_MAGIC,
};
use crate::error::ProtocolError;
use crate::transmission::Command;
use crate::wire::{be_u16, be_u32, be_u64};

/// What the client sent under a cookie, as the reader needs to know it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Sent {
    pub command: Command,
    pub offset: u64,
    pub length: u32,
}

/// What the reader needs next.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Want {
    /// Exactly this many more bytes into [`ReplyReader::buffer`], then
    /// [`ReplyReader::filled`].
    Bytes(usize),
    /// The next `len` bytes on the wire are data of request `cookie` at
    /// `at` bytes from the request's start; after moving some of them,
    /// call [`ReplyReader::data_moved`].
    Data { cookie: u64, at: u32, len: u32 },
}

/// Something the caller acts on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Event {
    /// `len` bytes of request `cookie` at `at` read as zeros (a hole):
    /// the caller fills them. `done` as in [`Event::Done`] follows.
    Hole {
        cookie: u64,
        at: u32,
        len: u32,
        done: bool,
    },
    /// Data of request `cookie` was moved in full: `[at, at + len)`.
    DataEnd {
        cookie: u64,
        at: u32,
        len: u32,
        done: bool,
    },
    /// The request failed with this wire error value; `done` says whether
    /// its reply is over (a structured error chunk may be followed by
    /// more).
    Error { cookie: u64, error: u32, done: bool },
    /// The request's reply is over (no error in this message).
    Done { cookie: u64 },
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum State {
    /// The first 4 bytes of a reply: its magic.
    Magic,
    SimpleHeader,
    ChunkHeader,
    /// An OFFSET_DATA chunk's offset field.
    DataOffset(Chunk),
    Data {
        chunk: Chunk,
        at: u32,
        left: u32,
    },
    /// An OFFSET_HOLE chunk's body.
    Hole(Chunk),
    /// An error chunk's body.
    ErrorBody(Chunk),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Chunk {
    flags: u16,
    kind: u16,
    cookie: u64,
    length: u32,
    sent: Sent,
}

/// Longest error chunk body: error, message length, message, offset.
const ERROR_BODY_MAX_BYTES: usize = 4 + 2 + STRING_MAX_BYTES + 8;

/// Reads replies from one connection.
#[derive(Debug)]
pub struct ReplyReader {
    structured: bool,
    state: State,
    buf: Vec<u8>,
    have: usize,
}

impl ReplyReader {
    /// `structured`: whether structured replies were negotiated (without
    /// them, a structured chunk is a protocol error).
    pub fn new(structured: bool) -> ReplyReader {
        ReplyReader {
            structured,
            state: State::Magic,
            buf: vec![0; ERROR_BODY_MAX_BYTES],
            have: 0,
        }
    }

    fn message_bytes(&self) -> usize {
        match self.state {
            State::Magic => 4,
            State::SimpleHeader => SIMPLE_REPLY_HEADER_BYTES,
            State::ChunkHeader => CHUNK_HEADER_BYTES,
            State::DataOffset(_) => 8,
            State::Hole(_) => 12,
            State::ErrorBody(chunk) => chunk.length as usize,
            State::Data { .. } => 0,
        }
    }

    pub fn want(&self) -> Want {
        match self.state {
            State::Data { chunk, at, left } => Want::Data {
                cookie: chunk.cookie,
                at,
                len: left,
            },
            _ => Want::Bytes(self.message_bytes() - self.have),
        }
    }

    /// Where the bytes of a [`Want::Bytes`] go.
    pub fn buffer(&mut self) -> &mut [u8] {
        let end = self.message_bytes();
        &mut self.buf[self.have..end]
    }

    /// `n` bytes were put at the front of [`ReplyReader::buffer`].
    /// `lookup` answers what was sent under a cookie (None: nothing).
    pub fn filled(
        &mut self,
        n: usize,
        lookup: &dyn Fn(u64) -> Option<Sent>,
    ) -> Result<Option<Event>, ProtocolError> {
        let need = self.message_bytes() - self.have;
        assert!(n <= need, "filled more than wanted");
        self.have += n;
        if self.have < self.message_bytes() {
            return Ok(None);
        }
        let message_len = self.have;
        self.have = 0;
        let message = &self.buf[..message_len];
        match self.state {
            State::Magic => {
                match be_u32(message, 0) {
                    SIMPLE_REPLY_MAGIC => self.state = State::SimpleHeader,
                    STRUCTURED_REPLY_MAGIC if self.structured => self.state = State::ChunkHeader,
                    STRUCTURED_REPLY_MAGIC => {
                        return Err(ProtocolError::Malformed(
                            "structured reply chunk, but structured replies were not agreed",
                        ))
                    }
                    other => {
                        return Err(ProtocolError::BadMagic {
                            expected: SIMPLE_REPLY_MAGIC.into(),
                            found: other.into(),
                        })
                    }
                }
                // The magic stays at the front of the header.
                self.have = 4;
                Ok(None)
            }
            State::SimpleHeader => self.on_simple(lookup),
            State::ChunkHeader => self.on_chunk_header(lookup),
            State::DataOffset(chunk) => {
                let offset = be_u64(message, 0);
                let len = chunk.length - 8;
                let at = range_in(&chunk.sent, offset, u64::from(len))?;
                self.state = State::Data {
                    chunk,
                    at,
                    left: len,
                };
                if len == 0 {
                    return Err(ProtocolError::Malformed("data chunk with no data"));
                }
                Ok(None)
            }
            State::Hole(chunk) => {
                let offset = be_u64(message, 0);
                let len = be_u32(message, 8);
                if len == 0 {
                    return Err(ProtocolError::Malformed("hole chunk of no bytes"));
                }
                let at = range_in(&chunk.sent, offset, u64::from(len))?;
                self.state = State::Magic;
                Ok(Some(Event::Hole {
                    cookie: chunk.cookie,
                    at,
                    len,
                    done: chunk.flags & reply_flags::DONE != 0,
                }))
            }
            State::ErrorBody(chunk) => {
                let error = be_u32(message, 0);
                let message_len = usize::from(be_u16(message, 4));
                let expected = 6
                    + message_len
                    + if chunk.kind == reply_type::ERROR_OFFSET {
                        8
                    } else {
                        0
                    };
                if expected != chunk.length as usize {
                    return Err(ProtocolError::Malformed(
                        "error chunk length disagrees with its message",
                    ));
                }
                if error == 0 {
                    return Err(ProtocolError::Malformed("error chunk with error value 0"));
                }
                if chunk.kind == reply_type::ERROR_OFFSET {
                    let offset = be_u64(message, 6 + message_len);
                    range_in(&chunk.sent, offset, 1)?;
                }
                self.state = State::Magic;
                Ok(Some(Event::Error {
                    cookie: chunk.cookie,
                    error,
                    done: chunk.flags & reply_flags::DONE != 0,
                }))
            }
            State::Data { .. } => unreachable!("data is moved by the caller"),
        }
    }

    fn on_simple(
        &mut self,
        lookup: &dyn Fn(u64) -> Option<Sent>,
    ) -> Result<Option<Event>, ProtocolError> {
        let error = be_u32(&self.buf, 4);
        let cookie = be_u64(&self.buf, 8);
        let sent = lookup(cookie).ok_or(ProtocolError::Malformed(
            "reply for a request that was not sent",
        ))?;
        self.state = State::Magic;
        if error != 0 {
            return Ok(Some(Event::Error {
                cookie,
                error,
                done: true,
            }));
        }
        if sent.command == Command::Read {
            if self.structured {
                // With structured replies agreed, a read's data must come in
                // chunks (proto.md: the server MUST NOT send a simple reply
                // with data).
                return Err(ProtocolError::Malformed(
                    "simple reply to a read after structured replies were agreed",
                ));
            }
            let chunk = Chunk {
                flags: reply_flags::DONE,
                kind: reply_type::OFFSET_DATA,
                cookie,
                length: sent.length,
                sent,
            };
            self.state = State::Data {
                chunk,
                at: 0,
                left: sent.length,
            };
            return Ok(None);
        }
        Ok(Some(Event::Done { cookie }))
    }

    fn on_chunk_header(
        &mut self,
        lookup: &dyn Fn(u64) -> Option<Sent>,
    ) -> Result<Option<Event>, ProtocolError> {
        let flags = be_u16(&self.buf, 4);
        let kind = be_u16(&self.buf, 6);
        let cookie = be_u64(&self.buf, 8);
        let length = be_u32(&self.buf, 16);
        let sent = lookup(cookie).ok_or(ProtocolError::Malformed(
            "reply chunk for a request that was not sent",
        ))?;
        let chunk = Chunk {
            flags,
            kind,
            cookie,
            length,
            sent,
        };
        let done = flags & reply_flags::DONE != 0;
        let read = sent.command == Command::Read;
        self.state = match kind {
            reply_type::NONE if length != 0 => {
                return Err(ProtocolError::Malformed("NONE chunk with a payload"))
            }
            reply_type::NONE if !done => {
                return Err(ProtocolError::Malformed("NONE chunk without the DONE flag"))
            }
            reply_type::NONE => {
                self.state = State::Magic;
                return Ok(Some(Event::Done { cookie }));
            }
            reply_type::OFFSET_DATA if read && length > 8 => State::DataOffset(chunk),
            reply_type::OFFSET_HOLE if read && length == 12 => State::Hole(chunk),
            reply_type::OFFSET_DATA | reply_type::OFFSET_HOLE if read => {
                return Err(ProtocolError::Malformed("read chunk of a wrong length"))
            }
            reply_type::OFFSET_DATA | reply_type::OFFSET_HOLE => {
                return Err(ProtocolError::Malformed(
                    "data chunk in the reply to a non-read",
                ))
            }
            reply_type::ERROR | reply_type::ERROR_OFFSET
                if (6..=ERROR_BODY_MAX_BYTES as u32).contains(&length) =>
            {
                State::ErrorBody(chunk)
            }
            reply_type::ERROR | reply_type::ERROR_OFFSET => {
                return Err(ProtocolError::Malformed("error chunk of a wrong length"))
            }
            _ => {
                return Err(ProtocolError::Malformed(
                    "reply chunk of a type this client never asks for",
                ))
            }
        };
        Ok(None)
    }

    /// `n` bytes of the current [`Want::Data`] were moved.
    pub fn data_moved(&mut self, n: u32) -> Option<Event> {
        let State::Data { chunk, at, left } = self.state else {
            panic!("data_moved without data wanted");
        };
        assert!(n <= left, "moved more data than wanted");
        if n < left {
            self.state = State::Data {
                chunk,
                at: at + n,
                left: left - n,
            };
            return None;
        }
        self.state = State::Magic;
        let len = chunk.length
            - if chunk.kind == reply_type::OFFSET_DATA && self.structured {
                8
            } else {
                0
            };
        Some(Event::DataEnd {
            cookie: chunk.cookie,
            at: at + n - len,
            len,
            done: chunk.flags & reply_flags::DONE != 0,
        })
    }
}

/// Where `[offset, offset + len)` starts inside the request, if it lies
/// wholly inside it.
fn range_in(sent: &Sent, offset: u64, len: u64) -> Result<u32, ProtocolError> {
    let end = offset.checked_add(len);
    let request_end = sent.offset + u64::from(sent.length);
    match end {
        Some(end) if offset >= sent.offset && end <= request_end => {
            Ok((offset - sent.offset) as u32)
        }
        _ => Err(ProtocolError::Malformed(
            "reply chunk outside the request's range",
        )),
    }
}
