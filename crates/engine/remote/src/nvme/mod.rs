//! NVMe/TCP namespaces as members, through nvraid's own initiator (the
//! wire format is nvraid-nvme-tcp's).
//!
//! - [`uri`]: the member form, `nvme+tcp://HOST:PORT/SUBSYSTEM-NQN/NSID`.
//! - `setup`: a connection (TCP, ICReq/ICResp) and commands run one at a
//!   time while queues are set up.
//! - `target`: the controller (admin queue: Connect, CC.EN, CSTS.RDY,
//!   Identify, Keep Alive), I/O queue ids, new I/O queues proving the
//!   member's identity.
//! - [`channel::NvmeChannel`]: a worker's pipelined I/O queue.
//! - [`export::NvmeExport`]: the member: simple path and worker channels.

pub mod channel;
pub mod export;
mod setup;
mod target;
pub mod uri;

pub use channel::NvmeChannel;
pub use export::{NvmeExport, NvmeOpenError};
pub use setup::NvmeError;
pub use target::NvmeInfo;
pub use uri::{is_nvme_uri, NvmeUri};
