//! nvraid-tune: the chunk-size search behind `nvraid tune`.
//!
//! For each chunk size tried, tune creates a throwaway array on the members
//! (destroying what they held), writes random data over the region the
//! workload uses (so reads read data, not holes), runs the workload with
//! nvraid-bench and closes the array. Then it scores every chunk on every
//! metric, recommends one (with the reason, and saying when the
//! measurements cannot tell the best ones apart); the binary's `--create`
//! then makes the real array with it ([`Plan::create_array`]).
//!
//! - [`candidates`]: the chunk sizes tried (`--chunks`) and the order each
//!   round visits them in;
//! - [`workload`]: what runs on each array (`--workload`);
//! - [`plan`]: [`Plan::new`], every check that can refuse the run, made
//!   before the first byte moves: the chunk list, the level against the
//!   member count, the workload's jobs against the array they will run on,
//!   members claimed by another nvraid writer, and members holding data
//!   without `--destructive`;
//! - [`measure`]: [`Plan::measure`], the rounds over the chunks through
//!   nvraid-bench (best of the rounds), telling an [`Observer`] what it
//!   does;
//! - [`score`]: the metrics, the scores and the recommendation (the rule
//!   of docs/tune.md is [`recommend`]);
//! - [`report`]: the table and the JSON (`nvraid-tune/1`).
//!
//! The library prints nothing: it returns data, writes its reports to the
//! writer it is given, and tells an [`Observer`] (the binary's live line)
//! how far a run is. docs/tune.md is the user's guide.

pub mod candidates;
mod error;
pub mod measure;
pub mod plan;
pub mod report;
pub mod score;
pub mod workload;

pub use error::Error;
pub use measure::{Observer, Outcome, Position, Stage};
pub use plan::{Plan, Request};
pub use score::ChunkRun;
pub use score::{recommend, scores, Metric, Recommendation, Unit};
pub use workload::Workload;
