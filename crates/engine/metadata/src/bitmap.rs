//! md's write-intent bitmap superblock (the part nvraid touches today).
//!
//! An internal bitmap lives `bitmap_offset` sectors (signed) from the md
//! superblock: a 256-byte header, then the bits. Header fields (little
//! endian): magic `bitm` (0x6d746962) at 0, version at 4, array UUID at 8,
//! events at 24, events_cleared at 32, sync_size at 40, state at 48, chunk
//! size at 52, daemon sleep at 56, write-behind at 60, sectors reserved at
//! 64, nodes at 68, cluster name at 72. There is no checksum.
//!
//! nvraid does not maintain the bits yet. Before its first write to an array
//! with a bitmap it sets the header's STALE state bit, which tells md that
//! the bitmap does not cover the writes made since: md then marks every
//! region dirty and resyncs all of it at its next assembly, instead of
//! trusting bits that missed nvraid's writes (a re-added member would
//! otherwise be recovered from those bits alone).

/// `bitm`.
pub const MAGIC: u32 = 0x6d74_6962;
/// The header's length.
pub const HEADER_BYTES: usize = 256;
/// md's BITMAP_STALE state bit: the bits do not cover every write.
pub const STATE_STALE: u32 = 1 << 1;
const STATE_AT: usize = 48;

/// Why bytes are not a bitmap header nvraid can mark.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum BitmapError {
    #[error("no md bitmap header (magic {found:#010x}, expected {MAGIC:#010x})")]
    BadMagic { found: u32 },
    #[error("md bitmap belongs to array {found}, not this array")]
    OtherArray { found: String },
    #[error("buffer of {0} bytes is too short for the bitmap header")]
    Short(usize),
}

fn check(header: &[u8], set_uuid: &[u8; 16]) -> Result<(), BitmapError> {
    if header.len() < HEADER_BYTES {
        return Err(BitmapError::Short(header.len()));
    }
    let magic = u32::from_le_bytes(header[0..4].try_into().expect("4 bytes"));
    if magic != MAGIC {
        return Err(BitmapError::BadMagic { found: magic });
    }
    if &header[8..24] != set_uuid {
        let uuid: [u8; 16] = header[8..24].try_into().expect("16 bytes");
        return Err(BitmapError::OtherArray {
            found: crate::format_uuid(&uuid),
        });
    }
    Ok(())
}

/// The header's state word, after checking it belongs to `set_uuid`.
pub fn state(header: &[u8], set_uuid: &[u8; 16]) -> Result<u32, BitmapError> {
    check(header, set_uuid)?;
    Ok(u32::from_le_bytes(
        header[STATE_AT..STATE_AT + 4].try_into().expect("4 bytes"),
    ))
}

/// Set the STALE bit in a header of the array `set_uuid`; every other byte
/// stays as it was.
pub fn mark_stale(header: &mut [u8], set_uuid: &[u8; 16]) -> Result<(), BitmapError> {
    let state = state(header, set_uuid)? | STATE_STALE;
    header[STATE_AT..STATE_AT + 4].copy_from_slice(&state.to_le_bytes());
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn marks_only_the_state_word() {
        let uuid = [3u8; 16];
        let mut header = vec![0xa5u8; 512];
        header[0..4].copy_from_slice(&MAGIC.to_le_bytes());
        header[8..24].copy_from_slice(&uuid);
        header[48..52].copy_from_slice(&0u32.to_le_bytes());
        let before = header.clone();
        mark_stale(&mut header, &uuid).unwrap();
        assert_eq!(state(&header, &uuid), Ok(STATE_STALE));
        let changed: Vec<usize> = (0..512).filter(|&i| header[i] != before[i]).collect();
        assert_eq!(changed, vec![48]);
        assert!(matches!(
            mark_stale(&mut header, &[4u8; 16]),
            Err(BitmapError::OtherArray { .. })
        ));
        header[0] = 0;
        assert!(matches!(
            state(&header, &uuid),
            Err(BitmapError::BadMagic { .. })
        ));
    }
}
