//! Fuzz the client's reply reader: arbitrary server bytes must parse into
//! events inside the requests' ranges or a protocol error, never a panic.
#![no_main]

use libfuzzer_sys::fuzz_target;
use nvraid_nbd::reply::{Event, ReplyReader, Sent, Want};
use nvraid_nbd::transmission::Command;

fn lookup(cookie: u64) -> Option<Sent> {
    match cookie {
        7 => Some(Sent { command: Command::Read, offset: 4096, length: 8192 }),
        8 => Some(Sent { command: Command::Write, offset: 0, length: 512 }),
        _ => None,
    }
}

fuzz_target!(|data: &[u8]| {
    let Some((&first, mut input)) = data.split_first() else { return };
    let mut reader = ReplyReader::new(first & 1 == 1);
    while !input.is_empty() {
        let event = match reader.want() {
            Want::Bytes(n) => {
                let take = n.min(input.len());
                reader.buffer()[..take].copy_from_slice(&input[..take]);
                input = &input[take..];
                match reader.filled(take, &lookup) {
                    Ok(e) => e,
                    Err(_) => return,
                }
            }
            Want::Data { cookie, at, len } => {
                let sent = lookup(cookie).expect("data only for a sent cookie");
                assert!(u64::from(at) + u64::from(len) <= u64::from(sent.length));
                let take = (len as usize).min(input.len());
                input = &input[take..];
                reader.data_moved(take as u32)
            }
        };
        if let Some(Event::Hole { cookie, at, len, .. }) = event {
            let sent = lookup(cookie).unwrap();
            assert!(u64::from(at) + u64::from(len) <= u64::from(sent.length));
        }
    }
});
