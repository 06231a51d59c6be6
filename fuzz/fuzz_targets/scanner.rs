//! Any text through the injection scanner: its normaliser (every decoded form) and the rules.
#![no_main]

use std::sync::LazyLock;

use libfuzzer_sys::fuzz_target;

static SCANNER: LazyLock<agentloop_scanner::Scanner> = LazyLock::new(|| {
    agentloop_scanner::ScannerConfig::default()
        .build()
        .expect("the built-in rules load")
        .expect("the scanner is on by default")
});

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    let _ = agentloop_scanner::normalize::forms(&text);
    let scan = SCANNER.scan(&text);
    let _ = agentloop_scanner::redact::redact(&text);
    let _ = scan.event_data("fuzz");
});
