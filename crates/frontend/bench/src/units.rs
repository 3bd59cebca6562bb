//! Sizes and durations as people type them, and as reports print them.
//!
//! Sizes follow fio's convention for block sizes: a bare number is bytes and
//! every suffix is a power of two (`4k` = `4K` = `4KiB` = 4096 bytes, `1M` =
//! 1 MiB, `8G` = 8 GiB). Durations take `us`, `ms`, `s`, `m`, `h`; a bare
//! number is seconds, as with fio's `runtime=`.
//!
//! Rates in reports use both families: MB/s is 10^6 bytes per second (the
//! unit of CrystalDiskMark, ATTO and AS SSD), MiB/s is 2^20.

use std::time::Duration;

/// Bytes in a decimal megabyte (MB/s in reports).
pub const MB_BYTES: f64 = 1_000_000.0;
/// Bytes in a binary mebibyte (MiB/s in reports).
pub const MIB_BYTES: f64 = 1_048_576.0;

/// A size or duration string that could not be read.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("cannot read {text:?} as a {what}: {why}")]
pub struct ParseError {
    /// The text given.
    pub text: String,
    /// "size" or "duration".
    pub what: &'static str,
    /// What was wrong with it.
    pub why: &'static str,
}

fn parse_error(text: &str, what: &'static str, why: &'static str) -> ParseError {
    ParseError {
        text: text.to_string(),
        what,
        why,
    }
}

/// Splits `"4KiB"` into `(4, "kib")`: leading digits and a lower-cased suffix.
fn split_number(text: &str) -> Option<(u64, String)> {
    let text = text.trim();
    let digits_end = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    let number = text[..digits_end].parse::<u64>().ok()?;
    Some((number, text[digits_end..].trim().to_ascii_lowercase()))
}

/// Parses a size in bytes: `512`, `4k`, `4K`, `4KiB`, `1M`, `1MiB`, `8G`, `1T`.
///
/// Every suffix is binary (fio's default for `bs=` and `size=`); a trailing
/// `b`, `ib` or `iB` is accepted and changes nothing. The same parser reads
/// member sizes (`mem:8G`), so one spelling works everywhere.
pub fn parse_size_bytes(text: &str) -> Result<u64, ParseError> {
    nvraid_member::parse_size(text).map_err(|e| parse_error(text, "size", e.reason))
}

/// Parses a duration: `10s`, `500ms`, `2m`, `1h`, `250us`; a bare number is
/// seconds.
pub fn parse_duration(text: &str) -> Result<Duration, ParseError> {
    let (number, suffix) = split_number(text)
        .ok_or_else(|| parse_error(text, "duration", "expected a number first"))?;
    let duration = match suffix.as_str() {
        "" | "s" | "sec" => Duration::from_secs(number),
        "ms" | "msec" => Duration::from_millis(number),
        "us" | "usec" => Duration::from_micros(number),
        "m" | "min" => Duration::from_secs(number.saturating_mul(60)),
        "h" => Duration::from_secs(number.saturating_mul(3600)),
        _ => {
            return Err(parse_error(
                text,
                "duration",
                "unknown suffix (use us, ms, s, m, h)",
            ))
        }
    };
    Ok(duration)
}

/// Formats a byte count the short way fio and CrystalDiskMark label block
/// sizes: `512`, `4K`, `128K`, `1M`, `64M` (binary units, exact only).
pub fn format_size(bytes: u64) -> String {
    const SUFFIXES: [(u32, &str); 4] = [(40, "T"), (30, "G"), (20, "M"), (10, "K")];
    for (shift, suffix) in SUFFIXES {
        let unit = 1u64 << shift;
        if bytes >= unit && bytes.is_multiple_of(unit) {
            return format!("{}{}", bytes / unit, suffix);
        }
    }
    bytes.to_string()
}

/// Formats a duration compactly for job names and tables: `5s`, `500ms`.
pub fn format_duration(duration: Duration) -> String {
    let ms = duration.as_millis();
    if ms.is_multiple_of(1000) {
        format!("{}s", ms / 1000)
    } else {
        format!("{ms}ms")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_use_binary_suffixes() {
        assert_eq!(parse_size_bytes("512").unwrap(), 512);
        assert_eq!(parse_size_bytes("4k").unwrap(), 4096);
        assert_eq!(parse_size_bytes("4K").unwrap(), 4096);
        assert_eq!(parse_size_bytes("4KiB").unwrap(), 4096);
        assert_eq!(parse_size_bytes("1M").unwrap(), 1 << 20);
        assert_eq!(parse_size_bytes("1MiB").unwrap(), 1 << 20);
        assert_eq!(parse_size_bytes("8G").unwrap(), 8 << 30);
        assert_eq!(parse_size_bytes("2t").unwrap(), 2 << 40);
        assert_eq!(parse_size_bytes("16MB").unwrap(), 16 << 20);
    }

    #[test]
    fn bad_sizes_are_refused() {
        for text in ["", "k", "4x", "-1", "1.5M", "99999999999P"] {
            let err = parse_size_bytes(text).unwrap_err();
            assert_eq!(err.text, text);
            assert_eq!(err.what, "size");
        }
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration("10s").unwrap(), Duration::from_secs(10));
        assert_eq!(parse_duration("10").unwrap(), Duration::from_secs(10));
        assert_eq!(parse_duration("500ms").unwrap(), Duration::from_millis(500));
        assert_eq!(parse_duration("2m").unwrap(), Duration::from_secs(120));
        assert_eq!(parse_duration("1h").unwrap(), Duration::from_secs(3600));
        assert_eq!(parse_duration("250us").unwrap(), Duration::from_micros(250));
        assert!(parse_duration("5d").is_err());
        assert!(parse_duration("s").is_err());
    }

    #[test]
    fn formatting_round_trips() {
        for bytes in [512u64, 4096, 131072, 1 << 20, 64 << 20, 8 << 30, 12 << 20] {
            assert_eq!(parse_size_bytes(&format_size(bytes)).unwrap(), bytes);
        }
        assert_eq!(format_size(4096), "4K");
        assert_eq!(format_size(1536), "1536");
        assert_eq!(format_duration(Duration::from_millis(1500)), "1500ms");
        assert_eq!(format_duration(Duration::from_secs(5)), "5s");
    }
}
