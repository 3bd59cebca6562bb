//! Numbers, sizes, rates and dates as the page writes them.

/// Bytes in a decimal megabyte, the unit of nvraid's MB/s.
pub(crate) const MB: f64 = 1e6;

/// `value` with `decimals` decimals and thousands separated by commas:
/// `25,296.90`.
pub(crate) fn grouped(value: f64, decimals: usize) -> String {
    let text = format!("{:.*}", decimals, value.abs());
    let (whole, fraction) = text.split_once('.').unwrap_or((&text, ""));
    let mut out = String::new();
    for (i, digit) in whole.chars().enumerate() {
        if i > 0 && (whole.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(digit);
    }
    if !fraction.is_empty() {
        out.push('.');
        out.push_str(fraction);
    }
    if value < 0.0 && out.chars().any(|c| c.is_ascii_digit() && c != '0') {
        out.insert(0, '-');
    }
    out
}

/// A count in at most four characters or so: `950`, `81.2k`, `1.55M`.
pub(crate) fn compact(value: f64) -> String {
    let (scaled, suffix) = if value >= 1e9 {
        (value / 1e9, "G")
    } else if value >= 1e6 {
        (value / 1e6, "M")
    } else if value >= 1e3 {
        (value / 1e3, "k")
    } else {
        (value, "")
    };
    format!("{}{suffix}", significant(scaled, 3))
}

/// `value` to `digits` significant digits, without trailing zeros.
pub(crate) fn significant(value: f64, digits: i32) -> String {
    if value == 0.0 || !value.is_finite() {
        return "0".to_string();
    }
    let magnitude = value.abs().log10().floor() as i32;
    let decimals = (digits - 1 - magnitude).max(0) as usize;
    let text = format!("{value:.decimals$}");
    if text.contains('.') {
        text.trim_end_matches('0').trim_end_matches('.').to_string()
    } else {
        text
    }
}

/// A size in binary units as nvraid names transfer and chunk sizes:
/// `512B`, `4K`, `64M`, `1.5M`.
pub(crate) fn size(bytes: f64) -> String {
    const UNITS: [(f64, &str); 4] = [
        (1099511627776.0, "T"),
        (1073741824.0, "G"),
        (1048576.0, "M"),
        (1024.0, "K"),
    ];
    for (unit, suffix) in UNITS {
        if bytes >= unit {
            return format!("{}{suffix}", significant(bytes / unit, 3));
        }
    }
    format!("{}B", significant(bytes, 3))
}

/// A rate in decimal units: `558 MB/s`, `3.54 GB/s`.
pub(crate) fn rate(bytes_per_sec: f64) -> String {
    if bytes_per_sec >= 1e9 {
        format!("{} GB/s", significant(bytes_per_sec / 1e9, 3))
    } else {
        format!("{} MB/s", significant(bytes_per_sec / MB, 3))
    }
}

/// A Unix time as `2025-11-23 05:58 UTC`.
pub(crate) fn utc(unix_secs: u64) -> String {
    let days = (unix_secs / 86_400) as i64;
    let secs_of_day = unix_secs % 86_400;
    let (year, month, day) = civil_date(days);
    format!(
        "{year:04}-{month:02}-{day:02} {:02}:{:02} UTC",
        secs_of_day / 3600,
        secs_of_day / 60 % 60
    )
}

/// The proleptic Gregorian date `days` after 1970-01-01, counting in
/// 400-year eras that start on 1 March (so leap days end a year).
fn civil_date(days: i64) -> (i64, u32, u32) {
    let shifted = days + 719_468; // days from 0000-03-01
    let era = shifted.div_euclid(146_097);
    let day_of_era = shifted.rem_euclid(146_097);
    let year_of_era =
        (day_of_era - day_of_era / 1460 + day_of_era / 36_524 - day_of_era / 146_096) / 365;
    let day_of_year = day_of_era - (365 * year_of_era + year_of_era / 4 - year_of_era / 100);
    let month_index = (5 * day_of_year + 2) / 153; // 0 = March
    let day = (day_of_year - (153 * month_index + 2) / 5 + 1) as u32;
    let month = if month_index < 10 {
        month_index + 3
    } else {
        month_index - 9
    } as u32;
    let year = year_of_era + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grouping() {
        assert_eq!(grouped(25296.896, 2), "25,296.90");
        assert_eq!(grouped(1204190.0, 0), "1,204,190");
        assert_eq!(grouped(999.0, 0), "999");
        assert_eq!(grouped(-1234.5, 1), "-1,234.5");
    }

    #[test]
    fn compact_counts() {
        assert_eq!(compact(950.0), "950");
        assert_eq!(compact(81_234.0), "81.2k");
        assert_eq!(compact(1_551_793.3), "1.55M");
    }

    #[test]
    fn sizes_and_rates() {
        assert_eq!(size(512.0), "512B");
        assert_eq!(size(4096.0), "4K");
        assert_eq!(size(64.0 * 1048576.0), "64M");
        assert_eq!(rate(558e6), "558 MB/s");
        assert_eq!(rate(3_544_615_384.6), "3.54 GB/s");
    }

    #[test]
    fn dates() {
        assert_eq!(utc(0), "1970-01-01 00:00 UTC");
        assert_eq!(utc(951_782_400), "2000-02-29 00:00 UTC");
        assert_eq!(utc(1_763_877_480), "2025-11-23 05:58 UTC");
    }
}
