//! Byte-level vectors, client/server handshakes run against each other in
//! memory, and property tests (round trips, arbitrary input never panics).

use std::sync::Arc;

use nvraid_nbd::consts::{cmd_flags, opt, rep, transmission_flags as tf};
use nvraid_nbd::option::{InfoRequest, MetaContextRequest, OptionReplyHeader};
use nvraid_nbd::server::BASE_ALLOCATION_ID;
use nvraid_nbd::transmission::{
    encode_block_status_chunk, encode_error_chunk, encode_offset_data_header, encode_simple_reply,
    Extent, ReplyHeader,
};
use nvraid_nbd::*;
use proptest::prelude::*;

fn export(name: &str) -> ExportInfo {
    ExportInfo {
        name: name.into(),
        description: "test array".into(),
        size_bytes: 1 << 30,
        transmission_flags: tf::SEND_FLUSH | tf::SEND_FUA | tf::CAN_MULTI_CONN,
        block_sizes: BlockSizes {
            minimum_bytes: 512,
            preferred_bytes: 4096,
            maximum_bytes: 32 << 20,
        },
        base_allocation: true,
    }
}

fn server(tls: TlsPolicy) -> ServerHandshake {
    let mut config = ServerConfig::new(vec![export("a"), export("b")]);
    config.tls = tls;
    ServerHandshake::new(Arc::new(config))
}

/// Feed all of `input`, returning the events.
fn feed(server: &mut ServerHandshake, mut input: &[u8]) -> Result<Vec<ServerEvent>, ProtocolError> {
    let mut events = Vec::new();
    while !input.is_empty() {
        let (used, event) = server.receive(input)?;
        input = &input[used..];
        events.extend(event);
        if server.is_done() {
            break;
        }
    }
    Ok(events)
}

/// Split server output into option replies (header, data).
fn replies(mut bytes: &[u8]) -> Vec<(OptionReplyHeader, Vec<u8>)> {
    let mut out = Vec::new();
    while !bytes.is_empty() {
        let header = OptionReplyHeader::parse(bytes[..20].try_into().unwrap()).unwrap();
        let end = 20 + header.length_bytes as usize;
        out.push((header, bytes[20..end].to_vec()));
        bytes = &bytes[end..];
    }
    out
}

#[test]
fn greeting_bytes_match_the_spec() {
    let mut s = server(TlsPolicy::Off);
    let greeting = s.take_output();
    assert_eq!(&greeting[..8], b"NBDMAGIC");
    assert_eq!(&greeting[8..16], b"IHAVEOPT");
    assert_eq!(&greeting[16..], &[0, 3]);
}

#[test]
fn export_name_with_zeroes() {
    let mut s = server(TlsPolicy::Off);
    s.take_output();
    let mut input = vec![0, 0, 0, 1];
    input.extend(OptionRequest::ExportName("b".into()).encode());
    let events = feed(&mut s, &input).unwrap();
    let out = s.take_output();
    assert_eq!(out.len(), 8 + 2 + 124);
    assert_eq!(&out[..8], &(1u64 << 30).to_be_bytes());
    let flags = u16::from_be_bytes([out[8], out[9]]);
    assert_eq!(
        flags,
        tf::HAS_FLAGS | tf::SEND_FLUSH | tf::SEND_FUA | tf::CAN_MULTI_CONN
    );
    match &events[..] {
        [ServerEvent::Ready(n)] => {
            assert_eq!(n.export_index, 1);
            assert!(n.via_export_name);
        }
        other => panic!("unexpected events {other:?}"),
    }
}

#[test]
fn unknown_export_name_disconnects() {
    let mut s = server(TlsPolicy::Off);
    let mut input = vec![0, 0, 0, 3];
    input.extend(OptionRequest::ExportName("nope".into()).encode());
    assert_eq!(
        feed(&mut s, &input),
        Err(ProtocolError::UnknownExport("nope".into()))
    );
}

#[test]
fn bad_option_magic_is_an_error() {
    let mut s = server(TlsPolicy::Off);
    let mut input = vec![0, 0, 0, 1];
    input.extend(b"IHAVEOPX\0\0\0\x01\0\0\0\0");
    assert!(matches!(
        feed(&mut s, &input),
        Err(ProtocolError::BadMagic { .. })
    ));
}

