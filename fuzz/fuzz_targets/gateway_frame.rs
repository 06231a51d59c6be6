//! Any text a WebSocket client sends before it is authenticated.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(text) = std::str::from_utf8(data) {
        agentloop_gateway::fuzz_frame(text);
    }
});
