//! Superblocks written by the Linux kernel (tests/fixtures/md) decode with a
//! valid checksum and the values mdadm --examine printed, and re-encode to
//! the same bytes.

use nvraid_metadata::{Role, Superblock, RESYNC_CLEAN, SUPER_OFFSET_BYTES};
use std::path::PathBuf;
use std::process::Command;

fn fixture_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../../tests/fixtures/md")
}

/// The first 8 KiB of a decompressed member image.
fn member_head(array: &str, disk: u32) -> Vec<u8> {
    let path = fixture_dir().join(array).join(format!("disk{disk}.img.xz"));
    let out = Command::new("xz")
        .arg("-dc")
        .arg(&path)
        .output()
        .expect("xz must be installed (apt-get install xz-utils)");
    assert!(out.status.success(), "xz failed on {}", path.display());
    out.stdout[..8192].to_vec()
}

fn decode(array: &str, disk: u32) -> (Superblock, Vec<u8>) {
    let head = member_head(array, disk);
    let raw = head[SUPER_OFFSET_BYTES as usize..SUPER_OFFSET_BYTES as usize + 4096].to_vec();
    (
        Superblock::decode(&raw).expect("kernel superblock decodes"),
        raw,
    )
}

#[test]
fn raid0_fixture_superblocks() {
    let expected_csums = [0x444ec250u32, 0xbc5b248d, 0x1833f306, 0xfa7d16e3];
    for disk in 0..4 {
        let (sb, raw) = decode("raid0-4d-64k", disk);
        assert_eq!(sb.level, 0);
        assert_eq!(sb.raid_disks, 4);
        assert_eq!(sb.chunk_sectors, 128);
        assert_eq!(sb.data_offset_sectors, 2048);
        assert_eq!(sb.data_size_sectors, 30720);
        assert_eq!(sb.role(), Role::Active(disk as u16));
        assert_eq!(sb.events, 0);
        assert_eq!(sb.resync_offset, RESYNC_CLEAN);
        assert_eq!(sb.name(), "mdvm:raid0-4d-64k");
        assert_eq!(
            nvraid_metadata::format_uuid(&sb.set_uuid),
            "8c4c13b5:6e3847c8:0dc50d99:17702a54"
        );
        assert_eq!(
            u32::from_le_bytes(raw[216..220].try_into().unwrap()),
            expected_csums[disk as usize]
        );
        let mut again = vec![0u8; 4096];
        sb.encode(&mut again).unwrap();
        assert_eq!(
            again[..sb.encoded_len()],
            raw[..sb.encoded_len()],
            "re-encode of disk {disk}"
        );
    }
}

#[test]
fn raid10_and_raid1_fixture_superblocks() {
    let (sb, _) = decode("raid10-n2-4d-64k", 2);
    assert_eq!(
        (sb.level, sb.layout, sb.size_sectors, sb.events),
        (10, 258, 30720, 3)
    );
    assert_eq!(sb.role(), Role::Active(2));
    let (sb, _) = decode("raid1-2d", 1);
    assert_eq!(
        (sb.level, sb.layout, sb.chunk_sectors, sb.events),
        (1, 0, 0, 4)
    );
    assert_eq!(sb.role(), Role::Active(1));
    assert!(sb.is_clean());
}

#[test]
fn corrupted_kernel_superblock_is_refused() {
    let (_, mut raw) = decode("raid1-2d", 0);
    raw[100] ^= 1;
    assert!(matches!(
        Superblock::decode(&raw),
        Err(nvraid_metadata::DecodeError::BadChecksum { .. })
    ));
    let (_, mut raw) = decode("raid1-2d", 0);
    raw[4] = 2;
    assert_eq!(
        Superblock::decode(&raw),
        Err(nvraid_metadata::DecodeError::UnsupportedVersion(2))
    );
    let (_, mut raw) = decode("raid1-2d", 0);
    raw[0] = 0;
    assert!(matches!(
        Superblock::decode(&raw),
        Err(nvraid_metadata::DecodeError::BadMagic { .. })
    ));
}