#[test]
fn unknown_client_flags_disconnect() {
    let mut s = server(TlsPolicy::Off);
    assert_eq!(
        feed(&mut s, &[0, 0, 0, 4]),
        Err(ProtocolError::UnknownClientFlags(4))
    );
}

#[test]
fn unknown_option_gets_unsup_and_handshake_goes_on() {
    let mut s = server(TlsPolicy::Off);
    s.take_output();
    let mut input = vec![0, 0, 0, 3];
    input.extend(
        OptionRequest::Unknown {
            option: 99,
            data: vec![1, 2, 3],
        }
        .encode(),
    );
    input.extend(OptionRequest::List.encode());
    let events = feed(&mut s, &input).unwrap();
    assert!(matches!(
        events[0],
        ServerEvent::Refused {
            option: 99,
            reply: rep::ERR_UNSUP,
            ..
        }
    ));
    let r = replies(&s.take_output());
    assert_eq!(r[0].0.reply_type, rep::ERR_UNSUP);
    assert_eq!(r[1].0.reply_type, rep::SERVER);
    assert_eq!(&r[1].1[..5], &[0, 0, 0, 1, b'a']);
    assert_eq!(r[2].0.reply_type, rep::SERVER);
    assert_eq!(r[3].0.reply_type, rep::ACK);
}

#[test]
fn list_with_data_is_invalid() {
    let mut s = server(TlsPolicy::Off);
    s.take_output();
    let mut input = vec![0, 0, 0, 1];
    input.extend(
        OptionRequest::Unknown {
            option: opt::LIST,
            data: vec![0],
        }
        .encode(),
    );
    feed(&mut s, &input).unwrap();
    assert_eq!(replies(&s.take_output())[0].0.reply_type, rep::ERR_INVALID);
}

#[test]
fn go_replies_info_then_ack_and_starts_transmission() {
    let mut s = server(TlsPolicy::Off);
    s.take_output();
    let mut input = vec![0, 0, 0, 3];
    input.extend(OptionRequest::StructuredReply.encode());
    let go = InfoRequest {
        export: String::new(),
        info_types: vec![1, 2, 3],
    };
    input.extend(OptionRequest::Go(go).encode());
    input.extend([0xde, 0xad]); // must stay unconsumed
    let mut rest = &input[..];
    let mut events = Vec::new();
    while !s.is_done() {
        let (used, event) = s.receive(rest).unwrap();
        rest = &rest[used..];
        events.extend(event);
    }
    assert_eq!(rest, &[0xde, 0xad]);
    let r = replies(&s.take_output());
    let kinds: Vec<u32> = r.iter().map(|(h, _)| h.reply_type).collect();
    assert_eq!(
        kinds,
        vec![
            rep::ACK,
            rep::INFO,
            rep::INFO,
            rep::INFO,
            rep::INFO,
            rep::ACK
        ]
    );
    assert_eq!(
        InfoReply::parse(&r[1].1).unwrap(),
        InfoReply::Export {
            size_bytes: 1 << 30,
            transmission_flags: tf::HAS_FLAGS
                | tf::SEND_FLUSH
                | tf::SEND_FUA
                | tf::CAN_MULTI_CONN
                | tf::SEND_DF
        }
    );
    assert_eq!(
        InfoReply::parse(&r[2].1).unwrap(),
        InfoReply::Name("a".into())
    );
    let ServerEvent::Ready(n) = &events[0] else {
        panic!("{events:?}")
    };
    assert!(n.structured_replies);
    assert!(!n.via_export_name);
}

#[test]
fn info_on_unknown_export_is_err_unknown() {
    let mut s = server(TlsPolicy::Off);
    s.take_output();
    let mut input = vec![0, 0, 0, 1];
    let info = InfoRequest {
        export: "zzz".into(),
        info_types: vec![],
    };
    input.extend(OptionRequest::Info(info).encode());
    feed(&mut s, &input).unwrap();
    assert_eq!(replies(&s.take_output())[0].0.reply_type, rep::ERR_UNKNOWN);
    assert!(!s.is_done());
}

