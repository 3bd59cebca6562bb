//! Integration tests: fixtures of real platforms, advice lines, validation against SEEDS.md,
//! bad input, this machine's /sys, JSON and --measure.

mod common;

use std::collections::BTreeMap;
use std::fs;
use std::path::Path;
use std::time::Duration;

use common::{args, fixture, plan_args, run_to_string, PLATFORMS};
use nvraid_topology::cli::run;
use nvraid_topology::model::{link_ceiling_bytes_per_sec, PcieGen};
use nvraid_topology::plan::Limit;
use nvraid_topology::{plan, scan, Attachment, Bottleneck, Level, Measured, Measurer, Topology};

fn device<'a>(topology: &'a Topology, name: &str) -> &'a nvraid_topology::BlockDevice {
    topology
        .devices
        .iter()
        .find(|d| d.name == name)
        .unwrap_or_else(|| panic!("{name} missing"))
}

fn plan_advice(platform: &str, level: Level, devices: &[&str]) -> (i32, String) {
    let dir = fixture(platform);
    run_to_string(&plan_args(dir.path(), level, devices), None)
}

fn assert_line(text: &str, line: &str) {
    assert!(
        text.lines().any(|l| l.trim_start_matches("  - ") == line),
        "missing advice line {line:?} in\n{text}"
    );
}

mod fixtures {
    use super::*;

    #[test]
    fn every_fixture_reports_cleanly() {
        for platform in PLATFORMS {
            let dir = fixture(platform);
            let (code, text) = run_to_string(&args(dir.path()), None);
            assert_eq!(code, 0, "{platform}:\n{text}");
            assert!(!text.contains("problem"), "{platform}:\n{text}");
            let topology = scan(dir.path()).unwrap();
            assert!(topology.devices.len() >= 3, "{platform}");
            for d in &topology.devices {
                assert!(
                    d.logical_block_size_bytes.is_some(),
                    "{platform} {}",
                    d.name
                );
                assert!(d.model.is_some(), "{platform} {}", d.name);
            }
        }
    }

    #[test]
    fn z170_tells_cpu_lanes_from_dmi() {
        let dir = fixture("z170");
        let t = scan(dir.path()).unwrap();
        assert_eq!(device(&t, "nvme0n1").attachment, Attachment::CpuLanes);
        assert_eq!(
            device(&t, "nvme0n1").root_port.as_deref(),
            Some("0000:00:01.0")
        );
        assert_eq!(device(&t, "nvme2n1").attachment, Attachment::Chipset);
        assert_eq!(device(&t, "sda").attachment, Attachment::Chipset);
        assert_eq!(device(&t, "nvme2n1").controller.as_deref(), Some("nvme2"));
        assert_eq!(device(&t, "nvme2n1").hw_queues, Some(8));
        assert_eq!(device(&t, "sda").sata_speed_gbps, Some(6.0));
        assert_eq!(t.idle_devices, vec!["loop0".to_string()]);
        assert_eq!(t.cpus_online, Some(8));
        let dmi = &t.uplinks[0];
        assert_eq!(dmi.id, "dmi:pci0000:00");
        assert!(dmi.shared);
        assert_eq!(dmi.devices, ["nvme2n1", "nvme3n1", "sda"]);
        let gen3_x4 = link_ceiling_bytes_per_sec(PcieGen::Gen3, 4);
        assert_eq!(dmi.ceiling_bytes_per_sec, Some(gen3_x4));
    }

    #[test]
    fn z170_chipset_pair_is_capped_by_dmi() {
        let (_, text) = plan_advice("z170", Level::Raid0, &["nvme2n1", "nvme3n1"]);
        assert_line(
            &text,
            "both drives sit behind DMI 3.0: RAID 0 reads cap at ≈3.5 GB/s; move one to a CPU slot",
        );
    }

    #[test]
    fn z170_cpu_pair_is_drive_limited_and_wants_workers() {
        let (_, text) = plan_advice("z170", Level::Raid0, &["nvme0n1", "/dev/nvme1n1"]);
        assert_line(
            &text,
            "the drives, not the links, limit RAID 0 reads (≈2.2 GB/s per drive, rated on nvme0n1)",
        );
        assert_line(
            &text,
            "use at least 8 workers: the drives expose 8 queues each",
        );
        assert!(!text.contains("sit behind DMI"), "{text}");
    }

