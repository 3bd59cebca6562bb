//! nvraid-nbd: the NBD protocol as a sans-IO codec, shared by the NBD
//! server (`nvraid serve`) and by NBD members. No sockets here: callers
//! move bytes, this crate turns them into messages and back.
//!
//! - [`consts`]: the numbers on the wire.
//! - [`option`]: handshake option requests and replies.
//! - [`server::ServerHandshake`] / [`client::ClientHandshake`]: the fixed
//!   newstyle handshake as state machines (bytes in, events and bytes out).
//! - [`transmission`]: request headers, simple and structured replies, and
//!   [`transmission::RequestRules`], the checks a request must pass.
//! - [`reply::ReplyReader`]: the client side of transmission replies
//!   (simple and structured), every wire length bounded by the request.
//! - [`error::ErrorCode`]: the one place errno becomes a wire error.
//!
//! The protocol is described in NetworkBlockDevice/nbd, doc/proto.md.

pub mod client;
pub mod consts;
pub mod error;
pub mod option;
pub mod reply;
pub mod server;
pub mod transmission;
mod wire;

pub use client::{ClientConfig, ClientEvent, ClientHandshake, ClientNegotiated};
pub use error::{ErrorCode, ProtocolError};
pub use option::{BlockSizes, InfoReply, OptionRequest};
pub use server::{ExportInfo, Negotiated, ServerConfig, ServerEvent, ServerHandshake, TlsPolicy};
pub use transmission::{Command, RequestHeader, RequestRules};
