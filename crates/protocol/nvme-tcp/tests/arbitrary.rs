//! The fuzz targets' harness, run on random input in CI (the fuzz
//! directory itself needs nightly): the host reader never panics and never
//! asks for data outside a command in flight.

use nvraid_nvme_tcp::pdu::{encode_c2h_data, DataHeader, Digests};
use nvraid_nvme_tcp::reader::{Event, Expect, PduReader, Role, Want};
use proptest::prelude::*;

fn lookup(cid: u16) -> Option<Expect> {
    match cid {
        7 => Some(Expect {
            limit: 8192,
            next: 0,
            to_host: true,
            ttag: 0,
        }),
        8 => Some(Expect {
            limit: 4096,
            next: 0,
            to_host: false,
            ttag: 0,
        }),
        _ => None,
    }
}

fn run(digests: Digests, mut input: &[u8]) {
    let mut reader = PduReader::new(Role::Host, digests, 1 << 20, 0);
    let mut dest = vec![0u8; 8192];
    while !input.is_empty() {
        let event = match reader.want() {
            Want::Bytes(n) => {
                assert!(n <= 256);
                let take = n.min(input.len());
                reader.buffer()[..take].copy_from_slice(&input[..take]);
                input = &input[take..];
                match reader.filled(take, &lookup) {
                    Ok(e) => e,
                    Err(_) => return,
                }
            }
            Want::Data { cid, offset, len } => {
                let e = lookup(cid).expect("data only for a command in flight");
                assert!(u64::from(offset) + u64::from(len) <= u64::from(e.limit));
                let take = (len as usize).min(input.len());
                let at = offset as usize;
                dest[at..at + take].copy_from_slice(&input[..take]);
                input = &input[take..];
                match reader.data_moved(&dest[at..at + take]) {
                    Ok(e) => e,
                    Err(_) => return,
                }
            }
        };
        if let Some(Event::DataDone {
            cid, offset, len, ..
        }) = event
        {
            let e = lookup(cid).unwrap();
            assert!(u64::from(offset) + u64::from(len) <= u64::from(e.limit));
        }
    }
}

proptest! {
    #[test]
    fn random_bytes_never_panic_the_host_reader(h in any::<bool>(), d in any::<bool>(),
            bytes in proptest::collection::vec(any::<u8>(), 0..600)) {
        run(Digests { header: h, data: d }, &bytes);
    }

    /// A valid C2HData with some bytes changed: still no panic, no data
    /// outside the command.
    #[test]
    fn mutated_c2h_data_never_escapes_the_command(h in any::<bool>(), d in any::<bool>(),
            flips in proptest::collection::vec((0usize..120, any::<u8>()), 0..4)) {
        let digests = Digests { header: h, data: d };
        let mut wire = Vec::new();
        let header = DataHeader { cid: 7, ttag: 0, offset: 0, length: 64 };
        encode_c2h_data(&mut wire, &header, true, true, digests, 0);
        wire.extend_from_slice(&[0x5a; 64]);
        if d {
            wire.extend_from_slice(&[0; 4]);
        }
        for (at, v) in flips {
            let n = wire.len();
            wire[at % n] = v;
        }
        run(digests, &wire);
    }
}
