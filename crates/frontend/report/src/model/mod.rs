//! The typed form of each kind of result, read from its JSON with every
//! field the page uses checked.

mod bench;
mod provenance;
mod topology;
mod tune;

pub(crate) use bench::{Bench, Job, Layout};
pub(crate) use provenance::Provenance;
pub(crate) use topology::{Ceiling, Device, Measurement, Plan, Topology, Uplink};
pub(crate) use tune::{Chunk, Metric, Tune};
