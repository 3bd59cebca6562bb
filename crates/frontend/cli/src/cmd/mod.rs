//! One module per subcommand.

pub mod assemble;
pub mod bench;
pub mod config;
pub mod create;
pub mod detail;
pub mod examine;
pub mod grow;
pub mod grow_online;
pub mod grow_policy;
pub mod io;
pub mod manage;
pub mod manual;
pub mod online;
pub mod report;
pub mod run;
pub mod serve;
pub mod topology;
pub mod tune;
pub mod ublk;

use nvraid_member::{format_size, parse_size};

/// How commands that only read assemble an array: degraded allowed.
pub fn read_only(direct: bool) -> nvraid_array::AssembleOptions {
    nvraid_array::AssembleOptions {
        writable: false,
        direct,
        allow_degraded: true,
    }
}

/// How commands that write and repair assemble an array: degraded allowed.
pub fn writable(direct: bool) -> nvraid_array::AssembleOptions {
    nvraid_array::AssembleOptions {
        writable: true,
        direct,
        allow_degraded: true,
    }
}

/// clap value parser for sizes (`64K`, `1M`, `8G`, plain bytes).
pub fn size_arg(text: &str) -> Result<u64, String> {
    parse_size(text).map_err(|e| e.to_string())
}

/// `1073741824 (1 GiB)`.
pub fn bytes_text(bytes: u64) -> String {
    format!("{bytes} ({})", format_size(bytes))
}

/// Seconds since the epoch as UTC `YYYY-MM-DD hh:mm:ss`.
pub fn time_text(seconds: u64) -> String {
    let days = seconds / 86_400;
    let rem = seconds % 86_400;
    let (y, m, d) = civil_from_days(days as i64);
    format!(
        "{y:04}-{m:02}-{d:02} {:02}:{:02}:{:02} UTC",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

/// Days since 1970-01-01 to a proleptic Gregorian date (Howard Hinnant's
/// well-known algorithm, written out here).
fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let y = yoe + era * 400 + i64::from(m <= 2);
    (y, m, d)
}

#[cfg(test)]
mod tests {
    #[test]
    fn formats_times() {
        assert_eq!(super::time_text(0), "1970-01-01 00:00:00 UTC");
        assert_eq!(super::time_text(1_795_325_480), "2026-11-22 05:31:20 UTC");
    }
}
