//! NVMe/TCP members against the Linux kernel's own target.
//!
//! In the kernel VM (Linux 6.12, tools/mdvm `--kernel 6.12`, modules
//! nvmet_tcp, null_blk and ublk_drv; `NVRAID_MDVM` may name another mdvm with the
//! same interface) the script `kernel_nvme_tcp.sh` beside this file sets
//! up four nvmet subsystems through configfs on 127.0.0.1:4420, each one
//! namespace on a memory-backed null_blk disk, and runs nvraid against
//! them with its own initiator, each step printing a line checked here:
//!
//! 1. `create` makes a RAID 5 of the four `nvme+tcp://` members (two of
//!    them with header and data digests);
//! 2. 8 MiB written and read back equal;
//! 3. one subsystem taken off the port (its configfs link removed) while a
//!    64 MiB write runs: the member is marked faulty with the reason (the
//!    connection nvmet closed, or its refusal of the subsystem) and the
//!    write completes;
//! 4. the unreachable member is named when the four are opened; the other
//!    three read both patterns back;
//! 5. the port link restored: `assemble` of the four exits 3 (degraded),
//!    the stale member shown faulty, the data the same; `add` rebuilds it,
//!    the array is clean, `check` finds the parity right and the data
//!    reads back;
//! 6. `bench` (two workers, each with its own pipelined I/O queue per
//!    member, random 4K reads and writes): the array stays clean and
//!    `check` finds the parity right;
//! 7. `serve --ublk 0`: 16 MiB written to /dev/ublkb0 with O_DIRECT reads
//!    back equal through the device and, after SIGTERM, from the members.

mod common;

use common::*;
use std::path::{Path, PathBuf};

#[test]
fn a_raid5_over_kernel_nvmet_tcp_members_degrades_keeps_its_data_and_rebuilds() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    // mdvm attaches at least one disk; the members are in the VM.
    std::fs::File::create(d.join("unused.img"))
        .unwrap()
        .set_len(1 << 20)
        .unwrap();
    let inside = nvraid_testing::vm::ship(d, &[PathBuf::from(env!("CARGO_BIN_EXE_nvraid"))]);
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/kernel_nvme_tcp.sh");
    let console = run_vm_612(
        &["nvmet_tcp", "null_blk", "ublk_drv"],
        &inside,
        &script,
        &[d.join("unused.img")],
        500,
    );
    for step in [
        "NVMET 4 subsystems on 127.0.0.1:4420",
        "CREATED raid5 of 4 nvme+tcp members",
        "READBACK 8 MiB ok",
        "WRITE under a lost member ok",
        "UNREACHABLE member named",
        "DEGRADED READ ok",
        "REASSEMBLED degraded, stale member faulty",
        "REBUILT clean, parity checked",
        "BENCH fast path ok, parity checked",
        "SERVED over ublk ok",
    ] {
        console_line(&console, step);
    }
    // The member was lost while the write ran (not after it ended), with
    // the reason: the connection nvmet closed under a write, or its refusal
    // of the subsystem when the channel connected again.
    console_line(&console, "WRITER running when the port link went");
    let faulty = console_line(
        &console,
        "nvraid: nvme+tcp://127.0.0.1/nqn.2026-11.io.nvraid.test:d2",
    );
    assert!(
        (faulty.contains("Connect: invalid parameters")
            || faulty.contains("the target closed the connection"))
            && faulty.contains("marked faulty"),
        "{faulty}"
    );
}
