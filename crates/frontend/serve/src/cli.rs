//! The flags of `nvraid serve` other than the members, for the binary to
//! embed with `#[command(flatten)]`.

use std::path::PathBuf;

use clap::{Args, ValueEnum};

use crate::options::{ListenAddress, ServeOptions, TlsFiles, TlsMode, UblkOptions, UblkStop};

/// Default Unix socket when no `--listen` is given.
pub const DEFAULT_SOCKET: &str = "/run/nvraid/nvraid.sock";

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum TlsArg {
    /// No TLS.
    Off,
    /// Allow clients to upgrade with STARTTLS.
    On,
    /// Refuse clients that do not upgrade, before they see the export.
    Require,
}

/// Export flags.
#[derive(Clone, Debug, Args)]
pub struct ServeArgs {
    /// Where to listen: unix:PATH or tcp:HOST:PORT (tcp:PORT binds
    /// 127.0.0.1). Repeatable. Default: unix:/run/nvraid/nvraid.sock.
    #[arg(long = "listen", value_name = "ADDRESS", value_parser = ListenAddress::parse)]
    pub listen: Vec<ListenAddress>,
    /// Export name clients ask for (the empty name also selects it).
    #[arg(long, default_value = "")]
    pub export: String,
    /// Refuse writes, trims and zeroing.
    #[arg(long)]
    pub read_only: bool,
    /// TLS mode; `on` and `require` need --tls-cert and --tls-key.
    #[arg(long, value_enum, default_value = "off")]
    pub tls: TlsArg,
    /// PEM certificate chain for TLS (this file, the key and --tls-ca are
    /// read before the array is assembled, at most 4 MiB each).
    #[arg(long, value_name = "FILE", requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,
    /// PEM private key for TLS.
    #[arg(long, value_name = "FILE", requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,
    /// Mutual TLS: clients must present a certificate signed by the CA in
    /// --tls-ca; others are refused during the TLS handshake, before they
    /// can list or choose an export.
    #[arg(long, requires = "tls_ca")]
    pub tls_verify_peer: bool,
    /// PEM CA certificate(s) that client certificates are checked against
    /// (with --tls-verify-peer).
    #[arg(long, value_name = "FILE", requires = "tls_verify_peer")]
    pub tls_ca: Option<PathBuf>,
    /// Most clients connected at once; more are refused.
    #[arg(long, default_value_t = 16)]
    pub max_connections: u32,
    /// Seconds a client has to finish the handshake (all of it).
    #[arg(long, value_name = "SECONDS", default_value_t = 10,
          value_parser = clap::value_parser!(u64).range(1..))]
    pub handshake_timeout: u64,
    /// When every connection slot is taken, a new client takes the slot of
    /// the connection idle longest, if that one has had no request for this
    /// many seconds (0: never; idle clients are never closed while slots
    /// are free).
    #[arg(long, value_name = "SECONDS", default_value_t = 60)]
    pub idle_timeout: u64,
    /// Seconds a request's payload has to arrive after its header, and a
    /// reply has to be read by the client; a client that misses either is
    /// disconnected (a deadline: trickling bytes does not extend it).
    #[arg(long, value_name = "SECONDS", default_value_t = 30,
          value_parser = clap::value_parser!(u64).range(1..))]
    pub transfer_timeout: u64,
    /// Largest READ/WRITE in bytes (advertised as the maximum block size).
    #[arg(long, value_name = "BYTES", default_value_t = 32 << 20)]
    pub max_request: u32,
    /// Requests in flight per connection.
    #[arg(long, default_value_t = 64)]
    pub max_inflight: u32,
    /// Control socket for `nvraid status` (default: beside the first Unix
    /// listen socket, with extension .ctl). Taken only when nothing is
    /// there or a socket no server answers on; any other file, or a running
    /// server's socket, is refused and left alone.
    #[arg(long, value_name = "PATH")]
    pub control: Option<PathBuf>,
    /// Worker threads (default: one per core, at most 8).
    #[arg(long)]
    pub workers: Option<u32>,
    /// Also serve the array as a local block device, /dev/ublkbID, through
    /// Linux's ublk driver (module ublk_drv, Linux 6.0+): ID is a device
    /// number, or `auto` (the default) for the first free one. Without
    /// --listen, only the device is served. If /dev/ublkcID is left by a
    /// killed server of this array, it is taken over (the device and a
    /// filesystem mounted on it stay). docs/ublk.md.
    #[arg(long, value_name = "ID", num_args = 0..=1, default_missing_value = "auto",
          value_parser = parse_ublk_id)]
    pub ublk: Option<UblkId>,
    /// With --ublk: write the device's number to FILE (atomically) once it
    /// is known, before the device starts, and remove the file when a
    /// clean stop deletes the device (`nvraid run` and the udev rule for
    /// /dev/nvraid/NAME read it).
    #[arg(long, value_name = "FILE", requires = "ublk")]
    pub ublk_record: Option<PathBuf>,
    /// With --ublk, what SIGTERM does with the device: `auto` leaves it
    /// for the next server while it is in use (a mounted filesystem: a
    /// restart, with the filesystem staying mounted) and deletes it
    /// otherwise; `delete` always deletes it; `keep` always leaves it.
    /// Either way the requests taken are finished and the array flushed.
    #[arg(long, value_enum, value_name = "WHEN", default_value = "auto")]
    pub ublk_stop: UblkStopArg,
    /// With --ublk: `on` (default) adds the device with ublk's user
    /// recovery, so that a killed server leaves it (and a filesystem on
    /// it) waiting for the next `serve --ublk ID`; `off`: when the server
    /// dies, the device fails its I/O and goes away (its number stays
    /// taken until `nvraid ublk delete ID`).
    #[arg(long, value_enum, value_name = "ON|OFF", default_value = "on")]
    pub ublk_recovery: Switch,
    /// Also serve the array as an NVMe over TCP subsystem (namespace 1,
    /// with a discovery controller) on HOST:PORT (HOST alone: port 4420),
    /// for hosts that attach with `nvme connect -t tcp`. Without --listen,
    /// no NBD socket is opened. docs/scale-out.md.
    #[arg(long = "nvme-tcp", value_name = "HOST:PORT",
          value_parser = crate::nvme::options::NvmeOptions::parse_listen)]
    pub nvme_tcp: Option<String>,
    /// With --nvme-tcp: the subsystem's NQN (default
    /// nqn.2014-08.org.nvraid:uuid:<the array's UUID>).
    #[arg(long, value_name = "NQN", requires = "nvme_tcp")]
    pub nqn: Option<String>,
    /// With --nvme-tcp: a host NQN allowed to connect (repeatable; default:
    /// any host). Others are refused at Connect.
    #[arg(long = "nvme-host", value_name = "NQN", requires = "nvme_tcp")]
    pub nvme_host: Vec<String>,
}

