//! Human sizes: `512`, `4k`, `64KiB`, `1M`, `8G`, `2T` (binary multiples).

/// Why a size string was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid size {input:?}: {reason}")]
pub struct SizeError {
    pub input: String,
    pub reason: &'static str,
}

/// Parse a size with an optional binary suffix (K, M, G, T, P; `KiB`, `KB`
/// and `k` all mean 1024). A bare number is bytes.
pub fn parse_size(input: &str) -> Result<u64, SizeError> {
    let err = |reason| SizeError {
        input: input.to_string(),
        reason,
    };
    let text = input.trim();
    let digits_end = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    if digits_end == 0 {
        return Err(err("expected a number"));
    }
    let number: u64 = text[..digits_end]
        .parse()
        .map_err(|_| err("number too large"))?;
    let suffix = text[digits_end..].trim().to_ascii_lowercase();
    let shift = match suffix.trim_end_matches("ib").trim_end_matches('b') {
        "" => 0,
        "k" => 10,
        "m" => 20,
        "g" => 30,
        "t" => 40,
        "p" => 50,
        _ => return Err(err("unknown suffix (use K, M, G, T or P)")),
    };
    number
        .checked_mul(1u64 << shift)
        .ok_or_else(|| err("size overflows 64 bits"))
}

/// Format bytes with the largest binary unit that divides them exactly,
/// else with one decimal (`64 KiB`, `1.5 GiB`).
pub fn format_size(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["KiB", "MiB", "GiB", "TiB", "PiB"];
    let mut unit = None;
    for (index, name) in UNITS.iter().enumerate() {
        if bytes >= 1u64 << (10 * (index + 1)) {
            unit = Some((index + 1, *name));
        }
    }
    match unit {
        None => format!("{bytes} B"),
        Some((power, name)) if bytes.is_multiple_of(1u64 << (10 * power)) => {
            format!("{} {name}", bytes >> (10 * power))
        }
        Some((power, name)) => {
            format!("{:.1} {name}", bytes as f64 / (1u64 << (10 * power)) as f64)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_sizes() {
        assert_eq!(parse_size("512"), Ok(512));
        assert_eq!(parse_size("4k"), Ok(4096));
        assert_eq!(parse_size("64KiB"), Ok(65536));
        assert_eq!(parse_size("1M"), Ok(1 << 20));
        assert_eq!(parse_size("8G"), Ok(8 << 30));
        assert_eq!(parse_size("2TB"), Ok(2 << 40));
        assert!(parse_size("").is_err());
        assert!(parse_size("1X").is_err());
        assert!(parse_size("-1").is_err());
        assert!(parse_size("99999999999P").is_err());
    }

    #[test]
    fn formats_sizes() {
        assert_eq!(format_size(100), "100 B");
        assert_eq!(format_size(65536), "64 KiB");
        assert_eq!(format_size(3 << 29), "1.5 GiB");
        assert_eq!(format_size(60 << 20), "60 MiB");
    }
}
