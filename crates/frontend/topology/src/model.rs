//! The bandwidth model: pure arithmetic, no I/O.
//!
//! A link's usable sequential bandwidth is
//!
//! ```text
//! transfer rate (GT/s per lane) / 8 bits × line-encoding efficiency × lanes × protocol efficiency
//! ```
//!
//! * Transfer rates and line encodings come from the PCI Express base specifications:
//!   Gen 1 2.5 GT/s and Gen 2 5 GT/s use 8b/10b; Gen 3 8 GT/s, Gen 4 16 GT/s and Gen 5 32 GT/s
//!   use 128b/130b; Gen 6 64 GT/s (PAM4) packs 256-byte FLITs of which 242 bytes carry TLPs and
//!   data-link payload (the rest is CRC and FEC).
//! * The protocol efficiency (TLP headers, data-link framing, ACK and flow-control DLLPs) is
//!   calibrated on the SM961 link-scaling measurements in SEEDS.md §2, which all land at 0.90 of
//!   the post-encoding rate (451.9 MB/s at Gen1 x2 of 500 MB/s; 1,777 MB/s at Gen3 x2 of
//!   1,969 MB/s). With 256-byte payloads and ≈24 bytes of header and framing per TLP the
//!   arithmetic gives ≈0.91, so the calibration is also plausible from first principles.
//! * Intel DMI 2.0 and 3.0 are electrically PCIe Gen 2 and Gen 3 links (x4 on desktop chipsets);
//!   DMI 4.0 is Gen 4 (x8 on Z690/Z790, x4 on cheaper boards). The model treats them as PCIe
//!   links of that generation and width (SEEDS.md §1: "DMI 3.0 ≈ PCIe 3.0 x4").
//!
//! All rates are bytes per second in decimal units (1 MB/s = 10^6 B/s), as the benchmarks in
//! SEEDS.md report them.

use serde::Serialize;

/// Fraction of the post-encoding PCIe rate left for payload (calibrated, see the module doc).
pub const PROTOCOL_EFFICIENCY: f64 = 0.90;

/// Fraction of the post-8b/10b SATA rate a fast SATA SSD reaches (≈560 MB/s of 600 MB/s).
/// Not from SEEDS.md and not validated here; common SATA SSD spec sheets top out there.
pub const SATA_PROTOCOL_EFFICIENCY: f64 = 0.93;

/// A PCI Express generation, identified by its per-lane transfer rate.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum PcieGen {
    Gen1,
    Gen2,
    Gen3,
    Gen4,
    Gen5,
    Gen6,
}

impl PcieGen {
    pub const ALL: [PcieGen; 6] = [
        PcieGen::Gen1,
        PcieGen::Gen2,
        PcieGen::Gen3,
        PcieGen::Gen4,
        PcieGen::Gen5,
        PcieGen::Gen6,
    ];

    /// The generation whose per-lane rate matches `gts` (as sysfs prints it: 2.5, 5.0, 8.0…).
    pub fn from_transfer_rate_gts(gts: f64) -> Option<PcieGen> {
        PcieGen::ALL
            .into_iter()
            .find(|g| (g.transfer_rate_gts() - gts).abs() < 0.01)
    }

    /// Per-lane raw transfer rate in gigatransfers per second.
    pub fn transfer_rate_gts(self) -> f64 {
        match self {
            PcieGen::Gen1 => 2.5,
            PcieGen::Gen2 => 5.0,
            PcieGen::Gen3 => 8.0,
            PcieGen::Gen4 => 16.0,
            PcieGen::Gen5 => 32.0,
            PcieGen::Gen6 => 64.0,
        }
    }

    /// Share of line bits that carry data after the line encoding.
    pub fn encoding_efficiency(self) -> f64 {
        match self {
            PcieGen::Gen1 | PcieGen::Gen2 => 8.0 / 10.0,
            PcieGen::Gen3 | PcieGen::Gen4 | PcieGen::Gen5 => 128.0 / 130.0,
            PcieGen::Gen6 => 242.0 / 256.0,
        }
    }

