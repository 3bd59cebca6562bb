//! Power loss, not just a killed process: `nvraid write` runs inside the
//! kernel VM (tools/mdvm) on a RAID 1 of two virtio disks (cache=none), one
//! 1 MiB write after another, each acknowledged on the VM's console once the
//! command has returned (its data flushed). The VM is killed part-way, with
//! its page cache and queues. On the host, every acknowledged write must be
//! in the array; `repair` then leaves every copy equal and the array clean.

mod common;

use common::*;
use std::process::Command;

const CHUNK: usize = 1 << 20;

/// The bytes the script writes as chunk `chunk` with seed `seed`: what
/// `pattern write -s SEED -n 1M` puts in a file (4 KiB block j holds the
/// little-endian u64 `j ^ seed`, repeated).
fn chunk_data(seed: u64) -> Vec<u8> {
    let mut out = vec![0u8; CHUNK];
    for (j, block) in out.chunks_mut(4096).enumerate() {
        let value = (j as u64 ^ seed).to_le_bytes();
        for word in block.chunks_mut(8) {
            word.copy_from_slice(&value);
        }
    }
    out
}

#[test]
fn acknowledged_writes_survive_a_power_loss() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    ok(
        &["create", "--level", "1", "--size", "48M", "a.img", "b.img"],
        d,
    );
    // nvraid and the one library the VM lacks (it carries libc for mdadm).
    let inside = d.join("in");
    std::fs::create_dir(&inside).unwrap();
    std::fs::copy(env!("CARGO_BIN_EXE_nvraid"), inside.join("nvraid")).unwrap();
    let ldd = Command::new("ldd")
        .arg(env!("CARGO_BIN_EXE_nvraid"))
        .output()
        .unwrap();
    for line in String::from_utf8_lossy(&ldd.stdout).lines() {
        if let Some(path) = line
            .split("=>")
            .nth(1)
            .and_then(|r| r.split_whitespace().next())
        {
            if path.contains("libgcc_s") {
                std::fs::copy(path, inside.join("libgcc_s.so.1")).unwrap();
            }
        }
    }
    let script = d.join("writes.sh");
    std::fs::write(
        &script,
        r#"set -e
export LD_LIBRARY_PATH=$MDVM_IN
set -- $MDVM_DISKS
dd if=/dev/zero of=/tmp/chunk bs=1048576 count=1 2> /dev/null
i=0
while true; do
	chunk=$((i % 44))
	seed=$((1000 + i))
	pattern write -s $seed -n 1048576 /tmp/chunk > /dev/null
	$MDVM_IN/nvraid write --offset ${chunk}M --input /tmp/chunk $1 $2 2> /dev/null
	echo "ACK $chunk $seed $i"
	i=$((i + 1))
done
"#,
    )
    .unwrap();
    let out = Command::new(repo().join("tools/mdvm/mdvm"))
        .args(["--cache", "none", "--timeout", "25", "--indir"])
        .arg(&inside)
        .arg("--script")
        .arg(&script)
        .arg(d.join("a.img"))
        .arg(d.join("b.img"))
        .output()
        .expect("tools/mdvm (./test.sh installs its tools)");
    let console = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        out.status.code(),
        Some(124),
        "the VM should have been cut off by its timeout:\n{console}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // The last acknowledged write of each chunk must be there, except in
    // the chunk the write after the last acknowledged one was writing when
    // the power went (it may hold some of each).
    let mut last: std::collections::BTreeMap<usize, u64> = Default::default();
    let mut count = 0u64;
    for line in console.lines() {
        let mut words = line.split_whitespace();
        if words.next() != Some("ACK") {
            continue;
        }
        let chunk: usize = words.next().unwrap().parse().unwrap();
        let seed: u64 = words.next().unwrap().parse().unwrap();
        last.insert(chunk, seed);
        count += 1;
    }
    assert!(
        count >= 2,
        "too few writes before the power went: {console}"
    );
    eprintln!("{count} writes acknowledged before the power went");
    last.remove(&((count % 44) as usize));
    let acked: Vec<(usize, u64)> = last.into_iter().collect();
    for (chunk, seed) in &acked {
        let offset = format!("{}M", chunk);
        let got = ok_bytes(
            &[
                "read", "--offset", &offset, "--length", "1M", "a.img", "b.img",
            ],
            d,
        );
        assert!(
            got == chunk_data(*seed),
            "acknowledged chunk {chunk} (seed {seed}) lost in the power loss; console:\n{console}"
        );
    }
    // Whatever was in flight, the copies are reconciled and the array clean.
    ok(&["repair", "a.img", "b.img"], d);
    assert_eq!(
        nvraid(&["check", "a.img", "b.img"], d).status.code(),
        Some(0)
    );
    let detail: serde_json::Value =
        serde_json::from_str(&ok(&["detail", "--json", "a.img", "b.img"], d)).unwrap();
    assert_eq!(detail["state"], "clean", "{detail}");
    for (chunk, seed) in &acked {
        let offset = format!("{}M", chunk);
        let got = ok_bytes(&["read", "--offset", &offset, "--length", "1M", "b.img"], d);
        assert!(
            got == chunk_data(*seed),
            "chunk {chunk} after repair, second copy"
        );
    }
}
