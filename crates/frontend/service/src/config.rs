//! `nvraid.conf`: which arrays this machine starts at boot, and how.
//!
//! Line-oriented, in mdadm.conf's manner: `#` starts a comment, blank lines
//! are skipped, keywords are in capitals.
//!
//! ```text
//! ARRAY <name> UUID=<uuid> [export=ublk|ublk:<id>|nbd:<address>|none] [degraded-after=<seconds>] [metrics=<host:port>]
//! PROGRAM <path>
//! MAILADDR <address>
//! MAILFROM <address>
//! METRICS <host:port>
//! ```
//!
//! A line that does not parse is an error with its number and reason; it
//! refuses only what it names (its array), and the other lines still
//! count. Two ARRAY lines for one UUID or one name refuse both arrays.
//!
//! Each array's daemon serves its own metrics endpoint: `METRICS` is the
//! address of the one array without a `metrics=` of its own. An address
//! two arrays would share is an error naming the lines; those arrays start
//! without metrics (a second listener on an address cannot start, and an
//! array must not stay down for its metrics).

use nvraid_metadata::format_uuid;
use serde::Serialize;
use std::fmt;
use std::path::{Path, PathBuf};

/// Where the configuration lives unless `--config` or `NVRAID_CONF` says
/// otherwise.
pub const DEFAULT_PATH: &str = "/etc/nvraid/nvraid.conf";

/// Seconds the last-resort timer waits for a missing member by default.
pub const DEFAULT_DEGRADED_AFTER: u32 = 30;

/// The configuration file to use: `explicit` (a `--config` flag), else
/// `NVRAID_CONF`, else [`DEFAULT_PATH`].
pub fn path(explicit: Option<&Path>) -> PathBuf {
    explicit
        .map(Path::to_path_buf)
        .or_else(|| std::env::var_os("NVRAID_CONF").map(PathBuf::from))
        .unwrap_or_else(|| PathBuf::from(DEFAULT_PATH))
}

/// How an array is exported once assembled.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Export {
    /// `/dev/ublkbN`; `Some(N)` a fixed number, `None` the first free one.
    Ublk(Option<u32>),
    /// An NBD listener (`--listen` of `nvraid serve`: `unix:PATH`,
    /// `tcp:HOST:PORT`, `tcp:PORT`).
    Nbd(String),
    /// Assembled and kept (resync, rebuild, alerts), exported only on its
    /// control socket's neighbour, a Unix socket in the run directory.
    None,
}

impl fmt::Display for Export {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Export::Ublk(None) => f.write_str("ublk"),
            Export::Ublk(Some(id)) => write!(f, "ublk:{id}"),
            Export::Nbd(address) => write!(f, "nbd:{address}"),
            Export::None => f.write_str("none"),
        }
    }
}

/// As it is written in the file (`ublk:3`, `nbd:tcp:10809`).
impl Serialize for Export {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.to_string())
    }
}

impl Export {
    /// Parse an `export=` value.
    pub fn parse(text: &str) -> Result<Export, String> {
        match text {
            "ublk" => return Ok(Export::Ublk(None)),
            "none" => return Ok(Export::None),
            _ => {}
        }
        if let Some(id) = text.strip_prefix("ublk:") {
            return match id.parse::<u32>() {
                Ok(n) if n < 1 << 20 => Ok(Export::Ublk(Some(n))),
                _ => Err(format!("export={text}: {id:?} is not a ublk device number")),
            };
        }
        if let Some(address) = text.strip_prefix("nbd:") {
            let valid = address.starts_with("unix:/")
                || address.starts_with('/')
                || address.strip_prefix("tcp:").is_some_and(|rest| {
                    rest.rsplit(':')
                        .next()
                        .is_some_and(|p| p.parse::<u16>().is_ok())
                });
            if !valid {
                return Err(format!(
                    "export={text}: expected nbd:unix:PATH, nbd:tcp:HOST:PORT or nbd:tcp:PORT"
                ));
            }
            return Ok(Export::Nbd(address.to_string()));
        }
        Err(format!(
            "export={text}: expected ublk, ublk:<id>, nbd:<address> or none"
        ))
    }
}

