//! What the signed channels share: the replay window, an HMAC-SHA256 over a request's parts
//! checked in constant time, and the `Retry-After` of a refusal.

use std::time::Duration;

use hmac::{Hmac, KeyInit as _, Mac as _};
use sha2::Sha256;

/// How far a signed request's timestamp may be from now.
pub const REPLAY_WINDOW: Duration = Duration::from_secs(300);

/// The HMAC-SHA256 of `parts` (in order) with `secret`.
pub(crate) fn mac(secret: &str, parts: &[&[u8]]) -> Hmac<Sha256> {
    let mut mac =
        Hmac::<Sha256>::new_from_slice(secret.as_bytes()).expect("HMAC takes a key of any length");
    for part in parts {
        mac.update(part);
    }
    mac
}

/// Whether `timestamp` (Unix seconds) is within [`REPLAY_WINDOW`] of `now`; `None` when it is
/// no number.
pub(crate) fn fresh(timestamp: &str, now: u64) -> Option<u64> {
    let at: u64 = timestamp.trim().parse().ok()?;
    (now.abs_diff(at) <= REPLAY_WINDOW.as_secs()).then_some(at)
}

/// Whether `hex` (after `prefix`) is the MAC of `parts` with `secret`, compared in constant time.
pub(crate) fn matches(secret: &str, parts: &[&[u8]], signature: &str, prefix: &str) -> bool {
    signature
        .strip_prefix(prefix)
        .and_then(|hex| hex::decode(hex).ok())
        .is_some_and(|given| mac(secret, parts).verify_slice(&given).is_ok())
}

/// The `Retry-After` seconds of a response, when it has them.
pub(crate) fn retry_after(response: &reqwest::Response) -> Option<Duration> {
    response
        .headers()
        .get("retry-after")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse().ok())
        .map(Duration::from_secs)
}
