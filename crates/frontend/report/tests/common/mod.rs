//! Fixtures shared by the tests.

// Each test crate uses its own part of this module.
#![allow(dead_code)]

use std::path::PathBuf;

use nvraid_report::{load, Input};

/// Every fixture, by file name.
pub const FIXTURES: [&str; 7] = [
    "bench-cdm.json",
    "bench-atto.json",
    "bench-sweep.json",
    "tune.json",
    "topology.json",
    "topology-plan.json",
    "topology-measure.json",
];

/// Path of the fixture `name`.
pub fn fixture_path(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name)
}

/// The fixture `name`, loaded.
pub fn fixture(name: &str) -> Input {
    load(&fixture_path(name)).unwrap_or_else(|e| panic!("{name}: {e}"))
}

/// The JSON of fixture `name`, for tests that change it.
pub fn fixture_json(name: &str) -> serde_json::Value {
    let text = std::fs::read_to_string(fixture_path(name)).expect("fixture readable");
    serde_json::from_str(&text).expect("fixture is JSON")
}

/// Every fixture, loaded, in [`FIXTURES`] order.
pub fn all_fixtures() -> Vec<Input> {
    FIXTURES.iter().map(|name| fixture(name)).collect()
}