    #[test]
    fn z170_crowded_dmi_is_flagged_without_a_plan() {
        let dir = fixture("z170");
        let (_, text) = run_to_string(&args(dir.path()), None);
        assert_line(
            &text,
            "nvme2n1 and nvme3n1 share DMI 3.0 (≈3.5 GB/s): together they cannot exceed it",
        );
    }

    #[test]
    fn a_link_trained_at_x2_is_flagged() {
        let dir = fixture("z170-x2");
        let t = scan(dir.path()).unwrap();
        let link = device(&t, "nvme2n1").pci_path[1].link.clone().unwrap();
        assert!(link.below_max_width);
        assert!(!link.below_max_speed);
        assert_eq!(
            (link.current_width_lanes, link.max_width_lanes),
            (Some(2), Some(4))
        );
        let (_, text) = run_to_string(&args(dir.path()), None);
        assert_line(
            &text,
            "nvme2 runs at x2 of x4: check the slot's lane sharing",
        );
        assert!(text.contains("BELOW MAXIMUM"), "{text}");
    }

    #[test]
    fn the_x2_member_sets_the_pace_of_a_plan() {
        let (_, text) = plan_advice("z170-x2", Level::Raid0, &["nvme0n1", "nvme2n1"]);
        assert_line(
            &text,
            "nvme2 runs at x2 of x4: check the slot's lane sharing",
        );
        assert_line(
            &text,
            "nvme2n1's link (0000:02:00.0 Gen3 x2) sets the pace at ≈1.8 GB/s per drive: RAID 0 reads cap at ≈3.5 GB/s",
        );
        assert!(
            text.contains(
                "nvme2n1 sets the pace at ≈1.8 GB/s while another member could do ≈2.3 GB/s"
            ),
            "{text}"
        );
    }

    #[test]
    fn x99_uses_dmi2_and_sata_links() {
        let dir = fixture("x99");
        let t = scan(dir.path()).unwrap();
        let dmi = t.uplinks.iter().find(|g| g.shared).unwrap();
        assert!(
            dmi.description.starts_with("DMI 2.0 x4"),
            "{}",
            dmi.description
        );
        assert_eq!(dmi.ceiling_bytes_per_sec, Some(1800e6));
        assert_eq!(device(&t, "nvme2n1").attachment, Attachment::Chipset);
        assert_eq!(device(&t, "nvme1n1").attachment, Attachment::CpuLanes);
        let (_, text) = plan_advice("x99", Level::Raid0, &["sda", "sdb", "sdc"]);
        assert_line(
            &text,
            "sda's link (SATA 6.0 Gb/s) sets the pace at ≈558 MB/s per drive: RAID 0 reads cap at ≈1.7 GB/s",
        );
        assert!(!text.contains("workers"), "{text}");
    }

    #[test]
    fn x99_mixed_pair_waits_for_the_gen2_drive() {
        let (_, text) = plan_advice("x99", Level::Raid0, &["nvme0n1", "nvme2n1"]);
        assert!(
            text.contains(
                "nvme2n1 sets the pace at ≈1.8 GB/s while another member could do ≈3.5 GB/s"
            ),
            "{text}"
        );
        assert_line(
            &text,
            "use at least 12 workers: the drives expose 12 queues each",
        );
    }

    #[test]
    fn amd_chipset_uplink_is_read_from_sysfs() {
        let dir = fixture("amd-x570");
        let t = scan(dir.path()).unwrap();
        let chipset = &t.uplinks[0];
        assert_eq!(chipset.id, "chipset:0000:02:00.0");
        assert_eq!(chipset.devices, ["nvme1n1", "nvme2n1"]);
        let gen4_x4 = link_ceiling_bytes_per_sec(PcieGen::Gen4, 4);
        assert_eq!(chipset.ceiling_bytes_per_sec, Some(gen4_x4));
        assert_eq!(device(&t, "nvme0n1").attachment, Attachment::CpuLanes);
        assert_eq!(
            device(&t, "nvme1n1").chipset.as_deref(),
            Some("AMD X570 chipset")
        );
        let (_, text) = plan_advice("amd-x570", Level::Raid0, &["nvme1n1", "nvme2n1"]);
        assert_line(
            &text,
            "both drives sit behind the AMD X570 chipset uplink: RAID 0 reads cap at ≈7.1 GB/s; move one to a CPU slot",
        );
    }

