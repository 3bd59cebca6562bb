//! Byte-exact vectors for the NVMe/TCP codec, and the reader's refusals.

use nvraid_nvme_tcp::command::{
    property, ConnectData, Cqe, DsmRange, Sqe, Status, CONNECT_DATA_BYTES,
};
use nvraid_nvme_tcp::identify::{Controller, Namespace, IDENTIFY_BYTES};
use nvraid_nvme_tcp::pdu::{
    self, crc32c, encode_c2h_data, encode_capsule_cmd, encode_capsule_resp, encode_r2t,
    encode_term_req, DataHeader, Digests, Header, IcReq, IcResp,
};
use nvraid_nvme_tcp::reader::{Event, Expect, PduReader, Role, Want};
use nvraid_nvme_tcp::ParseError;

fn hex(s: &str) -> Vec<u8> {
    let s: String = s.chars().filter(|c| !c.is_whitespace()).collect();
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
        .collect()
}

#[test]
fn crc32c_is_the_castagnoli_check_value() {
    assert_eq!(crc32c(b"123456789"), 0xe306_9283);
    assert_eq!(crc32c(&[0u8; 32]), 0x8a91_36aa);
}

#[test]
fn icreq_is_byte_exact() {
    let b = IcReq {
        pfv: 0,
        hpda: 0,
        digests: Digests {
            header: true,
            data: false,
        },
        maxr2t: 0,
    }
    .encode();
    let mut want = hex("00 00 80 00 80000000 0000 00 01 00000000");
    want.resize(128, 0);
    assert_eq!(b.to_vec(), want);
    assert!(IcReq::parse(&b).unwrap().digests.header);
}

#[test]
fn icresp_parses_and_refuses_an_unsupported_pfv() {
    let mut b = hex("01 00 80 00 80000000 0000 00 03 00000200");
    b.resize(128, 0);
    let r = IcResp::parse(&b).unwrap();
    assert_eq!(r.maxh2cdata, 131072);
    assert!(r.digests.header && r.digests.data);
    b[8] = 1;
    assert_eq!(IcResp::parse(&b), Err(ParseError::Version(1)));
    b[8] = 0;
    b[12..16].copy_from_slice(&100u32.to_le_bytes());
    assert!(matches!(
        IcResp::parse(&b),
        Err(ParseError::Field {
            field: "MAXH2CDATA",
            ..
        })
    ));
}

