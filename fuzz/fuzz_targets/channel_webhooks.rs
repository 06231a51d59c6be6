//! Any body posted to a chat-app endpoint: Telegram's, Slack's and a signed webhook's parsers.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(Some(inbound)) = agentloop_channels::telegram::parse_update(data) {
        let _ = inbound.session_key("main");
    }
    let _ = agentloop_channels::slack::parse(data);
    if let Ok(inbound) = agentloop_channels::webhook::parse("fuzz", data) {
        let _ = inbound.into_message("main");
    }
});