    /// 1 for Gen 1, … 6 for Gen 6.
    pub fn number(self) -> u8 {
        self as u8 + 1
    }

    /// Bytes per second one lane moves after line encoding, before protocol overhead.
    pub fn lane_bytes_per_sec(self) -> f64 {
        self.transfer_rate_gts() * 1e9 / 8.0 * self.encoding_efficiency()
    }
}

/// Post-encoding bandwidth of a link, one direction.
pub fn link_encoded_bytes_per_sec(gen: PcieGen, width_lanes: u32) -> f64 {
    gen.lane_bytes_per_sec() * f64::from(width_lanes)
}

/// Usable sequential bandwidth of a link, one direction: the model's link ceiling.
pub fn link_ceiling_bytes_per_sec(gen: PcieGen, width_lanes: u32) -> f64 {
    link_encoded_bytes_per_sec(gen, width_lanes) * PROTOCOL_EFFICIENCY
}

/// Versions of Intel's Direct Media Interface between CPU and PCH.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum DmiVersion {
    Dmi2,
    Dmi3,
    Dmi4,
}

impl DmiVersion {
    /// The PCIe generation DMI of this version is built on.
    pub fn pcie_gen(self) -> PcieGen {
        match self {
            DmiVersion::Dmi2 => PcieGen::Gen2,
            DmiVersion::Dmi3 => PcieGen::Gen3,
            DmiVersion::Dmi4 => PcieGen::Gen4,
        }
    }

    /// "DMI 3.0" and so on.
    pub fn label(self) -> &'static str {
        match self {
            DmiVersion::Dmi2 => "DMI 2.0",
            DmiVersion::Dmi3 => "DMI 3.0",
            DmiVersion::Dmi4 => "DMI 4.0",
        }
    }
}

/// Usable bandwidth of a DMI link shared by everything behind the PCH.
pub fn dmi_ceiling_bytes_per_sec(version: DmiVersion, width_lanes: u32) -> f64 {
    link_ceiling_bytes_per_sec(version.pcie_gen(), width_lanes)
}

/// Usable bandwidth of a SATA link at `gbps` (1.5, 3.0 or 6.0), 8b/10b encoded.
pub fn sata_ceiling_bytes_per_sec(gbps: f64) -> f64 {
    gbps * 1e9 / 10.0 * SATA_PROTOCOL_EFFICIENCY
}

/// Where a drive's rated speed comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum RatingSource {
    /// The small table of drives in SEEDS.md (`known_drive_rating`).
    Seeds,
    /// A `--measure` run on this machine.
    Measured,
}

/// Sequential speeds a drive reaches on its own, independent of the link.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct DriveRating {
    pub read_bytes_per_sec: f64,
    pub write_bytes_per_sec: Option<f64>,
    pub source: RatingSource,
}

/// Drives whose single-drive sequential speeds SEEDS.md states, matched on the sysfs model string.
const KNOWN_DRIVES: [(&str, f64, f64); 5] = [
    // Intel SSD 750, add-in card and 2.5" U.2 (SEEDS §1: 2,200 MB/s read, 900 MB/s write).
    ("SSDPEDMW", 2200e6, 900e6),
    ("SSDPE2MW", 2200e6, 900e6),
    // Samsung 950 PRO (SEEDS §4: ≈2,300 MB/s read, ≈950 MB/s write, one drive measured).
    ("950 PRO", 2300e6, 950e6),
    // Micron 9100 (SEEDS §5: best per drive 2.3 GB/s read, 700 MB/s write).
    ("Micron_9100", 2300e6, 700e6),
    ("MTFDHA", 2300e6, 700e6),
];

/// The SEEDS.md rating of a drive model, if it is one of the drives the seeds measured.
pub fn known_drive_rating(model: &str) -> Option<DriveRating> {
    KNOWN_DRIVES
        .iter()
        .find(|(needle, _, _)| model.contains(needle))
        .map(|&(_, read, write)| DriveRating {
            read_bytes_per_sec: read,
            write_bytes_per_sec: Some(write),
            source: RatingSource::Seeds,
        })
}

