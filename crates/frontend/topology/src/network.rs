//! Remote members: the network link an NBD or NVMe/TCP member is reached
//! through, turned into the planner's link ceiling.
//!
//! For `nbd://HOST[:PORT]/EXPORT` and `nvme+tcp://HOST[:PORT]/NQN`, the
//! route to HOST (`ip -j route get`) names the interface. Its rate is the lower of a tbf shaper at its root
//! (`tc -j qdisc show dev`, the rate in bytes per second) and the speed the
//! link reports (`/sys/class/net/DEV/speed`, Mbit/s; absent or -1 on many
//! virtual links). What a member can move over it is that rate times the
//! share of each frame that is payload: a TCP segment of `mtu - 52` bytes
//! (IPv4 and TCP headers with timestamps) in a frame of `mtu + 14` (the
//! Ethernet header, which the shaper counts). Members whose routes share an
//! interface share its rate (the planner's shared uplink). `nbd+unix://`
//! members have no network link: without a rating they make the ceiling
//! unknown.

use crate::plan::{MemberInput, SharedUplink};
use crate::Error;
use std::collections::BTreeMap;
use std::process::Command;

/// What is known about the link to one remote member.
#[derive(Clone, Debug, PartialEq)]
pub struct NetworkLink {
    pub interface: String,
    /// Line rate in bits per second and where it came from.
    pub rate_bits: Option<(f64, &'static str)>,
    pub mtu: u32,
}

impl NetworkLink {
    /// Payload bytes per second a TCP stream can carry over the link.
    pub fn payload_bytes_per_sec(&self) -> Option<f64> {
        self.rate_bits
            .map(|(bits, _)| bits / 8.0 * payload_share(self.mtu))
    }

