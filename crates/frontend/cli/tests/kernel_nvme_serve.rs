//! `nvraid serve --nvme-tcp`: the array as an NVMe/TCP subsystem, attached
//! by the Linux kernel's own initiator.
//!
//! In the kernel VM (Linux 6.12, tools/mdvm `--kernel 6.12`, modules
//! nvme_tcp and ext4; `NVRAID_MDVM` may name another mdvm with the same
//! interface), over a RAID 5 of 3 virtio disks nvraid created here; the
//! in-VM script is `kernel_nvme_serve.sh` beside this file, each step
//! printing a line checked here:
//!
//! 1. the server listens on 127.0.0.1:4420 under the NQN derived from the
//!    array's UUID, allowing one host NQN;
//! 2. the kernel connects to the discovery controller and leaves;
//! 3. another host NQN is refused at Connect;
//! 4. the kernel's controller shows the namespace with the array's size,
//!    512-byte blocks (the array's sector), 512 KiB commands and a volatile write cache; `nvraid
//!    status` shows the host and its I/O queues;
//! 5. 32 MiB of raw data read back equal after the page cache is dropped;
//! 6. blkdiscard (Linux's Dataset Management carries 4 KiB of data for
//!    one range), mkfs.ext4 and 20 files written and synced;
//! 7. the kernel disconnects and the server sees the controller go;
//! 8. connected again: e2fsck clean and every file verifies;
//! 9. the array grown online onto a fourth disk (`grow --socket`) with
//!    ext4 mounted on the host: at the grow's end the host's namespace
//!    takes the new size by itself (the server's Namespace Attribute
//!    Changed notice, an Asynchronous Event), 8 MiB past the old end read
//!    back raw past the page cache, resize2fs grows ext4 online, 20 more
//!    files, e2fsck clean, all 40 verify;
//! 10. SIGTERM: the array is flushed and closed clean, 4 members
//!     (checked on the images here too).

mod common;

use common::*;
use std::path::{Path, PathBuf};

#[test]
fn the_kernels_nvme_tcp_initiator_carries_ext4_across_a_reconnect() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let members = ["a.img", "b.img", "c.img"];
    let mut create = vec!["create", "--level", "5", "--chunk", "64K", "--size", "128M"];
    create.extend(members);
    ok(&create, d);
    let mut detail = vec!["detail", "--json"];
    detail.extend(members);
    let detail: serde_json::Value = serde_json::from_str(&ok(&detail, d)).unwrap();
    let size = detail["size_bytes"].as_u64().unwrap();
    let uuid: String = detail["uuid"]
        .as_str()
        .unwrap()
        .chars()
        .filter(char::is_ascii_hexdigit)
        .collect();
    let nqn = format!(
        "nqn.2014-08.org.nvraid:uuid:{}-{}-{}-{}-{}",
        &uuid[0..8],
        &uuid[8..12],
        &uuid[12..16],
        &uuid[16..20],
        &uuid[20..32]
    );

    let inside = nvraid_testing::vm::ship(
        d,
        &[
            PathBuf::from(env!("CARGO_BIN_EXE_nvraid")),
            nvraid_testing::vm::host_tool("mkfs.ext4"),
            nvraid_testing::vm::host_tool("e2fsck"),
            nvraid_testing::vm::host_tool("resize2fs"),
        ],
    );
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/kernel_nvme_serve.sh");
    // The disk the array grows onto: blank, as large as the members.
    let member_bytes = std::fs::metadata(d.join("a.img")).unwrap().len();
    std::fs::File::create(d.join("d.img"))
        .unwrap()
        .set_len(member_bytes)
        .unwrap();
    let images: Vec<PathBuf> = members
        .iter()
        .chain(&["d.img"])
        .map(|m| d.join(m))
        .collect();
    let console = run_vm_612(&["nvme_tcp", "ext4"], &inside, &script, &images, 700);
    assert_eq!(console_line(&console, "NQN "), format!("NQN {nqn}"));
    let discovery = console_line(&console, "DISCOVERY ");
    assert!(discovery.ends_with("type=discovery"), "{discovery}");
    console_line(&console, "STRANGER refused");
    let attached = console_line(&console, "ATTACHED ");
    assert!(
        attached.ends_with(&format!(
            "size={size} lbs=512 max_kb=512 cache=write back subsysnqn={nqn}"
        )),
        "{attached}"
    );
    let status = console_line(&console, "STATUS ");
    assert!(
        status.contains("host nqn.2014-08.org.nvraid:vm-host") && status.contains("io_queues=2"),
        "{status}"
    );
    for step in [
        "RAW 32 MiB ok",
        "DISCARDED 1 MiB",
        "FILES 20 written",
        "DISCONNECTED",
        "VERIFIED 20 files after reconnecting, fsck clean",
        "GROWN grown online from 3 to 4 members",
        "STOPPED: nvraid: stopped; array flushed and closed",
        "DONE",
    ] {
        console_line(&console, step);
    }
    // A RAID 5 of 3 grown to 4: half as large again, seen by the host
    // without reconnecting.
    let grown = size / 2 * 3;
    assert_eq!(
        console_line(&console, "RESIZED "),
        format!("RESIZED old={size} new={grown}")
    );
    assert_eq!(
        console_line(&console, "GREW "),
        format!("GREW ext4 online: 40 files verified, fsck clean, {grown} bytes")
    );
    let state = console_line(&console, "DETAIL ");
    assert!(
        state.contains("Raid Devices : 4") && state.contains("State : clean"),
        "{state}"
    );
    let mut detail = vec!["detail"];
    detail.extend(members);
    detail.push("d.img");
    let text = ok(&detail, d);
    assert!(text.lines().any(|l| l.trim() == "State : clean"), "{text}");
    assert!(
        text.lines().any(|l| l.trim() == "Raid Devices : 4"),
        "{text}"
    );
}
