//! `nvraid serve --nvme-tcp` on this host, reached with nvraid's own
//! NVMe/TCP initiator (this host's kernel has no NVMe/TCP; the kernel's
//! initiator is `kernel_nvme_serve`'s, in the VM): the subsystem NQN is
//! derived from the array's UUID, `--nvme-host` lets only its host in,
//! `nvraid status` lists the host and its queue, what the host wrote is on
//! the members after SIGINT, and bad flags are refused before the array is
//! assembled.

mod common;

use common::*;
use nvraid_remote::nvme::NvmeExport;
use nvraid_remote::RemoteOptions;
use std::time::Duration;

const HOST: &str = "nqn.2014-08.org.nvraid:cli-test";

fn options() -> RemoteOptions {
    RemoteOptions {
        request_timeout: Duration::from_secs(10),
        connect_timeout: Duration::from_secs(5),
    }
}

/// The address and NQN the server's log says it listens on.
fn listening(dir: &std::path::Path) -> (String, String) {
    for _ in 0..400 {
        let log = std::fs::read_to_string(dir.join("serve.log")).unwrap_or_default();
        if let Some(line) = log.lines().find(|l| l.contains("event=listening-nvme-tcp")) {
            let field = |name: &str| {
                line.split(' ')
                    .find_map(|w| w.strip_prefix(name))
                    .unwrap_or_else(|| panic!("no {name} in {line}"))
                    .to_string()
            };
            return (field("address="), field("nqn="));
        }
        std::thread::sleep(Duration::from_millis(25));
    }
    panic!(
        "no NVMe/TCP listener: {}",
        std::fs::read_to_string(dir.join("serve.log")).unwrap_or_default()
    );
}

#[test]
fn serve_nvme_tcp_exports_the_array_under_its_uuids_nqn_to_the_allowed_host() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let members = vec!["m0".to_string(), "m1".to_string()];
    ok(&["create", "--level", "1", "--size", "16M", "m0", "m1"], d);
    let detail: serde_json::Value =
        serde_json::from_str(&ok(&["detail", "--json", "m0", "m1"], d)).unwrap();
    let hex: String = detail["uuid"]
        .as_str()
        .unwrap()
        .chars()
        .filter(char::is_ascii_hexdigit)
        .collect();
    let expected = format!(
        "nqn.2014-08.org.nvraid:uuid:{}-{}-{}-{}-{}",
        &hex[0..8],
        &hex[8..12],
        &hex[12..16],
        &hex[16..20],
        &hex[20..32]
    );
    let metrics = {
        let probe = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        probe.local_addr().unwrap().to_string()
    };
    let served = serve_with(
        d,
        &members,
        &[
            "--nvme-tcp",
            "127.0.0.1:0",
            "--nvme-host",
            HOST,
            "--metrics",
            &metrics,
        ],
    );
    let (address, nqn) = listening(d);
    assert_eq!(nqn, expected);
    // Another host is refused at Connect.
    let stranger = NvmeExport::open(
        &format!("nvme+tcp://{address}/{nqn}?hostnqn=nqn.2014-08.org.example:other"),
        options(),
    );
    let Err(refused) = stranger else {
        panic!("a host not in --nvme-host got in");
    };
    assert!(refused.to_string().contains("host"), "{refused}");
    // The allowed host writes and reads back.
    let export = NvmeExport::open(
        &format!("nvme+tcp://{address}/{nqn}?hostnqn={HOST}"),
        options(),
    )
    .unwrap();
    assert_eq!(
        export.info().size_bytes,
        detail["size_bytes"].as_u64().unwrap()
    );
    let data: Vec<u8> = (0..1 << 20)
        .map(|i| (i % 251) as u8 ^ (i >> 16) as u8)
        .collect();
    export.write_at(&data, 4096).unwrap();
    export.flush().unwrap();
    let mut back = vec![0u8; data.len()];
    export.read_at(&mut back, 4096).unwrap();
    assert!(back == data, "read back differently");
    let json: serde_json::Value = serde_json::from_str(&ok(
        &[
            "status",
            "--socket",
            d.join("md.ctl").to_str().unwrap(),
            "--json",
        ],
        d,
    ))
    .unwrap();
    let controllers = json["nvme"]["controllers"].as_array().unwrap();
    assert_eq!(controllers.len(), 1, "{json}");
    assert_eq!(controllers[0]["hostnqn"], HOST);
    assert_eq!(controllers[0]["io_queues"].as_array().unwrap().len(), 1);
    assert_eq!(json["nvme"]["nqn"], nqn.as_str());
    let text = ok(
        &["status", "--socket", d.join("md.ctl").to_str().unwrap()],
        d,
    );
    assert!(
        text.contains(&format!("nvme-tcp: {address} nqn {nqn} (1 controllers)"))
            && text.contains(&format!("host {HOST}"))
            && text.contains("io_queues=1"),
        "{text}"
    );
    // /metrics counts the commands as the nvme export's, and times them.
    let scrape = {
        use std::io::{Read, Write};
        let mut stream = std::net::TcpStream::connect(&metrics).unwrap();
        stream.write_all(b"GET /metrics HTTP/1.0\r\n\r\n").unwrap();
        let mut text = String::new();
        stream.read_to_string(&mut text).unwrap();
        text
    };
    let sample = |name: &str, labels: &[&str]| -> f64 {
        scrape
            .lines()
            .filter(|l| l.starts_with(&format!("{name}{{")))
            .find(|l| labels.iter().all(|want| l.contains(want)))
            .and_then(|l| l.rsplit(' ').next())
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("no {name} {labels:?} in\n{scrape}"))
    };
    let nvme_write = ["export=\"nvme\"", "op=\"write\""];
    let writes = sample("nvraid_export_requests_total", &nvme_write);
    assert!(writes >= 1.0, "{scrape}");
    let timed = sample("nvraid_export_request_duration_seconds_count", &nvme_write);
    assert_eq!(timed, writes, "{scrape}");
    let reads = ["export=\"nvme\"", "op=\"read\""];
    assert!(sample("nvraid_export_request_duration_seconds_count", &reads) >= 1.0);
    let nbd = ["export=\"nbd\"", "op=\"write\""];
    assert_eq!(
        sample("nvraid_export_requests_total", &nbd),
        0.0,
        "{scrape}"
    );
    export.close();
    served.interrupt();
    // On the members, after a clean stop.
    ok(
        &[
            "read", "--offset", "4096", "--length", "1M", "--output", "out", "m0", "m1",
        ],
        d,
    );
    assert!(std::fs::read(d.join("out")).unwrap() == data);
    let text = ok(&["detail", "m0", "m1"], d);
    assert!(text.lines().any(|l| l.trim() == "State : clean"), "{text}");
}