    pub fn describe(&self) -> String {
        match self.rate_bits {
            Some((bits, source)) => format!(
                "{} at {} ({source}, MTU {})",
                self.interface,
                format_bits(bits),
                self.mtu
            ),
            None => format!("{} (rate unknown)", self.interface),
        }
    }
}

/// The share of a frame's bytes that is TCP payload.
pub fn payload_share(mtu: u32) -> f64 {
    let mtu = f64::from(mtu.max(576));
    (mtu - 52.0) / (mtu + 14.0)
}

fn format_bits(bits: f64) -> String {
    if bits >= 1e9 {
        format!("{:.3} Gbit/s", bits / 1e9)
    } else {
        format!("{:.0} Mbit/s", bits / 1e6)
    }
}

/// The interface of `ip -j route get ADDR`'s answer.
pub fn parse_route_dev(json: &str) -> Option<String> {
    let v: serde_json::Value = serde_json::from_str(json).ok()?;
    v.get(0)?.get("dev")?.as_str().map(str::to_string)
}

/// A root tbf's rate (bits per second) in `tc -j qdisc show dev DEV`.
pub fn parse_tbf_rate_bits(json: &str) -> Option<f64> {
    let v: serde_json::Value = serde_json::from_str(json).ok()?;
    v.as_array()?
        .iter()
        .find(|q| q["kind"] == "tbf" && q["root"] == true)
        .and_then(|q| q["options"]["rate"].as_f64())
        .map(|bytes| bytes * 8.0)
}

fn run(cmd: &str, args: &[&str]) -> Result<String, String> {
    let out = Command::new(cmd)
        .args(args)
        .output()
        .map_err(|e| format!("{cmd}: {e} (install iproute2)"))?;
    if !out.status.success() {
        return Err(format!(
            "{cmd} {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// The link to `host` (an address or a name) on this machine.
pub fn link_to(host: &str) -> Result<NetworkLink, String> {
    let address = std::net::ToSocketAddrs::to_socket_addrs(&(host, 0))
        .map_err(|e| format!("cannot resolve {host}: {e}"))?
        .next()
        .ok_or_else(|| format!("{host} has no address"))?
        .ip()
        .to_string();
    let dev = parse_route_dev(&run("ip", &["-j", "route", "get", &address])?)
        .ok_or_else(|| format!("no route to {address}"))?;
    let tbf = run("tc", &["-j", "qdisc", "show", "dev", &dev])
        .ok()
        .and_then(|json| parse_tbf_rate_bits(&json));
    let sysfs = |name: &str| {
        std::fs::read_to_string(format!("/sys/class/net/{dev}/{name}"))
            .ok()
            .and_then(|s| s.trim().parse::<i64>().ok())
    };
    let speed = sysfs("speed")
        .filter(|&mbit| mbit > 0)
        .map(|mbit| mbit as f64 * 1e6);
    let rate_bits = match (tbf, speed) {
        (Some(t), Some(s)) if s < t => Some((s, "link speed")),
        (Some(t), _) => Some((t, "tc tbf shaper")),
        (None, Some(s)) => Some((s, "link speed")),
        (None, None) => None,
    };
    let mtu = sysfs("mtu").map_or(1500, |m| m as u32);
    Ok(NetworkLink {
        interface: dev,
        rate_bits,
        mtu,
    })
}

/// Planner inputs for NBD and NVMe/TCP URIs: each member's link, or the
/// interface several share.
pub fn remote_members(uris: &[String]) -> Result<Vec<MemberInput>, Error> {
    let mut links = Vec::new();
    for uri in uris {
        if nvraid_remote::is_nvme_uri(uri) {
            let parsed =
                nvraid_remote::NvmeUri::parse(uri).map_err(|e| Error::Usage(e.to_string()))?;
            let link = link_to(&parsed.host).map_err(|e| Error::Usage(format!("{uri}: {e}")))?;
            links.push((uri.clone(), Some(link)));
            continue;
        }
        let parsed = nvraid_remote::NbdUri::parse(uri).map_err(|e| Error::Usage(e.to_string()))?;
        let link = match parsed.address {
            nvraid_remote::uri::Address::Tcp { host, .. } => {
                Some(link_to(&host).map_err(|e| Error::Usage(format!("{uri}: {e}")))?)
            }
            nvraid_remote::uri::Address::Unix(_) => None,
        };
        links.push((uri.clone(), link));
    }
    let mut sharing: BTreeMap<String, usize> = BTreeMap::new();
    for link in links.iter().filter_map(|(_, l)| l.as_ref()) {
        *sharing.entry(link.interface.clone()).or_default() += 1;
    }
    Ok(links
        .into_iter()
        .map(|(uri, link)| {
            let Some(link) = link else {
                return MemberInput {
                    name: uri,
                    link_ceiling_bytes_per_sec: None,
                    limiting_link: None,
                    uplink: None,
                    rating: None,
                };
            };
            let shared = sharing[&link.interface] > 1;
            let ceiling = link.payload_bytes_per_sec();
            MemberInput {
                name: uri,
                link_ceiling_bytes_per_sec: if shared { None } else { ceiling },
                limiting_link: Some(format!("network link {}", link.describe())),
                uplink: match (shared, ceiling) {
                    (true, Some(c)) => Some(SharedUplink {
                        id: link.interface.clone(),
                        label: format!("network link {}", link.describe()),
                        ceiling_bytes_per_sec: c,
                    }),
                    _ => None,
                },
                rating: None,
            }
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn route_and_shaper_outputs_parse() {
        let route = r#"[{"dst":"10.77.2.2","dev":"nvsan-h2","prefsrc":"10.77.2.1","flags":[],"uid":0,"cache":[]}]"#;
        assert_eq!(parse_route_dev(route).as_deref(), Some("nvsan-h2"));
        let tbf = r#"[{"kind":"tbf","handle":"8019:","root":true,"refcnt":3,"options":{"rate":125000000,"burst":262125,"lat":20000}}]"#;
        assert_eq!(parse_tbf_rate_bits(tbf), Some(1e9));
        let none = r#"[{"kind":"noqueue","handle":"0:","root":true,"refcnt":2,"options":{}}]"#;
        assert_eq!(parse_tbf_rate_bits(none), None);
        assert_eq!(parse_route_dev("garbage"), None);
    }

    #[test]
    fn payload_share_counts_headers() {
        // 9000-byte MTU: 8948 of 9014 bytes; 1500: 1448 of 1514.
        assert!((payload_share(9000) - 8948.0 / 9014.0).abs() < 1e-9);
        assert!((payload_share(1500) - 1448.0 / 1514.0).abs() < 1e-9);
        let link = NetworkLink {
            interface: "eth0".into(),
            rate_bits: Some((10e9, "link speed")),
            mtu: 1500,
        };
        let got = link.payload_bytes_per_sec().unwrap();
        assert!((got - 1.25e9 * 1448.0 / 1514.0).abs() < 1.0, "{got}");
    }
}
