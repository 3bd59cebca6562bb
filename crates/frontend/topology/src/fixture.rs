//! Expands a sysfs fixture manifest into a directory tree, symlinks included.
//!
//! Fixtures live in `tests/fixtures/<platform>/sysfs.manifest`. One directive per line; `#`
//! starts a comment. Paths are relative to the sysfs root.
//!
//! | directive | writes |
//! |---|---|
//! | `file PATH = TEXT` | `PATH` containing `TEXT` and a newline |
//! | `link PATH -> TARGET` | a symlink (TARGET is relative, as in sysfs) |
//! | `pci PATH VVVV:DDDD CLASS [numa=N] [link=CUR/CW/MAX/MW]` | `vendor`, `device`, `class`, `numa_node`, and the four `*_link_*` files; speeds are GT/s numbers or `Unknown` |
//! | `blk PATH [sectors=N] [lbs=N] [pbs=N] [mq=N]` | `size`, `queue/logical_block_size`, `queue/physical_block_size`, `mq/0..N-1/` |
//! | `nvme PCIDIR CTRL NS [blk options] model=TEXT` | controller `PCIDIR/nvme/CTRL` with `model` and `device`, namespace `NS` under it, and `block/NS` |
//! | `nvme-mp PCIDIR CTRL SUBSYS NS PATHDISK [blk options] model=TEXT` | the same under native multipath: the head disk under `devices/virtual/nvme-subsystem/SUBSYS`, the blk-mq path disk `PATHDISK` inside the controller |
//! | `sata PCIDIR ATAN HOSTN H:C:T:L NAME [gbps=N] [blk options] model=TEXT` | an AHCI port, its SCSI disk and `block/NAME` |

use std::fs;
use std::io;
use std::path::Path;

/// Writes the tree `manifest` describes under `dir`.
pub fn expand_manifest(manifest: &str, dir: &Path) -> io::Result<()> {
    for (number, raw) in manifest.lines().enumerate() {
        let line = raw.split(" #").next().unwrap_or("").trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        directive(line, dir).map_err(|e| {
            io::Error::new(
                e.kind(),
                format!("manifest line {}: {e}: {line}", number + 1),
            )
        })?;
    }
    Ok(())
}

fn bad(what: &str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, what.to_string())
}

fn directive(line: &str, dir: &Path) -> io::Result<()> {
    let (word, rest) = line.split_once(' ').ok_or_else(|| bad("no arguments"))?;
    match word {
        "file" => {
            let (path, text) = rest.split_once(" =").ok_or_else(|| bad("file needs ="))?;
            write_file(dir, path.trim(), text.trim())
        }
        "link" => {
            let (path, target) = rest
                .split_once(" -> ")
                .ok_or_else(|| bad("link needs ->"))?;
            symlink(dir, path.trim(), target.trim())
        }
        "pci" => pci(dir, rest),
        "blk" => {
            let (args, _) = split_model(rest);
            let words: Vec<&str> = args.split_whitespace().collect();
            blk(
                dir,
                words.first().ok_or_else(|| bad("blk needs a path"))?,
                &words[1..],
            )
        }
        "nvme" => nvme(dir, rest),
        "nvme-mp" => nvme_multipath(dir, rest),
        "sata" => sata(dir, rest),
        _ => Err(bad("unknown directive")),
    }
}

fn write_file(dir: &Path, path: &str, text: &str) -> io::Result<()> {
    let full = dir.join(path);
    if let Some(parent) = full.parent() {
        fs::create_dir_all(parent)?;
    }
    fs::write(full, format!("{text}\n"))
}

fn symlink(dir: &Path, path: &str, target: &str) -> io::Result<()> {
    let full = dir.join(path);
    if let Some(parent) = full.parent() {
        fs::create_dir_all(parent)?;
    }
    std::os::unix::fs::symlink(target, full)
}

