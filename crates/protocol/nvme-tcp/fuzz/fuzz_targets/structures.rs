//! Fuzz the fixed structures: ICReq/ICResp, Connect data, Identify
//! Controller/Namespace, completion entries. Any input parses or fails.
#![no_main]

use libfuzzer_sys::fuzz_target;
use nvraid_nvme_tcp::command::{ConnectData, Cqe, CQE_BYTES};
use nvraid_nvme_tcp::identify::{Controller, Namespace};
use nvraid_nvme_tcp::pdu::{IcReq, IcResp};

fuzz_target!(|data: &[u8]| {
    let _ = IcReq::parse(data);
    let _ = IcResp::parse(data);
    let _ = ConnectData::parse(data);
    if let Ok(c) = Controller::parse(data) {
        let _ = c.max_transfer_bytes(4096);
        let _ = c.in_capsule_bytes();
    }
    if let Ok(n) = Namespace::parse(data) {
        assert!((512..=65536).contains(&n.block_bytes));
        let _ = n.size_bytes();
    }
    if data.len() >= CQE_BYTES {
        let c = Cqe::parse(&data[..CQE_BYTES]);
        let _ = c.status.errno();
        let _ = c.status.to_string();
    }
});