#[test]
fn meta_context_needs_structured_replies() {
    let mut s = server(TlsPolicy::Off);
    s.take_output();
    let meta = MetaContextRequest {
        export: "a".into(),
        queries: vec!["base:allocation".into()],
    };
    let mut input = vec![0, 0, 0, 1];
    input.extend(OptionRequest::SetMetaContext(meta.clone()).encode());
    input.extend(OptionRequest::StructuredReply.encode());
    input.extend(OptionRequest::SetMetaContext(meta).encode());
    feed(&mut s, &input).unwrap();
    let r = replies(&s.take_output());
    assert_eq!(r[0].0.reply_type, rep::ERR_INVALID);
    assert_eq!(r[1].0.reply_type, rep::ACK);
    assert_eq!(r[2].0.reply_type, rep::META_CONTEXT);
    assert_eq!(&r[2].1[..4], &BASE_ALLOCATION_ID.to_be_bytes());
    assert_eq!(&r[2].1[4..], b"base:allocation");
    assert_eq!(r[3].0.reply_type, rep::ACK);
}

#[test]
fn forced_tls_refuses_everything_but_starttls() {
    let mut s = server(TlsPolicy::Required);
    s.take_output();
    let mut input = vec![0, 0, 0, 1];
    input.extend(OptionRequest::List.encode());
    input.extend(OptionRequest::StartTls.encode());
    let events = feed(&mut s, &input).unwrap();
    assert_eq!(events.last(), Some(&ServerEvent::StartTls));
    let r = replies(&s.take_output());
    assert_eq!(r[0].0.reply_type, rep::ERR_TLS_REQD);
    assert_eq!(r[1].0.reply_type, rep::ACK);
    assert_eq!(s.bytes_wanted(), 0);
    s.tls_started();
    feed(&mut s, &OptionRequest::List.encode()).unwrap();
    assert_eq!(replies(&s.take_output())[0].0.reply_type, rep::SERVER);
}

#[test]
fn forced_tls_export_name_disconnects() {
    let mut s = server(TlsPolicy::Required);
    let mut input = vec![0, 0, 0, 1];
    input.extend(OptionRequest::ExportName("a".into()).encode());
    assert_eq!(feed(&mut s, &input), Err(ProtocolError::TlsRequired));
}

#[test]
fn starttls_without_tls_is_policy() {
    let mut s = server(TlsPolicy::Off);
    s.take_output();
    let mut input = vec![0, 0, 0, 1];
    input.extend(OptionRequest::StartTls.encode());
    feed(&mut s, &input).unwrap();
    assert_eq!(replies(&s.take_output())[0].0.reply_type, rep::ERR_POLICY);
}

#[test]
fn oversized_option_disconnects() {
    let mut s = server(TlsPolicy::Off);
    let mut input = vec![0, 0, 0, 1];
    input.extend(b"IHAVEOPT");
    input.extend(6u32.to_be_bytes());
    input.extend(1_000_000u32.to_be_bytes());
    assert!(matches!(
        feed(&mut s, &input),
        Err(ProtocolError::OptionTooLong { .. })
    ));
}

#[test]
fn abort_is_acknowledged() {
    let mut s = server(TlsPolicy::Off);
    s.take_output();
    let mut input = vec![0, 0, 0, 1];
    input.extend(OptionRequest::Abort.encode());
    assert_eq!(feed(&mut s, &input).unwrap(), vec![ServerEvent::Aborted]);
    assert_eq!(replies(&s.take_output())[0].0.reply_type, rep::ACK);
}

/// Run a client and a server against each other in memory.
fn converse(client_config: ClientConfig, tls: TlsPolicy) -> (ClientNegotiated, Negotiated) {
    let mut s = server(tls);
    let mut c = ClientHandshake::new(client_config);
    let (mut client_ready, mut server_ready) = (None, None);
    for _ in 0..100 {
        let to_client = s.take_output();
        let mut input = &to_client[..];
        while !input.is_empty() {
            let (used, event) = c.receive(input).unwrap();
            input = &input[used..];
            match event {
                Some(ClientEvent::StartTls) => c.tls_started(),
                Some(ClientEvent::Ready(n)) => client_ready = Some(n),
                None => {}
            }
        }
        let to_server = c.take_output();
        let mut input = &to_server[..];
        while !input.is_empty() {
            let (used, event) = s.receive(input).unwrap();
            input = &input[used..];
            match event {
                Some(ServerEvent::StartTls) => s.tls_started(),
                Some(ServerEvent::Ready(n)) => server_ready = Some(n),
                _ => {}
            }
        }
        if let (Some(c), Some(s)) = (&client_ready, &server_ready) {
            return (c.clone(), s.clone());
        }
    }
    panic!("handshake did not finish");
}

