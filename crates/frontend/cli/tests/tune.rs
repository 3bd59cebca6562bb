//! `nvraid tune`: every refusal leaves every member as it was (a member with
//! ext4, one with an md array, bad `--chunks`, a level the members cannot
//! make, an unknown workload, members served by a running `nvraid serve`);
//! a run's JSON follows the nvraid-tune/1 contract and its recommendation
//! follows the rule of docs/tune.md from the values it reports; `--create`
//! leaves the recommended chunk; zram members work end to end.
//!
//! Runs are short (small regions, 20-40 ms steps, few chunks): these tests
//! check behaviour, not speed (bench/tune-repeat.sh measures the default).

mod common;

use common::*;
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::Command;

const K: u64 = 1024;

/// Files `names` in `dir`, `mib` MiB each, every 4 KiB block holding its
/// own number (so that a changed byte changes the hash).
fn members(dir: &Path, names: &[&str], mib: u64) -> Vec<String> {
    for name in names {
        let mut bytes = vec![0u8; (mib << 20) as usize];
        for (i, block) in bytes.chunks_mut(4096).enumerate() {
            block[..8].copy_from_slice(&(i as u64).to_le_bytes());
            block[8..8 + name.len()].copy_from_slice(name.as_bytes());
        }
        std::fs::write(dir.join(name), bytes).unwrap();
    }
    names.iter().map(|n| n.to_string()).collect()
}

/// A command line's words.
fn words(line: &str) -> Vec<&str> {
    line.split_whitespace().collect()
}

fn args<'a>(fixed: &[&'a str], members: &'a [String]) -> Vec<&'a str> {
    let mut all = fixed.to_vec();
    all.extend(members.iter().map(String::as_str));
    all
}

/// Each chunk's score, as docs/tune.md defines it, from the JSON's values.
fn scores(doc: &Value) -> Vec<(u64, f64)> {
    let keys: Vec<&str> = doc["metrics"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["key"].as_str().unwrap())
        .collect();
    let chunks = doc["chunks"].as_array().unwrap();
    let value = |c: &Value, k: &str| c["values"][k].as_f64().unwrap();
    let best: Vec<f64> = keys
        .iter()
        .map(|k| chunks.iter().map(|c| value(c, k)).fold(0.0, f64::max))
        .collect();
    chunks
        .iter()
        .map(|c| {
            let logs: f64 = keys
                .iter()
                .zip(&best)
                .map(|(k, &b)| if b > 0.0 { (value(c, k) / b).ln() } else { 0.0 })
                .sum();
            (
                c["chunk_bytes"].as_u64().unwrap(),
                (logs / keys.len() as f64).exp(),
            )
        })
        .collect()
}

/// The rule of docs/tune.md: the chunks the best score beats by less than
/// the noise threshold are tied; one alone is the recommendation, several
/// go to the one nearest to 64K in powers of two (the larger when two are
/// as near). Returns (recommended, within_noise).
fn expected(doc: &Value) -> (u64, Vec<u64>) {
    let noise = doc["noise_pct"].as_f64().unwrap();
    let scores = scores(doc);
    let best = scores.iter().map(|s| s.1).fold(f64::MIN, f64::max);
    let tied: Vec<u64> = scores
        .iter()
        .filter(|s| s.1 >= best || (best / s.1 - 1.0) * 100.0 < noise)
        .map(|s| s.0)
        .collect();
    let distance = |c: u64| (c.ilog2() as i64 - 16).unsigned_abs();
    let chosen = *tied
        .iter()
        .min_by_key(|&&c| (distance(c), std::cmp::Reverse(c)))
        .unwrap();
    let within = if tied.len() > 1 { tied } else { Vec::new() };
    (chosen, within)
}

