//! The receiving side of an NVMe/TCP connection (after ICReq/ICResp) as a
//! state machine: the caller fills [`PduReader::buffer`] as
//! [`PduReader::want`] asks, and moves data straight into its own buffers
//! when asked for [`Want::Data`].
//!
//! Every header is checked before anything after it is read: the type is
//! one this side receives, its header length is the type's, the digest
//! flags are the ones negotiated, the data offset and PDU length agree
//! with the data length, and a data PDU or R2T names a command in flight
//! (the caller's `lookup`) and stays inside that command's data, in order.
//! Header and data digests are verified. The longest thing read into the
//! reader's own buffer is a header with its digest, padding, or a TermReq's
//! quote: never more than 256 bytes.

use crate::bytes::le32;
use crate::command::Sqe;
use crate::error::ParseError;
use crate::pdu::{
    crc32c, crc32c_append, flags, pdu_type, CommonHeader, DataHeader, Digests, Header, TermReq,
    CAPSULE_CMD_HLEN, CAPSULE_RESP_HLEN, COMMON_HEADER_BYTES, DATA_HLEN, DIGEST_BYTES, TERM_HLEN,
    TERM_MAX_DATA,
};

/// Which end of the connection reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    /// The host: CapsuleResp, C2HData, R2T, C2HTermReq.
    Host,
    /// The controller: CapsuleCmd, H2CData, H2CTermReq.
    Controller,
}

/// What the caller knows of a command in flight, for checking a data PDU
/// or R2T that names it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Expect {
    /// The command's data length.
    pub limit: u32,
    /// Where the next C2HData/H2CData/R2T must start (data moves in order).
    pub next: u32,
    /// The command moves data to the host (a read) rather than to the
    /// controller.
    pub to_host: bool,
    /// The transfer tag an H2CData must carry (controller side).
    pub ttag: u16,
}

/// What the reader needs next.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Want {
    /// Fill `buffer()[..n]` (or a prefix of it) and call `filled`.
    Bytes(usize),
    /// The next `len` bytes on the wire are data of command `cid` at
    /// `offset` in its buffer: move them there (all or a prefix) and call
    /// `data_moved` with them.
    Data { cid: u16, offset: u32, len: u32 },
}

/// What a completed step produced.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Event {
    /// A PDU's header, checked. For a data PDU its data follows
    /// ([`Want::Data`]), then [`Event::DataDone`].
    Header(Header),
    /// A data PDU's data arrived (and its digest matched).
    DataDone {
        cid: u16,
        offset: u32,
        len: u32,
        last: bool,
        success: bool,
    },
    /// The peer ended the connection with a TermReq.
    Term(TermReq),
}

#[derive(Clone, Copy, Debug)]
enum State {
    Common,
    Rest {
        ch: CommonHeader,
    },
    Pad {
        left: usize,
    },
    Data {
        cid: u16,
        offset: u32,
        len: u32,
        done: u32,
        crc: u32,
    },
    DataDigest {
        cid: u16,
        offset: u32,
        len: u32,
        crc: u32,
    },
    TermData {
        fes: u16,
        fei: u32,
        len: usize,
    },
}

/// The PDU receiver of one connection.
#[derive(Debug)]
pub struct PduReader {
    role: Role,
    digests: Digests,
    /// Controller side: most in-capsule data bytes a command may carry.
    max_in_capsule: u32,
    /// Most data bytes one data PDU may carry.
    max_data: u32,
    state: State,
    /// After the current data PDU (and padding): its header facts.
    pending: Option<Pending>,
    buf: [u8; 256],
    have: usize,
}

#[derive(Clone, Copy, Debug)]
struct Pending {
    cid: u16,
    offset: u32,
    len: u32,
    last: bool,
    success: bool,
}

impl PduReader {
    /// A reader for `role` with the negotiated `digests`; `max_data` bounds
    /// one data PDU's payload, `max_in_capsule` a command's in-capsule data
    /// (controller side).
    pub fn new(role: Role, digests: Digests, max_data: u32, max_in_capsule: u32) -> PduReader {
        PduReader {
            role,
            digests,
            max_in_capsule,
            max_data,
            state: State::Common,
            pending: None,
            buf: [0; 256],
            have: 0,
        }
    }

    /// Whether the reader is between PDUs.
    pub fn idle(&self) -> bool {
        matches!(self.state, State::Common) && self.have == 0
    }

