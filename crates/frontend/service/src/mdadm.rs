//! Peace with mdadm.
//!
//! An nvraid array carries md superblocks, so mdadm's udev rule (and the
//! initramfs's copy of it) would hand its members to the kernel's md. nvraid
//! keeps one marked block in mdadm.conf with an `ARRAY <ignore> UUID=...`
//! line per array it serves; mdadm's incremental and `--assemble --scan`
//! skip an array such a line matches. Every other line of the file is kept
//! byte for byte. `update-initramfs -u` carries the file into the
//! initramfs.
//!
//! And nvraid never takes an array the kernel's md has assembled:
//! [`held_by_md`] looks for a member among `/sys/block/md*/slaves/`.

use std::path::{Path, PathBuf};

/// Debian's mdadm.conf.
pub const DEFAULT_PATH: &str = "/etc/mdadm/mdadm.conf";

/// The block's first line.
pub const BEGIN: &str =
    "# nvraid: begin (arrays nvraid serves: mdadm must not assemble them; kept by `nvraid config`)";
/// The block's last line.
pub const END: &str = "# nvraid: end";

fn is_begin(line: &str) -> bool {
    line.trim_end().starts_with("# nvraid: begin")
}

fn is_end(line: &str) -> bool {
    line.trim_end() == END
}

fn ignore_line(uuid: &str) -> String {
    format!("ARRAY <ignore> UUID={uuid}")
}

/// The file split around nvraid's block: (before, the block's UUIDs,
/// after). Without a block, everything is `before`.
fn split(text: &str) -> (String, Vec<String>, String) {
    let lines: Vec<&str> = text.split_inclusive('\n').collect();
    let Some(begin) = lines.iter().position(|l| is_begin(l)) else {
        return (text.to_string(), Vec::new(), String::new());
    };
    let end = lines[begin..]
        .iter()
        .position(|l| is_end(l))
        .map(|i| begin + i)
        .unwrap_or(lines.len() - 1);
    let uuids = lines[begin + 1..end.max(begin + 1)]
        .iter()
        .filter_map(|l| {
            l.trim()
                .strip_prefix("ARRAY <ignore> UUID=")
                .map(str::to_string)
        })
        .collect();
    let after_start = if end < lines.len() && is_end(lines[end]) {
        end + 1
    } else {
        lines.len()
    };
    (
        lines[..begin].concat(),
        uuids,
        lines[after_start..].concat(),
    )
}

fn join(before: &str, uuids: &[String], after: &str) -> String {
    if uuids.is_empty() {
        return format!("{before}{after}");
    }
    let mut out = before.to_string();
    if !out.is_empty() && !out.ends_with('\n') {
        out.push('\n');
    }
    out.push_str(BEGIN);
    out.push('\n');
    for uuid in uuids {
        out.push_str(&ignore_line(uuid));
        out.push('\n');
    }
    out.push_str(END);
    out.push('\n');
    out.push_str(after);
    out
}

/// The UUIDs nvraid's block lists.
pub fn ignored(text: &str) -> Vec<String> {
    split(text).1
}

/// `text` with `uuid` (mdadm's form) in nvraid's block; the same text when
/// it is there already.
pub fn add_ignore(text: &str, uuid: &str) -> String {
    let (before, mut uuids, after) = split(text);
    if uuids.iter().any(|u| u == uuid) {
        return text.to_string();
    }
    uuids.push(uuid.to_string());
    join(&before, &uuids, &after)
}

/// `text` without `uuid` in nvraid's block (the block goes when it is
/// empty); the same text when it is not there.
pub fn remove_ignore(text: &str, uuid: &str) -> String {
    let (before, mut uuids, after) = split(text);
    if !uuids.iter().any(|u| u == uuid) {
        return text.to_string();
    }
    uuids.retain(|u| u != uuid);
    join(&before, &uuids, &after)
}

/// The sysfs root (`/sys`, or `NVRAID_SYSFS` for tests).
pub fn sysfs_root() -> PathBuf {
    std::env::var_os("NVRAID_SYSFS")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/sys"))
}

/// The kernel md device (`/dev/mdN`) that holds `member` now, if any: a
/// block device whose device number a `/sys/block/md*/slaves/*/dev`
/// shows, or a file behind a loop device an md holds
/// (`slaves/loopN/loop/backing_file`).
pub fn held_by_md(sysfs: &Path, member: &Path) -> Option<String> {
    use std::os::unix::fs::{FileTypeExt, MetadataExt};
    let meta = std::fs::metadata(member).ok()?;
    let device = meta
        .file_type()
        .is_block_device()
        .then(|| format!("{}:{}", major(meta.rdev()), minor(meta.rdev())));
    let canonical = std::fs::canonicalize(member).ok();
    let mut mds: Vec<PathBuf> = std::fs::read_dir(sysfs.join("block"))
        .ok()?
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with("md"))
        .map(|e| e.path())
        .collect();
    mds.sort();
    for md in mds {
        let Ok(slaves) = std::fs::read_dir(md.join("slaves")) else {
            continue;
        };
        for slave in slaves.flatten() {
            let dir = slave.path();
            let dev = std::fs::read_to_string(dir.join("dev")).ok();
            let backing = std::fs::read_to_string(dir.join("loop/backing_file")).ok();
            let same_device = device
                .as_deref()
                .is_some_and(|d| dev.as_deref().map(str::trim) == Some(d));
            let same_file = canonical
                .as_deref()
                .is_some_and(|c| backing.as_deref().is_some_and(|b| Path::new(b.trim()) == c));
            if same_device || same_file {
                let name = md.file_name()?.to_string_lossy().into_owned();
                return Some(format!("/dev/{name}"));
            }
        }
    }
    None
}