/// One `ARRAY` line.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct ArrayEntry {
    pub name: String,
    /// md's array UUID (`set_uuid` in the superblock).
    #[serde(serialize_with = "uuid_text")]
    pub uuid: [u8; 16],
    pub export: Export,
    /// Seconds to wait for missing members before a degraded start.
    pub degraded_after: u32,
    /// Its daemon's metrics address (`metrics=`), when it has its own.
    pub metrics: Option<String>,
    /// The line it was read from (1-based; 0 for one not read from a file).
    pub line: usize,
}

fn uuid_text<S: serde::Serializer>(uuid: &[u8; 16], s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(&format_uuid(uuid))
}

impl ArrayEntry {
    /// The line `nvraid config add` writes (defaults left out).
    pub fn to_line(&self) -> String {
        let mut line = format!("ARRAY {} UUID={}", self.name, format_uuid(&self.uuid));
        if self.export != Export::Ublk(None) {
            line.push_str(&format!(" export={}", self.export));
        }
        if self.degraded_after != DEFAULT_DEGRADED_AFTER {
            line.push_str(&format!(" degraded-after={}", self.degraded_after));
        }
        if let Some(metrics) = &self.metrics {
            line.push_str(&format!(" metrics={metrics}"));
        }
        line
    }

    /// The UUID in mdadm's form.
    pub fn uuid_text(&self) -> String {
        format_uuid(&self.uuid)
    }
}

/// Alert and metrics settings, for every array's daemon.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct AlertSettings {
    pub program: Option<PathBuf>,
    pub mailaddr: Option<String>,
    pub mailfrom: Option<String>,
    pub metrics: Option<String>,
}

/// What the file says, without its bad lines.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Config {
    pub arrays: Vec<ArrayEntry>,
    pub alerts: AlertSettings,
}

/// A line that does not parse, or lines that contradict each other.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct ConfigError {
    /// The line(s) at fault, 1-based, first the one reported.
    pub lines: Vec<usize>,
    /// The array the line(s) name, when that much could be read: that
    /// array is refused.
    pub array: Option<String>,
    pub reason: String,
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.lines.as_slice() {
            [one] => write!(f, "line {one}: {}", self.reason),
            many => {
                let text: Vec<String> = many.iter().map(usize::to_string).collect();
                write!(f, "lines {}: {}", text.join(" and "), self.reason)
            }
        }
    }
}

/// An array name: `[A-Za-z0-9_.-]{1,32}`, not `.` or `..` (it becomes a
/// file name in the run directory and a unit's instance).
pub fn check_name(name: &str) -> Result<(), String> {
    let valid = !name.is_empty()
        && name.len() <= 32
        && name != "."
        && name != ".."
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-'));
    if valid {
        Ok(())
    } else {
        Err(format!(
            "{name:?} is not an array name (1 to 32 of A-Z a-z 0-9 _ . -)"
        ))
    }
}

/// md's UUID in mdadm's form (`xxxxxxxx:xxxxxxxx:xxxxxxxx:xxxxxxxx`) or
/// the dashed form (`8-4-4-4-12`); hex digits in either case.
pub fn parse_uuid(text: &str) -> Option<[u8; 16]> {
    let groups: Vec<usize> = text.split([':', '-']).map(str::len).collect();
    let colon = text.contains(':') && !text.contains('-') && groups == [8, 8, 8, 8];
    let dashed = text.contains('-') && !text.contains(':') && groups == [8, 4, 4, 4, 12];
    if !colon && !dashed {
        return None;
    }
    let hex: String = text.chars().filter(|c| *c != ':' && *c != '-').collect();
    let mut uuid = [0u8; 16];
    for (i, byte) in uuid.iter_mut().enumerate() {
        *byte = u8::from_str_radix(hex.get(2 * i..2 * i + 2)?, 16).ok()?;
    }
    Some(uuid)
}