    pub fn want(&self) -> Want {
        match self.state {
            State::Common => Want::Bytes(COMMON_HEADER_BYTES - self.have),
            State::Rest { ch } => Want::Bytes(self.rest_len(&ch) - self.have),
            State::Pad { left } => Want::Bytes(left - self.have),
            State::Data {
                cid,
                offset,
                len,
                done,
                ..
            } => Want::Data {
                cid,
                offset: offset + done,
                len: len - done,
            },
            State::DataDigest { .. } => Want::Bytes(DIGEST_BYTES - self.have),
            State::TermData { len, .. } => Want::Bytes(len - self.have),
        }
    }

    /// Where to put the bytes [`Want::Bytes`] asks for.
    pub fn buffer(&mut self) -> &mut [u8] {
        let n = match self.want() {
            Want::Bytes(n) => n,
            Want::Data { .. } => 0,
        };
        let start = match self.state {
            // The common header stays at the front while the rest follows.
            State::Rest { .. } => COMMON_HEADER_BYTES + self.have,
            _ => self.have,
        };
        &mut self.buf[start..start + n]
    }

    fn rest_len(&self, ch: &CommonHeader) -> usize {
        let hd = if is_term(ch.pdu_type) {
            0
        } else {
            self.digests.header_bytes()
        };
        usize::from(ch.hlen) - COMMON_HEADER_BYTES + hd
    }

    /// `n` bytes of [`PduReader::buffer`] were filled.
    pub fn filled(
        &mut self,
        n: usize,
        lookup: &dyn Fn(u16) -> Option<Expect>,
    ) -> Result<Option<Event>, ParseError> {
        let Want::Bytes(want) = self.want() else {
            panic!("invariant: filled() called while the reader wants data");
        };
        assert!(
            n <= want,
            "invariant: filled more than the reader asked for"
        );
        self.have += n;
        if n < want {
            return Ok(None);
        }
        self.have = 0;
        match self.state {
            State::Common => {
                let ch = CommonHeader::parse(&self.buf[..COMMON_HEADER_BYTES])?;
                self.check_common(&ch)?;
                self.state = State::Rest { ch };
                Ok(None)
            }
            State::Rest { ch } => self.header_done(ch, lookup),
            State::Pad { .. } => {
                self.start_data();
                Ok(None)
            }
            State::DataDigest {
                cid,
                offset,
                len,
                crc,
            } => {
                let found = le32(&self.buf, 0);
                if found != crc {
                    return Err(ParseError::DataDigest {
                        found,
                        computed: crc,
                    });
                }
                self.data_finished(cid, offset, len)
            }
            State::TermData { fes, fei, len } => {
                let data = self.buf[..len].to_vec();
                self.state = State::Common;
                Ok(Some(Event::Term(TermReq { fes, fei, data })))
            }
            State::Data { .. } => unreachable!("Data wants data, not bytes"),
        }
    }

    /// `bytes` (a prefix of what [`Want::Data`] asked for) are now in the
    /// caller's buffer.
    pub fn data_moved(&mut self, bytes: &[u8]) -> Result<Option<Event>, ParseError> {
        let State::Data {
            cid,
            offset,
            len,
            done,
            crc,
        } = self.state
        else {
            panic!("invariant: data_moved() called while the reader wants bytes");
        };
        assert!(
            bytes.len() as u64 <= u64::from(len - done),
            "invariant: moved more data than the reader asked for"
        );
        let crc = if self.digests.data {
            crc32c_append(crc, bytes)
        } else {
            0
        };
        let done = done + bytes.len() as u32;
        if done < len {
            self.state = State::Data {
                cid,
                offset,
                len,
                done,
                crc,
            };
            return Ok(None);
        }
        if self.digests.data {
            self.state = State::DataDigest {
                cid,
                offset,
                len,
                crc,
            };
            return Ok(None);
        }
        self.data_finished(cid, offset, len)
    }

    fn data_finished(
        &mut self,
        cid: u16,
        offset: u32,
        len: u32,
    ) -> Result<Option<Event>, ParseError> {
        let p = self
            .pending
            .take()
            .expect("invariant: a data PDU's facts are kept while its data arrives");
        self.state = State::Common;
        Ok(Some(Event::DataDone {
            cid,
            offset,
            len,
            last: p.last,
            success: p.success,
        }))
    }

    fn start_data(&mut self) {
        let p = self
            .pending
            .expect("invariant: data follows a data PDU's header");
        self.state = State::Data {
            cid: p.cid,
            offset: p.offset,
            len: p.len,
            done: 0,
            crc: 0,
        };
    }

