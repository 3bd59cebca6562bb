//! nvraid-remote: NBD exports and NVMe/TCP namespaces as array members,
//! through nvraid's own NBD client and NVMe/TCP initiator.
//!
//! - [`uri`]: `nbd://`, `nbds://`, `nbd+unix://` URIs.
//! - [`session`]: connecting and the handshake (TLS too), within a deadline.
//! - [`tls`]: the process's TLS client configuration (`--tls-ca`, ...).
//! - [`channel::NbdChannel`]: one worker's pipelined connection (requests
//!   sent straight from the operation's buffers, replies matched by cookie,
//!   timeouts, reconnection); it is the fast path's
//!   [`nvraid_io::remote::Channel`].
//! - [`shared`]: one connection shared by every worker, for servers
//!   without CAN_MULTI_CONN.
//! - [`export::RemoteExport`]: a member's export, its simple-path
//!   connection, and new channels for workers.
//! - [`identity::Identity`]: the member's proof of identity, checked on
//!   every new connection before any request is sent on it.
//! - [`nvme`]: NVMe/TCP namespaces as members (`nvme+tcp://`), through
//!   nvraid's own initiator.
//!
//! Wire parsing is nvraid-nbd's (`reply::ReplyReader`) and nvraid-nvme-tcp's
//! (`reader::PduReader`); this crate moves bytes.

pub mod channel;
pub mod export;
pub mod identity;
pub mod nvme;
pub mod session;
pub mod shared;
pub mod tls;
pub mod uri;

pub use channel::{NbdChannel, RemoteOptions};
pub use export::{RemoteError, RemoteExport};
pub use identity::Identity;
pub use nvme::{is_nvme_uri, NvmeExport, NvmeUri};
pub use session::{ConnectError, ExportInfo};
pub use uri::{is_nbd_uri, NbdUri};
