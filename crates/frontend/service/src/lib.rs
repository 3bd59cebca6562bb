//! nvraid as a system service (issue 32): what the boot-time commands
//! share, kept out of the binary so that each piece is tested on its own.
//!
//! - [`config`]: `/etc/nvraid/nvraid.conf`, parsed line by line (a bad line
//!   refuses its array only, with its line number) and edited by
//!   `nvraid config add|remove`;
//! - [`incremental`]: the run directory (`/run/nvraid`): the members udev
//!   has reported for each array, the decision "every role is here: start
//!   the service / not yet: arm the last-resort timer", the ublk registry,
//!   and the `systemctl` call;
//! - [`launch`]: the `nvraid serve` command line `nvraid run` execs;
//! - [`mdadm`]: the marked `ARRAY <ignore>` block nvraid keeps in
//!   mdadm.conf, and the refusal of an array the kernel's md holds;
//! - [`notify`]: systemd's readiness protocol (`sd_notify`).
//!
//! A frontend crate: it uses the engine (nvraid-array's scan, the
//! superblock's UUID) and is used by the binary only.

pub mod config;
pub mod incremental;
pub mod launch;
pub mod mdadm;
pub mod notify;

pub use config::{AlertSettings, ArrayEntry, Config, ConfigError, Export};
