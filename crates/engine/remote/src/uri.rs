//! NBD URIs (the NBD project's doc/uri.md): which server, which export,
//! and whether TLS is wanted.
//!
//! - `nbd://HOST[:PORT]/EXPORT` (TCP, port 10809 by default)
//! - `nbds://HOST[:PORT]/EXPORT` (the same over TLS)
//! - `nbd+unix:///EXPORT?socket=PATH` and `nbds+unix:///EXPORT?socket=PATH`
//!
//! The export name is the path after the first `/`, percent-decoded; it
//! may be empty (the server's default export). `?tls-hostname=NAME` sets
//! the name the server's certificate must carry.

use std::fmt;
use std::path::PathBuf;

/// Where the server listens.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Address {
    Tcp { host: String, port: u16 },
    Unix(PathBuf),
}

/// A parsed NBD URI.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NbdUri {
    pub address: Address,
    pub export: String,
    pub tls: bool,
    /// `?tls-hostname=NAME`: the name the server's certificate must carry
    /// (default: the host; `localhost` for unix sockets).
    pub tls_hostname: Option<String>,
}

/// Why a URI was refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{uri}: {reason}")]
pub struct UriError {
    pub uri: String,
    pub reason: String,
}

/// The default NBD port.
pub const DEFAULT_PORT: u16 = 10809;

/// Whether `spec` names an NBD export (it starts with an NBD scheme).
pub fn is_nbd_uri(spec: &str) -> bool {
    ["nbd://", "nbds://", "nbd+unix://", "nbds+unix://"]
        .iter()
        .any(|scheme| spec.starts_with(scheme))
}

impl NbdUri {
    pub fn parse(uri: &str) -> Result<NbdUri, UriError> {
        let fail = |reason: &str| UriError {
            uri: uri.to_string(),
            reason: reason.to_string(),
        };
        let (scheme, rest) = uri
            .split_once("://")
            .ok_or_else(|| fail("not a URI (expected nbd://, nbds://, nbd+unix://)"))?;
        let (tls, unix) = match scheme {
            "nbd" => (false, false),
            "nbds" => (true, false),
            "nbd+unix" => (false, true),
            "nbds+unix" => (true, true),
            _ => {
                return Err(fail(
                    "unknown scheme (expected nbd, nbds, nbd+unix, nbds+unix)",
                ))
            }
        };
        let (rest, query) = match rest.split_once('?') {
            Some((rest, query)) => (rest, Some(query)),
            None => (rest, None),
        };
        let (authority, path) = match rest.find('/') {
            Some(at) => (&rest[..at], &rest[at + 1..]),
            None => (rest, ""),
        };
        let export = percent_decode(path).ok_or_else(|| fail("bad %-escape in the export name"))?;
        let param = |key: &str| {
            query
                .into_iter()
                .flat_map(|q| q.split('&'))
                .find_map(|pair| pair.strip_prefix(key))
        };
        let socket = param("socket=");
        let tls_hostname = match param("tls-hostname=") {
            Some(v) => Some(percent_decode(v).ok_or_else(|| fail("bad %-escape in tls-hostname"))?),
            None => None,
        };
        let address = if unix {
            if !authority.is_empty() {
                return Err(fail(
                    "a unix-socket URI has no host (write nbd+unix:///EXPORT?socket=PATH)",
                ));
            }
            let socket = socket.ok_or_else(|| fail("a unix-socket URI needs ?socket=PATH"))?;
            let socket =
                percent_decode(socket).ok_or_else(|| fail("bad %-escape in the socket path"))?;
            Address::Unix(PathBuf::from(socket))
        } else {
            if socket.is_some() {
                return Err(fail("?socket= belongs to nbd+unix:// URIs"));
            }
            let (host, port) =
                split_host_port(authority).ok_or_else(|| fail("bad host or port"))?;
            if host.is_empty() {
                return Err(fail("no host"));
            }
            Address::Tcp { host, port }
        };
        Ok(NbdUri {
            address,
            export,
            tls,
            tls_hostname,
        })
    }
}

pub(crate) fn split_host_port(authority: &str) -> Option<(String, u16)> {
    // [v6]:port, [v6], host:port, host
    if let Some(rest) = authority.strip_prefix('[') {
        let (host, after) = rest.split_once(']')?;
        let port = match after {
            "" => DEFAULT_PORT,
            p => p.strip_prefix(':')?.parse().ok()?,
        };
        return Some((host.to_string(), port));
    }
    match authority.rsplit_once(':') {
        Some((host, port)) => Some((host.to_string(), port.parse().ok()?)),
        None => Some((authority.to_string(), DEFAULT_PORT)),
    }
}

pub(crate) fn percent_decode(text: &str) -> Option<String> {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = std::str::from_utf8(bytes.get(i + 1..i + 3)?).ok()?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

impl fmt::Display for NbdUri {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = if self.tls { "s" } else { "" };
        let mut query = Vec::new();
        match &self.address {
            Address::Tcp { host, port } if host.contains(':') => {
                write!(f, "nbd{s}://[{host}]:{port}/{}", self.export)?
            }
            Address::Tcp { host, port } => write!(f, "nbd{s}://{host}:{port}/{}", self.export)?,
            Address::Unix(path) => {
                write!(f, "nbd{s}+unix:///{}", self.export)?;
                query.push(format!("socket={}", path.display()));
            }
        }
        if let Some(name) = &self.tls_hostname {
            query.push(format!("tls-hostname={name}"));
        }
        if !query.is_empty() {
            write!(f, "?{}", query.join("&"))?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_forms_of_doc_uri_md() {
        let u = NbdUri::parse("nbd://node1:10900/disk%201").unwrap();
        assert_eq!(
            u.address,
            Address::Tcp {
                host: "node1".into(),
                port: 10900
            }
        );
        assert_eq!(u.export, "disk 1");
        assert!(!u.tls);
        let u = NbdUri::parse("nbds://10.0.0.2").unwrap();
        assert_eq!(u.export, "");
        assert!(u.tls);
        assert_eq!(
            u.address,
            Address::Tcp {
                host: "10.0.0.2".into(),
                port: DEFAULT_PORT
            }
        );
        let u = NbdUri::parse("nbd://[fd00::2]:99/e").unwrap();
        assert_eq!(
            u.address,
            Address::Tcp {
                host: "fd00::2".into(),
                port: 99
            }
        );
        let u = NbdUri::parse("nbd+unix:///e?socket=/run/x.sock").unwrap();
        assert_eq!(u.address, Address::Unix("/run/x.sock".into()));
        assert_eq!(u.to_string(), "nbd+unix:///e?socket=/run/x.sock");
        assert!(is_nbd_uri("nbds+unix:///?socket=/s"));
        assert!(!is_nbd_uri("/dev/nbd0"));
    }

    #[test]
    fn bad_uris_say_what_is_wrong() {
        for (uri, words) in [
            ("nbd+unix:///e", "needs ?socket="),
            ("nbd://:10809/e", "no host"),
            ("nbd://h:99999/e", "bad host or port"),
            ("nbd://h/%zz", "%-escape"),
            ("nbd://h/e?socket=/s", "belongs to nbd+unix"),
            ("nbd+unix://h/e?socket=/s", "has no host"),
            ("nfs://h/e", "unknown scheme"),
        ] {
            let err = NbdUri::parse(uri).unwrap_err().to_string();
            assert!(err.starts_with(uri), "{err}");
            assert!(err.contains(words), "{uri}: {err}");
        }
    }
}