    fn check_common(&self, ch: &CommonHeader) -> Result<(), ParseError> {
        let t = ch.pdu_type;
        let (expected_hlen, allowed_flags) = match (self.role, t) {
            (Role::Host, pdu_type::CAPSULE_RESP) => (CAPSULE_RESP_HLEN, flags::HDGST),
            (Role::Host, pdu_type::C2H_DATA) => (
                DATA_HLEN,
                flags::HDGST | flags::DDGST | flags::LAST_PDU | flags::SUCCESS,
            ),
            (Role::Host, pdu_type::R2T) => (DATA_HLEN, flags::HDGST),
            (Role::Host, pdu_type::C2H_TERM_REQ) => (TERM_HLEN, 0),
            (Role::Controller, pdu_type::CAPSULE_CMD) => {
                (CAPSULE_CMD_HLEN, flags::HDGST | flags::DDGST)
            }
            (Role::Controller, pdu_type::H2C_DATA) => {
                (DATA_HLEN, flags::HDGST | flags::DDGST | flags::LAST_PDU)
            }
            (Role::Controller, pdu_type::H2C_TERM_REQ) => (TERM_HLEN, 0),
            (_, 0x00..=0x07 | 0x09) => return Err(ParseError::UnexpectedType { pdu_type: t }),
            _ => return Err(ParseError::UnknownType(t)),
        };
        if usize::from(ch.hlen) != expected_hlen {
            return Err(ParseError::HeaderLength {
                pdu_type: t,
                hlen: ch.hlen,
                expected: expected_hlen as u8,
            });
        }
        // Digest flags say what was negotiated, no more and no less (a
        // TermReq is never digested).
        let bad_flags = ch.flags & !allowed_flags != 0
            || (!is_term(t) && (ch.flags & flags::HDGST != 0) != self.digests.header)
            || (ch.flags & flags::DDGST != 0 && !self.digests.data)
            || (ch.flags & flags::SUCCESS != 0 && ch.flags & flags::LAST_PDU == 0);
        if bad_flags {
            return Err(ParseError::Flags {
                pdu_type: t,
                flags: ch.flags,
            });
        }
        // Header and header digest.
        let header_end = COMMON_HEADER_BYTES + self.rest_len(ch);
        let plen = ch.plen as usize;
        if is_term(t) {
            if !(TERM_HLEN..=TERM_HLEN + TERM_MAX_DATA).contains(&plen) {
                return Err(ParseError::PduLength {
                    pdu_type: t,
                    plen: ch.plen,
                    max: (TERM_HLEN + TERM_MAX_DATA) as u32,
                });
            }
            return Ok(());
        }
        let has_data = matches!(t, pdu_type::C2H_DATA | pdu_type::H2C_DATA)
            || (t == pdu_type::CAPSULE_CMD && plen > header_end);
        if !has_data {
            if plen != header_end {
                return Err(ParseError::PduLength {
                    pdu_type: t,
                    plen: ch.plen,
                    max: header_end as u32,
                });
            }
            return Ok(());
        }
        let pdo = usize::from(ch.pdo);
        if pdo < header_end || pdo > plen {
            return Err(ParseError::DataOffset {
                pdu_type: t,
                pdo: ch.pdo,
                hlen: ch.hlen,
                plen: ch.plen,
            });
        }
        let dd = self.digests.data_bytes();
        if (ch.flags & flags::DDGST != 0) != self.digests.data {
            return Err(ParseError::Flags {
                pdu_type: t,
                flags: ch.flags,
            });
        }
        let data_len = plen - pdo;
        if data_len <= dd {
            return Err(ParseError::PduLength {
                pdu_type: t,
                plen: ch.plen,
                max: 0,
            });
        }
        let max = if t == pdu_type::CAPSULE_CMD {
            self.max_in_capsule
        } else {
            self.max_data
        };
        if (data_len - dd) as u64 > u64::from(max) {
            return Err(ParseError::PduLength {
                pdu_type: t,
                plen: ch.plen,
                max: (pdo + dd) as u32 + max,
            });
        }
        Ok(())
    }

