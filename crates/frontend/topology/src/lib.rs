//! PCIe/sysfs topology walker, bandwidth model and advice: the library behind
//! `nvraid topology`.
//!
//! * [`scan`] walks a sysfs tree into a [`Topology`]: every block device, its path to the PCIe
//!   root port, link speeds and widths, NUMA node, queues, block sizes, model, and whether it
//!   sits behind the chipset; devices are grouped by the uplink they share.
//! * [`model`] holds the bandwidth model (pure functions).
//! * [`plan()`] computes the ceiling of a proposed array and what limits it; [`advice`] turns
//!   both into plain words.
//! * [`network`] finds the network link of an NBD member (route, tc shaper, link speed).
//! * [`measure`] runs a short read-only benchmark; [`cli`] is the command.
//!
//! docs/topology.md describes the model, its sources and validation, and the JSON schema.

#![forbid(unsafe_code)]

pub mod advice;
pub mod cli;
pub mod error;
pub mod fixture;
pub mod measure;
pub mod model;
pub mod network;
pub mod pci_ids;
pub mod plan;
pub mod report;
pub mod scan;
mod sysfs;

pub use error::Error;
pub use measure::{Bottleneck, DirectReadMeasurer, Measured, Measurer};
pub use plan::{level_label, plan, plan_members, Level, Limit, MemberInput, Plan};
pub use report::Report;
pub use scan::{scan, Attachment, BlockDevice, Topology, UplinkGroup};