impl Config {
    /// Parse the file's text: what is valid, and every error.
    pub fn parse(text: &str) -> (Config, Vec<ConfigError>) {
        let mut config = Config::default();
        let mut errors = Vec::new();
        // (line, keyword) of each alert setting seen, for duplicates.
        let mut settings: Vec<(usize, &str)> = Vec::new();
        for (index, raw) in text.lines().enumerate() {
            let number = index + 1;
            let line = raw.split('#').next().unwrap_or("").trim();
            let mut words = line.split_whitespace();
            let Some(keyword) = words.next() else {
                continue;
            };
            let rest: Vec<&str> = words.collect();
            let error = |array: Option<&str>, reason: String| ConfigError {
                lines: vec![number],
                array: array.map(str::to_string),
                reason,
            };
            match keyword {
                "ARRAY" => match parse_array(&rest, number) {
                    Ok(entry) => config.arrays.push(entry),
                    Err((array, reason)) => errors.push(error(array.as_deref(), reason)),
                },
                "PROGRAM" | "MAILADDR" | "MAILFROM" | "METRICS" => {
                    if let Some((first, _)) = settings.iter().find(|(_, k)| *k == keyword) {
                        errors.push(error(
                            None,
                            format!("a second {keyword} line (the first is line {first}); this one is ignored"),
                        ));
                        continue;
                    }
                    let [value] = rest.as_slice() else {
                        errors.push(error(
                            None,
                            format!("{keyword} takes one value, found {}", rest.len()),
                        ));
                        continue;
                    };
                    match setting(keyword, value) {
                        Ok(()) => {}
                        Err(reason) => {
                            errors.push(error(None, reason));
                            continue;
                        }
                    }
                    settings.push((number, keyword));
                    let value = value.to_string();
                    match keyword {
                        "PROGRAM" => config.alerts.program = Some(PathBuf::from(value)),
                        "MAILADDR" => config.alerts.mailaddr = Some(value),
                        "MAILFROM" => config.alerts.mailfrom = Some(value),
                        _ => config.alerts.metrics = Some(value),
                    }
                }
                other => {
                    let hint = if ["array", "program", "mailaddr", "mailfrom", "metrics"]
                        .contains(&other.to_ascii_lowercase().as_str())
                    {
                        format!(
                            " (keywords are in capitals: {})",
                            other.to_ascii_uppercase()
                        )
                    } else {
                        String::new()
                    };
                    errors.push(error(
                        None,
                        format!(
                            "unknown keyword {other:?}{hint}; expected ARRAY, PROGRAM, MAILADDR, \
                             MAILFROM or METRICS"
                        ),
                    ));
                }
            }
        }
        refuse_duplicates(&mut config.arrays, &mut errors);
        let metrics_line = settings
            .iter()
            .find(|(_, k)| *k == "METRICS")
            .map(|(n, _)| *n);
        share_no_metrics(&mut config, metrics_line, &mut errors);
        errors.sort_by_key(|e| e.lines[0]);
        (config, errors)
    }

    /// Read and parse `path`; a missing file is an empty configuration
    /// (`Ok(None)`), any other read error an error.
    pub fn load(path: &Path) -> std::io::Result<Option<(Config, Vec<ConfigError>)>> {
        match std::fs::read_to_string(path) {
            Ok(text) => Ok(Some(Config::parse(&text))),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e),
        }
    }

    pub fn by_name(&self, name: &str) -> Option<&ArrayEntry> {
        self.arrays.iter().find(|a| a.name == name)
    }

    pub fn by_uuid(&self, uuid: &[u8; 16]) -> Option<&ArrayEntry> {
        self.arrays.iter().find(|a| &a.uuid == uuid)
    }

    /// Where `entry`'s daemon serves metrics: its own `metrics=`, else
    /// `METRICS` (which parsing keeps only while one array uses it).
    pub fn metrics_of(&self, entry: &ArrayEntry) -> Option<String> {
        entry
            .metrics
            .clone()
            .or_else(|| self.alerts.metrics.clone())
    }
}