/// Checks a document against the nvraid-tune/1 contract; returns it.
fn check_contract(out: &str, members: &[String], level: &str, chunks: &[u64]) -> Value {
    let doc: Value = serde_json::from_str(out).expect("tune --json prints JSON");
    let mut fields: Vec<&str> = doc
        .as_object()
        .unwrap()
        .keys()
        .map(|k| k.as_str())
        .collect();
    fields.sort_unstable();
    assert_eq!(
        fields,
        [
            "chunks",
            "command",
            "level",
            "machine",
            "members",
            "metrics",
            "noise_pct",
            "nvraid version",
            "recommendation",
            "schema",
            "subject",
            "workload",
        ]
    );
    assert_eq!(doc["schema"], "nvraid-tune/1");
    assert_eq!(doc["nvraid version"], env!("CARGO_PKG_VERSION"));
    assert!(doc["command"].as_str().unwrap().starts_with("nvraid tune"));
    let subject = doc["subject"].as_str().unwrap();
    assert!(subject.starts_with(level), "{subject}");
    assert!(
        members.iter().all(|m| subject.contains(m.as_str())),
        "{subject}"
    );
    assert!(doc["machine"]["nproc"].as_u64().unwrap() >= 1);
    assert_eq!(doc["level"], level);
    let listed: Vec<&str> = doc["members"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m.as_str().unwrap())
        .collect();
    assert_eq!(listed, members);
    assert!(doc["noise_pct"].is_number());
    let metrics = doc["metrics"].as_array().unwrap();
    assert!(!metrics.is_empty());
    for metric in metrics {
        assert_eq!(metric.as_object().unwrap().len(), 2, "{metric}");
        let unit = metric["unit"].as_str().unwrap();
        assert!(unit == "IOPS" || unit == "MB/s", "{metric}");
        let key = metric["key"].as_str().unwrap();
        assert_eq!(unit == "IOPS", key.starts_with("RND"), "{metric}");
    }
    let entries = doc["chunks"].as_array().unwrap();
    let tried: Vec<u64> = entries
        .iter()
        .map(|c| c["chunk_bytes"].as_u64().unwrap())
        .collect();
    assert_eq!(tried, chunks);
    for entry in entries {
        assert_eq!(
            entry.as_object().unwrap().len(),
            3,
            "chunk_bytes, values, bench"
        );
        let values = entry["values"].as_object().unwrap();
        assert_eq!(values.len(), metrics.len());
        for metric in metrics {
            let value = values[metric["key"].as_str().unwrap()].as_f64().unwrap();
            assert!(value > 0.0, "{metric}: {value}");
        }
        let bench = &entry["bench"];
        assert_eq!(bench["schema"], "nvraid-bench/1");
        assert!(bench["subject"].as_str().unwrap().contains("chunk"));
        assert!(bench["machine"].is_object() && bench["command"].is_string());
        assert_eq!(
            bench["jobs"].as_array().unwrap().len(),
            metrics.len(),
            "one bench job per metric"
        );
    }
    let recommendation = doc["recommendation"].as_object().unwrap();
    assert_eq!(recommendation.len(), 3);
    assert!(!doc["recommendation"]["reason"].as_str().unwrap().is_empty());
    let (chosen, within) = expected(&doc);
    assert_eq!(
        doc["recommendation"]["chunk_bytes"].as_u64().unwrap(),
        chosen,
        "the rule, recomputed from the values, picks another chunk: {doc:#}"
    );
    let listed: Vec<u64> = doc["recommendation"]["within_noise"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c.as_u64().unwrap())
        .collect();
    assert_eq!(listed, within);
    doc
}

/// The array the members form now: (name, chunk bytes).
fn array_on(dir: &Path, members: &[String]) -> (String, u64) {
    let detail: Value =
        serde_json::from_str(&ok(&args(&["detail", "--json"], members), dir)).unwrap();
    (
        detail["name"].as_str().unwrap().to_string(),
        detail["chunk_bytes"].as_u64().unwrap(),
    )
}

