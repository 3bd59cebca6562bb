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

/// A directory the VM sees as $MDVM_IN: nvraid and `tools` (host
/// binaries), with the libraries they need.
fn inside_dir(d: &std::path::Path, tools: &[&str]) -> std::path::PathBuf {
    let mut binaries = vec![std::path::PathBuf::from(env!("CARGO_BIN_EXE_nvraid"))];
    binaries.extend(tools.iter().map(|t| std::path::PathBuf::from(tool(t))));
    nvraid_testing::vm::ship(d, &binaries)
}

#[test]
fn acknowledged_writes_survive_a_power_loss() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    ok(
        &["create", "--level", "1", "--size", "48M", "a.img", "b.img"],
        d,
    );
    let inside = inside_dir(d, &[]);
    let out = cut_power_while_writing(
        d,
        &inside,
        "",
        "$MDVM_IN/nvraid write --offset ${chunk}M --input /tmp/chunk $1 $2 2> /dev/null",
        25,
    );
    verify_power_loss(d, &out, &["a.img", "b.img"]);
}

/// Power loss under `nvraid serve`: inside the VM the server exports a RAID
/// 1 of two virtio disks (cache=none), the kernel's own NBD client
/// (nbd-client, /dev/nbd0) writes 1 MiB chunks with O_DIRECT and fsync (a
/// FLUSH after the write), and each is acknowledged once dd returns. The VM
/// is killed part-way; on the host every acknowledged chunk is there.
#[test]
fn acknowledged_nbd_writes_through_serve_survive_a_power_loss() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    ok(
        &["create", "--level", "1", "--size", "48M", "a.img", "b.img"],
        d,
    );
    let inside = inside_dir(d, &["nbd-client"]);
    let out = cut_power_while_writing(
        d,
        &inside,
        r#"$MDVM_IN/nvraid serve --listen unix:/tmp/md.sock $1 $2 2> /tmp/serve.log &
n=0
while [ ! -S /tmp/md.ctl ]; do
	n=$((n + 1)); [ $n -lt 200 ] || { cat /tmp/serve.log; exit 1; }
	sleep 0.1
done
$MDVM_IN/nbd-client -L -b 4096 -u /tmp/md.sock /dev/nbd0 > /dev/null 2>&1 || { echo "nbd-client failed"; cat /tmp/serve.log; exit 1; }
echo "CONNECTED $(cat /sys/block/nbd0/size) sectors""#,
        "dd if=/tmp/chunk of=/dev/nbd0 bs=1048576 seek=$chunk count=1 oflag=direct conv=fsync,notrunc 2> /dev/null",
        30,
    );
    let console = String::from_utf8_lossy(&out.stdout);
    assert!(
        console.contains("CONNECTED"),
        "the NBD client did not connect: {console}"
    );
    verify_power_loss(d, &out, &["a.img", "b.img"]);
}

/// Run, in the kernel VM (virtio disks `a.img`, `b.img` with cache=none,
/// `inside` as $MDVM_IN), `setup` and then an endless loop that fills
/// /tmp/chunk with `pattern write -s SEED` and runs `write` (with
/// `$chunk` = the chunk number, 1 MiB each, 44 of them), printing `ACK
/// chunk seed i` after each; the VM is killed by its timeout of
/// `timeout_s` seconds, part-way through some write.
fn cut_power_while_writing(
    d: &std::path::Path,
    inside: &std::path::Path,
    setup: &str,
    write: &str,
    timeout_s: u32,
) -> std::process::Output {
    let script = d.join("writes.sh");
    std::fs::write(
        &script,
        format!(
            r#"set -e
export LD_LIBRARY_PATH=$MDVM_IN
set -- $MDVM_DISKS
{setup}
dd if=/dev/zero of=/tmp/chunk bs=1048576 count=1 2> /dev/null
i=0
while true; do
	chunk=$((i % 44))
	seed=$((1000 + i))
	pattern write -s $seed -n 1048576 /tmp/chunk > /dev/null
	{write}
	echo "ACK $chunk $seed $i"
	i=$((i + 1))
done
"#
        ),
    )
    .unwrap();
    Command::new(repo().join("tools/mdvm/mdvm"))
        .args([
            "--cache",
            "none",
            "--timeout",
            &timeout_s.to_string(),
            "--indir",
        ])
        .arg(inside)
        .arg("--script")
        .arg(&script)
        .arg(d.join("a.img"))
        .arg(d.join("b.img"))
        .output()
        .expect("tools/mdvm (./test.sh installs its tools)")
}

/// After the VM was cut off: every chunk acknowledged on its console
/// (`ACK chunk seed i`) is in the array `members` (but the one being
/// written when the power went), and `repair` leaves it clean with equal
/// copies that still hold them.
fn verify_power_loss(d: &std::path::Path, out: &std::process::Output, members: &[&str]) {
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
                "read", "--offset", &offset, "--length", "1M", members[0], members[1],
            ],
            d,
        );
        assert!(
            got == chunk_data(*seed),
            "acknowledged chunk {chunk} (seed {seed}) lost in the power loss; console:\n{console}"
        );
    }
    // Whatever was in flight, the copies are reconciled and the array clean.
    ok(&["repair", members[0], members[1]], d);
    assert_eq!(
        nvraid(&["check", members[0], members[1]], d).status.code(),
        Some(0)
    );
    let detail: serde_json::Value =
        serde_json::from_str(&ok(&["detail", "--json", members[0], members[1]], d)).unwrap();
    assert_eq!(detail["state"], "clean", "{detail}");
    for (chunk, seed) in &acked {
        let offset = format!("{}M", chunk);
        let got = ok_bytes(
            &["read", "--offset", &offset, "--length", "1M", members[1]],
            d,
        );
        assert!(
            got == chunk_data(*seed),
            "chunk {chunk} after repair, second copy"
        );
    }
}