    #[test]
    fn server_spans_numa_nodes_through_multipath() {
        let dir = fixture("server-2numa");
        let t = scan(dir.path()).unwrap();
        let nvme2 = device(&t, "nvme2n1");
        assert_eq!(nvme2.numa_node, Some(1));
        assert_eq!(nvme2.controller.as_deref(), Some("nvme2"));
        assert_eq!(nvme2.hw_queues, Some(32));
        assert_eq!(nvme2.root_complex.as_deref(), Some("pci0000:85"));
        assert_eq!(nvme2.attachment, Attachment::CpuLanes);
        let (_, text) = plan_advice(
            "server-2numa",
            Level::Raid10 { near: 2 },
            &["nvme0n1", "nvme1n1", "nvme2n1", "nvme3n1"],
        );
        assert!(
            text.contains("the drives span NUMA nodes 0 and 1:"),
            "{text}"
        );
        assert_line(
            &text,
            "use at least 32 workers: the drives expose 32 queues each",
        );
    }

    #[test]
    fn vmd_devices_are_placed_through_the_vmd_domain() {
        let dir = fixture("vmd");
        let t = scan(dir.path()).unwrap();
        let cpu = device(&t, "nvme0n1");
        assert_eq!(cpu.vmd.as_deref(), Some("0000:00:0e.0"));
        assert_eq!(cpu.attachment, Attachment::CpuLanes);
        assert_eq!(cpu.root_port.as_deref(), Some("10000:e0:06.0"));
        let pch = device(&t, "nvme1n1");
        assert_eq!(pch.attachment, Attachment::Chipset);
        assert_eq!(pch.chipset.as_deref(), Some("Intel 600 Series PCH"));
        let dmi = &t.uplinks[0];
        assert_eq!(
            dmi.devices,
            ["nvme1n1", "sda"],
            "VMD and non-VMD PCH devices share DMI"
        );
        assert!(dmi.assumed);
        let (_, text) = run_to_string(&args(dir.path()), None);
        assert!(
            text.contains("nvme0n1 and nvme1n1 sit behind Intel VMD (0000:00:0e.0)"),
            "{text}"
        );
    }

    #[test]
    fn named_devices_filter_the_report() {
        let dir = fixture("z170");
        let mut a = args(dir.path());
        a.devices = vec!["nvme0n1".into()];
        let (_, text) = run_to_string(&a, None);
        assert!(text.contains("nvme0n1"));
        assert!(!text.contains("nvme2n1"), "{text}");
    }
}

/// The model against the published measurements in SEEDS.md (docs/topology.md, "Validation").
mod validation {
    use super::*;

    fn planned_read(platform: &str, devices: &[&str]) -> (f64, f64) {
        let dir = fixture(platform);
        let t = scan(dir.path()).unwrap();
        let names: Vec<String> = devices.iter().map(|d| d.to_string()).collect();
        let p = plan(&t, &names, Level::Raid0, &BTreeMap::new()).unwrap();
        (
            p.read.bytes_per_sec.unwrap(),
            p.write.bytes_per_sec.unwrap(),
        )
    }

