//! The candidates: which chunk sizes tune tries, and in which order each
//! round visits them.

use crate::Error;
use nvraid_bench::units::parse_size_bytes;

/// Chunk sizes tried without `--chunks`: 4 KiB to 1 MiB, powers of two.
pub const DEFAULT_CHUNKS: [u64; 9] = [
    4 << 10,
    8 << 10,
    16 << 10,
    32 << 10,
    64 << 10,
    128 << 10,
    256 << 10,
    512 << 10,
    1 << 20,
];

/// The chunk sizes md and nvraid accept.
pub const CHUNK_BYTES_MIN: u64 = 4 << 10;
/// The largest chunk tune tries.
pub const CHUNK_BYTES_MAX: u64 = 4 << 20;

/// Reads `--chunks`: each entry a power of two from 4K to 4M. Sorted, each
/// size once; [`DEFAULT_CHUNKS`] when none is given.
pub fn parse_chunks(text: Option<&str>) -> Result<Vec<u64>, Error> {
    let Some(text) = text else {
        return Ok(DEFAULT_CHUNKS.to_vec());
    };
    let mut chunks = Vec::new();
    for entry in text.split(',').map(str::trim) {
        if entry.is_empty() {
            return Err(Error::EmptyChunk { text: text.into() });
        }
        let bytes = parse_size_bytes(entry).map_err(Error::ChunkText)?;
        if !bytes.is_power_of_two() {
            return Err(Error::NotPowerOfTwo {
                entry: entry.into(),
                bytes,
            });
        }
        if !(CHUNK_BYTES_MIN..=CHUNK_BYTES_MAX).contains(&bytes) {
            return Err(Error::ChunkRange {
                entry: entry.into(),
            });
        }
        chunks.push(bytes);
    }
    chunks.sort_unstable();
    chunks.dedup();
    Ok(chunks)
}

/// The order round `round` (from 0) visits `count` candidates in, as
/// indices: ascending in even rounds, descending in odd ones, so that a
/// slow spell of the machine, or a drift over the run, does not fall on
/// the same chunks each time.
pub fn round_order(round: u32, count: usize) -> Vec<usize> {
    match round % 2 {
        0 => (0..count).collect(),
        _ => (0..count).rev().collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const K: u64 = 1024;

    #[test]
    fn chunks_are_powers_of_two_from_4k_to_4m() {
        assert_eq!(
            parse_chunks(Some("64k, 16K,512k,16k")).unwrap(),
            vec![16 * K, 64 * K, 512 * K]
        );
        assert_eq!(parse_chunks(Some("4m,4k")).unwrap(), vec![4 * K, 4096 * K]);
        assert_eq!(parse_chunks(None).unwrap(), DEFAULT_CHUNKS.to_vec());
        for (bad, message) in [
            ("48k", "--chunks: 48k (49152 bytes) is not a power of two"),
            ("2k", "--chunks: 2k is outside 4K-4M"),
            ("8M", "--chunks: 8M is outside 4K-4M"),
            ("64k,,128k", "--chunks \"64k,,128k\": an empty entry"),
        ] {
            assert_eq!(parse_chunks(Some(bad)).unwrap_err().to_string(), message);
        }
        let error = parse_chunks(Some("abc")).unwrap_err().to_string();
        assert!(
            error.starts_with("--chunks: cannot read \"abc\""),
            "{error}"
        );
    }

    #[test]
    fn rounds_go_up_then_down() {
        assert_eq!(round_order(0, 4), [0, 1, 2, 3]);
        assert_eq!(round_order(1, 4), [3, 2, 1, 0]);
        assert_eq!(round_order(2, 4), [0, 1, 2, 3]);
        assert_eq!(round_order(3, 1), [0]);
        assert!(round_order(0, 0).is_empty());
    }
}
