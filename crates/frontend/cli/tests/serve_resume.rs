//! `nvraid serve` going on with reshapes the kernel's md (or nvraid)
//! left part-way that it once refused: the kernel's RAID 10 near grows
//! served and finished while clients read, then assembled by the
//! kernel's md in tools/mdvm with every byte in place and no mismatch.

mod common;

use common::reshape::*;
use common::*;
use std::path::{Path, PathBuf};
use std::process::Command;

/// The whole served array through NBD (`nbdcopy`).
fn served_bytes(d: &Path) -> Vec<u8> {
    let got = Command::new(tool("nbdcopy"))
        .arg(format!(
            "nbd+unix:///?socket={}",
            d.join("md.sock").display()
        ))
        .arg("-")
        .output()
        .unwrap();
    assert!(
        got.status.success(),
        "{}",
        String::from_utf8_lossy(&got.stderr)
    );
    got.stdout
}

/// Serve the kernel's `state` (a RAID 10 near growing, stopped cleanly
/// at `position`) in `d`: the grow goes on from the kernel's position
/// while the old shape's 30 MiB read back as the pattern, and finishes;
/// the array assembled afterwards is `raid_disks` members of `size`
/// bytes, the pattern then zeros, the copies agreeing. Its images.
fn serve_finishes_the_kernels_raid10_grow(
    d: &Path,
    state: &str,
    position: u64,
    raid_disks: u64,
    size: u64,
) -> Vec<PathBuf> {
    let m = md_state(state, d);
    let server = serve_with(d, &m, &["--reshape-speed", "1"]);
    let log = serve_log(d);
    assert!(
        log.contains(&format!(
            "event=reshape-resumed position={position} raid_disks=4->{raid_disks}"
        )),
        "{log}"
    );
    let s = status(d);
    assert_eq!(s["array"]["size_bytes"], 30 << 20, "{s}");
    let got = served_bytes(d);
    assert_eq!(
        status(d)["array"]["reshape"]["state"],
        "running",
        "the grow ended before the read"
    );
    assert!(
        got == pattern(30 << 20),
        "{state}: a byte read wrong mid-grow"
    );
    let s = wait_reshape_finished(d);
    assert_eq!(s["array"]["reshape"]["raid_disks"], raid_disks, "{s}");
    server.interrupt();
    let grown = detail(d, &m);
    assert_eq!(grown["state"], "clean", "{grown}");
    assert_eq!(grown["raid_disks"], raid_disks, "{grown}");
    assert_eq!(grown["size_bytes"], size, "{grown}");
    assert_eq!(grown["data_offset_bytes"], 1920 * 512, "{grown}");
    let all = ok_bytes(&with(&["read"], &m), d);
    assert_eq!(all.len() as u64, size);
    assert!(all[..30 << 20] == pattern(30 << 20)[..], "{state}");
    assert!(
        all[30 << 20..].iter().all(|&b| b == 0),
        "{state}: new space"
    );
    assert_checks_clean(d, &m, state);
    m.iter().map(|name| d.join(name)).collect()
}

#[test]
fn serve_goes_on_with_the_kernels_raid10_grows_and_md_assembles_the_result() {
    // The kernel's RAID 10 near=2 of 4 growing to 5 (no bitmap, stopped
    // at 448 KiB) and to 6 (md's bitmap resized to 8 KiB chunks, stopped
    // at 384 KiB), both stopped cleanly: `serve` refused them, naming
    // `grow --continue`. Now each is served in its old shape while the
    // grow goes on to its end, every byte read back through NBD; the
    // kernel's md then assembles both results (one VM boot), reads the
    // pattern and its check finds no mismatch.
    let dir = tempfile::tempdir().unwrap();
    let (five, six) = (dir.path().join("five"), dir.path().join("six"));
    std::fs::create_dir(&five).unwrap();
    std::fs::create_dir(&six).unwrap();
    let mut images =
        serve_finishes_the_kernels_raid10_grow(&five, "reshape", 448 << 10, 5, 75 << 19);
    images.extend(serve_finishes_the_kernels_raid10_grow(
        &six,
        "reshape_r10_bitmap",
        384 << 10,
        6,
        45 << 20,
    ));
    assert_eq!(
        detail(&six, &md_state_names(&six))["bitmap"]["chunk_bytes"],
        8192
    );
    let report = kernel_finishes(&images, 30 << 20);
    let lines: Vec<&str> = report
        .lines()
        .filter(|l| l.starts_with("KERNEL "))
        .collect();
    assert_eq!(lines.len(), 2, "{report}");
    for (disks, size) in [(5, 75u64 << 19), (6, 45 << 20)] {
        let line = lines
            .iter()
            .find(|l| l.contains(&format!("disks={disks} ")))
            .unwrap_or_else(|| panic!("no array of {disks} members:\n{report}"));
        assert!(
            line.contains("level=raid10")
                && line.contains(&format!("size={size} "))
                && line.contains("pattern=ok")
                && line.contains("mismatch=0"),
            "{line}\n{report}"
        );
    }
}

/// The member images in `d`, sorted (what [`md_state`] unpacked there).
fn md_state_names(d: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(d)
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|n| n.ends_with(".img"))
        .collect();
    names.sort();
    names
}