    /// (case, predicted MB/s, measured MB/s, allowed error).
    fn rows() -> Vec<(&'static str, f64, f64, f64)> {
        let sm961 = |gen, width| link_ceiling_bytes_per_sec(gen, width) / 1e6;
        let dir = fixture("z170-x2");
        let t = scan(dir.path()).unwrap();
        let gen3_x2_fixture = device(&t, "nvme2n1").link_ceiling_bytes_per_sec.unwrap() / 1e6;
        let (chipset_read, chipset_write) = planned_read("z170", &["nvme2n1", "nvme3n1"]);
        let (split_read, _) = planned_read("z170-x2", &["nvme0n1", "nvme1n1"]);
        let (ssd750_read, _) = planned_read("z170", &["nvme0n1", "nvme1n1"]);
        let (micron_read, _) = planned_read("server-2numa", &["nvme0n1", "nvme1n1"]);
        vec![
            ("SM961 Gen1 x2", sm961(PcieGen::Gen1, 2), 451.9, 0.10),
            ("SM961 Gen2 x2", sm961(PcieGen::Gen2, 2), 901.7, 0.10),
            ("SM961 Gen2 x4", sm961(PcieGen::Gen2, 4), 1805.0, 0.10),
            (
                "SM961 Gen3 x2 (z170-x2 fixture)",
                gen3_x2_fixture,
                1777.0,
                0.10,
            ),
            ("Gen3 x4 ceiling", sm961(PcieGen::Gen3, 4), 3550.0, 0.10),
            (
                "2x 950 PRO chipset RAID 0 read",
                chipset_read / 1e6,
                3257.0,
                0.10,
            ),
            (
                "2x 950 PRO chipset RAID 0 write",
                chipset_write / 1e6,
                1911.0,
                0.10,
            ),
            (
                "2x 950 PRO CPU + chipset read",
                split_read / 1e6,
                4604.0,
                0.10,
            ),
            (
                "2x SSD 750 CPU lanes read (ATTO)",
                ssd750_read / 1e6,
                4717.0,
                0.10,
            ),
            (
                "2x SSD 750 CPU lanes read (IOMeter)",
                ssd750_read / 1e6,
                4461.0 * 1.048_576,
                0.10,
            ),
            (
                "2x Micron 9100 RAID 0 read",
                micron_read / 1e6,
                4575.0,
                0.10,
            ),
            // Documented exception: a cited third-party "≈3,200 MB/s" (SEEDS §2); see docs.
            (
                "RST RAID 0 saturation (cited)",
                chipset_read / 1e6,
                3200.0,
                0.12,
            ),
        ]
    }

    #[test]
    fn predictions_match_seeds_measurements() {
        let mut failures = Vec::new();
        for (case, predicted, measured, allowed) in rows() {
            let error = (predicted - measured) / measured;
            println!(
                "| {case} | {predicted:.0} | {measured:.0} | {:+.1}% |",
                error * 100.0
            );
            if error.abs() > allowed {
                failures.push(case);
            }
        }
        assert!(failures.is_empty(), "outside tolerance: {failures:?}");
    }

    #[test]
    fn the_chipset_pair_is_limited_by_the_shared_uplink() {
        let dir = fixture("z170");
        let t = scan(dir.path()).unwrap();
        let names = vec!["nvme2n1".to_string(), "nvme3n1".to_string()];
        let p = plan(&t, &names, Level::Raid0, &BTreeMap::new()).unwrap();
        assert!(matches!(
            p.read.limited_by,
            Limit::SharedUplink { members: 2, .. }
        ));
        assert!(matches!(p.write.limited_by, Limit::Device { .. }));
    }
}

mod bad_input {
    use super::*;

    #[test]
    fn missing_files_are_reported_per_device() {
        let dir = fixture("z170");
        let root = dir.path();
        fs::remove_file(root.join("block/nvme3n1/queue/logical_block_size")).unwrap();
        fs::remove_file(root.join("devices/pci0000:00/0000:00:1d.0/0000:04:00.0/vendor")).unwrap();
        let t = scan(root).unwrap();
        let nvme3 = device(&t, "nvme3n1");
        assert!(
            nvme3
                .problems
                .iter()
                .any(|p| p == "missing queue/logical_block_size"),
            "{:?}",
            nvme3.problems
        );
        assert_eq!(nvme3.logical_block_size_bytes, None);
        let nvme2 = device(&t, "nvme2n1");
        assert!(nvme2
            .problems
            .iter()
            .any(|p| p.contains("0000:04:00.0: missing or unparsable vendor")));
        assert!(device(&t, "nvme0n1").problems.is_empty());
        let (code, text) = run_to_string(&args(root), None);
        assert_eq!(code, 1);
        assert!(
            text.contains("problem   missing queue/logical_block_size"),
            "{text}"
        );
        assert!(text.contains("nvme0n1"), "{text}");
    }

