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
        bitmap: nvraid_array::BitmapChoice::Auto,
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

/// Let the real kernel md (tools/mdvm/mdvm-check, in a VM) assemble and
/// read `images`, with mdvm-check's `options`; fails the test unless it
/// succeeds. Returns its output.
pub fn kernel_check(images: &[String], options: &[&str]) -> String {
    let check =
        std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../../tools/mdvm/mdvm-check");
    let out = std::process::Command::new(&check)
        .args(options)
        .arg("--")
        .args(images)
        .output()
        .unwrap_or_else(|e| panic!("{}: {e}", check.display()));
    let text = format!(
        "{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.status.success(),
        "the kernel did not assemble and read the arrays (install the VM's tools with ./test.sh):\n{text}"
    );
    text
}

/// The bytes block `b` holds after its `version`-th write (the live
/// reshape tests' clients).
pub fn pattern(b: u64, version: u64, out: &mut [u8]) {
    let mut x =
        b.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ version.wrapping_mul(0xd6e8_feb8_6659_fd93) | 1;
    for word in out.chunks_mut(8) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        word.copy_from_slice(&x.to_le_bytes()[..word.len()]);
    }
}

/// Submit one operation on `queue` and wait for it to complete whole.
pub fn one(
    queue: &mut Box<dyn nvraid_io::queue::Queue>,
    op: nvraid_io::queue::OpKind,
    offset: u64,
    len: u32,
) {
    queue.submit(0, op, offset, len, false).unwrap();
    let mut result = None;
    while result.is_none() {
        queue.reap(1, &mut |c| result = Some(c.result)).unwrap();
    }
    assert_eq!(result.unwrap(), Ok(len), "{op:?} at {offset}+{len}");
}

/// Clients, each on its own fast-path queue owning every `threads`-th 4
/// KiB block, read their blocks back (checked against the last version
/// written) and, one op in `write_every` (none: reads only), write a new
/// version, until `running` clears (200 ops at least); each returns its
/// blocks' last versions (0: the fill). `seed` varies the choices,
/// `during` names the work for a failed check.
pub fn clients_during(
    array: &Arc<Array>,
    threads: u64,
    write_every: Option<u64>,
    seed: u64,
    during: &'static str,
    running: &Arc<std::sync::atomic::AtomicBool>,
) -> Vec<std::thread::JoinHandle<Vec<(u64, u64)>>> {
    use nvraid_io::queue::{OpKind, Target};
    use std::sync::atomic::Ordering;
    const BLOCK: u64 = 4096;
    let blocks = array.size_bytes() / BLOCK;
    (0..threads)
        .map(|t| {
            let array = array.clone();
            let running = running.clone();
            std::thread::spawn(move || {
                let target =
                    nvraid_array::FanoutTarget::array(array, nvraid_io::engine::EngineKind::Psync);
                let mut queue = target.open_queue(1, 64 << 10).unwrap();
                let mut rng = Rng(seed + t);
                let mut versions = std::collections::HashMap::new();
                let mut want = vec![0u8; BLOCK as usize];
                let mut ops = 0u64;
                while running.load(Ordering::Acquire) || ops < 200 {
                    ops += 1;
                    let b = rng.below(blocks / threads) * threads + t;
                    if write_every.is_some_and(|n| rng.below(n) == 0) {
                        let v = versions.get(&b).copied().unwrap_or(0) + 1;
                        pattern(b, v, queue.buffer_mut(0)[..BLOCK as usize].as_mut());
                        one(&mut queue, OpKind::Write, b * BLOCK, BLOCK as u32);
                        versions.insert(b, v);
                    } else {
                        one(&mut queue, OpKind::Read, b * BLOCK, BLOCK as u32);
                        pattern(b, versions.get(&b).copied().unwrap_or(0), &mut want);
                        assert!(
                            queue.buffer(0)[..BLOCK as usize] == want[..],
                            "block {b} read back wrong during the {during}"
                        );
                    }
                }
                versions.into_iter().collect()
            })
        })
        .collect()
}

/// Delete the member files of roles `lost`; the specs of the others.
pub fn lose(specs: &[String], lost: &[usize]) -> Vec<String> {
    for &role in lost {
        std::fs::remove_file(&specs[role]).unwrap();
    }
    (0..specs.len())
        .filter(|r| !lost.contains(r))
        .map(|r| specs[r].clone())
        .collect()
}

/// A new, empty member file of `bytes` at `spec`, open for writing.
pub fn fresh_member(spec: &str, bytes: u64) -> nvraid_member::Member {
    nvraid_member::Member::open(
        spec,
        nvraid_member::OpenOptions {
            write: true,
            create_bytes: Some(bytes),
            direct: true,
            ..Default::default()
        },
    )
    .unwrap()
}

/// Read the whole array from `kept` and compare it with `model`.
pub fn reads_as(kept: &[String], model: &[u8], what: &str) {
    let array = writable(kept);
    let mut back = vec![0u8; model.len()];
    array.read_at(&mut back, 0).unwrap();
    assert!(back == model, "{what}");
}