/// `key=value` options of a directive.
fn option<'a>(words: &[&'a str], key: &str) -> Option<&'a str> {
    words
        .iter()
        .find_map(|w| w.strip_prefix(key)?.strip_prefix('='))
}

fn speed_text(value: &str) -> String {
    if value == "Unknown" {
        value.to_string()
    } else {
        format!("{value} GT/s PCIe")
    }
}

fn pci(dir: &Path, rest: &str) -> io::Result<()> {
    let words: Vec<&str> = rest.split_whitespace().collect();
    let [path, ids, class, options @ ..] = words.as_slice() else {
        return Err(bad("pci needs PATH VVVV:DDDD CLASS"));
    };
    let (vendor, device) = ids.split_once(':').ok_or_else(|| bad("ids need :"))?;
    write_file(dir, &format!("{path}/vendor"), &format!("0x{vendor}"))?;
    write_file(dir, &format!("{path}/device"), &format!("0x{device}"))?;
    write_file(dir, &format!("{path}/class"), class)?;
    let numa = option(options, "numa").unwrap_or("-1");
    write_file(dir, &format!("{path}/numa_node"), numa)?;
    let Some(link) = option(options, "link") else {
        return Ok(());
    };
    let parts: Vec<&str> = link.split('/').collect();
    let [cur, cur_w, max, max_w] = parts.as_slice() else {
        return Err(bad("link=CUR/CW/MAX/MW"));
    };
    write_file(dir, &format!("{path}/current_link_speed"), &speed_text(cur))?;
    write_file(dir, &format!("{path}/current_link_width"), cur_w)?;
    write_file(dir, &format!("{path}/max_link_speed"), &speed_text(max))?;
    write_file(dir, &format!("{path}/max_link_width"), max_w)
}

fn blk(dir: &Path, path: &str, options: &[&str]) -> io::Result<()> {
    let sectors = option(options, "sectors").unwrap_or("1000215216");
    write_file(dir, &format!("{path}/size"), sectors)?;
    let lbs = option(options, "lbs").unwrap_or("512");
    write_file(dir, &format!("{path}/queue/logical_block_size"), lbs)?;
    let pbs = option(options, "pbs").unwrap_or(lbs);
    write_file(dir, &format!("{path}/queue/physical_block_size"), pbs)?;
    let queues: u32 = option(options, "mq")
        .unwrap_or("0")
        .parse()
        .map_err(|_| bad("mq=N"))?;
    for q in 0..queues {
        fs::create_dir_all(dir.join(format!("{path}/mq/{q}")))?;
    }
    Ok(())
}

/// Splits "args… model=TEXT WITH SPACES" into the args and the model.
fn split_model(rest: &str) -> (&str, Option<&str>) {
    match rest.split_once("model=") {
        Some((args, model)) => (args, Some(model.trim())),
        None => (rest, None),
    }
}

fn nvme(dir: &Path, rest: &str) -> io::Result<()> {
    let (args, model) = split_model(rest);
    let words: Vec<&str> = args.split_whitespace().collect();
    let [pci_dir, ctrl, ns, options @ ..] = words.as_slice() else {
        return Err(bad("nvme needs PCIDIR CTRL NS"));
    };
    let ctrl_dir = format!("{pci_dir}/nvme/{ctrl}");
    write_file(dir, &format!("{ctrl_dir}/model"), model.unwrap_or(""))?;
    symlink(dir, &format!("{ctrl_dir}/device"), "../..")?;
    let ns_dir = format!("{ctrl_dir}/{ns}");
    blk(dir, &ns_dir, options)?;
    symlink(dir, &format!("{ns_dir}/device"), &format!("../../{ctrl}"))?;
    symlink(dir, &format!("block/{ns}"), &format!("../{ns_dir}"))
}