    #[test]
    fn unknown_link_speed_is_a_problem_not_a_panic() {
        let dir = fixture("z170-x2");
        let root = dir.path();
        let ep = root.join("devices/pci0000:00/0000:00:1c.4/0000:02:00.0");
        fs::write(ep.join("current_link_speed"), "Unknown\n").unwrap();
        fs::write(ep.join("max_link_speed"), "Unknown speed\n").unwrap();
        let t = scan(root).unwrap();
        let d = device(&t, "nvme2n1");
        assert!(
            d.problems.iter().any(|p| p.contains("link speed Unknown")),
            "{:?}",
            d.problems
        );
        let link = d.pci_path[1].link.clone().unwrap();
        assert_eq!(link.current_speed_gts, None);
        assert_eq!(link.ceiling_bytes_per_sec, None);
        assert_eq!(d.link_ceiling_bytes_per_sec, None);
        let (code, _) = run_to_string(&args(root), None);
        assert_eq!(code, 1);
    }

    #[test]
    fn garbage_values_are_reported() {
        let dir = fixture("z170");
        let root = dir.path();
        let ep = root.join("devices/pci0000:00/0000:00:01.0/0000:01:00.0");
        fs::write(ep.join("current_link_speed"), "fast\n").unwrap();
        fs::write(ep.join("max_link_width"), "many\n").unwrap();
        fs::write(ep.join("class"), "zz\n").unwrap();
        fs::remove_file(ep.join("numa_node")).unwrap();
        fs::create_dir(ep.join("numa_node")).unwrap(); // unreadable: a directory
        let t = scan(root).unwrap();
        let d = device(&t, "nvme0n1");
        assert!(
            d.problems
                .iter()
                .any(|p| p.contains("unparsable current_link_speed")),
            "{:?}",
            d.problems
        );
        assert!(
            d.problems
                .iter()
                .any(|p| p.contains("cannot read numa_node")),
            "{:?}",
            d.problems
        );
        assert!(
            d.problems.iter().any(|p| p.contains("unparsable class")),
            "{:?}",
            d.problems
        );
    }

    #[test]
    fn a_dangling_device_link_is_reported_and_the_rest_prints() {
        let dir = fixture("z170");
        let root = dir.path();
        std::os::unix::fs::symlink(
            "../devices/pci0000:00/0000:00:1d.0/0000:09:00.0/nvme/nvme9/nvme9n1",
            root.join("block/nvme9n1"),
        )
        .unwrap();
        let t = scan(root).unwrap();
        let gone = device(&t, "nvme9n1");
        assert_eq!(gone.attachment, Attachment::Unknown);
        assert!(
            gone.problems[0].contains("does not resolve"),
            "{:?}",
            gone.problems
        );
        let (code, text) = run_to_string(&args(root), None);
        assert_eq!(code, 1);
        assert!(text.contains("devices the walk could not place"), "{text}");
        assert!(text.contains("nvme0n1  INTEL SSDPEDMW400G4"), "{text}");
    }

    #[test]
    fn a_root_that_is_not_sysfs_is_an_error() {
        let dir = tempfile::tempdir().unwrap();
        fs::write(dir.path().join("hello.txt"), "not sysfs").unwrap();
        let mut out = Vec::new();
        let err = run(&args(dir.path()), None, &mut out).unwrap_err();
        assert_eq!(err.exit_code(), 2);
        assert!(err.to_string().contains("is not a sysfs tree"), "{err}");
        let err = run(&args(Path::new("/nonexistent/sys")), None, &mut out).unwrap_err();
        assert!(err.to_string().contains("is not a sysfs tree"), "{err}");
    }

    #[test]
    fn planning_an_unknown_device_is_an_error() {
        let dir = fixture("z170");
        let mut out = Vec::new();
        let a = plan_args(dir.path(), Level::Raid0, &["nvme0n1", "nvme7n1"]);
        let err = run(&a, None, &mut out).unwrap_err();
        assert!(err.to_string().contains("nvme7n1"), "{err}");
        let a = plan_args(dir.path(), Level::Raid1, &["nvme0n1"]);
        assert!(run(&a, None, &mut out).is_err());
    }
}