#[test]
fn client_and_server_agree() {
    let config = ClientConfig {
        export: "b".into(),
        tls: true,
        structured_replies: true,
        meta_contexts: vec!["base:allocation".into()],
    };
    let (c, s) = converse(config, TlsPolicy::Required);
    assert_eq!(c.size_bytes, 1 << 30);
    assert_eq!(c.transmission_flags, s.transmission_flags);
    assert_eq!(c.block_sizes.unwrap().maximum_bytes, 32 << 20);
    assert!(c.structured_replies);
    assert_eq!(
        c.meta_contexts,
        vec![(BASE_ALLOCATION_ID, "base:allocation".to_string())]
    );
    assert_eq!(s.export_index, 1);
    assert_eq!(s.meta_context_ids, vec![BASE_ALLOCATION_ID]);
    assert!(s.tls_active);
}

#[test]
fn plain_client_gets_simple_replies() {
    let config = ClientConfig {
        export: "a".into(),
        tls: false,
        structured_replies: false,
        meta_contexts: vec![],
    };
    let (c, s) = converse(config, TlsPolicy::Off);
    assert!(!c.structured_replies);
    assert!(!s.structured_replies);
    assert_eq!(c.transmission_flags & tf::SEND_DF, 0);
}

#[test]
fn request_header_vector() {
    let header = RequestHeader {
        flags: cmd_flags::FUA,
        command: Command::Write,
        cookie: 0x0102_0304_0506_0708,
        offset: 4096,
        length: 512,
    };
    let bytes = header.encode();
    let expected: [u8; 28] = [
        0x25, 0x60, 0x95, 0x13, 0, 1, 0, 1, 1, 2, 3, 4, 5, 6, 7, 8, 0, 0, 0, 0, 0, 0, 0x10, 0, 0,
        0, 2, 0,
    ];
    assert_eq!(bytes, expected);
    assert_eq!(RequestHeader::parse(&bytes).unwrap(), header);
    assert!(header.fua());
    assert_eq!(header.payload_bytes(), 512);
}

#[test]
fn request_with_bad_magic_is_refused() {
    let mut bytes = [0u8; 28];
    bytes[0] = 0x25;
    assert!(matches!(
        RequestHeader::parse(&bytes),
        Err(ProtocolError::BadMagic { .. })
    ));
}

#[test]
fn reply_vectors() {
    let simple = encode_simple_reply(7, Some(ErrorCode::Invalid));
    assert_eq!(
        simple,
        [0x67, 0x44, 0x66, 0x98, 0, 0, 0, 22, 0, 0, 0, 0, 0, 0, 0, 7]
    );
    let data = encode_offset_data_header(9, 512, 1024, true);
    assert_eq!(&data[..4], &[0x66, 0x8e, 0x33, 0xef]);
    assert_eq!(&data[4..8], &[0, 1, 0, 1]);
    assert_eq!(&data[16..20], &(1024u32 + 8).to_be_bytes());
    assert_eq!(&data[20..], &512u64.to_be_bytes());
    let error = encode_error_chunk(9, ErrorCode::Io, "bad");
    assert_eq!(&error[6..8], &[0x80, 0x01]);
    assert_eq!(&error[20..], &[0, 0, 0, 5, 0, 3, b'b', b'a', b'd']);
    let extents = [Extent {
        length_bytes: 4096,
        flags: 0,
    }];
    let status = encode_block_status_chunk(9, 1, &extents, true);
    assert_eq!(&status[16..20], &12u32.to_be_bytes());
    assert_eq!(&status[20..], &[0, 0, 0, 1, 0, 0, 0x10, 0, 0, 0, 0, 0]);
}

#[test]
fn reply_header_parses_both_kinds() {
    let simple = encode_simple_reply(42, None);
    assert_eq!(
        ReplyHeader::parse(&simple).unwrap(),
        Some((
            ReplyHeader::Simple {
                error: 0,
                cookie: 42
            },
            16
        ))
    );
    let chunk = encode_offset_data_header(42, 0, 512, false);
    let Some((ReplyHeader::Chunk(h), 20)) = ReplyHeader::parse(&chunk).unwrap() else {
        panic!()
    };
    assert_eq!(h.cookie, 42);
    assert!(!h.is_done());
    assert_eq!(ReplyHeader::parse(&chunk[..3]).unwrap(), None);
}

