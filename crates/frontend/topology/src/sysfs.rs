//! Reading single sysfs attributes without panicking on whatever the tree holds.

use std::fs;
use std::io::ErrorKind;
use std::path::Path;

/// The trimmed text of `dir/name`: `Ok(None)` when the file does not exist,
/// `Err(reason)` when it exists but cannot be read.
/// At most `ATTR_MAX_BYTES` are read (a sysfs text attribute is one page;
/// a tree given with `--sysfs-root` may hold anything).
pub fn read_attr(dir: &Path, name: &str) -> Result<Option<String>, String> {
    match read_bounded(&dir.join(name)) {
        Ok(bytes) => Ok(Some(String::from_utf8_lossy(&bytes).trim().to_string())),
        Err(e) if e.kind() == ErrorKind::NotFound => Ok(None),
        Err(e) => Err(format!("cannot read {name}: {e}")),
    }
}

/// The most read from one attribute.
const ATTR_MAX_BYTES: u64 = 1 << 20;

fn read_bounded(path: &Path) -> std::io::Result<Vec<u8>> {
    use std::io::Read;
    let mut bytes = Vec::new();
    fs::File::open(path)?
        .take(ATTR_MAX_BYTES + 1)
        .read_to_end(&mut bytes)?;
    if bytes.len() as u64 > ATTR_MAX_BYTES {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("longer than {} MiB", ATTR_MAX_BYTES >> 20),
        ));
    }
    Ok(bytes)
}

/// `read_attr`, folding read failures into `problems`.
pub fn attr(dir: &Path, name: &str, problems: &mut Vec<String>) -> Option<String> {
    read_attr(dir, name).unwrap_or_else(|reason| {
        problems.push(reason);
        None
    })
}

/// A hexadecimal attribute such as `vendor` ("0x8086").
pub fn parse_hex(text: &str) -> Option<u32> {
    u32::from_str_radix(text.trim_start_matches("0x"), 16).ok()
}

/// A link speed as sysfs prints it: "8.0 GT/s PCIe", "8 GT/s", "Unknown", "Unknown speed".
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum SpeedText {
    Gts(f64),
    Unknown,
}

pub fn parse_link_speed(text: &str) -> Option<SpeedText> {
    if text.starts_with("Unknown") {
        return Some(SpeedText::Unknown);
    }
    let (number, rest) = text.split_once(' ')?;
    if !rest.starts_with("GT/s") {
        return None;
    }
    number.parse::<f64>().ok().map(SpeedText::Gts)
}

/// The number of CPUs in a list such as "0-7,16-23".
pub fn count_cpu_list(text: &str) -> Option<u32> {
    let mut count = 0;
    for part in text.split(',').filter(|p| !p.is_empty()) {
        count += match part.split_once('-') {
            Some((lo, hi)) => hi.parse::<u32>().ok()?.checked_sub(lo.parse().ok()?)? + 1,
            None => part.parse::<u32>().map(|_| 1).ok()?,
        };
    }
    Some(count)
}

/// "0000:00:1d.0" or "10000:e1:00.0": a PCI function address (domain may be wider under VMD).
pub fn is_pci_address(name: &str) -> bool {
    let Some((domain, rest)) = name.split_once(':') else {
        return false;
    };
    let bytes = rest.as_bytes();
    domain.len() >= 4
        && domain.chars().all(|c| c.is_ascii_hexdigit())
        && bytes.len() == 7
        && bytes[2] == b':'
        && bytes[5] == b'.'
        && rest[..2]
            .chars()
            .chain(rest[3..5].chars())
            .all(|c| c.is_ascii_hexdigit())
        && (b'0'..=b'7').contains(&bytes[6])
}

/// "pci0000:00" or "pci10000:e0": a host bridge (root complex) directory.
pub fn is_host_bridge(name: &str) -> bool {
    name.strip_prefix("pci").is_some_and(|rest| {
        rest.split_once(':').is_some_and(|(d, b)| {
            d.len() >= 4
                && b.len() == 2
                && d.chars().chain(b.chars()).all(|c| c.is_ascii_hexdigit())
        })
    })
}

/// (bus, device number) of a PCI address.
pub fn bus_and_slot(address: &str) -> Option<(u8, u8)> {
    let mut parts = address.rsplitn(3, ':');
    let dev_fn = parts.next()?;
    let bus = parts.next()?;
    let slot = dev_fn.split('.').next()?;
    Some((
        u8::from_str_radix(bus, 16).ok()?,
        u8::from_str_radix(slot, 16).ok()?,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn link_speeds_parse_in_old_and_new_formats() {
        assert_eq!(parse_link_speed("8.0 GT/s PCIe"), Some(SpeedText::Gts(8.0)));
        assert_eq!(parse_link_speed("2.5 GT/s"), Some(SpeedText::Gts(2.5)));
        assert_eq!(parse_link_speed("Unknown"), Some(SpeedText::Unknown));
        assert_eq!(parse_link_speed("Unknown speed"), Some(SpeedText::Unknown));
        assert_eq!(parse_link_speed("fast"), None);
        assert_eq!(parse_link_speed("8.0 Gb/s"), None);
    }

    #[test]
    fn cpu_lists_count() {
        assert_eq!(count_cpu_list("0-7"), Some(8));
        assert_eq!(count_cpu_list("0-1,4,6-7"), Some(5));
        assert_eq!(count_cpu_list("0"), Some(1));
        assert_eq!(count_cpu_list("7-0"), None);
        assert_eq!(count_cpu_list("x"), None);
    }

    #[test]
    fn pci_names_are_recognised() {
        assert!(is_pci_address("0000:00:1d.0"));
        assert!(is_pci_address("10000:e1:00.0"));
        assert!(!is_pci_address("0000:00:1d"));
        assert!(!is_pci_address("nvme0"));
        assert!(!is_pci_address("0:0:0:0"));
        assert!(is_host_bridge("pci0000:00"));
        assert!(is_host_bridge("pci10000:e0"));
        assert!(!is_host_bridge("pci_bus"));
        assert_eq!(bus_and_slot("0000:00:1d.0"), Some((0, 0x1d)));
        assert_eq!(bus_and_slot("10000:e1:00.0"), Some((0xe1, 0)));
    }

    #[test]
    fn hex_attributes_parse() {
        assert_eq!(parse_hex("0x8086"), Some(0x8086));
        assert_eq!(parse_hex("0x010802"), Some(0x010802));
        assert_eq!(parse_hex("zz"), None);
    }
}
