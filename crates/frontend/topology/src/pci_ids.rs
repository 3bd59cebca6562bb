//! PCI vendor/device ids that tell chipset from CPU, and VMD from everything else.
//!
//! Id ranges were checked against the pci.ids database (Debian package `pci.ids`). A range
//! covers a chipset family's whole block of ids (root ports, SATA, …), so any of its functions
//! identifies the PCH behind which a device sits.

use crate::model::DmiVersion;

pub const VENDOR_INTEL: u16 = 0x8086;
pub const VENDOR_AMD: u16 = 0x1022;
pub const VENDOR_VIRTIO: u16 = 0x1af4;

/// PCI class code of a PCI-to-PCI bridge (root ports and switch ports), programming interface 0.
pub const CLASS_PCI_BRIDGE: u32 = 0x060400;

/// An Intel platform controller hub family and the DMI link that connects it to the CPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PchFamily {
    pub name: &'static str,
    pub dmi: DmiVersion,
    pub dmi_width_lanes: u32,
    /// True where boards of this family ship with different DMI widths and the table picks one.
    pub width_varies: bool,
}

const fn pch(name: &'static str, dmi: DmiVersion, width: u32, varies: bool) -> PchFamily {
    PchFamily {
        name,
        dmi,
        dmi_width_lanes: width,
        width_varies: varies,
    }
}

/// (first id, last id, family), Intel vendor id 0x8086.
const INTEL_PCH_RANGES: [(u16, u16, PchFamily); 14] = [
    (
        0x1c00,
        0x1c7f,
        pch("Intel 6 Series PCH", DmiVersion::Dmi2, 4, false),
    ),
    (
        0x1d00,
        0x1d7f,
        pch("Intel X79/C600 PCH", DmiVersion::Dmi2, 4, false),
    ),
    (
        0x1e00,
        0x1e7f,
        pch("Intel 7 Series PCH", DmiVersion::Dmi2, 4, false),
    ),
    (
        0x8c00,
        0x8c7f,
        pch("Intel 8 Series PCH", DmiVersion::Dmi2, 4, false),
    ),
    (
        0x8c80,
        0x8cff,
        pch("Intel 9 Series PCH", DmiVersion::Dmi2, 4, false),
    ),
    (
        0x8d00,
        0x8d7f,
        pch("Intel X99/C610 PCH", DmiVersion::Dmi2, 4, false),
    ),
    (
        0xa100,
        0xa17f,
        pch("Intel 100 Series PCH", DmiVersion::Dmi3, 4, false),
    ),
    (
        0xa180,
        0xa1ff,
        pch("Intel C620 PCH", DmiVersion::Dmi3, 4, false),
    ),
    (
        0xa280,
        0xa2ff,
        pch("Intel 200 Series PCH", DmiVersion::Dmi3, 4, false),
    ),
    (
        0xa300,
        0xa37f,
        pch("Intel 300 Series PCH", DmiVersion::Dmi3, 4, false),
    ),
    (
        0x0680,
        0x06ff,
        pch("Intel 400 Series PCH", DmiVersion::Dmi3, 4, false),
    ),
    (
        0x4380,
        0x43ff,
        pch("Intel 500 Series PCH", DmiVersion::Dmi3, 8, true),
    ),
    (
        0x7a80,
        0x7aff,
        pch("Intel 600 Series PCH", DmiVersion::Dmi4, 8, true),
    ),
    (
        0x7a00,
        0x7a7f,
        pch("Intel 700 Series PCH", DmiVersion::Dmi4, 8, true),
    ),
];

/// Used when a function is recognised as PCH by its position but its id is not in the table.
pub const UNKNOWN_PCH: PchFamily = pch("Intel PCH (unknown family)", DmiVersion::Dmi3, 4, true);

/// The PCH family an Intel device id belongs to.
pub fn intel_pch_family(device_id: u16) -> Option<PchFamily> {
    INTEL_PCH_RANGES
        .iter()
        .find(|(lo, hi, _)| (*lo..=*hi).contains(&device_id))
        .map(|&(_, _, family)| family)
}