/// Bad input, data without --destructive: refused by name, no byte changed.
#[test]
fn refusals_change_no_byte() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let names = members(d, &["m0", "m1", "m2", "m3"], 24);
    // m0: ext4; m1 and m2: an md array.
    let status = Command::new(tool("mkfs.ext4"))
        .args(["-q", "-F"])
        .arg(d.join("m0"))
        .status()
        .unwrap();
    assert!(status.success());
    ok(&["create", "--level", "1", "m1", "m2"], d);

    let no_flag = ["tune", "--level", "0", "--chunks", "64k"];
    refused(
        &args(&no_flag, &names),
        d,
        &[
            "m0 holds an ext2/3/4 filesystem",
            "m1 holds an md v1.2 superblock",
            "m3 holds data nvraid does not recognise",
            "--destructive",
        ],
    );
    for (fixed, needle) in [
        (
            &["--chunks", "48k"][..],
            "--chunks: 48k (49152 bytes) is not a power of two",
        ),
        (&["--chunks", "64k,8M"][..], "--chunks: 8M is outside 4K-4M"),
        (&["--chunks", "2k"][..], "--chunks: 2k is outside 4K-4M"),
        (&["--chunks", "fast"][..], "--chunks: cannot read \"fast\""),
        (
            &["--workload", "crystal"][..],
            "--workload \"crystal\": not a workload",
        ),
        (&["--workload", "rw=sideways"][..], "rw=sideways"),
        (
            &["--workload", "rw=read,colour=red"][..],
            "unknown job option \"colour\"",
        ),
        (&["--workload", "rw=read,bs=3000"][..], "--bs 3000"),
        (&["--noise", "inf"][..], "--noise inf: a percentage"),
    ] {
        let mut all = vec!["tune", "--level", "0", "--destructive"];
        all.extend_from_slice(fixed);
        all.extend(names.iter().map(String::as_str));
        refused(&all, d, &[needle]);
    }
    // Levels the four members cannot make, and raid1 (no chunk).
    refused(
        &args(&["tune", "--level", "6", "--destructive"], &names[..3]),
        d,
        &["--level 6 over 3 member(s)", "at least 4 members"],
    );
    refused(
        &args(&["tune", "--level", "1", "--destructive"], &names),
        d,
        &["raid1 has no chunk"],
    );
    refused(
        &args(&["tune", "--level", "7", "--destructive"], &names),
        d,
        &["unsupported level"],
    );
    // A member missing.
    refused(
        &["tune", "--level", "0", "--destructive", "m0", "m1", "nope"],
        d,
        &["nope: does not exist"],
    );
}

/// Members a running `nvraid serve` has claimed: refused with the holder,
/// before any byte of any member moves.
#[test]
fn members_in_use_by_serve_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let served = members(d, &["s0", "s1"], 24);
    let all = members(d, &["f0", "f1"], 24)
        .into_iter()
        .chain(served.iter().cloned())
        .collect::<Vec<_>>();
    ok(&args(&["create", "--level", "1"], &served), d);
    let mut server = serve(d, &served);
    let hashes = |paths: &[String]| -> Vec<String> {
        paths
            .iter()
            .map(|p| sha(&std::fs::read(d.join(p)).unwrap()))
            .collect()
    };
    let before = hashes(&all);
    let out = nvraid(
        &args(
            &["tune", "--level", "0", "--chunks", "64k", "--destructive"],
            &all,
        ),
        d,
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("s0: in use by")
            && stderr.contains(&format!("pid {}", server.id()))
            && stderr.contains("nvraid serve"),
        "{stderr}"
    );
    said_once(&stderr);
    assert_eq!(hashes(&all), before, "a refused tune changed a member");
    Command::new("kill")
        .arg("-INT")
        .arg(server.id().to_string())
        .status()
        .unwrap();
    assert!(server.wait().unwrap().success());
}