/// `on` or `off`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Switch {
    On,
    Off,
}

/// `--ublk-stop`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum UblkStopArg {
    Auto,
    Delete,
    Keep,
}

/// `--ublk ID`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum UblkId {
    Auto,
    Number(u32),
}

fn parse_ublk_id(text: &str) -> Result<UblkId, String> {
    if text == "auto" {
        return Ok(UblkId::Auto);
    }
    match text.parse::<u32>() {
        Ok(n) if n < 1 << 20 => Ok(UblkId::Number(n)),
        _ => Err(format!(
            "{text:?} is not a device number or `auto` (write --ublk=ID, or put --ublk \
             after the members, when the next word is a member)"
        )),
    }
}

impl ServeArgs {
    /// Turn flags into options (defaults for everything not a flag).
    /// `--tls on|require` without a certificate, or a certificate with
    /// `--tls off`, is refused.
    pub fn to_options(&self) -> Result<ServeOptions, String> {
        let listen = if self.listen.is_empty() && (self.ublk.is_some() || self.nvme_tcp.is_some()) {
            Vec::new()
        } else if self.listen.is_empty() {
            vec![ListenAddress::Unix(PathBuf::from(DEFAULT_SOCKET))]
        } else {
            self.listen.clone()
        };
        let tls = match self.tls {
            TlsArg::Off => TlsMode::Off,
            TlsArg::On => TlsMode::On,
            TlsArg::Require => TlsMode::Require,
        };
        let tls_files = match (&self.tls_cert, &self.tls_key) {
            (Some(cert), Some(key)) => Some(TlsFiles {
                cert: cert.clone(),
                key: key.clone(),
                client_ca: self.tls_ca.clone(),
            }),
            _ => None,
        };
        if tls == TlsMode::Off && tls_files.is_some() {
            return Err("--tls-cert/--tls-key given but --tls is off".into());
        }
        if self.tls_verify_peer && tls != TlsMode::Require {
            return Err(
                "--tls-verify-peer needs --tls require (a client that skips TLS would skip the check)"
                    .into(),
            );
        }
        let defaults = ServeOptions::default();
        let mut options = ServeOptions {
            listen,
            export_name: self.export.clone(),
            read_only: self.read_only,
            tls,
            tls_files,
            connections_max: self.max_connections,
            handshake_timeout: std::time::Duration::from_secs(self.handshake_timeout),
            idle_timeout: (self.idle_timeout > 0)
                .then(|| std::time::Duration::from_secs(self.idle_timeout)),
            transfer_timeout: std::time::Duration::from_secs(self.transfer_timeout),
            request_max_bytes: self.max_request,
            inflight_max: self.max_inflight,
            inflight_max_bytes: defaults
                .inflight_max_bytes
                .max(2 * u64::from(self.max_request)),
            workers: self.workers.unwrap_or(defaults.workers),
            ..defaults
        };
        options.ublk = self.ublk.map(|id| UblkOptions {
            id: match id {
                UblkId::Auto => None,
                UblkId::Number(n) => Some(n),
            },
            record: self.ublk_record.clone(),
            on_stop: match self.ublk_stop {
                UblkStopArg::Auto => UblkStop::Auto,
                UblkStopArg::Delete => UblkStop::Delete,
                UblkStopArg::Keep => UblkStop::Keep,
            },
            recovery: self.ublk_recovery == Switch::On,
            ..UblkOptions::default()
        });
        options.nvme = self
            .nvme_tcp
            .as_ref()
            .map(|listen| crate::nvme::NvmeOptions {
                listen: listen.clone(),
                nqn: self.nqn.clone().unwrap_or_default(),
                hosts: self.nvme_host.clone(),
                ..crate::nvme::NvmeOptions::default()
            });
        options.control_socket = self
            .control
            .clone()
            .or_else(|| default_control(&options.listen));
        options.validate()?;
        Ok(options)
    }
}