/// "≈3.5 GB/s" or "≈450 MB/s": the rounding used in advice lines.
pub fn format_rate(bytes_per_sec: f64) -> String {
    if bytes_per_sec >= 1e9 {
        format!("≈{:.1} GB/s", bytes_per_sec / 1e9)
    } else {
        format!("≈{:.0} MB/s", bytes_per_sec / 1e6)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mb(bytes_per_sec: f64) -> f64 {
        bytes_per_sec / 1e6
    }

    #[test]
    fn per_lane_rates_follow_the_spec_encodings() {
        assert_eq!(mb(PcieGen::Gen1.lane_bytes_per_sec()), 250.0);
        assert_eq!(mb(PcieGen::Gen2.lane_bytes_per_sec()), 500.0);
        assert!((mb(PcieGen::Gen3.lane_bytes_per_sec()) - 984.6).abs() < 0.1);
        assert!((mb(PcieGen::Gen4.lane_bytes_per_sec()) - 1969.2).abs() < 0.1);
        assert!((mb(PcieGen::Gen5.lane_bytes_per_sec()) - 3938.5).abs() < 0.1);
        assert!((mb(PcieGen::Gen6.lane_bytes_per_sec()) - 7562.5).abs() < 0.1);
    }

    #[test]
    fn generations_parse_from_sysfs_rates() {
        assert_eq!(PcieGen::from_transfer_rate_gts(2.5), Some(PcieGen::Gen1));
        assert_eq!(PcieGen::from_transfer_rate_gts(8.0), Some(PcieGen::Gen3));
        assert_eq!(PcieGen::from_transfer_rate_gts(64.0), Some(PcieGen::Gen6));
        assert_eq!(PcieGen::from_transfer_rate_gts(7.0), None);
        assert_eq!(PcieGen::Gen4.number(), 4);
    }

    #[test]
    fn gen3_x4_ceiling_matches_the_seeds_figure() {
        // SEEDS §2: "Gen3 x4 ceiling ≈ 3,550 MB/s".
        let ceiling = mb(link_ceiling_bytes_per_sec(PcieGen::Gen3, 4));
        assert!((ceiling - 3550.0).abs() / 3550.0 < 0.01, "{ceiling}");
    }

    #[test]
    fn dmi_versions_equal_their_pcie_links() {
        assert_eq!(
            dmi_ceiling_bytes_per_sec(DmiVersion::Dmi3, 4),
            link_ceiling_bytes_per_sec(PcieGen::Gen3, 4)
        );
        assert_eq!(mb(dmi_ceiling_bytes_per_sec(DmiVersion::Dmi2, 4)), 1800.0);
        assert!(
            dmi_ceiling_bytes_per_sec(DmiVersion::Dmi4, 8)
                > 3.9 * dmi_ceiling_bytes_per_sec(DmiVersion::Dmi3, 4)
        );
    }

    #[test]
    fn ceiling_scales_linearly_with_width() {
        for gen in PcieGen::ALL {
            let x1 = link_ceiling_bytes_per_sec(gen, 1);
            assert!((link_ceiling_bytes_per_sec(gen, 16) - 16.0 * x1).abs() < 1.0);
        }
    }

    #[test]
    fn sata_6g_is_near_560_mb() {
        assert!((mb(sata_ceiling_bytes_per_sec(6.0)) - 558.0).abs() < 1.0);
    }

    #[test]
    fn known_drives_match_on_model_substrings() {
        let r = known_drive_rating("Samsung SSD 950 PRO 512GB").unwrap();
        assert_eq!(r.read_bytes_per_sec, 2300e6);
        assert_eq!(r.write_bytes_per_sec, Some(950e6));
        assert!(known_drive_rating("INTEL SSDPEDMW400G4").is_some());
        assert!(known_drive_rating("Samsung SSD 980 PRO 1TB").is_none());
    }

    #[test]
    fn rates_format_for_people() {
        assert_eq!(format_rate(3.5446e9), "≈3.5 GB/s");
        assert_eq!(format_rate(450e6), "≈450 MB/s");
    }
}