/// No two arrays' daemons get one metrics address: `METRICS` used by two
/// or more arrays (those without `metrics=`) is dropped, and two arrays
/// naming one address lose it both; each case an error naming the lines.
/// The arrays themselves still start.
fn share_no_metrics(
    config: &mut Config,
    metrics_line: Option<usize>,
    errors: &mut Vec<ConfigError>,
) {
    if let (Some(global), Some(line)) = (config.alerts.metrics.clone(), metrics_line) {
        let users: Vec<&ArrayEntry> = config
            .arrays
            .iter()
            .filter(|a| a.metrics.is_none())
            .collect();
        let named: Vec<&ArrayEntry> = config
            .arrays
            .iter()
            .filter(|a| a.metrics.as_deref() == Some(global.as_str()))
            .collect();
        if users.len() + named.len() >= 2 {
            let names: Vec<&str> = users
                .iter()
                .chain(&named)
                .map(|a| a.name.as_str())
                .collect();
            let mut lines = vec![line];
            lines.extend(users.iter().chain(&named).map(|a| a.line));
            errors.push(ConfigError {
                lines,
                array: None,
                reason: format!(
                    "METRICS {global} would be the address of {} arrays ({}), and each array's \
                     daemon listens on its own: give each ARRAY line its own metrics=HOST:PORT; \
                     until then these arrays start without metrics",
                    names.len(),
                    names.join(", ")
                ),
            });
            config.alerts.metrics = None;
            for entry in config.arrays.iter_mut() {
                if entry.metrics.as_deref() == Some(global.as_str()) {
                    entry.metrics = None;
                }
            }
        }
    }
    let mut clash = vec![false; config.arrays.len()];
    for i in 0..config.arrays.len() {
        for j in i + 1..config.arrays.len() {
            let (a, b) = (&config.arrays[i], &config.arrays[j]);
            let (Some(address), Some(other)) = (&a.metrics, &b.metrics) else {
                continue;
            };
            if address != other {
                continue;
            }
            clash[i] = true;
            clash[j] = true;
            errors.push(ConfigError {
                lines: vec![a.line, b.line],
                array: None,
                reason: format!(
                    "metrics={address} on two arrays ({} and {}), and each array's daemon \
                     listens on its own: both start without metrics until one is changed",
                    a.name, b.name
                ),
            });
        }
    }
    for (entry, clashes) in config.arrays.iter_mut().zip(clash) {
        if clashes {
            entry.metrics = None;
        }
    }
}

/// `PROGRAM` must be an absolute path; `METRICS` a `host:port`.
fn setting(keyword: &str, value: &str) -> Result<(), String> {
    match keyword {
        "PROGRAM" if !value.starts_with('/') => {
            Err(format!("PROGRAM {value}: the program's absolute path"))
        }
        "METRICS"
            if !value
                .rsplit_once(':')
                .is_some_and(|(host, port)| !host.is_empty() && port.parse::<u16>().is_ok()) =>
        {
            Err(format!("METRICS {value}: expected HOST:PORT"))
        }
        "MAILADDR" | "MAILFROM" if !value.contains('@') && value != "root" => {
            Err(format!("{keyword} {value}: not a mail address"))
        }
        _ => Ok(()),
    }
}

