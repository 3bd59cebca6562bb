//! Helpers shared by the array crate's integration tests.
#![allow(dead_code)] // each test binary uses its own subset

use nvraid_array::{assemble, create, Array, AssembleOptions, CreateOptions};
use nvraid_layout::Level;
use std::sync::Arc;

/// A small deterministic generator (xorshift64*), so failures replay.
pub struct Rng(pub u64);

impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// A new array of `members` files `m0`, `m1`... in `dir` (created, closed
/// clean); their specs by role.
pub fn new_array(
    dir: &tempfile::TempDir,
    level: Level,
    members: usize,
    chunk_bytes: u64,
    member_bytes: u64,
) -> Vec<String> {
    let specs: Vec<String> = (0..members)
        .map(|i| dir.path().join(format!("m{i}")).display().to_string())
        .collect();
    let options = CreateOptions {
        level,
        chunk_bytes,
        name: "tests".into(),
        size_bytes: Some(member_bytes),
        force: false,
        direct: true,
    };
    create(&specs, &options).unwrap().close().unwrap();
    specs
}

/// Assemble the array `specs` form, writable (degraded allowed), for
/// queues to share.
pub fn writable(specs: &[String]) -> Arc<Array> {
    let options = AssembleOptions {
        writable: true,
        allow_degraded: true,
        ..Default::default()
    };
    Arc::new(assemble(specs, options).unwrap())
}
