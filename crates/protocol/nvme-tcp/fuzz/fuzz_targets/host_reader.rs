//! Fuzz the host's PDU reader: arbitrary controller bytes must parse into
//! events whose data stays inside the commands in flight, or an error,
//! never a panic.
#![no_main]

use libfuzzer_sys::fuzz_target;
use nvraid_nvme_tcp::pdu::Digests;
use nvraid_nvme_tcp::reader::{Event, Expect, PduReader, Role, Want};

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

fuzz_target!(|data: &[u8]| {
    let Some((&first, mut input)) = data.split_first() else {
        return;
    };
    let digests = Digests {
        header: first & 1 != 0,
        data: first & 2 != 0,
    };
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
});