fn major(dev: u64) -> u64 {
    ((dev >> 32) & 0xffff_f000) | ((dev >> 8) & 0xfff)
}

fn minor(dev: u64) -> u64 {
    ((dev >> 12) & 0xffff_ff00) | (dev & 0xff)
}

#[cfg(test)]
mod tests {
    use super::*;

    const A: &str = "0a1b2c3d:4e5f6071:8293a4b5:c6d7e8f9";
    const B: &str = "11111111:22222222:33333333:44444444";
    const DEBIAN: &str =
        "# mdadm.conf\n#\n# !NB! Run update-initramfs -u after updating this file.\n\
        HOMEHOST <system>\nMAILADDR root\n\n# definitions of existing MD arrays\n\
        ARRAY /dev/md/0  metadata=1.2 UUID=aaaaaaaa:bbbbbbbb:cccccccc:dddddddd name=host:0\n";

    #[test]
    fn the_block_round_trips_and_keeps_every_other_line() {
        let one = add_ignore(DEBIAN, A);
        assert_eq!(
            one,
            format!("{DEBIAN}{BEGIN}\nARRAY <ignore> UUID={A}\n{END}\n")
        );
        assert_eq!(add_ignore(&one, A), one, "adding twice changes nothing");
        let two = add_ignore(&one, B);
        assert_eq!(ignored(&two), vec![A, B]);
        assert!(two.starts_with(DEBIAN));
        // A user's line after the block stays where it is.
        let edited = format!("{two}DEVICE partitions\n");
        let less = remove_ignore(&edited, A);
        assert_eq!(
            less,
            format!("{DEBIAN}{BEGIN}\nARRAY <ignore> UUID={B}\n{END}\nDEVICE partitions\n")
        );
        assert_eq!(
            remove_ignore(&less, A),
            less,
            "removing twice changes nothing"
        );
        assert_eq!(
            remove_ignore(&less, B),
            format!("{DEBIAN}DEVICE partitions\n")
        );
        assert_eq!(remove_ignore(&add_ignore(DEBIAN, B), B), DEBIAN);
    }

    #[test]
    fn an_empty_or_unterminated_file() {
        assert_eq!(
            add_ignore("", A),
            format!("{BEGIN}\nARRAY <ignore> UUID={A}\n{END}\n")
        );
        assert_eq!(remove_ignore(&add_ignore("", A), A), "");
        let text = "MAILADDR root";
        assert_eq!(
            add_ignore(text, A),
            format!("MAILADDR root\n{BEGIN}\nARRAY <ignore> UUID={A}\n{END}\n")
        );
    }

    #[test]
    fn a_member_held_by_the_kernels_md_is_found_by_device_or_backing_file() {
        let sys = tempfile::tempdir().unwrap();
        let member = tempfile::NamedTempFile::new().unwrap();
        assert_eq!(held_by_md(sys.path(), member.path()), None);
        let loop_dir = sys.path().join("block/md127/slaves/loop3/loop");
        std::fs::create_dir_all(&loop_dir).unwrap();
        std::fs::write(loop_dir.join("backing_file"), "/elsewhere\n").unwrap();
        assert_eq!(held_by_md(sys.path(), member.path()), None);
        let real = std::fs::canonicalize(member.path()).unwrap();
        std::fs::write(
            loop_dir.join("backing_file"),
            format!("{}\n", real.display()),
        )
        .unwrap();
        assert_eq!(
            held_by_md(sys.path(), member.path()).as_deref(),
            Some("/dev/md127")
        );
        // A block device by its number: /dev/null is 1:3 (a character
        // device, so it is never matched as a member).
        assert_eq!(major(libc_makedev(8, 17)), 8);
        assert_eq!(minor(libc_makedev(8, 17)), 17);
        assert_eq!(minor(libc_makedev(259, 300)), 300);
    }

    fn libc_makedev(major: u64, minor: u64) -> u64 {
        ((major & 0xffff_f000) << 32)
            | ((major & 0xfff) << 8)
            | ((minor & 0xffff_ff00) << 12)
            | (minor & 0xff)
    }
}
