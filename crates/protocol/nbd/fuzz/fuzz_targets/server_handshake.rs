//! Arbitrary client bytes into the server handshake: it must never panic,
//! never consume more than it is given, and stop at the first error.
#![no_main]

use std::sync::Arc;

use libfuzzer_sys::fuzz_target;
use nvraid_nbd::consts::transmission_flags as tf;
use nvraid_nbd::{BlockSizes, ExportInfo, ServerConfig, ServerEvent, ServerHandshake, TlsPolicy};

fuzz_target!(|data: &[u8]| {
    let export = ExportInfo {
        name: "a".into(),
        description: "fuzz".into(),
        size_bytes: 1 << 30,
        transmission_flags: tf::SEND_FLUSH | tf::SEND_FUA,
        block_sizes: BlockSizes { minimum_bytes: 512, preferred_bytes: 4096, maximum_bytes: 1 << 25 },
        base_allocation: true,
    };
    let mut config = ServerConfig::new(vec![export]);
    config.tls = if data.first().is_some_and(|b| b & 1 == 1) { TlsPolicy::Required } else { TlsPolicy::Optional };
    let mut handshake = ServerHandshake::new(Arc::new(config));
    let mut input = data;
    while !input.is_empty() && !handshake.is_done() {
        match handshake.receive(input) {
            Ok((used, event)) => {
                assert!(used <= input.len());
                input = &input[used..];
                if event == Some(ServerEvent::StartTls) {
                    handshake.tls_started();
                }
                let _ = handshake.take_output();
            }
            Err(_) => break,
        }
    }
});