/// Like the kernel's super_1_load: a superblock with a feature bit the
/// kernel does not define, or a non-zero reserved byte, is refused even with
/// a correct checksum, and names what is wrong.
#[test]
fn unknown_feature_bits_and_reserved_bytes_are_refused() {
    use nvraid_metadata::{checksum, DecodeError};
    let (_, sb_bytes) = decode("raid1-2d", 0);
    let resealed = |edit: &dyn Fn(&mut Vec<u8>)| {
        let mut bytes = sb_bytes.to_vec();
        edit(&mut bytes);
        let len = 256 + 2 * u32::from_le_bytes(bytes[220..224].try_into().unwrap()) as usize;
        let csum = checksum(&bytes[..len]);
        bytes[216..220].copy_from_slice(&csum.to_le_bytes());
        bytes
    };
    let unknown = resealed(&|b| b[8..12].copy_from_slice(&(1u32 << 20).to_le_bytes()));
    assert_eq!(
        Superblock::decode(&unknown),
        Err(DecodeError::UnknownFeatures(1 << 20))
    );
    for at in [12usize, 15, 224, 255] {
        let reserved = resealed(&|b| b[at] = 1);
        assert_eq!(
            Superblock::decode(&reserved),
            Err(DecodeError::ReservedNotZero(at)),
            "byte {at}"
        );
    }
    // The untouched superblock still decodes (the edits, not the resealing,
    // are what is refused).
    assert!(Superblock::decode(&resealed(&|_| {})).is_ok());
}

/// A kernel superblock with one sector field set past what 64 bits of bytes
/// count, its checksum made valid: refused, naming the field (every user of
/// a decoded superblock multiplies these by 512 without overflow).
#[test]
fn a_sector_count_past_64_bits_of_bytes_is_refused_naming_the_field() {
    use nvraid_metadata::DecodeError;
    let (sb, raw) = decode("raid0-4d-64k", 0);
    let patched = |at: usize, value: u64| {
        let mut out = raw.clone();
        out[at..at + 8].copy_from_slice(&value.to_le_bytes());
        let csum = nvraid_metadata::checksum(&out[..sb.encoded_len()]);
        out[216..220].copy_from_slice(&csum.to_le_bytes());
        Superblock::decode(&out)
    };
    for (field, at) in [("size", 80), ("data_offset", 128), ("data_size", 136)] {
        for value in [u64::MAX / 512 + 1, 1 << 63, u64::MAX] {
            let e = patched(at, value).unwrap_err();
            assert_eq!(
                e,
                DecodeError::SectorsOverflow {
                    field,
                    sectors: value
                }
            );
            assert!(e.to_string().contains(field), "{e}");
        }
        // Large but countable: decoded.
        assert!(patched(at, u64::MAX / 1024).is_ok(), "{field}");
    }
    // Each fits, but the data area ends past 2^64 bytes.
    let mut out = raw.clone();
    out[128..136].copy_from_slice(&(u64::MAX / 512).to_le_bytes());
    out[136..144].copy_from_slice(&(u64::MAX / 512).to_le_bytes());
    let csum = nvraid_metadata::checksum(&out[..sb.encoded_len()]);
    out[216..220].copy_from_slice(&csum.to_le_bytes());
    assert!(matches!(
        Superblock::decode(&out),
        Err(DecodeError::DataAreaOverflow { .. })
    ));
}

/// A kernel superblock whose data_offset is moved into the superblock's own
/// sectors (its checksum made valid): refused on decode, naming the field,
/// and the same superblock is refused on encode (a write to the data area
/// would overwrite the superblock).
#[test]
fn a_data_offset_inside_the_superblock_is_refused_naming_the_field() {
    use nvraid_metadata::DecodeError;
    let (sb, raw) = decode("raid1-2d", 0);
    let superblock_end = 8 + (sb.encoded_len() as u64).div_ceil(512);
    for data_offset in [0, 8, superblock_end - 1] {
        let mut out = raw.clone();
        out[128..136].copy_from_slice(&data_offset.to_le_bytes());
        let csum = nvraid_metadata::checksum(&out[..sb.encoded_len()]);
        out[216..220].copy_from_slice(&csum.to_le_bytes());
        let e = Superblock::decode(&out).unwrap_err();
        assert_eq!(
            e,
            DecodeError::DataOverlapsSuperblock {
                data_offset,
                superblock_end
            }
        );
        assert!(e.to_string().contains("data_offset"), "{e}");
        let mut bad = sb.clone();
        bad.data_offset_sectors = data_offset;
        assert_eq!(bad.encode(&mut vec![0u8; 4096]), Err(e));
    }
    // Right behind the superblock is allowed.
    let mut edge = sb.clone();
    edge.data_offset_sectors = superblock_end;
    let mut out = vec![0u8; 4096];
    edge.encode(&mut out).unwrap();
    assert_eq!(Superblock::decode(&out), Ok(edge));
}