fn rules() -> RequestRules {
    RequestRules {
        size_bytes: 1 << 20,
        minimum_block_bytes: 512,
        maximum_payload_bytes: 64 << 10,
        transmission_flags: tf::HAS_FLAGS | tf::SEND_FUA | tf::SEND_FLUSH,
        block_status: false,
        any_alignment: false,
    }
}

fn request(command: Command, offset: u64, length: u32) -> RequestHeader {
    RequestHeader {
        flags: 0,
        command,
        cookie: 1,
        offset,
        length,
    }
}

#[test]
fn rules_refuse_bad_requests_with_the_right_code() {
    let r = rules();
    let code = |h: RequestHeader| r.check(&h).map_err(|e| e.code);
    assert_eq!(code(request(Command::Read, 0, 4096)), Ok(()));
    assert_eq!(
        code(request(Command::Read, 1 << 20, 512)),
        Err(ErrorCode::Invalid)
    );
    assert_eq!(
        code(request(Command::Write, (1 << 20) - 512, 1024)),
        Err(ErrorCode::NoSpace)
    );
    assert_eq!(
        code(request(Command::Write, u64::MAX - 100, 512)),
        Err(ErrorCode::NoSpace)
    );
    assert_eq!(
        code(request(Command::Read, 100, 512)),
        Err(ErrorCode::Invalid)
    );
    assert_eq!(
        code(request(Command::Read, 0, 100)),
        Err(ErrorCode::Invalid)
    );
    assert_eq!(
        code(request(Command::Read, 0, 128 << 10)),
        Err(ErrorCode::Overflow)
    );
    assert_eq!(code(request(Command::Trim, 0, 1 << 20)), Ok(()));
    assert_eq!(
        code(request(Command::Unknown(42), 0, 512)),
        Err(ErrorCode::Invalid)
    );
    assert_eq!(
        code(request(Command::BlockStatus, 0, 512)),
        Err(ErrorCode::Invalid)
    );
    assert_eq!(code(request(Command::Flush, 0, 0)), Ok(()));
    assert_eq!(
        code(request(Command::Flush, 0, 512)),
        Err(ErrorCode::Invalid)
    );
    let mut df = request(Command::Read, 0, 512);
    df.flags = cmd_flags::DF;
    assert_eq!(code(df), Err(ErrorCode::Invalid));
    let mut fua = request(Command::Write, 0, 512);
    fua.flags = cmd_flags::FUA;
    assert_eq!(code(fua), Ok(()));
    let read_only = RequestRules {
        transmission_flags: tf::HAS_FLAGS | tf::READ_ONLY,
        ..rules()
    };
    assert_eq!(
        read_only
            .check(&request(Command::Write, 0, 512))
            .unwrap_err()
            .code,
        ErrorCode::NotPermitted
    );
}

#[test]
fn errno_mapping_lives_in_one_place() {
    assert_eq!(ErrorCode::from_errno(libc_eio()), ErrorCode::Io);
    assert_eq!(ErrorCode::from_errno(28), ErrorCode::NoSpace);
    assert_eq!(ErrorCode::from_errno(122), ErrorCode::NoSpace); // EDQUOT
    assert_eq!(ErrorCode::from_errno(30), ErrorCode::NotPermitted); // EROFS
    assert_eq!(ErrorCode::from_errno(9999), ErrorCode::Io);
    for code in [
        ErrorCode::Io,
        ErrorCode::Invalid,
        ErrorCode::Shutdown,
        ErrorCode::NotSupported,
    ] {
        assert_eq!(ErrorCode::from_value(code.value()), Some(code));
    }
}

fn libc_eio() -> i32 {
    5
}

fn name_strategy() -> impl Strategy<Value = String> + Clone {
    "[a-zA-Z0-9:/._-]{0,40}"
}

fn option_strategy() -> impl Strategy<Value = OptionRequest> {
    let info = || {
        (
            name_strategy(),
            proptest::collection::vec(any::<u16>(), 0..8),
        )
            .prop_map(|(export, info_types)| InfoRequest { export, info_types })
    };
    let meta = || {
        (
            name_strategy(),
            proptest::collection::vec(name_strategy(), 0..4),
        )
            .prop_map(|(export, queries)| MetaContextRequest { export, queries })
    };
    prop_oneof![
        name_strategy().prop_map(OptionRequest::ExportName),
        Just(OptionRequest::Abort),
        Just(OptionRequest::List),
        Just(OptionRequest::StartTls),
        Just(OptionRequest::StructuredReply),
        info().prop_map(OptionRequest::Info),
        info().prop_map(OptionRequest::Go),
        meta().prop_map(OptionRequest::ListMetaContext),
        meta().prop_map(OptionRequest::SetMetaContext),
        (100u32..1000, proptest::collection::vec(any::<u8>(), 0..16))
            .prop_map(|(option, data)| OptionRequest::Unknown { option, data }),
    ]
}

