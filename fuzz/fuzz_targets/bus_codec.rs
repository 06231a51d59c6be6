//! Any bytes on a bus subject: decoded as each message type in each encoding (protobuf, JSON,
//! and as the first byte says), and an inbound message validated as the router does.
#![no_main]

use agentloop_proto::v1::{InboundMessage, OutboundMessage, RunCommand, SystemEvent};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    for content_type in [None, Some("application/json"), Some("application/x-protobuf")] {
        if let Ok((mut inbound, _)) =
            agentloop_proto::decode::<InboundMessage>(content_type, data)
        {
            let _ = agentloop_proto::validate_inbound(&mut inbound, "fuzz");
        }
        if let Ok((command, _)) = agentloop_proto::decode::<RunCommand>(content_type, data) {
            let _ = agentloop_proto::validate_run_command(&command);
        }
        let _ = agentloop_proto::decode::<OutboundMessage>(content_type, data);
        let _ = agentloop_proto::decode::<SystemEvent>(content_type, data);
    }
});
