//! The client's reply reader: well-formed replies are understood, and any
//! bytes at all either parse into events inside the requests' ranges or
//! end in a protocol error, never a panic or an out-of-range write. The
//! fuzz target `reply_reader` runs the same driver.

use nvraid_nbd::consts::reply_type;
use nvraid_nbd::reply::{Event, ReplyReader, Sent, Want};
use nvraid_nbd::transmission::{
    encode_offset_data_header, encode_simple_reply, ChunkHeader, Command,
};
use proptest::prelude::*;

const SENT: [(u64, Sent); 3] = [
    (
        7,
        Sent {
            command: Command::Read,
            offset: 4096,
            length: 8192,
        },
    ),
    (
        8,
        Sent {
            command: Command::Write,
            offset: 0,
            length: 512,
        },
    ),
    (
        9,
        Sent {
            command: Command::Flush,
            offset: 0,
            length: 0,
        },
    ),
];

fn lookup(cookie: u64) -> Option<Sent> {
    SENT.iter().find(|(c, _)| *c == cookie).map(|(_, s)| *s)
}

/// Feed `input`; returns the events (or the error) and checks every data
/// range against the request it belongs to.
fn drive(structured: bool, mut input: &[u8]) -> Result<Vec<Event>, String> {
    let mut reader = ReplyReader::new(structured);
    let mut events = Vec::new();
    while !input.is_empty() {
        let event = match reader.want() {
            Want::Bytes(n) => {
                let take = n.min(input.len());
                reader.buffer()[..take].copy_from_slice(&input[..take]);
                input = &input[take..];
                reader.filled(take, &lookup).map_err(|e| e.to_string())?
            }
            Want::Data { cookie, at, len } => {
                let sent = lookup(cookie).expect("data only for a sent cookie");
                assert!(u64::from(at) + u64::from(len) <= u64::from(sent.length));
                let take = (len as usize).min(input.len());
                input = &input[take..];
                reader.data_moved(take as u32)
            }
        };
        if let Some(event) = event {
            if let Event::Hole {
                cookie, at, len, ..
            } = event
            {
                let sent = lookup(cookie).unwrap();
                assert!(u64::from(at) + u64::from(len) <= u64::from(sent.length));
            }
            events.push(event);
        }
    }
    Ok(events)
}

#[test]
fn simple_and_structured_replies_are_understood() {
    let mut wire = encode_simple_reply(8, None).to_vec();
    wire.extend(encode_simple_reply(7, None));
    wire.extend(vec![1u8; 8192]);
    let events = drive(false, &wire).unwrap();
    assert_eq!(events[0], Event::Done { cookie: 8 });
    assert_eq!(
        events[1],
        Event::DataEnd {
            cookie: 7,
            at: 0,
            len: 8192,
            done: true
        }
    );

    let mut wire = encode_offset_data_header(7, 8192, 4096, false).to_vec();
    wire.extend(vec![2u8; 4096]);
    let hole = ChunkHeader {
        flags: 1,
        reply_type: reply_type::OFFSET_HOLE,
        cookie: 7,
        length_bytes: 12,
    };
    wire.extend(hole.encode());
    wire.extend(4096u64.to_be_bytes());
    wire.extend(4096u32.to_be_bytes());
    let events = drive(true, &wire).unwrap();
    assert_eq!(
        events[0],
        Event::DataEnd {
            cookie: 7,
            at: 4096,
            len: 4096,
            done: false
        }
    );
    assert_eq!(
        events[1],
        Event::Hole {
            cookie: 7,
            at: 0,
            len: 4096,
            done: true
        }
    );
}

#[test]
fn lies_are_protocol_errors() {
    // Data past the request's end.
    let mut wire = encode_offset_data_header(7, 8192, 8192, true).to_vec();
    wire.extend(vec![0u8; 8192]);
    assert!(drive(true, &wire)
        .unwrap_err()
        .contains("outside the request"));
    // A cookie never sent.
    assert!(drive(false, &encode_simple_reply(99, None))
        .unwrap_err()
        .contains("not sent"));
    // Data for a write.
    let wire = encode_offset_data_header(8, 0, 512, true);
    assert!(drive(true, &wire).unwrap_err().contains("non-read"));
    // A structured chunk when none was agreed.
    assert!(drive(
        false,
        &ChunkHeader {
            flags: 1,
            reply_type: 0,
            cookie: 9,
            length_bytes: 0
        }
        .encode()
    )
    .unwrap_err()
    .contains("not agreed"));
    // An error chunk claiming a huge message.
    let header = ChunkHeader {
        flags: 1,
        reply_type: reply_type::ERROR,
        cookie: 9,
        length_bytes: 1 << 30,
    };
    assert!(drive(true, &header.encode())
        .unwrap_err()
        .contains("wrong length"));
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2000, ..ProptestConfig::default() })]

    #[test]
    fn any_bytes_parse_or_fail_cleanly(structured: bool, bytes in proptest::collection::vec(any::<u8>(), 0..256)) {
        let _ = drive(structured, &bytes);
    }

    /// Garbage after a valid prefix: the prefix's magic makes the random
    /// tail reach the deeper states.
    #[test]
    fn garbage_after_a_valid_header(cookie in 7u64..10, kind in 0u16..4, len in 0u32..20000,
                                   tail in proptest::collection::vec(any::<u8>(), 0..64)) {
        let mut wire = ChunkHeader { flags: 1, reply_type: kind, cookie, length_bytes: len }.encode().to_vec();
        wire.extend(tail);
        let _ = drive(true, &wire);
    }
}