fn default_control(listen: &[ListenAddress]) -> Option<PathBuf> {
    listen.iter().find_map(|a| match a {
        ListenAddress::Unix(path) => Some(path.with_extension("ctl")),
        ListenAddress::Tcp(_) => None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Binary {
        #[command(flatten)]
        serve: ServeArgs,
    }

    fn parse(args: &[&str]) -> Result<ServeOptions, String> {
        let mut all = vec!["nvraid"];
        all.extend_from_slice(args);
        Binary::try_parse_from(all)
            .map_err(|e| e.to_string())?
            .serve
            .to_options()
    }

    #[test]
    fn defaults_listen_on_a_unix_socket_with_a_control_socket_beside_it() {
        let options = parse(&[]).unwrap();
        assert_eq!(
            options.listen,
            vec![ListenAddress::Unix(DEFAULT_SOCKET.into())]
        );
        assert_eq!(
            options.control_socket,
            Some(PathBuf::from("/run/nvraid/nvraid.ctl"))
        );
        assert_eq!(options.request_max_bytes, 32 << 20);
        assert_eq!(options.tls, TlsMode::Off);
        assert_eq!(options.transfer_timeout, std::time::Duration::from_secs(30));
    }

    #[test]
    fn nvme_tcp_takes_port_4420_by_default_and_needs_no_nbd_listener() {
        let options = parse(&["--nvme-tcp", "10.0.0.5"]).unwrap();
        assert!(options.listen.is_empty(), "no NBD socket without --listen");
        let nvme = options.nvme.unwrap();
        assert_eq!(nvme.listen, "10.0.0.5:4420");
        assert!(nvme.nqn.is_empty(), "the NQN is derived from the array");
        let uuid = [0x12; 16];
        assert_eq!(
            crate::nvme::NvmeOptions {
                namespace_uuid: uuid,
                ..nvme
            }
            .subsystem_nqn(),
            "nqn.2014-08.org.nvraid:uuid:12121212-1212-1212-1212-121212121212"
        );
        let options = parse(&[
            "--nvme-tcp",
            "[::1]:4421",
            "--nqn",
            "nqn.2014-08.org.example:data",
            "--nvme-host",
            "nqn.2014-08.org.example:h1",
            "--listen",
            "tcp:10809",
        ])
        .unwrap();
        let nvme = options.nvme.unwrap();
        assert_eq!(nvme.listen, "[::1]:4421");
        assert_eq!(nvme.subsystem_nqn(), "nqn.2014-08.org.example:data");
        assert_eq!(nvme.hosts, vec!["nqn.2014-08.org.example:h1".to_string()]);
        assert_eq!(options.listen.len(), 1);
    }

    #[test]
    fn bad_nvme_tcp_flags_are_refused_by_name() {
        let err = parse(&["--nvme-tcp", "host:port"]).unwrap_err();
        assert!(err.contains("--nvme-tcp"), "{err}");
        let err = parse(&["--nvme-tcp", "127.0.0.1", "--nqn", "data"]).unwrap_err();
        assert!(err.contains("--nqn \"data\": not an NQN"), "{err}");
        let err = parse(&[
            "--nvme-tcp",
            "127.0.0.1",
            "--nqn",
            "nqn.2014-08.org.nvmexpress.discovery",
        ])
        .unwrap_err();
        assert!(err.contains("discovery controller"), "{err}");
        let err = parse(&["--nvme-tcp", "127.0.0.1", "--nvme-host", "me"]).unwrap_err();
        assert!(err.contains("--nvme-host \"me\""), "{err}");
        let err = parse(&["--nqn", "nqn.2014-08.org.example:x"]).unwrap_err();
        assert!(err.contains("--nvme-tcp"), "--nqn alone: {err}");
    }

    #[test]
    fn tcp_without_host_binds_loopback() {
        let options = parse(&["--listen", "tcp:10809", "--listen", "unix:/tmp/x.sock"]).unwrap();
        assert_eq!(
            options.listen[0],
            ListenAddress::Tcp("127.0.0.1:10809".into())
        );
        assert_eq!(options.listen[1], ListenAddress::Unix("/tmp/x.sock".into()));
        assert!(parse(&["--listen", "tcp:host"]).is_err());
        assert!(parse(&["--listen", "relative"]).is_err());
    }

    #[test]
    fn tls_flags_must_agree() {
        assert!(parse(&["--tls", "require"]).is_err());
        assert!(parse(&["--tls-cert", "c.pem", "--tls-key", "k.pem"]).is_err());
        assert!(parse(&["--tls-cert", "c.pem"]).is_err());
        let options = parse(&[
            "--tls",
            "require",
            "--tls-cert",
            "c.pem",
            "--tls-key",
            "k.pem",
        ])
        .unwrap();
        assert_eq!(options.tls, TlsMode::Require);
    }

    #[test]
    fn ublk_takes_a_number_or_auto_and_listens_on_nothing_else_unless_asked() {
        let options = parse(&["--ublk"]).unwrap();
        assert!(options.listen.is_empty(), "{:?}", options.listen);
        assert_eq!(options.ublk.as_ref().unwrap().id, None);
        assert_eq!(options.control_socket, None);
        let options = parse(&["--ublk", "auto"]).unwrap();
        assert_eq!(options.ublk.unwrap().id, None);
        let options = parse(&["--ublk=3", "--listen", "unix:/tmp/x.sock"]).unwrap();
        assert_eq!(options.ublk.unwrap().id, Some(3));
        assert_eq!(
            options.listen,
            vec![ListenAddress::Unix("/tmp/x.sock".into())]
        );
        let options = parse(&["--ublk", "--ublk-record", "/run/nvraid/ublk/data"]).unwrap();
        assert_eq!(
            options.ublk.unwrap().record,
            Some(PathBuf::from("/run/nvraid/ublk/data"))
        );
        assert!(
            parse(&["--ublk-record", "/tmp/r"]).is_err(),
            "only with --ublk"
        );
        let e = parse(&["--ublk", "/dev/vdb"]).unwrap_err();
        assert!(e.contains("not a device number or `auto`"), "{e}");
        assert!(parse(&[]).unwrap().ublk.is_none());
    }

    #[test]
    fn limits_are_taken_and_checked() {
        let options = parse(&[
            "--max-connections",
            "4",
            "--max-request",
            "1048576",
            "--read-only",
            "--export",
            "a",
        ])
        .unwrap();
        assert_eq!(options.connections_max, 4);
        assert_eq!(options.request_max_bytes, 1 << 20);
        assert!(options.read_only);
        assert_eq!(options.export_name, "a");
        assert!(parse(&["--max-connections", "0"]).is_err());
        let options = parse(&["--transfer-timeout", "2"]).unwrap();
        assert_eq!(options.transfer_timeout, std::time::Duration::from_secs(2));
        assert!(parse(&["--transfer-timeout", "0"]).is_err());
        assert!(parse(&["--max-request", "100"]).is_err());
    }
}