#[test]
fn bad_nvme_tcp_flags_are_refused_before_the_array_is_assembled() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    ok(&["create", "--level", "1", "--size", "8M", "m0", "m1"], d);
    refused(
        &[
            "serve",
            "--nvme-tcp",
            "127.0.0.1",
            "--nqn",
            "data",
            "m0",
            "m1",
        ],
        d,
        &["--nqn \"data\": not an NQN"],
    );
    refused(
        &[
            "serve",
            "--nvme-tcp",
            "127.0.0.1",
            "--nvme-host",
            "host-a",
            "m0",
            "m1",
        ],
        d,
        &["--nvme-host \"host-a\": not an NQN"],
    );
    refused(
        &[
            "serve",
            "--nvme-tcp",
            "127.0.0.1",
            "--nqn",
            "nqn.2014-08.org.nvmexpress.discovery",
            "m0",
            "m1",
        ],
        d,
        &["discovery controller's NQN"],
    );
    // An address another process listens on.
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let address = taken.local_addr().unwrap().to_string();
    refused(
        &["serve", "--nvme-tcp", &address, "m0", "m1"],
        d,
        &[&format!("nvme-tcp:{address}")],
    );
}

/// `serve` binds its listening sockets (`--nvme-tcp`, `--listen`) before
/// it assembles the array: an address in use is refused by name even when
/// the members could not be assembled at all (before, the members were
/// assembled first and the bind failed after), and the refusal of a real
/// array changes no byte on any member.
#[test]
fn a_busy_nvme_tcp_port_is_refused_before_the_array_is_assembled() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let address = taken.local_addr().unwrap().to_string();
    // No array at all: the port is what is refused, not the members.
    refused(
        &["serve", "--nvme-tcp", &address, "absent0", "absent1"],
        d,
        &[&format!("nvme-tcp:{address}")],
    );
    refused(
        &[
            "serve",
            "--listen",
            &format!("tcp:{address}"),
            "absent0",
            "absent1",
        ],
        d,
        &[&address],
    );
    // A mirror: nothing on its members changes.
    ok(&["create", "--level", "1", "--size", "8M", "m0", "m1"], d);
    refused(
        &["serve", "--nvme-tcp", &address, "m0", "m1"],
        d,
        &[&format!("nvme-tcp:{address}")],
    );
}