/// One ARRAY line's words after the keyword. On error: the array's name
/// when it could be read, and the reason.
fn parse_array(words: &[&str], line: usize) -> Result<ArrayEntry, (Option<String>, String)> {
    let Some((&name, options)) = words.split_first() else {
        return Err((None, "ARRAY without a name".into()));
    };
    if name.contains('=') {
        return Err((
            None,
            format!("ARRAY {name}: the array's name comes first (ARRAY <name> UUID=<uuid> ...)"),
        ));
    }
    check_name(name).map_err(|e| (None, format!("ARRAY {e}")))?;
    let fail = |reason: String| (Some(name.to_string()), format!("ARRAY {name}: {reason}"));
    let mut uuid = None;
    let mut export = None;
    let mut degraded_after = None;
    let mut metrics = None;
    for option in options {
        let Some((key, value)) = option.split_once('=') else {
            return Err(fail(format!("{option:?} is not KEY=VALUE")));
        };
        let seen = match key {
            "UUID" | "uuid" => uuid.is_some(),
            "export" => export.is_some(),
            "degraded-after" => degraded_after.is_some(),
            "metrics" => metrics.is_some(),
            other => {
                return Err(fail(format!(
                    "unknown option {other:?} (expected UUID=, export=, degraded-after=, metrics=)"
                )))
            }
        };
        if seen {
            return Err(fail(format!("{key}= given twice")));
        }
        match key {
            "UUID" | "uuid" => {
                uuid = Some(parse_uuid(value).ok_or_else(|| {
                    fail(format!(
                        "UUID={value} is not an md array UUID (xxxxxxxx:xxxxxxxx:xxxxxxxx:xxxxxxxx)"
                    ))
                })?)
            }
            "export" => export = Some(Export::parse(value).map_err(&fail)?),
            "metrics" => {
                setting("METRICS", value)
                    .map_err(|_| fail(format!("metrics={value}: expected HOST:PORT")))?;
                metrics = Some(value.to_string());
            }
            _ => {
                degraded_after = Some(value.parse::<u32>().map_err(|_| {
                    fail(format!("degraded-after={value} is not a number of seconds"))
                })?)
            }
        }
    }
    let uuid = uuid.ok_or_else(|| fail("no UUID= (nvraid config add writes it)".into()))?;
    Ok(ArrayEntry {
        name: name.to_string(),
        uuid,
        export: export.unwrap_or(Export::Ublk(None)),
        degraded_after: degraded_after.unwrap_or(DEFAULT_DEGRADED_AFTER),
        metrics,
        line,
    })
}

/// Two lines for one UUID or one name: both arrays refused, the error
/// naming both lines.
fn refuse_duplicates(arrays: &mut Vec<ArrayEntry>, errors: &mut Vec<ConfigError>) {
    let mut refused = vec![false; arrays.len()];
    for i in 0..arrays.len() {
        for j in i + 1..arrays.len() {
            let (a, b) = (&arrays[i], &arrays[j]);
            let what = if a.uuid == b.uuid {
                format!("UUID {}", a.uuid_text())
            } else if a.name == b.name {
                format!("the name {}", a.name)
            } else {
                continue;
            };
            refused[i] = true;
            refused[j] = true;
            for (entry, other) in [(a, b), (b, a)] {
                errors.push(ConfigError {
                    lines: vec![entry.line, other.line],
                    array: Some(entry.name.clone()),
                    reason: format!(
                        "two ARRAY lines for {what} ({} and {}); neither is started until one \
                         is removed",
                        a.name, b.name
                    ),
                });
            }
        }
    }
    let mut index = 0;
    arrays.retain(|_| {
        index += 1;
        !refused[index - 1]
    });
}

/// The file's text with `entry`'s line appended (a newline added first
/// when the text does not end with one).
pub fn with_array(text: &str, entry: &ArrayEntry) -> String {
    let mut out = text.to_string();
    if !out.is_empty() && !out.ends_with('\n') {
        out.push('\n');
    }
    out.push_str(&entry.to_line());
    out.push('\n');
    out
}

/// The file's text without the ARRAY line(s) naming `name` (every other
/// byte kept), and how many were removed.
pub fn without_array(text: &str, name: &str) -> (String, usize) {
    let mut out = String::with_capacity(text.len());
    let mut removed = 0;
    for line in text.split_inclusive('\n') {
        let content = line.split('#').next().unwrap_or("");
        let mut words = content.split_whitespace();
        if words.next() == Some("ARRAY") && words.next() == Some(name) {
            removed += 1;
            continue;
        }
        out.push_str(line);
    }
    (out, removed)
}