#[test]
fn read_command_capsule_is_byte_exact() {
    let sqe = Sqe::read(0x1234, 1, 0x0102_0304_0506_0708, 8, 4096);
    let want = hex("02 40 3412 01000000 00000000 00000000 0000000000000000
         0000000000000000 00100000 000000 5a
         0807060504030201 07000000 00000000 00000000 00000000");
    assert_eq!(sqe.0.to_vec(), want);
    let mut buf = Vec::new();
    encode_capsule_cmd(&mut buf, &sqe, 0, Digests::default(), 0);
    let mut head = hex("04 00 48 00 48000000");
    head.extend_from_slice(&want);
    assert_eq!(buf, head);
}

#[test]
fn write_with_in_capsule_data_and_digests_is_framed() {
    let sqe = Sqe::write(7, 1, 16, 1, 512, true, true);
    assert_eq!(sqe.0[39], 0x01, "in-capsule SGL descriptor");
    assert_eq!(sqe.cdw(12), 1 << 30, "one block (0's based), FUA");
    let d = Digests {
        header: true,
        data: true,
    };
    let mut buf = Vec::new();
    encode_capsule_cmd(&mut buf, &sqe, 512, d, 0);
    // hlen 72 + hdgst 4 = pdo 76; plen 76 + 512 + 4.
    assert_eq!(&buf[..8], &hex("04 03 48 4c 50020000")[..]);
    assert_eq!(buf.len(), 76);
    let hd = u32::from_le_bytes(buf[72..76].try_into().unwrap());
    assert_eq!(hd, crc32c(&buf[..72]));
    // With CPDA 3 (16-byte alignment) the data starts at 80.
    let mut padded = Vec::new();
    encode_capsule_cmd(&mut padded, &sqe, 512, d, 3);
    assert_eq!(padded[3], 80);
    assert_eq!(padded.len(), 80);
}

#[test]
fn fabrics_commands_are_byte_exact() {
    let c = Sqe::connect(1, 0, 31, 120_000, true);
    assert_eq!(&c.0[..5], &hex("7f 40 0100 01")[..]);
    assert_eq!(c.0[39], 0x01);
    assert_eq!(&c.0[32..36], &hex("00040000")[..]);
    assert_eq!(&c.0[40..52], &hex("0000 0000 1f00 00 00 c0d40100")[..]);
    let g = Sqe::property_get(2, property::CAP, true);
    assert_eq!(&g.0[..5], &hex("7f 40 0200 04")[..]);
    assert_eq!(&g.0[40..48], &hex("01 000000 00000000")[..]);
    let s = Sqe::property_set(3, property::CC, 0x0046_0001);
    assert_eq!(
        &s.0[40..56],
        &hex("00 000000 14000000 0100460000000000")[..]
    );
    let data = ConnectData {
        host_id: [0xab; 16],
        cntlid: 0xffff,
        subnqn: "nqn.2014-08.org.example:a".into(),
        hostnqn: "nqn.2014-08.org.nvmexpress:uuid:x".into(),
    };
    let b = data.encode().unwrap();
    assert_eq!(b.len(), CONNECT_DATA_BYTES);
    assert_eq!(&b[16..18], &[0xff, 0xff]);
    assert_eq!(&b[256..256 + 25], b"nqn.2014-08.org.example:a");
    assert_eq!(b[256 + 25], 0);
    assert_eq!(ConnectData::parse(&b).unwrap(), data);
    let long = ConnectData {
        subnqn: "n".repeat(256),
        ..data
    };
    assert!(long.encode().is_err());
}

#[test]
fn io_commands_are_byte_exact() {
    let z = Sqe::write_zeroes(9, 1, 100, 65536, true, false);
    assert_eq!(z.opcode(), 0x08);
    assert_eq!(z.cdw(12), 0xffff | (1 << 25));
    assert_eq!(z.lba_range(), (100, 65536));
    let f = Sqe::flush(10, 1);
    assert_eq!(&f.0[..8], &hex("00 40 0a00 01000000")[..]);
    let d = Sqe::dsm_deallocate(11, 1, 2, true);
    assert_eq!((d.cdw(10), d.cdw(11)), (1, 4));
    assert_eq!(d.sgl(), (32, 0x01));
    assert_eq!(
        DsmRange {
            slba: 0x10,
            blocks: 8
        }
        .encode()
        .to_vec(),
        hex("00000000 08000000 1000000000000000")
    );
    let i = Sqe::identify(12, 1, 0);
    assert_eq!(i.cdw(10), 1);
    assert_eq!(i.sgl(), (4096, 0x5a));
}

#[test]
fn completion_entry_round_trips_with_its_status() {
    let b = hex("0100ffff00000000 0500 0000 2a00 0380");
    let c = Cqe::parse(&b);
    assert_eq!(c.result, 0xffff_0001);
    assert_eq!(c.cid, 42);
    assert_eq!(c.status.code_type(), 0);
    assert_eq!(c.status.code(), 0x01);
    assert!(!c.status.is_success());
    assert!(c.status.do_not_retry());
    let status = Status::new(1, 0x82, true);
    let back = Cqe::parse(&Cqe { status, ..c }.encode());
    assert_eq!(back.status, status);
    assert!(status.to_string().contains("invalid parameters"));
}

#[test]
fn identify_fields_are_read_from_their_offsets() {
    let mut b = vec![0u8; IDENTIFY_BYTES];
    b[24..29].copy_from_slice(b"Linux");
    b[77] = 5;
    b[516..520].copy_from_slice(&4u32.to_le_bytes());
    b[520..522].copy_from_slice(&0x000cu16.to_le_bytes());
    b[525] = 1;
    b[1792..1796].copy_from_slice(&(16u32 + 4).to_le_bytes());
    let c = Controller::parse(&b).unwrap();
    assert_eq!(c.model, "Linux");
    assert_eq!(c.max_transfer_bytes(4096), Some(128 * 1024));
    assert!(c.supports_write_zeroes() && c.supports_dsm() && c.vwc);
    assert_eq!(c.in_capsule_bytes(), 256);
    let mut n = vec![0u8; IDENTIFY_BYTES];
    n[0..8].copy_from_slice(&2048u64.to_le_bytes());
    n[25] = 1;
    n[26] = 1;
    n[128 + 4 + 2] = 12;
    let ns = Namespace::parse(&n).unwrap();
    assert_eq!((ns.block_bytes, ns.size_bytes()), (4096, Some(8 << 20)));
    n[26] = 2;
    assert!(Namespace::parse(&n).is_err(), "format index past NLBAF");
    n[26] = 0;
    n[128 + 2] = 40;
    assert!(Namespace::parse(&n).is_err(), "block size shift 40");
}

/// Feed `wire` to a host reader; data goes to `dest`.
fn run_host(
    wire: &[u8],
    d: Digests,
    lookup: &dyn Fn(u16) -> Option<Expect>,
    dest: &mut [u8],
) -> Result<Vec<Event>, ParseError> {
    let mut r = PduReader::new(Role::Host, d, 1 << 20, 0);
    let mut input = wire;
    let mut events = Vec::new();
    while !input.is_empty() {
        let e = match r.want() {
            Want::Bytes(n) => {
                let take = n.min(input.len());
                r.buffer()[..take].copy_from_slice(&input[..take]);
                input = &input[take..];
                r.filled(take, lookup)?
            }
            Want::Data { offset, len, .. } => {
                let take = (len as usize).min(input.len());
                let at = offset as usize;
                dest[at..at + take].copy_from_slice(&input[..take]);
                input = &input[take..];
                r.data_moved(&dest[at..at + take])?
            }
        };
        events.extend(e);
    }
    assert!(r.idle(), "input ended inside a PDU");
    Ok(events)
}

fn read_of_8k(cid: u16) -> Option<Expect> {
    (cid == 5).then_some(Expect {
        limit: 8192,
        next: 0,
        to_host: true,
        ttag: 0,
    })
}

fn c2h(d: Digests, cid: u16, offset: u32, data: &[u8], last: bool) -> Vec<u8> {
    let mut buf = Vec::new();
    let h = DataHeader {
        cid,
        ttag: 0,
        offset,
        length: data.len() as u32,
    };
    encode_c2h_data(&mut buf, &h, last, last, d, 0);
    buf.extend_from_slice(data);
    if d.data {
        buf.extend_from_slice(&pdu::data_digest_trailer(&[data]));
    }
    buf
}

#[test]
fn c2h_data_with_digests_lands_in_the_buffer() {
    let d = Digests {
        header: true,
        data: true,
    };
    let data: Vec<u8> = (0..4096u32).map(|i| i as u8).collect();
    let wire = c2h(d, 5, 0, &data, true);
    assert_eq!(&wire[..8], &hex("07 0f 18 1c 20100000")[..]);
    let mut dest = vec![0u8; 8192];
    let events = run_host(&wire, d, &read_of_8k, &mut dest).unwrap();
    assert_eq!(&dest[..4096], &data[..]);
    assert_eq!(
        events.last(),
        Some(&Event::DataDone {
            cid: 5,
            offset: 0,
            len: 4096,
            last: true,
            success: true
        })
    );
}

#[test]
fn a_c2h_data_with_a_bad_data_digest_is_refused() {
    let d = Digests {
        header: false,
        data: true,
    };
    let mut wire = c2h(d, 5, 0, &[7u8; 512], true);
    let n = wire.len();
    wire[n - 1] ^= 1;
    let err = run_host(&wire, d, &read_of_8k, &mut [0u8; 8192]).unwrap_err();
    assert!(matches!(err, ParseError::DataDigest { .. }), "{err}");
}

#[test]
fn a_pdu_with_a_bad_header_digest_is_refused() {
    let d = Digests {
        header: true,
        data: false,
    };
    let mut wire = Vec::new();
    encode_capsule_resp(
        &mut wire,
        &Cqe {
            result: 0,
            sq_head: 0,
            sq_id: 0,
            cid: 5,
            status: Status::SUCCESS,
        },
        d,
    );
    wire[10] ^= 0x80;
    let err = run_host(&wire, d, &read_of_8k, &mut []).unwrap_err();
    assert!(matches!(err, ParseError::HeaderDigest { .. }), "{err}");
    assert_eq!(err.fes(), 0x03);
}

#[test]
fn a_c2h_data_past_the_commands_length_is_refused() {
    let d = Digests::default();
    let wire = c2h(d, 5, 4096, &[0u8; 8192], true);
    let err = run_host(&wire, d, &read_of_8k, &mut [0u8; 8192]).unwrap_err();
    assert!(
        matches!(err, ParseError::OutOfRange { limit: 8192, .. }),
        "{err}"
    );
}

#[test]
fn a_c2h_data_for_a_command_never_sent_is_refused() {
    let d = Digests::default();
    let wire = c2h(d, 6, 0, &[0u8; 512], true);
    let err = run_host(&wire, d, &read_of_8k, &mut [0u8; 8192]).unwrap_err();
    assert_eq!(
        err,
        ParseError::UnknownCommand {
            pdu: "C2HData",
            cid: 6
        }
    );
}

#[test]
fn a_c2h_data_out_of_order_is_refused() {
    let d = Digests::default();
    let wire = c2h(d, 5, 512, &[0u8; 512], false);
    let err = run_host(&wire, d, &read_of_8k, &mut [0u8; 8192]).unwrap_err();
    assert!(matches!(err, ParseError::OutOfOrder { .. }), "{err}");
}

#[test]
fn digest_flags_must_match_what_was_negotiated() {
    let wire = c2h(
        Digests {
            header: true,
            data: false,
        },
        5,
        0,
        &[0u8; 512],
        true,
    );
    let err = run_host(&wire, Digests::default(), &read_of_8k, &mut [0u8; 8192]).unwrap_err();
    assert!(matches!(err, ParseError::Flags { .. }), "{err}");
}

#[test]
fn an_r2t_for_a_read_or_past_the_write_is_refused() {
    let mut wire = Vec::new();
    let h = DataHeader {
        cid: 5,
        ttag: 1,
        offset: 0,
        length: 4096,
    };
    encode_r2t(&mut wire, &h, Digests::default());
    assert_eq!(
        wire,
        hex("09 00 18 00 18000000 0500 0100 00000000 00100000 00000000")
    );
    let err = run_host(&wire, Digests::default(), &read_of_8k, &mut []).unwrap_err();
    assert!(matches!(err, ParseError::UnknownCommand { pdu: "R2T", .. }));
    let write_of_2k = |cid: u16| {
        (cid == 5).then_some(Expect {
            limit: 2048,
            next: 0,
            to_host: false,
            ttag: 0,
        })
    };
    let err = run_host(&wire, Digests::default(), &write_of_2k, &mut []).unwrap_err();
    assert!(matches!(err, ParseError::OutOfRange { .. }));
}

#[test]
fn a_term_req_is_reported_with_its_quote() {
    let mut wire = Vec::new();
    encode_term_req(&mut wire, false, 0x02, 0, &[1, 2, 3]);
    assert_eq!(&wire[..14], &hex("03 00 18 18 1b000000 0200 00000000")[..]);
    let events = run_host(&wire, Digests::default(), &read_of_8k, &mut []).unwrap();
    match &events[..] {
        [Event::Term(t)] => {
            assert_eq!(t.data, vec![1, 2, 3]);
            assert!(t.to_string().contains("sequence"));
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_giant_pdu_length_is_refused_at_the_common_header() {
    // A C2HData claiming 4 GiB of data.
    let wire = hex("07 00 18 18 ffffffff");
    let mut r = PduReader::new(Role::Host, Digests::default(), 1 << 20, 0);
    r.buffer().copy_from_slice(&wire);
    let err = r.filled(8, &read_of_8k).unwrap_err();
    assert!(matches!(err, ParseError::PduLength { .. }), "{err}");
    // A CapsuleResp claiming data.
    let wire = hex("05 00 18 00 00010000");
    let mut r = PduReader::new(Role::Host, Digests::default(), 1 << 20, 0);
    r.buffer().copy_from_slice(&wire);
    assert!(r.filled(8, &read_of_8k).is_err());
}

#[test]
fn a_controller_reads_a_capsule_with_in_capsule_data() {
    let sqe = Sqe::write(3, 1, 0, 1, 512, true, false);
    let mut wire = Vec::new();
    encode_capsule_cmd(&mut wire, &sqe, 512, Digests::default(), 0);
    wire.extend_from_slice(&[9u8; 512]);
    let mut r = PduReader::new(Role::Controller, Digests::default(), 1 << 20, 8192);
    let mut input = &wire[..];
    let mut got = Vec::new();
    let mut events = Vec::new();
    let none = |_: u16| None;
    while !input.is_empty() {
        let e = match r.want() {
            Want::Bytes(n) => {
                let take = n.min(input.len());
                r.buffer()[..take].copy_from_slice(&input[..take]);
                input = &input[take..];
                r.filled(take, &none).unwrap()
            }
            Want::Data { len, .. } => {
                let take = (len as usize).min(input.len());
                got.extend_from_slice(&input[..take]);
                let e = r.data_moved(&input[..take]).unwrap();
                input = &input[take..];
                e
            }
        };
        events.extend(e);
    }
    assert_eq!(got, vec![9u8; 512]);
    assert!(matches!(&events[0], Event::Header(Header::CapsuleCmd { sqe: s }) if s.cid() == 3));
    // More in-capsule data than the controller allows.
    let mut r = PduReader::new(Role::Controller, Digests::default(), 1 << 20, 256);
    r.buffer().copy_from_slice(&wire[..8]);
    assert!(r.filled(8, &none).is_err());
}