mod real_sysfs {
    use super::*;

    #[test]
    fn this_machine_gives_a_report_not_an_error() {
        let t = scan(Path::new("/sys")).expect("/sys scans");
        let (code, text) = run_to_string(&args(Path::new("/sys")), None);
        assert!(code == 0 || code == 1, "{code}");
        assert!(text.starts_with("nvraid topology: /sys"), "{text}");
        for d in &t.devices {
            assert!(text.contains(&d.name), "{} missing from\n{text}", d.name);
            assert_ne!(d.attachment, Attachment::Unknown, "{d:?}");
        }
        println!("{text}");
    }
}

mod json {
    use super::*;

    #[test]
    fn json_report_has_the_documented_fields() {
        let dir = fixture("z170");
        let mut a = plan_args(dir.path(), Level::Raid0, &["nvme2n1", "nvme3n1"]);
        a.json = true;
        let (code, text) = run_to_string(&a, None);
        assert_eq!(code, 0);
        let v: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert_eq!(v["schema"], "nvraid-topology/1");
        let devices = v["topology"]["devices"].as_array().unwrap();
        let nvme2 = devices.iter().find(|d| d["name"] == "nvme2n1").unwrap();
        assert_eq!(nvme2["attachment"], "chipset");
        assert_eq!(nvme2["kind"], "nvme");
        assert_eq!(nvme2["uplink"], "dmi:pci0000:00");
        assert_eq!(nvme2["pci_path"][0]["role"], "root_port");
        assert_eq!(nvme2["pci_path"][1]["link"]["current_gen"], "gen3");
        assert_eq!(nvme2["pci_path"][1]["link"]["current_width_lanes"], 4);
        assert_eq!(v["topology"]["uplinks"][0]["kind"], "intel_dmi");
        assert_eq!(v["plan"]["level"], "raid0");
        assert_eq!(v["plan"]["read"]["limited_by"]["kind"], "shared_uplink");
        assert!(v["plan"]["read"]["bytes_per_sec"].as_f64().unwrap() > 3.5e9);
        assert!(v["advice"].as_array().unwrap().len() >= 2);
        assert!(v["measurements"].as_array().unwrap().is_empty());
    }
}

mod measure {
    use super::*;

    /// Reports fixed figures per device name; fails for "nvme3n1".
    struct FixedMeasurer;

    impl Measurer for FixedMeasurer {
        fn seq_read(&self, path: &Path, _: Duration) -> std::io::Result<Measured> {
            let name = path.file_name().unwrap().to_string_lossy();
            let (bytes_per_sec, cpu_busy_fraction) = match name.as_ref() {
                "nvme0n1" => (3.4e9, 0.2),
                "nvme1n1" => (1.1e9, 0.97),
                "nvme2n1" => (1.9e9, 0.1),
                _ => return Err(std::io::Error::other("device busy")),
            };
            Ok(Measured {
                bytes_per_sec,
                iops: bytes_per_sec / 1048576.0,
                cpu_busy_fraction,
                direct_io: true,
            })
        }
    }

    #[test]
    fn measurements_are_classified_beside_their_ceilings() {
        let dir = fixture("z170");
        let mut a = args(dir.path());
        a.measure = true;
        a.devices = vec![
            "nvme0n1".into(),
            "nvme1n1".into(),
            "nvme2n1".into(),
            "nvme3n1".into(),
        ];
        let mut out = Vec::new();
        let code = run(&a, Some(&FixedMeasurer), &mut out).unwrap();
        let text = String::from_utf8(out).unwrap();
        assert_eq!(code, 1, "nvme3n1 failed to measure");
        assert!(text.contains("nvme0n1  ≈3.4 GB/s"), "{text}");
        assert!(text.contains("predicted ≈3.5 GB/s: link-limited"), "{text}");
        assert!(text.contains("cpu-limited"), "{text}");
        assert!(text.contains("device-limited"), "{text}");
        assert!(text.contains("nvme3n1  not measured:"), "{text}");
    }