/// Write `text` to `path` atomically (a temporary file beside it, synced,
/// renamed over it), creating the directory when missing.
pub fn write_atomically(path: &Path, text: &str) -> std::io::Result<()> {
    use std::io::Write;
    let dir = path.parent().filter(|d| !d.as_os_str().is_empty());
    if let Some(dir) = dir {
        std::fs::create_dir_all(dir)?;
    }
    let file_name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let temp = path.with_file_name(format!(".{file_name}.nvraid-{}", std::process::id()));
    let result = (|| {
        let mut file = std::fs::File::create(&temp)?;
        // Keep the mode of the file replaced (mdadm.conf may be 0644 or
        // stricter).
        if let Ok(meta) = std::fs::metadata(path) {
            file.set_permissions(meta.permissions())?;
        }
        file.write_all(text.as_bytes())?;
        file.sync_all()?;
        std::fs::rename(&temp, path)
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&temp);
    }
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    const U1: &str = "0a1b2c3d:4e5f6071:8293a4b5:c6d7e8f9";
    const U2: &str = "11111111:22222222:33333333:44444444";
    const U3: &str = "55555555:66666666:77777777:88888888";

    fn only_error(text: &str) -> ConfigError {
        let (_, errors) = Config::parse(text);
        assert_eq!(errors.len(), 1, "{errors:?}");
        errors.into_iter().next().unwrap()
    }

    #[test]
    fn a_full_file_parses_with_defaults_and_comments() {
        let text = format!(
            "# nvraid's arrays\n\nARRAY data UUID={U1}   # the RAID 5\n\
             ARRAY scratch uuid=11111111-2222-3333-3333-444444444444 export=nbd:tcp:10809 degraded-after=120 metrics=127.0.0.1:9178\n\
             ARRAY quiet UUID={} export=none metrics=localhost:9179\n\
             PROGRAM /usr/local/bin/alert\nMAILADDR root\nMAILFROM nvraid@example.org\nMETRICS 127.0.0.1:9177\n",
            U2.replace("1111", "5555")
        );
        let (config, errors) = Config::parse(&text);
        assert!(errors.is_empty(), "{errors:?}");
        assert_eq!(config.arrays.len(), 3);
        let data = config.by_name("data").unwrap();
        assert_eq!(data.uuid_text(), U1);
        assert_eq!(data.export, Export::Ublk(None));
        assert_eq!(data.degraded_after, 30);
        assert_eq!(data.line, 3);
        let scratch = config.by_name("scratch").unwrap();
        assert_eq!(scratch.uuid_text(), "11111111:22223333:33334444:44444444");
        assert_eq!(scratch.export, Export::Nbd("tcp:10809".into()));
        assert_eq!(scratch.degraded_after, 120);
        assert_eq!(
            config.metrics_of(scratch).as_deref(),
            Some("127.0.0.1:9178")
        );
        assert_eq!(config.metrics_of(data).as_deref(), Some("127.0.0.1:9177"));
        assert_eq!(config.by_name("quiet").unwrap().export, Export::None);
        assert_eq!(
            config.alerts.program,
            Some(PathBuf::from("/usr/local/bin/alert"))
        );
        assert_eq!(config.alerts.mailaddr.as_deref(), Some("root"));
        assert_eq!(
            config.alerts.mailfrom.as_deref(),
            Some("nvraid@example.org")
        );
        assert_eq!(config.alerts.metrics.as_deref(), Some("127.0.0.1:9177"));
    }

    #[test]
    fn an_unknown_keyword_is_named_with_its_line() {
        let e = only_error(&format!("ARRAY a UUID={U1}\nDEVICE /dev/sd*\n"));
        assert_eq!(e.lines, vec![2]);
        assert!(
            e.to_string()
                .starts_with("line 2: unknown keyword \"DEVICE\""),
            "{e}"
        );
        let e = only_error("array a UUID=x\n");
        assert!(
            e.to_string().contains("keywords are in capitals: ARRAY"),
            "{e}"
        );
    }

    #[test]
    fn a_bad_uuid_refuses_that_array_by_name() {
        for bad in [
            "0a1b2c3d:4e5f6071:8293a4b5",
            "0a1b2c3d:4e5f6071:8293a4b5:c6d7e8fg",
            "0a1b2c3d4e5f60718293a4b5c6d7e8f9",
            "0a1b2c3d-4e5f6071:8293a4b5:c6d7e8f9",
        ] {
            let e = only_error(&format!("\nARRAY data UUID={bad}\n"));
            assert_eq!(e.lines, vec![2]);
            assert_eq!(e.array.as_deref(), Some("data"));
            assert!(e.to_string().contains("is not an md array UUID"), "{e}");
        }
    }

    #[test]
    fn each_array_has_its_own_metrics_address_and_a_shared_one_is_refused_by_its_lines() {
        // One array on METRICS, one on its own: both served.
        let text = format!(
            "METRICS 127.0.0.1:9177\nARRAY a UUID={U1}\nARRAY b UUID={U2} metrics=127.0.0.1:9178\n"
        );
        let (config, errors) = Config::parse(&text);
        assert!(errors.is_empty(), "{errors:?}");
        let [a, b] = [&config.arrays[0], &config.arrays[1]];
        assert_eq!(config.metrics_of(a).as_deref(), Some("127.0.0.1:9177"));
        assert_eq!(config.metrics_of(b).as_deref(), Some("127.0.0.1:9178"));
        assert_eq!(
            b.to_line(),
            format!("ARRAY b UUID={U2} metrics=127.0.0.1:9178")
        );
        // METRICS for two arrays: an error naming its line and theirs; the
        // arrays start, without metrics.
        let text = format!("ARRAY a UUID={U1}\nMETRICS 127.0.0.1:9177\nARRAY b UUID={U2}\n");
        let (config, errors) = Config::parse(&text);
        assert_eq!(config.arrays.len(), 2);
        assert_eq!(errors.len(), 1, "{errors:?}");
        assert_eq!(errors[0].lines, vec![2, 1, 3]);
        assert_eq!(errors[0].array, None);
        assert!(
            errors[0].reason.contains("2 arrays (a, b)"),
            "{}",
            errors[0]
        );
        assert!(config.arrays.iter().all(|a| config.metrics_of(a).is_none()));
        // METRICS and an array naming the same address.
        let text = format!(
            "METRICS 127.0.0.1:9177\nARRAY a UUID={U1}\nARRAY b UUID={U2} metrics=127.0.0.1:9177\n"
        );
        let (config, errors) = Config::parse(&text);
        assert_eq!(errors.len(), 1, "{errors:?}");
        assert!(config.arrays.iter().all(|a| config.metrics_of(a).is_none()));
        // Two arrays on one address of their own.
        let text = format!(
            "ARRAY a UUID={U1} metrics=[::1]:9 \nARRAY c UUID={U3}\nARRAY b UUID={U2} metrics=[::1]:9\n"
        );
        let (config, errors) = Config::parse(&text);
        assert_eq!(errors.len(), 1, "{errors:?}");
        assert_eq!(errors[0].lines, vec![1, 3]);
        assert!(
            errors[0]
                .reason
                .contains("metrics=[::1]:9 on two arrays (a and b)"),
            "{}",
            errors[0]
        );
        assert_eq!(config.arrays.len(), 3);
        assert!(config.arrays.iter().all(|a| config.metrics_of(a).is_none()));
        // A bad address refuses its array, by name.
        let e = only_error(&format!("ARRAY a UUID={U1} metrics=9177\n"));
        assert_eq!(e.array.as_deref(), Some("a"));
        assert!(e.reason.contains("metrics=9177: expected HOST:PORT"), "{e}");
    }

    #[test]
    fn two_lines_for_one_array_refuse_both_and_name_both_lines() {
        let text = format!("ARRAY a UUID={U1}\nARRAY b UUID={U2}\nARRAY c UUID={U1}\n");
        let (config, errors) = Config::parse(&text);
        assert_eq!(config.arrays.len(), 1);
        assert_eq!(config.arrays[0].name, "b");
        assert_eq!(errors.len(), 2, "{errors:?}");
        assert_eq!(errors[0].lines, vec![1, 3]);
        assert_eq!(errors[0].array.as_deref(), Some("a"));
        assert_eq!(errors[1].lines, vec![3, 1]);
        assert_eq!(errors[1].array.as_deref(), Some("c"));
        assert!(errors[0]
            .to_string()
            .starts_with("lines 1 and 3: two ARRAY lines for UUID"));
        // One name on two UUIDs.
        let text = format!("ARRAY a UUID={U1}\nARRAY a UUID={U2}\n");
        let (config, errors) = Config::parse(&text);
        assert!(config.arrays.is_empty());
        assert!(errors[0].reason.contains("the name a"), "{errors:?}");
    }

    #[test]
    fn a_line_that_does_not_parse_leaves_the_others_loaded() {
        let text = format!(
            "ARRAY good UUID={U1}\nARRAY broken UUID={U2} export=floppy\nARRAY\nARRAY x/y UUID={U2}\n\
             ARRAY nouuid\nARRAY opt UUID={U2} colour=blue\nARRAY twice UUID={U2} UUID={U2}\n\
             ARRAY slow UUID={U2} degraded-after=soon\nPROGRAM relative/path\nPROGRAM\nMETRICS nowhere\n"
        );
        let (config, errors) = Config::parse(&text);
        assert_eq!(config.arrays.len(), 1, "{:?}", config.arrays);
        assert_eq!(config.arrays[0].name, "good");
        let lines: Vec<usize> = errors.iter().map(|e| e.lines[0]).collect();
        assert_eq!(lines, (2..=11).collect::<Vec<_>>(), "{errors:#?}");
        let text: Vec<String> = errors.iter().map(ToString::to_string).collect();
        assert!(text[0].contains("export=floppy"), "{}", text[0]);
        assert!(text[1].contains("ARRAY without a name"), "{}", text[1]);
        assert!(text[2].contains("not an array name"), "{}", text[2]);
        assert!(text[3].contains("no UUID="), "{}", text[3]);
        assert!(text[4].contains("unknown option \"colour\""), "{}", text[4]);
        assert!(text[5].contains("UUID= given twice"), "{}", text[5]);
        assert!(text[6].contains("degraded-after=soon"), "{}", text[6]);
        assert!(text[7].contains("absolute path"), "{}", text[7]);
        assert!(text[8].contains("takes one value"), "{}", text[8]);
        assert!(text[9].contains("HOST:PORT"), "{}", text[9]);
        assert_eq!(errors[0].array.as_deref(), Some("broken"));
        assert_eq!(errors[1].array, None);
    }

    #[test]
    fn a_second_alert_setting_is_an_error_and_the_first_stays() {
        let (config, errors) = Config::parse("PROGRAM /a\nPROGRAM /b\n");
        assert_eq!(config.alerts.program, Some(PathBuf::from("/a")));
        assert_eq!(errors[0].lines, vec![2]);
        assert!(errors[0].reason.contains("the first is line 1"));
    }

    #[test]
    fn uuids_in_both_forms() {
        let colon = parse_uuid(U1).unwrap();
        let dashed = parse_uuid("0A1B2C3D-4E5F-6071-8293-A4B5C6D7E8F9").unwrap();
        assert_eq!(colon, dashed);
        assert_eq!(format_uuid(&colon), U1);
        assert!(parse_uuid("").is_none());
        assert!(parse_uuid("0a1b2c3d:4e5f6071:8293a4b5:c6d7e8f9:00").is_none());
    }

    #[test]
    fn lines_are_written_removed_and_read_back() {
        let entry = ArrayEntry {
            name: "data".into(),
            uuid: parse_uuid(U1).unwrap(),
            export: Export::Ublk(Some(3)),
            degraded_after: 45,
            metrics: None,
            line: 0,
        };
        let start = "# mine\nMAILADDR root";
        let text = with_array(start, &entry);
        assert_eq!(
            text,
            format!(
                "# mine\nMAILADDR root\nARRAY data UUID={U1} export=ublk:3 degraded-after=45\n"
            )
        );
        let (config, errors) = Config::parse(&text);
        assert!(errors.is_empty());
        assert_eq!(config.arrays[0], ArrayEntry { line: 3, ..entry });
        let (back, removed) = without_array(&text, "data");
        assert_eq!(removed, 1);
        assert_eq!(back, "# mine\nMAILADDR root\n");
        let (same, removed) = without_array(&text, "dat");
        assert_eq!((same.as_str(), removed), (text.as_str(), 0));
    }

    #[test]
    fn names_are_checked() {
        assert!(check_name("data-1.b_2").is_ok());
        for bad in ["", ".", "..", "a/b", "a b", &"x".repeat(33), "é"] {
            assert!(check_name(bad).is_err(), "{bad:?}");
        }
    }
}