/// Intel Volume Management Device ids (Skylake-SP, Ice Lake-SP, Rocket/Tiger/Alder/Raptor/Meteor Lake).
const INTEL_VMD_IDS: [u16; 7] = [0x201d, 0x28c0, 0x467f, 0x4c3d, 0x9a0b, 0xa77f, 0xad0b];

pub fn is_intel_vmd(vendor_id: u16, device_id: u16) -> bool {
    vendor_id == VENDOR_INTEL && INTEL_VMD_IDS.contains(&device_id)
}

/// AMD chipset (Promontory and the X570 chipset) functions by id, with a name.
const AMD_CHIPSET_IDS: [(u16, &str); 13] = [
    (0x43b0, "AMD X370 chipset"),
    (0x43b1, "AMD X399 chipset"),
    (0x43b4, "AMD 300 Series chipset"),
    (0x43b5, "AMD X370 chipset"),
    (0x43b7, "AMD 300 Series chipset"),
    (0x43c6, "AMD 400 Series chipset"),
    (0x43c7, "AMD 400 Series chipset"),
    (0x43c8, "AMD 400 Series chipset"),
    (0x43e9, "AMD 500 Series chipset"),
    (0x43eb, "AMD 500 Series chipset"),
    (0x57ad, "AMD X570 chipset"),
    (0x57a3, "AMD X570 chipset"),
    (0x57a4, "AMD X570 chipset"),
];

/// The name of the AMD chipset an id belongs to, if it is a known chipset function.
pub fn amd_chipset_name(device_id: u16) -> Option<&'static str> {
    AMD_CHIPSET_IDS
        .iter()
        .find(|(id, _)| *id == device_id)
        .map(|(_, name)| *name)
}

/// AMD bridges that lead to functions inside the CPU package (USB, SATA, PSP), not to slots.
const AMD_INTERNAL_BRIDGE_IDS: [u16; 4] = [0x1454, 0x1484, 0x14b9, 0x1635];

pub fn is_amd_internal_bridge(device_id: u16) -> bool {
    AMD_INTERNAL_BRIDGE_IDS.contains(&device_id)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn z170_root_ports_are_100_series_with_dmi3_x4() {
        let family = intel_pch_family(0xa110).unwrap();
        assert_eq!(family.dmi, DmiVersion::Dmi3);
        assert_eq!(family.dmi_width_lanes, 4);
        assert_eq!(
            intel_pch_family(0xa102).unwrap().name,
            "Intel 100 Series PCH"
        );
    }

    #[test]
    fn x99_and_older_chipsets_use_dmi2() {
        assert_eq!(intel_pch_family(0x8d10).unwrap().dmi, DmiVersion::Dmi2);
        assert_eq!(intel_pch_family(0x1c10).unwrap().dmi, DmiVersion::Dmi2);
        assert_eq!(intel_pch_family(0x1d10).unwrap().dmi, DmiVersion::Dmi2);
    }

    #[test]
    fn cpu_root_ports_are_not_pch() {
        assert!(intel_pch_family(0x1901).is_none()); // Skylake PEG
        assert!(intel_pch_family(0x2f02).is_none()); // Haswell-E root port
        assert!(intel_pch_family(0x2030).is_none()); // Skylake-SP root port
    }

    #[test]
    fn vmd_ids_need_the_intel_vendor() {
        assert!(is_intel_vmd(0x8086, 0x201d));
        assert!(is_intel_vmd(0x8086, 0x467f));
        assert!(is_intel_vmd(0x8086, 0x9a0b));
        assert!(!is_intel_vmd(0x1022, 0x201d));
    }

    #[test]
    fn amd_chipset_ids_have_names() {
        assert_eq!(amd_chipset_name(0x57ad), Some("AMD X570 chipset"));
        assert_eq!(amd_chipset_name(0x1483), None);
        assert!(is_amd_internal_bridge(0x1484));
    }
}
