//! `--nvme-tcp`'s options: what the target offers, checked before the
//! server starts (a leaf: the server's options hold them).

/// The well-known NQN of a discovery controller.
pub const DISCOVERY_NQN: &str = "nqn.2014-08.org.nvmexpress.discovery";
/// The TCP port NVMe/TCP uses by default.
pub const DEFAULT_PORT: u16 = 4420;

/// `--nvme-tcp`: what the NVMe/TCP target offers.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NvmeOptions {
    /// `HOST:PORT` (or `HOST`: port 4420) to listen on; port 0 picks one.
    pub listen: String,
    /// The subsystem's NQN; empty: `nqn.2014-08.org.nvraid:uuid:<uuid>` of
    /// `namespace_uuid` (the caller sets it from the array).
    pub nqn: String,
    /// Host NQNs allowed to connect; empty: any host.
    pub hosts: Vec<String>,
    /// The namespace's UUID (and NGUID): the array's UUID.
    pub namespace_uuid: [u8; 16],
    /// I/O queues one controller may have.
    pub queues_max: u16,
    /// Entries per queue (CAP.MQES + 1).
    pub queue_depth: u16,
    /// In-capsule data an I/O command may carry (larger writes use R2T).
    pub in_capsule_bytes: u32,
}

impl Default for NvmeOptions {
    fn default() -> Self {
        NvmeOptions {
            listen: format!("0.0.0.0:{DEFAULT_PORT}"),
            nqn: String::new(),
            hosts: Vec::new(),
            namespace_uuid: [0; 16],
            queues_max: 64,
            queue_depth: 128,
            in_capsule_bytes: 8192,
        }
    }
}

impl NvmeOptions {
    /// The subsystem NQN derived from a UUID.
    pub fn nqn_of_uuid(uuid: &[u8; 16]) -> String {
        let h = |r: std::ops::Range<usize>| {
            uuid[r]
                .iter()
                .map(|b| format!("{b:02x}"))
                .collect::<String>()
        };
        format!(
            "nqn.2014-08.org.nvraid:uuid:{}-{}-{}-{}-{}",
            h(0..4),
            h(4..6),
            h(6..8),
            h(8..10),
            h(10..16)
        )
    }

    /// The NQN served (the given one, or the one of the namespace UUID).
    pub fn subsystem_nqn(&self) -> String {
        if self.nqn.is_empty() {
            Self::nqn_of_uuid(&self.namespace_uuid)
        } else {
            self.nqn.clone()
        }
    }

    /// `HOST:PORT`, the port 4420 when none is given.
    pub fn parse_listen(text: &str) -> Result<String, String> {
        let text = text.strip_prefix("tcp:").unwrap_or(text);
        if text.is_empty() {
            return Err("--nvme-tcp: empty address (expected HOST:PORT or HOST)".into());
        }
        // [v6]:port, v6 alone, host:port, host.
        if let Some(rest) = text.strip_prefix('[') {
            return match rest.split_once(']') {
                Some((_, "")) => Ok(format!("{text}:{DEFAULT_PORT}")),
                Some((_, port)) if port.strip_prefix(':').is_some_and(valid_port) => {
                    Ok(text.to_string())
                }
                _ => Err(format!("--nvme-tcp {text:?}: expected [IPv6]:PORT")),
            };
        }
        match text.rsplit_once(':') {
            None => Ok(format!("{text}:{DEFAULT_PORT}")),
            Some((host, _)) if host.contains(':') => Ok(format!("[{text}]:{DEFAULT_PORT}")),
            Some((_, port)) if valid_port(port) => Ok(text.to_string()),
            Some(_) => Err(format!(
                "--nvme-tcp {text:?}: the port is not a number within 0..=65535"
            )),
        }
    }

    /// The options make sense (called by `ServeOptions::validate`).
    pub(crate) fn validate(&self) -> Result<(), String> {
        if !self.nqn.is_empty() {
            check_nqn(&self.nqn, "--nqn")?;
        }
        if self.nqn == DISCOVERY_NQN {
            return Err(format!(
                "--nqn {DISCOVERY_NQN} is the discovery controller's NQN, not a subsystem's"
            ));
        }
        for host in &self.hosts {
            check_nqn(host, "--nvme-host")?;
        }
        if self.queues_max == 0 || self.queues_max > 1024 {
            return Err("NVMe/TCP I/O queues per controller not within 1..=1024".into());
        }
        if !(2..=1024).contains(&self.queue_depth) {
            return Err("NVMe/TCP queue depth not within 2..=1024".into());
        }
        if !(1024..=(1 << 20)).contains(&self.in_capsule_bytes) {
            return Err("NVMe/TCP in-capsule data not within 1 KiB..=1 MiB".into());
        }
        Ok(())
    }
}

fn valid_port(port: &str) -> bool {
    port.parse::<u16>().is_ok()
}

/// An NQN as the specification has it: `nqn.` and at most 223 bytes of
/// UTF-8, no NUL.
pub(crate) fn check_nqn(nqn: &str, flag: &str) -> Result<(), String> {
    if !nqn.starts_with("nqn.") || nqn.len() > 223 || nqn.contains('\0') {
        return Err(format!(
            "{flag} {nqn:?}: not an NQN (nqn.YYYY-MM.reverse.domain:name, at most 223 bytes)"
        ));
    }
    Ok(())
}
