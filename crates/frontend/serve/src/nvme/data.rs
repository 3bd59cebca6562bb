//! The bytes the controller reports: Identify (controller, namespace,
//! active namespace list, namespace identification descriptors), log
//! pages (error, SMART / health, firmware slots, discovery) and the CAP
//! and VS properties.

use std::net::SocketAddr;

use nvraid_nvme_tcp::identify::{oncs, IDENTIFY_BYTES};

use super::controller::Subsystem;
use super::options::DISCOVERY_NQN;

/// NVMe version reported: 1.3 (namespace descriptors, no command-set
/// specific Identify).
pub(crate) const VERSION: u32 = 0x0001_0300;
/// Asynchronous Event Requests a controller holds at once (AERL + 1).
pub(crate) const AER_MAX: usize = 4;

fn put(b: &mut [u8], at: usize, bytes: &[u8]) {
    b[at..at + bytes.len()].copy_from_slice(bytes);
}

/// An ASCII field padded with spaces.
fn put_text(b: &mut [u8], at: usize, len: usize, text: &str) {
    b[at..at + len].fill(b' ');
    let bytes = text.as_bytes();
    let n = bytes.len().min(len);
    b[at..at + n].copy_from_slice(&bytes[..n]);
}

/// An ASCII field padded with NULs (NQNs, discovery addresses).
fn put_string(b: &mut [u8], at: usize, len: usize, text: &str) {
    b[at..at + len].fill(0);
    let bytes = text.as_bytes();
    let n = bytes.len().min(len - 1);
    b[at..at + n].copy_from_slice(&bytes[..n]);
}

/// CAP: queue entries, contiguous queues required, a 15 s ready timeout,
/// the NVM command set, 4 KiB pages.
pub(crate) fn cap(subsystem: &Subsystem) -> u64 {
    let mqes = u64::from(subsystem.queue_depth - 1);
    let cqr = 1u64 << 16;
    let timeout_500ms = 30u64 << 24;
    let css_nvm = 1u64 << 37;
    mqes | cqr | timeout_500ms | css_nvm
}