/// A run over files: the JSON follows the contract and the rule, the
/// members end as the last throwaway array, and `--create` leaves the
/// recommended chunk; the text table shows the recommendation, its reason
/// and a tie when there is one.
#[test]
fn a_run_follows_the_rule_and_creates_the_array() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let names = members(d, &["f0", "f1", "f2", "f3"], 24);

    // The default workload, 3 chunks, 2 rounds of 20 ms steps.
    let out = ok(
        &args(
            &words(
                "tune --level 0 --chunks 16k,64k,256k --rounds 2 --runtime 20ms --ramp 0 \
                 --size 16M --destructive --json",
            ),
            &names,
        ),
        d,
    );
    let doc = check_contract(&out, &names, "raid0", &[16 * K, 64 * K, 256 * K]);
    assert_eq!(doc["workload"], "default");
    assert_eq!(doc["noise_pct"].as_f64(), Some(10.0));
    assert_eq!(doc["metrics"].as_array().unwrap().len(), 16);
    assert_eq!(doc["metrics"][2]["key"], "RND4K Q32T1 read");
    assert_eq!(doc["metrics"][2]["unit"], "IOPS");
    assert_eq!(doc["metrics"][0]["key"], "SEQ1M Q8T1 read");
    assert_eq!(doc["metrics"][0]["unit"], "MB/s");
    let job = &doc["chunks"][0]["bench"]["jobs"][0];
    assert_eq!(job["nvraid"]["runs"], 2, "each value is the best of 2 runs");
    assert_eq!(job["job options"]["size"], "16M");
    // Round 2 went down the list: the last array measured was 16K's.
    assert_eq!(array_on(d, &names), ("tune".to_string(), 16 * K));

    // One job, RAID 10, a tie forced with --noise 1000 (the best would have to
    // score 11 times the other), then --create.
    let out = ok(
        &args(
            &words(
                "tune --level 10 --chunks 8k,1m --workload rw=randread,bs=4k,iodepth=8 \
                 --rounds 1 --runtime 30ms --ramp 0 --size 8M --noise 1000 \
                 --destructive --create --name tuned",
            ),
            &names,
        ),
        d,
    );
    assert!(
        out.contains("workload rw=randread,bs=4k,iodepth=8,numjobs=1"),
        "{out}"
    );
    let header = out.lines().nth(1).unwrap();
    assert!(
        header.starts_with("metric") && header.contains("8K") && header.contains("1M"),
        "{out}"
    );
    let row: Vec<&str> = out
        .lines()
        .find(|l| l.starts_with("RND4K Q8T1 read"))
        .unwrap_or_else(|| panic!("no metric row: {out}"))
        .split_whitespace()
        .collect();
    assert_eq!(
        row.len(),
        6,
        "label (3 words), unit, a value per chunk: {out}"
    );
    assert_eq!(row[3], "IOPS");
    // The best of the row is starred (every value equal to it, when two
    // chunks measure exactly the same).
    let values: Vec<f64> = row[4..]
        .iter()
        .map(|v| v.trim_end_matches('*').parse().unwrap())
        .collect();
    let best = values.iter().copied().fold(f64::MIN, f64::max);
    for (value, text) in values.iter().zip(&row[4..]) {
        assert_eq!(
            text.ends_with('*'),
            *value == best,
            "the best of the row is starred: {out}"
        );
    }
    assert!(out.contains("\nRecommended chunk: 8K\n"), "{out}");
    assert!(
        out.contains("\nReason: 8K and 1M are within noise (")
            && out.contains("so 8K, the nearest to nvraid's default (64K), is chosen"),
        "{out}"
    );
    assert!(out.contains("\nWithin noise: 8K, 1M\n"), "{out}");
    assert_eq!(array_on(d, &names), ("tuned".to_string(), 8 * K));

    // In-memory members need no --destructive.
    let out = ok(
        &words(
            "tune --level 5 --chunks 4k,64k --workload rw=write,bs=64k --rounds 1 \
             --runtime 20ms --ramp 0 --size 4M --json mem:16M mem:16M mem:16M",
        ),
        d,
    );
    let mem: Vec<String> = vec!["mem:16M".into(); 3];
    check_contract(&out, &mem, "raid5", &[4 * K, 64 * K]);
}

/// zram devices made for this test (`zramctl --find`), reset when dropped.
struct Zram(Vec<PathBuf>);

impl Drop for Zram {
    fn drop(&mut self) {
        for dev in &self.0 {
            let _ = Command::new("zramctl").arg("--reset").arg(dev).status();
        }
    }
}

fn root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
}

/// Block devices: four zram members; a refusal without --destructive
/// changes none of their bytes; a RAID 5 run follows the contract.
#[test]
fn zram_members() {
    if !root() {
        eprintln!("zram_members: skipped, zram devices need root");
        return;
    }
    let _ = Command::new("modprobe")
        .arg("zram")
        .stderr(std::process::Stdio::null())
        .status();
    let zramctl = tool("zramctl");
    let mut devices = Zram(Vec::new());
    for _ in 0..4 {
        let out = Command::new(&zramctl)
            .args(["--find", "--size", "48M"])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "zramctl --find: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        devices
            .0
            .push(PathBuf::from(String::from_utf8(out.stdout).unwrap().trim()));
    }
    let names: Vec<String> = devices.0.iter().map(|p| p.display().to_string()).collect();
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    // Something on the first member to refuse.
    ok(&args(&["create", "--level", "1"], &names[..2]), d);
    let hashes = || -> Vec<String> {
        names
            .iter()
            .map(|p| sha(&std::fs::read(p).unwrap()))
            .collect()
    };
    let before = hashes();
    let stderr = refusal(&args(&["tune", "--level", "5"], &names), d);
    assert!(
        stderr.contains(&format!("{} holds an md v1.2 superblock", names[0]))
            && stderr.contains("--destructive"),
        "{stderr}"
    );
    assert_eq!(hashes(), before, "a refused tune changed a zram member");

    let out = ok(
        &args(
            &words(
                "tune --level 5 --chunks 16k,128k --rounds 1 --runtime 20ms --ramp 0 \
                 --size 32M --destructive --json",
            ),
            &names,
        ),
        d,
    );
    check_contract(&out, &names, "raid5", &[16 * K, 128 * K]);
    assert_eq!(array_on(d, &names), ("tune".to_string(), 128 * K));
}
