//! Arbitrary bytes as transmission requests: parsing and checking must not
//! panic, and an accepted data request lies inside the export.
#![no_main]

use libfuzzer_sys::fuzz_target;
use nvraid_nbd::consts::transmission_flags as tf;
use nvraid_nbd::transmission::ReplyHeader;
use nvraid_nbd::{Command, RequestHeader, RequestRules};

fuzz_target!(|data: &[u8]| {
    let rules = RequestRules {
        size_bytes: 1 << 30,
        minimum_block_bytes: 512,
        maximum_payload_bytes: 1 << 25,
        transmission_flags: tf::HAS_FLAGS | tf::SEND_FUA | tf::SEND_DF,
        block_status: data.len() % 2 == 0,
        any_alignment: data.len() % 3 == 0,
    };
    for chunk in data.chunks_exact(28) {
        let Ok(header) = RequestHeader::parse(chunk.try_into().unwrap()) else { continue };
        assert_eq!(RequestHeader::parse(&header.encode()), Ok(header));
        if rules.check(&header).is_ok() && !matches!(header.command, Command::Flush | Command::Disconnect) {
            assert!(header.offset + u64::from(header.length) <= rules.size_bytes);
        }
    }
    let _ = ReplyHeader::parse(data);
});
