//! nvraid-nvme-tcp: NVMe over TCP as a sans-IO codec, used by nvraid's
//! NVMe/TCP members (and, later, by its NVMe/TCP export). No sockets here:
//! callers move bytes, this crate turns them into messages and back, and
//! every length it takes from the wire is bounded before it is used.
//!
//! - [`pdu`]: the transport's PDUs (common header, ICReq/ICResp,
//!   CapsuleCmd/CapsuleResp, H2CData, C2HData, R2T, the two TermReqs) and
//!   their encoders; header and data digests (CRC32C).
//! - [`reader::PduReader`]: the receiving side as a state machine; data
//!   PDUs are checked against the commands in flight before their payload
//!   is moved, so a caller can read it straight into its buffers.
//! - [`command`]: the 64-byte submission queue entry, the 16-byte
//!   completion entry and its status, Fabrics commands (Connect and its
//!   1 KiB data, Property Get/Set), admin commands (Identify, Keep Alive)
//!   and I/O commands (Read, Write, Flush, Write Zeroes, Dataset
//!   Management).
//! - [`identify`]: the fields of Identify Controller and Identify
//!   Namespace nvraid needs.
//! - [`error::ParseError`]: why bytes from the peer were refused.
//!
//! Formats: the NVMe Base, NVMe over Fabrics and NVMe/TCP transport
//! specifications.

mod bytes;
pub mod command;
pub mod error;
pub mod identify;
pub mod pdu;
pub mod reader;

pub use error::ParseError;
