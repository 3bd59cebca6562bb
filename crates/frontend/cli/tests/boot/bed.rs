//! The boot test bed itself (`tools/bootvm`), where it can be checked without
//! booting.

use nvraid_testing::bootvm::Machine;
use std::process::Command;

/// A power cut leaves the root's ext4 with its journal still to replay: until the
/// guest's kernel replays it, a block bitmap need not match the checksum its group
/// descriptor holds. bootvm reads the next boot's initramfs out of that root on the
/// host; it read it with debugfs's checks on, so the machine could not boot again
/// after such a cut ("Block bitmap checksum does not match bitmap"). Here group 0's
/// block bitmap is zeroed in the overlay (through qemu-io, as the guest would have
/// written it) and the initramfs must still come out whole.
#[test]
fn a_root_that_lost_power_still_gives_its_initramfs() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let machine = Machine::new(d, &[]);
    let image = String::from_utf8(
        Command::new(env!("CARGO_MANIFEST_DIR").to_string() + "/../../../tools/bootvm/mkroot")
            .output()
            .unwrap()
            .stdout,
    )
    .unwrap()
    .trim()
    .to_string();
    let fetched = Command::new("debugfs")
        .args(["-c", "-R", "stats", &image])
        .output()
        .expect("debugfs (./test.sh installs e2fsprogs)");
    let stats = String::from_utf8_lossy(&fetched.stdout);
    let field = |name: &str| -> u64 {
        stats
            .lines()
            .find_map(|l| l.trim().strip_prefix(name))
            .unwrap_or_else(|| panic!("no {name:?} in debugfs stats:\n{stats}"))
            .trim()
            .parse()
            .unwrap()
    };
    let block_size = field("Block size:");
    let bitmap = stats
        .lines()
        .find_map(|l| {
            let rest = l.trim().strip_prefix("Group  0:")?;
            let at = rest.split("block bitmap at ").nth(1)?;
            at.split(|c: char| !c.is_ascii_digit())
                .next()?
                .parse::<u64>()
                .ok()
        })
        .unwrap_or_else(|| panic!("no group 0 block bitmap in debugfs stats:\n{stats}"));
    let zeroed = Command::new("qemu-io")
        .args(["-f", "qcow2", "-c"])
        .arg(format!("write -P 0 {} {block_size}", bitmap * block_size))
        .arg(machine.root())
        .output()
        .expect("qemu-io (./test.sh installs qemu-utils)");
    assert!(
        zeroed.status.success(),
        "qemu-io: {}",
        String::from_utf8_lossy(&zeroed.stderr)
    );

    let out = d.join("initrd.img");
    machine
        .initrd(&out)
        .unwrap_or_else(|e| panic!("bootvm could not read the initramfs: {e}"));
    let base = Command::new("debugfs")
        .args(["-c", "-R"])
        .arg(format!("cat /boot/initrd.img-{}", kernel_release(&image)))
        .arg(&image)
        .output()
        .unwrap()
        .stdout;
    assert!(
        base.len() > 1 << 20,
        "the image's initramfs is {} bytes",
        base.len()
    );
    assert!(
        std::fs::read(&out).unwrap() == base,
        "the initramfs read from the overlay differs from the image's"
    );
}

/// The kernel release whose initramfs the image holds.
fn kernel_release(image: &str) -> String {
    let listed = Command::new("debugfs")
        .args(["-c", "-R", "ls /boot", image])
        .output()
        .unwrap();
    String::from_utf8_lossy(&listed.stdout)
        .split_whitespace()
        .find_map(|w| w.strip_prefix("initrd.img-"))
        .unwrap_or_else(|| panic!("no initrd in {image}'s /boot"))
        .to_string()
}