    fn header_done(
        &mut self,
        ch: CommonHeader,
        lookup: &dyn Fn(u16) -> Option<Expect>,
    ) -> Result<Option<Event>, ParseError> {
        let hlen = usize::from(ch.hlen);
        if !is_term(ch.pdu_type) && self.digests.header {
            let computed = crc32c(&self.buf[..hlen]);
            let found = le32(&self.buf, hlen);
            if found != computed {
                return Err(ParseError::HeaderDigest { found, computed });
            }
        }
        let header = Header::parse(&ch, &self.buf[..hlen]);
        let header_end = COMMON_HEADER_BYTES + self.rest_len(&ch);
        let dd = self.digests.data_bytes() as u32;
        // Bytes of data the PDU carries (after padding, before its digest).
        let carried = if usize::from(ch.pdo) >= header_end {
            (ch.plen - u32::from(ch.pdo)).saturating_sub(dd)
        } else {
            0
        };
        let pad = usize::from(ch.pdo).saturating_sub(header_end);
        match &header {
            Header::TermReq { fes, fei } => {
                self.state = State::TermData {
                    fes: *fes,
                    fei: *fei,
                    len: ch.plen as usize - TERM_HLEN,
                };
                if ch.plen as usize == TERM_HLEN {
                    self.state = State::Common;
                    return Ok(Some(Event::Term(TermReq {
                        fes: *fes,
                        fei: *fei,
                        data: Vec::new(),
                    })));
                }
                return Ok(None);
            }
            Header::CapsuleResp { .. } => {
                self.state = State::Common;
            }
            Header::R2T { data } => {
                let e =
                    lookup(data.cid)
                        .filter(|e| !e.to_host)
                        .ok_or(ParseError::UnknownCommand {
                            pdu: "R2T",
                            cid: data.cid,
                        })?;
                check_range("R2T", data, &e)?;
                self.state = State::Common;
            }
            Header::C2HData {
                data,
                last,
                success,
            } => {
                let e =
                    lookup(data.cid)
                        .filter(|e| e.to_host)
                        .ok_or(ParseError::UnknownCommand {
                            pdu: "C2HData",
                            cid: data.cid,
                        })?;
                self.expect_data(ch.pdu_type, data, carried, &e, "C2HData")?;
                self.data_follows(data.cid, data.offset, carried, *last, *success, pad);
            }
            Header::H2CData { data, last } => {
                let e = lookup(data.cid)
                    .filter(|e| !e.to_host && e.ttag == data.ttag)
                    .ok_or(ParseError::UnknownCommand {
                        pdu: "H2CData",
                        cid: data.cid,
                    })?;
                self.expect_data(ch.pdu_type, data, carried, &e, "H2CData")?;
                self.data_follows(data.cid, data.offset, carried, *last, false, pad);
            }
            Header::CapsuleCmd { sqe } => {
                check_capsule(sqe, carried)?;
                if carried > 0 {
                    self.data_follows(sqe.cid(), 0, carried, true, false, pad);
                } else {
                    self.state = State::Common;
                }
            }
        }
        Ok(Some(Event::Header(header)))
    }

    fn expect_data(
        &self,
        t: u8,
        data: &DataHeader,
        carried: u32,
        e: &Expect,
        pdu: &'static str,
    ) -> Result<(), ParseError> {
        if data.length != carried {
            return Err(ParseError::DataLength {
                pdu_type: t,
                data_len: data.length,
                carried,
            });
        }
        check_range(pdu, data, e)
    }

    fn data_follows(
        &mut self,
        cid: u16,
        offset: u32,
        len: u32,
        last: bool,
        success: bool,
        pad: usize,
    ) {
        self.pending = Some(Pending {
            cid,
            offset,
            len,
            last,
            success,
        });
        if pad > 0 {
            self.state = State::Pad { left: pad };
        } else {
            self.start_data();
        }
    }
}

fn is_term(t: u8) -> bool {
    t == pdu_type::H2C_TERM_REQ || t == pdu_type::C2H_TERM_REQ
}

/// A data PDU or R2T stays inside its command's data, starts where the
/// previous one ended, and moves at least one byte.
fn check_range(pdu: &'static str, data: &DataHeader, e: &Expect) -> Result<(), ParseError> {
    let end = u64::from(data.offset) + u64::from(data.length);
    if data.length == 0 || end > u64::from(e.limit) {
        return Err(ParseError::OutOfRange {
            pdu,
            cid: data.cid,
            offset: data.offset,
            len: data.length,
            limit: e.limit,
        });
    }
    if data.offset != e.next {
        return Err(ParseError::OutOfOrder {
            pdu,
            cid: data.cid,
            offset: data.offset,
            expected: e.next,
        });
    }
    Ok(())
}

/// A command capsule's in-capsule data matches its SGL descriptor.
fn check_capsule(sqe: &Sqe, carried: u32) -> Result<(), ParseError> {
    let (len, kind) = sqe.sgl();
    let in_capsule = kind == crate::command::sgl::IN_CAPSULE;
    if carried > 0 && (!in_capsule || len != carried) {
        return Err(ParseError::DataLength {
            pdu_type: pdu_type::CAPSULE_CMD,
            data_len: len,
            carried,
        });
    }
    Ok(())
}