    #[test]
    fn measured_speeds_feed_the_plan() {
        let dir = fixture("z170");
        let mut a = plan_args(dir.path(), Level::Raid0, &["nvme1n1", "nvme2n1"]);
        a.measure = true;
        a.json = true;
        let mut out = Vec::new();
        run(&a, Some(&FixedMeasurer), &mut out).unwrap();
        let v: serde_json::Value = serde_json::from_slice(&out).unwrap();
        assert_eq!(v["plan"]["read"]["limited_by"]["kind"], "device");
        assert_eq!(v["plan"]["read"]["limited_by"]["source"], "measured");
        assert_eq!(v["plan"]["read"]["bytes_per_sec"].as_f64().unwrap(), 2.2e9);
        assert_eq!(v["measurements"][0]["bottleneck"], "cpu_limited");
    }

    #[test]
    fn builtin_measurer_reads_files_named_like_devices() {
        let dir = fixture("z170");
        let devs = tempfile::tempdir().unwrap();
        fs::write(devs.path().join("nvme0n1"), vec![7u8; 8 << 20]).unwrap();
        let mut a = args(dir.path());
        a.measure = true;
        a.dev_dir = devs.path().to_path_buf();
        a.devices = vec!["nvme0n1".into()];
        let (code, text) = run_to_string(&a, None);
        assert_eq!(code, 0, "{text}");
        assert!(text.contains("measured (sequential read):"), "{text}");
        assert!(text.contains("IOPS"), "{text}");
    }

    #[test]
    fn builtin_measurer_reads_a_read_only_loop_device() {
        let file = tempfile::NamedTempFile::new().unwrap();
        fs::write(file.path(), vec![1u8; 16 << 20]).unwrap();
        let attach = std::process::Command::new("losetup")
            .args(["--find", "--show", "--read-only"])
            .arg(file.path())
            .output();
        // Loop devices need root and the loop driver, which CI has; a machine
        // without them fails here with the reason rather than passing untested.
        let attach = attach.expect("losetup must be installed (util-linux)");
        assert!(
            attach.status.success(),
            "losetup could not attach a loop device: {}",
            String::from_utf8_lossy(&attach.stderr)
        );
        let loop_dev = String::from_utf8_lossy(&attach.stdout).trim().to_string();
        let result = nvraid_topology::DirectReadMeasurer::default()
            .seq_read(Path::new(&loop_dev), Duration::from_millis(300));
        let _ = std::process::Command::new("losetup")
            .args(["-d", &loop_dev])
            .status();
        let measured = result.unwrap();
        assert!(measured.bytes_per_sec > 0.0);
        let bottleneck = nvraid_topology::measure::classify(&measured, None);
        assert_ne!(bottleneck, Bottleneck::LinkLimited);
    }
}

/// NVMe/TCP members are planned as NBD ones are, by the link their route
/// uses (loopback here: no rate, so the ceiling stays unknown), and
/// refused without --plan, naming the form.
#[test]
fn nvme_tcp_members_are_planned_by_their_network_link() {
    let dir = fixture("z170");
    let members = [
        "nvme+tcp://127.0.0.1/nqn.2026-11.test:a",
        "nvme+tcp://127.0.0.1:4421/nqn.2026-11.test:b/2",
    ];
    let (code, text) = run_to_string(&plan_args(dir.path(), Level::Raid0, &members), None);
    assert_eq!(code, 0, "{text}");
    assert!(
        text.contains(
            "plan: RAID 0 of nvme+tcp://127.0.0.1/nqn.2026-11.test:a, \
             nvme+tcp://127.0.0.1:4421/nqn.2026-11.test:b/2"
        ),
        "{text}"
    );
    assert!(text.contains("has no modelled link"), "{text}");
    let mut unplanned = common::args(dir.path());
    unplanned.devices = members.iter().map(|m| m.to_string()).collect();
    let err = run(&unplanned, None, &mut Vec::new())
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("nvme+tcp://") && err.contains("--plan"),
        "{err}"
    );
}
