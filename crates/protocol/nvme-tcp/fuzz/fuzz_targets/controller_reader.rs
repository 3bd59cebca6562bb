//! Fuzz the controller's PDU reader: arbitrary host bytes (command
//! capsules with in-capsule data, H2CData) must parse within the bounds
//! given, or fail, never panic.
#![no_main]

use libfuzzer_sys::fuzz_target;
use nvraid_nvme_tcp::pdu::Digests;
use nvraid_nvme_tcp::reader::{Expect, PduReader, Role, Want};

fn lookup(cid: u16) -> Option<Expect> {
    (cid == 3).then_some(Expect {
        limit: 16384,
        next: 4096,
        to_host: false,
        ttag: 1,
    })
}

fuzz_target!(|data: &[u8]| {
    let Some((&first, mut input)) = data.split_first() else {
        return;
    };
    let digests = Digests {
        header: first & 1 != 0,
        data: first & 2 != 0,
    };
    let mut reader = PduReader::new(Role::Controller, digests, 65536, 8192);
    while !input.is_empty() {
        let result = match reader.want() {
            Want::Bytes(n) => {
                assert!(n <= 256);
                let take = n.min(input.len());
                reader.buffer()[..take].copy_from_slice(&input[..take]);
                input = &input[take..];
                reader.filled(take, &lookup)
            }
            Want::Data { cid, offset, len } => {
                if cid == 3 {
                    assert!(offset >= 4096 && u64::from(offset) + u64::from(len) <= 16384);
                } else {
                    assert!(offset == 0 && len <= 8192);
                }
                let take = (len as usize).min(input.len());
                let (moved, rest) = input.split_at(take);
                input = rest;
                reader.data_moved(moved)
            }
        };
        if result.is_err() {
            return;
        }
    }
});