fn nvme_multipath(dir: &Path, rest: &str) -> io::Result<()> {
    let (args, model) = split_model(rest);
    let words: Vec<&str> = args.split_whitespace().collect();
    let [pci_dir, ctrl, subsys, ns, path_disk, options @ ..] = words.as_slice() else {
        return Err(bad("nvme-mp needs PCIDIR CTRL SUBSYS NS PATHDISK"));
    };
    let model = model.unwrap_or("");
    let ctrl_dir = format!("{pci_dir}/nvme/{ctrl}");
    write_file(dir, &format!("{ctrl_dir}/model"), model)?;
    blk(dir, &format!("{ctrl_dir}/{path_disk}"), options)?;
    let subsys_dir = format!("devices/virtual/nvme-subsystem/{subsys}");
    write_file(dir, &format!("{subsys_dir}/model"), model)?;
    let up = "../../../";
    symlink(
        dir,
        &format!("{subsys_dir}/{ctrl}"),
        &format!("{up}{ctrl_dir}").replacen("devices/", "", 1),
    )?;
    let head = format!("{subsys_dir}/{ns}");
    let head_options: Vec<&str> = options
        .iter()
        .filter(|o| !o.starts_with("mq="))
        .copied()
        .collect();
    blk(dir, &head, &head_options)?;
    symlink(dir, &format!("{head}/device"), &format!("../../{subsys}"))?;
    symlink(dir, &format!("block/{ns}"), &format!("../{head}"))
}

fn sata(dir: &Path, rest: &str) -> io::Result<()> {
    let (args, model) = split_model(rest);
    let words: Vec<&str> = args.split_whitespace().collect();
    let [pci_dir, ata, host, hctl, name, options @ ..] = words.as_slice() else {
        return Err(bad("sata needs PCIDIR ATAN HOSTN H:C:T:L NAME"));
    };
    let port = ata.trim_start_matches("ata");
    let gbps = option(options, "gbps").unwrap_or("6.0");
    let link = format!("{pci_dir}/{ata}/link{port}/ata_link/link{port}/sata_spd");
    write_file(dir, &link, &format!("{gbps} Gbps"))?;
    let target = hctl.rsplit_once(':').map_or(*hctl, |(t, _)| t);
    let scsi = format!("{pci_dir}/{ata}/{host}/target{target}/{hctl}");
    write_file(dir, &format!("{scsi}/model"), model.unwrap_or(""))?;
    let disk = format!("{scsi}/block/{name}");
    blk(dir, &disk, options)?;
    symlink(dir, &format!("{disk}/device"), &format!("../../../{hctl}"))?;
    symlink(dir, &format!("block/{name}"), &format!("../{disk}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn manifest_writes_files_links_and_pci_attributes() {
        let dir = tempfile::tempdir().unwrap();
        let manifest = "\
# a comment
pci devices/pci0000:00/0000:00:1d.0 8086:a118 0x060400 link=8.0/4/8.0/4
nvme devices/pci0000:00/0000:00:1d.0/0000:03:00.0 nvme0 nvme0n1 mq=4 model=Test Drive 1
file devices/system/cpu/online = 0-3
";
        expand_manifest(manifest, dir.path()).unwrap();
        let read = |p: &str| fs::read_to_string(dir.path().join(p)).unwrap();
        assert_eq!(
            read("devices/pci0000:00/0000:00:1d.0/current_link_speed"),
            "8.0 GT/s PCIe\n"
        );
        assert_eq!(read("block/nvme0n1/device/model"), "Test Drive 1\n");
        assert_eq!(read("block/nvme0n1/queue/logical_block_size"), "512\n");
        assert_eq!(
            fs::read_dir(dir.path().join("block/nvme0n1/mq"))
                .unwrap()
                .count(),
            4
        );
        assert_eq!(read("devices/system/cpu/online"), "0-3\n");
    }

    #[test]
    fn unknown_directives_name_their_line() {
        let dir = tempfile::tempdir().unwrap();
        let err = expand_manifest("\nfrob x", dir.path()).unwrap_err();
        assert!(err.to_string().contains("line 2"), "{err}");
    }
}