/// The serial number: the namespace UUID's first 10 bytes in hex.
fn serial(subsystem: &Subsystem) -> String {
    subsystem.namespace_uuid[..10]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// Identify Controller (CNS 1).
pub(crate) fn identify_controller(subsystem: &Subsystem, cntlid: u16, discovery: bool) -> Vec<u8> {
    let mut b = vec![0u8; IDENTIFY_BYTES];
    // PCI vendor ids stay 0: no PCI vendor.
    put_text(&mut b, 4, 20, &serial(subsystem));
    put_text(&mut b, 24, 40, "nvraid");
    put_text(&mut b, 64, 8, env!("CARGO_PKG_VERSION"));
    b[72] = 6; // recommended arbitration burst
    if !discovery {
        b[76] = 1 << 1; // CMIC: more than one controller (one per host)
                        // MDTS, in units of 4 KiB pages (CAP.MPSMIN), as a power of two.
        b[77] = (subsystem.max_command_bytes / 4096).trailing_zeros() as u8;
    }
    put(&mut b, 78, &cntlid.to_le_bytes());
    put(&mut b, 80, &VERSION.to_le_bytes());
    if !discovery {
        // OAES: Namespace Attribute Notices (the array's size changed),
        // with the Changed Namespace List log page.
        put(&mut b, 92, &(1u32 << 8).to_le_bytes());
    }
    b[111] = if discovery { 2 } else { 1 }; // CNTRLTYPE
    b[258] = 3; // ACL: 4 aborts
    b[259] = (AER_MAX - 1) as u8; // AERL
    b[260] = 1 << 1; // FRMW: one firmware slot
    b[261] = 1 << 2; // LPA: extended data for Get Log Page
    b[262] = 0; // ELPE: one error log entry
    put(&mut b, 320, &10u16.to_le_bytes()); // KAS: 1 s granularity
    b[512] = 0x66; // SQES: 64 bytes
    b[513] = 0x44; // CQES: 16 bytes
    put(&mut b, 514, &subsystem.queue_depth.to_le_bytes()); // MAXCMD
    if !discovery {
        put(&mut b, 516, &1u32.to_le_bytes()); // NN
        let mut oncs_bits = 0u16;
        if !subsystem.read_only {
            oncs_bits |= oncs::DSM | oncs::WRITE_ZEROES;
        }
        put(&mut b, 520, &oncs_bits.to_le_bytes());
        // VWC: a volatile write cache (the members' caches, a write-back
        // cache), so hosts send Flush.
        b[525] = 1;
        put(&mut b, 540, &1u32.to_le_bytes()); // MNAN
    }
    // SGLS: SGLs supported, offsets in data blocks (in-capsule data).
    put(&mut b, 536, &((1u32 << 0) | (1u32 << 20)).to_le_bytes());
    let nqn = if discovery {
        DISCOVERY_NQN
    } else {
        &subsystem.nqn
    };
    put_string(&mut b, 768, 256, nqn);
    // Fabrics: capsule sizes in 16-byte units, data right after the SQE.
    let ioccsz = (64 + subsystem.in_capsule_bytes) / 16;
    put(&mut b, 1792, &ioccsz.to_le_bytes());
    put(&mut b, 1796, &1u32.to_le_bytes()); // IORCSZ: 16-byte responses
    put(&mut b, 1800, &0u16.to_le_bytes()); // ICDOFF
    b[1802] = 0; // FCATT: the dynamic controller model
    b[1803] = 1; // MSDBD: one SGL data block descriptor
    b
}

/// Identify Namespace (CNS 0) of NSID 1.
pub(crate) fn identify_namespace(subsystem: &Subsystem) -> Vec<u8> {
    let mut b = vec![0u8; IDENTIFY_BYTES];
    let blocks = subsystem.blocks();
    put(&mut b, 0, &blocks.to_le_bytes()); // NSZE
    put(&mut b, 8, &blocks.to_le_bytes()); // NCAP
    put(&mut b, 16, &blocks.to_le_bytes()); // NUSE
    b[25] = 0; // NLBAF: one format
    b[26] = 0; // FLBAS: format 0
    b[30] = 1; // NMIC: may be attached to more than one controller
    put(&mut b, 104, &subsystem.namespace_uuid); // NGUID
                                                 // LBA format 0: no metadata, the block size.
    b[130] = subsystem.block_bytes.trailing_zeros() as u8;
    b
}

/// The active namespace list (CNS 2): NSID 1 when `after` is below it.
pub(crate) fn active_namespaces(after: u32) -> Vec<u8> {
    let mut b = vec![0u8; IDENTIFY_BYTES];
    if after < 1 {
        put(&mut b, 0, &1u32.to_le_bytes());
    }
    b
}

/// Namespace identification descriptors (CNS 3): NGUID and UUID.
pub(crate) fn namespace_descriptors(subsystem: &Subsystem) -> Vec<u8> {
    let mut b = vec![0u8; IDENTIFY_BYTES];
    b[0] = 2; // NIDT: NGUID
    b[1] = 16;
    put(&mut b, 4, &subsystem.namespace_uuid);
    b[20] = 3; // NIDT: UUID
    b[21] = 16;
    put(&mut b, 24, &subsystem.namespace_uuid);
    b
}

/// Log page `lid`, whole (the caller takes the part asked for); `None`:
/// a page this controller does not have.
pub(crate) fn log_page(
    subsystem: &Subsystem,
    lid: u8,
    discovery: bool,
    local: SocketAddr,
) -> Option<Vec<u8>> {
    match (lid, discovery) {
        // Error information: one entry, empty.
        (0x01, false) => Some(vec![0u8; 64]),
        // SMART / health: no warnings, 300 K, all spare available.
        (0x02, false) => {
            let mut b = vec![0u8; 512];
            put(&mut b, 1, &300u16.to_le_bytes());
            b[3] = 100;
            b[4] = 10;
            Some(b)
        }
        // Firmware slots: slot 1 active.
        (0x03, false) => {
            let mut b = vec![0u8; 512];
            b[0] = 1;
            put_text(&mut b, 8, 8, env!("CARGO_PKG_VERSION"));
            Some(b)
        }
        (0x70, true) => Some(discovery_log(subsystem, local)),
        _ => None,
    }
}

/// The discovery log: one entry, this subsystem at the address the host
/// reached (the listener's, or the connection's when the listener is a
/// wildcard).
fn discovery_log(subsystem: &Subsystem, local: SocketAddr) -> Vec<u8> {
    let mut b = vec![0u8; 2048];
    put(&mut b, 0, &1u64.to_le_bytes()); // GENCTR
    put(&mut b, 8, &1u64.to_le_bytes()); // NUMREC
    let e = 1024;
    b[e] = 3; // TRTYPE: TCP
    b[e + 1] = if local.is_ipv4() { 1 } else { 2 }; // ADRFAM
    b[e + 2] = 2; // SUBTYPE: an NVM subsystem
    b[e + 3] = 0x02; // TREQ: secure channel not required
    put(&mut b, e + 4, &1u16.to_le_bytes()); // PORTID
    put(&mut b, e + 6, &0xffffu16.to_le_bytes()); // CNTLID: dynamic
    put(&mut b, e + 8, &32u16.to_le_bytes()); // ASQSZ
    put_string(&mut b, e + 32, 32, &local.port().to_string());
    put_string(&mut b, e + 256, 256, &local.ip().to_string());
    put_string(&mut b, e + 512, 256, &subsystem.nqn);
    b[e + 768] = 0; // TSAS: no security
    b
}
