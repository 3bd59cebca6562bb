//! NVMe/TCP member URIs:
//!
//! `nvme+tcp://HOST[:PORT]/SUBSYSTEM-NQN[/NSID][?hostnqn=NQN]`
//!
//! - PORT: 4420 by default (the NVMe/TCP I/O port).
//! - SUBSYSTEM-NQN: the subsystem's NQN, percent-decoded (an NQN holds
//!   no `/`; write `%2F` if one must).
//! - NSID: the namespace, 1 by default.
//! - `?hostnqn=`: the host NQN nvraid connects as (the target's allow
//!   list names it); by default `/etc/nvme/hostnqn`, else one made from
//!   this machine's id.
//! - `?digest=header,data` (or `header`, `data`): ask for CRC32C digests.

use crate::uri::{percent_decode, split_host_port, UriError};
use std::fmt;

/// The default NVMe/TCP port.
pub const DEFAULT_PORT: u16 = 4420;

/// A parsed NVMe/TCP member URI.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NvmeUri {
    pub host: String,
    pub port: u16,
    pub subnqn: String,
    pub nsid: u32,
    pub hostnqn: Option<String>,
    pub header_digest: bool,
    pub data_digest: bool,
}

/// Whether `spec` names an NVMe/TCP namespace.
pub fn is_nvme_uri(spec: &str) -> bool {
    spec.starts_with("nvme+tcp://")
}

impl NvmeUri {
    pub fn parse(uri: &str) -> Result<NvmeUri, UriError> {
        let fail = |reason: &str| UriError {
            uri: uri.to_string(),
            reason: reason.to_string(),
        };
        let rest = uri
            .strip_prefix("nvme+tcp://")
            .ok_or_else(|| fail("not an NVMe/TCP URI (expected nvme+tcp://)"))?;
        let (rest, query) = match rest.split_once('?') {
            Some((rest, query)) => (rest, Some(query)),
            None => (rest, None),
        };
        let (authority, path) = rest.split_once('/').ok_or_else(|| {
            fail("no subsystem NQN (write nvme+tcp://HOST[:PORT]/SUBSYSTEM-NQN[/NSID])")
        })?;
        let (host, port) = split_host_port_or(authority).ok_or_else(|| fail("bad host or port"))?;
        if host.is_empty() {
            return Err(fail("no host"));
        }
        let (nqn, nsid) = match path.split_once('/') {
            Some((nqn, nsid)) => {
                let nsid: u32 = nsid
                    .parse()
                    .ok()
                    .filter(|&n| n != 0 && n != u32::MAX)
                    .ok_or_else(|| fail("the namespace id is not a number in 1..=4294967294"))?;
                (nqn, nsid)
            }
            None => (path, 1),
        };
        let subnqn = percent_decode(nqn).ok_or_else(|| fail("bad %-escape in the NQN"))?;
        check_nqn(&subnqn).map_err(|reason| fail(&format!("subsystem NQN: {reason}")))?;
        let mut parsed = NvmeUri {
            host,
            port,
            subnqn,
            nsid,
            hostnqn: None,
            header_digest: false,
            data_digest: false,
        };
        for pair in query.into_iter().flat_map(|q| q.split('&')) {
            if let Some(v) = pair.strip_prefix("hostnqn=") {
                let v = percent_decode(v).ok_or_else(|| fail("bad %-escape in hostnqn"))?;
                check_nqn(&v).map_err(|reason| fail(&format!("hostnqn: {reason}")))?;
                parsed.hostnqn = Some(v);
            } else if let Some(v) = pair.strip_prefix("digest=") {
                for d in v.split(',') {
                    match d {
                        "header" => parsed.header_digest = true,
                        "data" => parsed.data_digest = true,
                        _ => return Err(fail("digest= takes header, data or header,data")),
                    }
                }
            } else {
                return Err(fail(&format!(
                    "unknown parameter {pair:?} (known: hostnqn=, digest=)"
                )));
            }
        }
        Ok(parsed)
    }
}

fn split_host_port_or(authority: &str) -> Option<(String, u16)> {
    let (host, port) = split_host_port(authority)?;
    // split_host_port gives NBD's default when no port is written.
    let explicit = match authority.strip_prefix('[') {
        Some(rest) => rest.split_once(']').is_some_and(|(_, p)| !p.is_empty()),
        None => authority.contains(':'),
    };
    Some((host, if explicit { port } else { DEFAULT_PORT }))
}

/// An NQN the wire can carry: 1..=223 bytes of printable ASCII.
fn check_nqn(nqn: &str) -> Result<(), String> {
    if nqn.is_empty() {
        return Err("empty".into());
    }
    if nqn.len() > 223 {
        return Err(format!("{} bytes, at most 223", nqn.len()));
    }
    if !nqn.bytes().all(|c| c.is_ascii_graphic()) {
        return Err("only printable ASCII without spaces".into());
    }
    Ok(())
}

impl fmt::Display for NvmeUri {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let host = if self.host.contains(':') {
            format!("[{}]", self.host)
        } else {
            self.host.clone()
        };
        write!(
            f,
            "nvme+tcp://{host}:{}/{}/{}",
            self.port, self.subnqn, self.nsid
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_member_form_parses_with_its_defaults() {
        let u = NvmeUri::parse("nvme+tcp://10.0.0.5/nqn.2024-01.io.example:disk1").unwrap();
        assert_eq!((u.host.as_str(), u.port, u.nsid), ("10.0.0.5", 4420, 1));
        assert_eq!(u.subnqn, "nqn.2024-01.io.example:disk1");
        let u = NvmeUri::parse("nvme+tcp://[::1]:4421/nqn.x:y/7?digest=header,data").unwrap();
        assert_eq!((u.host.as_str(), u.port, u.nsid), ("::1", 4421, 7));
        assert!(u.header_digest && u.data_digest);
        assert_eq!(u.to_string(), "nvme+tcp://[::1]:4421/nqn.x:y/7");
        let u = NvmeUri::parse("nvme+tcp://h:4422/nqn.x:y").unwrap();
        assert_eq!(u.port, 4422);
        let u = NvmeUri::parse("nvme+tcp://[::1]/nqn.x:y").unwrap();
        assert_eq!(u.port, 4420);
    }

    #[test]
    fn bad_member_uris_name_their_fault() {
        for (bad, says) in [
            ("nvme+tcp://host", "no subsystem NQN"),
            ("nvme+tcp:///nqn.x", "no host"),
            ("nvme+tcp://h/nqn.x/0", "namespace id"),
            ("nvme+tcp://h/nqn.x/abc", "namespace id"),
            ("nvme+tcp://h/", "subsystem NQN: empty"),
            ("nvme+tcp://h/nqn.x?digest=crc", "digest="),
            ("nvme+tcp://h/nqn.x?foo=1", "unknown parameter"),
            ("nvme+tcp://h:99999/nqn.x", "bad host or port"),
        ] {
            let e = NvmeUri::parse(bad).unwrap_err().to_string();
            assert!(e.contains(says), "{bad}: {e}");
        }
    }
}
