//! Recognising data a member already holds, so `create` does not overwrite a
//! filesystem or another array by accident.

use nvraid_member::Member;
use nvraid_metadata::{Superblock, MAGIC};

/// How much of the start of a member is inspected.
const HEAD_BYTES: usize = 68 * 1024;

/// Describe the first recognised signature on `member`, if any.
pub fn detect(member: &Member) -> std::io::Result<Option<String>> {
    let size = member.size_bytes();
    let head_len = (HEAD_BYTES as u64).min(size) as usize;
    let mut head = vec![0u8; head_len];
    member.read_at(&mut head, 0)?;
    if let Some(found) = detect_head(&head) {
        return Ok(Some(found));
    }
    detect_tail(member)
}

fn at(head: &[u8], offset: usize, magic: &[u8]) -> bool {
    head.get(offset..offset + magic.len()) == Some(magic)
}

fn detect_head(head: &[u8]) -> Option<String> {
    if at(head, 4096, &MAGIC.to_le_bytes()) {
        return Some(md_description(&head[4096..], "1.2"));
    }
    if at(head, 0, &MAGIC.to_le_bytes()) {
        return Some(md_description(head, "1.1"));
    }
    let known: [(usize, &[u8], &str); 9] = [
        (1080, &[0x53, 0xef], "an ext2/3/4 filesystem"),
        (0, b"XFSB", "an XFS filesystem"),
        (65600, b"_BHRfS_M", "a btrfs filesystem"),
        (4086, b"SWAPSPACE2", "a swap area"),
        (0, b"LUKS\xba\xbe", "a LUKS encrypted volume"),
        (3, b"NTFS    ", "an NTFS filesystem"),
        (512, b"EFI PART", "a GPT partition table"),
        (82, b"FAT32   ", "a FAT32 filesystem"),
        (54, b"FAT1", "a FAT filesystem"),
    ];
    for (offset, magic, what) in known {
        if at(head, offset, magic) {
            return Some(what.to_string());
        }
    }
    if at(head, 510, &[0x55, 0xaa]) && head[446..510].iter().any(|&b| b != 0) {
        return Some("an MBR partition table".to_string());
    }
    None
}

fn md_description(bytes: &[u8], version: &str) -> String {
    match Superblock::decode(bytes) {
        Ok(sb) => format!(
            "an md v{version} superblock (array {}, name {:?}, level {})",
            nvraid_metadata::format_uuid(&sb.set_uuid),
            sb.name(),
            sb.level
        ),
        Err(e) => format!("an md v{version} superblock ({e})"),
    }
}

/// md v0.90 and v1.0 keep their superblock near the end of the device.
fn detect_tail(member: &Member) -> std::io::Result<Option<String>> {
    let size = member.size_bytes();
    if size < 128 * 1024 {
        return Ok(None);
    }
    // v1.0: 8 KiB before the end, rounded down to 4 KiB. v0.90: in the last
    // 64 KiB-aligned 64 KiB block.
    let v10 = (size - 8192) & !4095;
    let v090 = (size & !65535) - 65536;
    let mut block = vec![0u8; 4096];
    for (offset, what) in [
        (v10, "an md v1.0 superblock"),
        (v090, "an md v0.90 superblock"),
    ] {
        member.read_at(&mut block, offset)?;
        if at(&block, 0, &MAGIC.to_le_bytes()) {
            return Ok(Some(what.to_string()));
        }
    }
    Ok(None)
}
