//! Reading a whole file named on the command line (a certificate, a key, a
//! JSON result) with a bound: a path such as `/dev/zero`, a pipe, or a
//! file far larger than its kind ever is would otherwise be read until
//! memory runs out. At most `limit + 1` bytes are read.

use std::io::{self, Read};
use std::path::Path;

/// The bytes of `path`, or an error when it holds more than `limit` bytes
/// (`what` names the kind of file for the message: "a PEM file").
pub fn read_file(path: &Path, limit: u64, what: &str) -> io::Result<Vec<u8>> {
    let file = std::fs::File::open(path)?;
    let mut bytes = Vec::new();
    file.take(limit.saturating_add(1)).read_to_end(&mut bytes)?;
    if bytes.len() as u64 > limit {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!(
                "longer than {} (the most read from {what}); is it the right file?",
                size_text(limit)
            ),
        ));
    }
    Ok(bytes)
}

/// [`read_file`] as UTF-8 text.
pub fn read_text(path: &Path, limit: u64, what: &str) -> io::Result<String> {
    String::from_utf8(read_file(path, limit, what)?)
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidData, "not UTF-8 text"))
}

fn size_text(bytes: u64) -> String {
    match bytes {
        b if b >= 1 << 20 && b % (1 << 20) == 0 => format!("{} MiB", b >> 20),
        b if b >= 1 << 10 && b % (1 << 10) == 0 => format!("{} KiB", b >> 10),
        b => format!("{b} bytes"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dev_zero_is_refused_after_the_limit() {
        let e = read_file(Path::new("/dev/zero"), 1 << 20, "a PEM file").unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidData);
        assert!(e.to_string().contains("longer than 1 MiB"), "{e}");
    }

    #[test]
    fn a_file_at_the_limit_is_read_whole() {
        let dir = std::env::temp_dir().join(format!("nvraid-bounded-{}", std::process::id()));
        std::fs::write(&dir, vec![7u8; 4096]).unwrap();
        assert_eq!(read_file(&dir, 4096, "x").unwrap().len(), 4096);
        assert!(read_file(&dir, 4095, "x").is_err());
        std::fs::remove_file(&dir).unwrap();
    }
}