proptest! {
    #[test]
    fn option_requests_round_trip(request in option_strategy()) {
        let bytes = request.encode();
        let header = nvraid_nbd::option::OptionHeader::parse(bytes[..16].try_into().unwrap()).unwrap();
        prop_assert_eq!(header.length_bytes as usize, bytes.len() - 16);
        prop_assert_eq!(OptionRequest::parse(header.option, &bytes[16..]).unwrap(), request);
    }

    #[test]
    fn request_headers_round_trip(flags: u16, code: u16, cookie: u64, offset: u64, length: u32) {
        let header = RequestHeader { flags, command: Command::from_code(code), cookie, offset, length };
        prop_assert_eq!(RequestHeader::parse(&header.encode()).unwrap(), header);
    }

    #[test]
    fn info_replies_round_trip(size: u64, flags: u16, min_log in 0u32..17, name in name_strategy()) {
        let sizes = BlockSizes { minimum_bytes: 1 << min_log, preferred_bytes: 1 << 17, maximum_bytes: u32::MAX };
        prop_assert!(sizes.is_valid());
        for reply in [
            InfoReply::Export { size_bytes: size, transmission_flags: flags },
            InfoReply::BlockSize(sizes),
            InfoReply::Name(name.clone()),
            InfoReply::Description(name.clone()),
        ] {
            prop_assert_eq!(InfoReply::parse(&reply.encode_data()).unwrap(), reply);
        }
    }

    #[test]
    fn server_handshake_survives_arbitrary_bytes(input in proptest::collection::vec(any::<u8>(), 0..512)) {
        let mut s = server(TlsPolicy::Optional);
        let _ = feed(&mut s, &input);
    }

    #[test]
    fn server_handshake_survives_arbitrary_options(
        flags in 0u32..4,
        options in proptest::collection::vec((0u32..16, proptest::collection::vec(any::<u8>(), 0..40)), 0..8),
    ) {
        let mut s = server(TlsPolicy::Optional);
        let mut input = flags.to_be_bytes().to_vec();
        for (option, data) in options {
            input.extend(OptionRequest::Unknown { option, data }.encode());
        }
        if let Ok(events) = feed(&mut s, &input) {
            if events.contains(&ServerEvent::StartTls) {
                s.tls_started();
            }
        }
    }

    #[test]
    fn client_handshake_survives_arbitrary_bytes(input in proptest::collection::vec(any::<u8>(), 0..512)) {
        let config = ClientConfig { export: String::new(), tls: false, structured_replies: true, meta_contexts: vec![] };
        let mut c = ClientHandshake::new(config);
        let mut rest = &input[..];
        while !rest.is_empty() {
            match c.receive(rest) {
                Ok((used, _)) => rest = &rest[used..],
                Err(_) => break,
            }
        }
    }

    #[test]
    fn checked_requests_lie_inside_the_export(code in 0u16..9, flags in 0u16..4, offset: u64, length: u32) {
        let r = rules();
        let header = RequestHeader { flags, command: Command::from_code(code), cookie: 0, offset, length };
        if r.check(&header).is_ok() && !matches!(header.command, Command::Flush | Command::Disconnect) {
            prop_assert!(offset + u64::from(length) <= r.size_bytes);
            prop_assert!(length > 0);
        }
    }
}

/// A client that negotiated no block sizes may send any alignment; one
/// that did is held to the minimum.
#[test]
fn unaligned_requests_pass_only_when_any_alignment_is_allowed() {
    let strict = rules();
    let lenient = RequestRules {
        any_alignment: true,
        ..rules()
    };
    for (command, offset, length) in [(Command::Read, 1, 100), (Command::Write, 700, 1000)] {
        let r = request(command, offset, length);
        assert_eq!(
            strict.check(&r).map_err(|e| e.code),
            Err(ErrorCode::Invalid)
        );
        assert_eq!(lenient.check(&r).map_err(|e| e.code), Ok(()));
    }
    // The range is still checked.
    let past = request(Command::Read, (1 << 20) - 10, 11);
    assert!(lenient.check(&past).is_err());
}
