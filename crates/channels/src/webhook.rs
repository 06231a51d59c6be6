//! Generic signed webhooks, for a program of your own on either side:
//! `POST /channels/webhook/<name>` takes a message in, and a reply is POSTed to the configured
//! URL. Both directions are signed the same way: `X-Agentloop-Timestamp: <Unix seconds>` and
//! `X-Agentloop-Signature: sha256=<hex of HMAC-SHA256(secret, "<timestamp>.<body>")>`, refused
//! outside a 5-minute window.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::{Conversation, Inbound, SendError, http, signed};

/// The header carrying the signature.
pub const SIGNATURE_HEADER: &str = "x-agentloop-signature";

/// The header carrying the timestamp (Unix seconds).
pub const TIMESTAMP_HEADER: &str = "x-agentloop-timestamp";

/// What a webhook's channel name starts with.
pub const CHANNEL_PREFIX: &str = "webhook-";

/// The channel name on the bus of the webhook `name` (`webhook-<name>`).
pub fn channel(name: &str) -> String {
    format!("{CHANNEL_PREFIX}{name}")
}

/// Whether `name` may name a webhook (`[a-z0-9_]`, 1 to 32 long): it becomes a subject token.
pub fn valid_name(name: &str) -> bool {
    (1..=32).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
}

/// Why a request is refused.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum RequestError {
    /// No valid signature of this webhook's secret.
    #[error("X-Agentloop-Signature does not match the request")]
    BadSignature,
    /// Signed too long ago (or in the future): a replay.
    #[error("X-Agentloop-Timestamp is missing or outside the 5-minute window")]
    Stale,
    /// Not a message.
    #[error("not a webhook message: {0}")]
    Malformed(String),
}

/// The signature of `body` at `timestamp` with `secret` (the header's value).
pub fn sign(secret: &str, timestamp: u64, body: &[u8]) -> String {
    use hmac::Mac as _;
    let stamp = timestamp.to_string();
    let mac = signed::mac(secret, &[stamp.as_bytes(), b".", body]);
    format!("sha256={}", hex::encode(mac.finalize().into_bytes()))
}

/// Checks a request's signature and timestamp against `secret`, `now` being Unix seconds.
///
/// # Errors
/// [`RequestError::Stale`] or [`RequestError::BadSignature`].
pub fn verify(
    secret: &str,
    timestamp: &str,
    signature: &str,
    body: &[u8],
    now: u64,
) -> Result<(), RequestError> {
    let at = signed::fresh(timestamp, now).ok_or(RequestError::Stale)?;
    let stamp = at.to_string();
    if signed::matches(
        secret,
        &[stamp.as_bytes(), b".", body],
        signature,
        "sha256=",
    ) {
        Ok(())
    } else {
        Err(RequestError::BadSignature)
    }
}

/// A message as a webhook sends it.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct Message {
    /// The conversation; with `thread`, what the session is.
    chat: String,
    /// Who wrote it.
    sender: String,
    /// What they wrote.
    text: String,
    /// Unique within the chat: a repeat is one message.
    message_id: String,
    #[serde(default)]
    thread: Option<String>,
    /// A conversation of many people.
    #[serde(default)]
    group: bool,
}

/// Reads a verified request body for the webhook `name`.
///
/// # Errors
/// [`RequestError::Malformed`] when it is not a message.
pub fn parse(name: &str, body: &[u8]) -> Result<Inbound, RequestError> {
    let message: Message =
        serde_json::from_slice(body).map_err(|err| RequestError::Malformed(err.to_string()))?;
    for (field, value) in [
        ("chat", &message.chat),
        ("sender", &message.sender),
        ("messageId", &message.message_id),
    ] {
        if value.trim().is_empty() {
            return Err(RequestError::Malformed(format!("{field} is empty")));
        }
    }
    if message.text.trim().is_empty() {
        return Err(RequestError::Malformed("text is empty".to_owned()));
    }
    Ok(Inbound {
        channel: channel(name),
        conversation: if message.group {
            Conversation::Group
        } else {
            Conversation::Direct
        },
        chat: message.chat,
        thread: message.thread.filter(|t| !t.is_empty()),
        message_id: message.message_id,
        sender: message.sender,
        text: message.text,
    })
}

/// A reply as POSTed to the webhook's URL.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Reply<'a> {
    /// The chat of the message answered.
    pub chat: &'a str,
    /// Its thread, when it had one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub thread: Option<&'a str>,
    /// The `messageId` of the message answered.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reply_to: Option<&'a str>,
    /// The answer.
    pub text: &'a str,
    /// Set when the run failed (`text` then says so in words).
    #[serde(skip_serializing_if = "str::is_empty")]
    pub error: &'a str,
    /// The run that answered.
    pub run_id: &'a str,
    /// The session.
    pub session_key: &'a str,
}

/// POSTs signed replies to one URL.
#[derive(Clone)]
pub struct Client {
    http: reqwest::Client,
    url: String,
    secret: String,
}

impl Client {
    /// A client posting to `url`, signing with `secret`.
    ///
    /// # Errors
    /// When the HTTP client cannot be built.
    pub fn new(url: &str, secret: &str, timeout: Duration) -> Result<Self, reqwest::Error> {
        Ok(Self {
            // Never following a redirect: the receiver cannot bounce a signed reply elsewhere.
            http: http::client(timeout)?,
            url: url.to_owned(),
            secret: secret.to_owned(),
        })
    }

    /// POSTs `reply`, signed.
    ///
    /// # Errors
    /// [`SendError`]: 429, 5xx and the network pass; any other refusal does not, a redirect
    /// (3xx, never followed) included.
    pub async fn post(&self, reply: &Reply<'_>, now: u64) -> Result<(), SendError> {
        let body =
            serde_json::to_vec(reply).map_err(|err| SendError::Permanent(err.to_string()))?;
        let response = self
            .http
            .post(&self.url)
            .header("content-type", "application/json")
            .header(TIMESTAMP_HEADER, now.to_string())
            .header(SIGNATURE_HEADER, sign(&self.secret, now, &body))
            .body(body)
            .send()
            .await
            .map_err(|err| SendError::Transient {
                reason: err.without_url().to_string(),
                retry_after: None,
            })?;
        let status = response.status();
        if status.is_success() {
            return Ok(());
        }
        if status.is_redirection() {
            return Err(SendError::Permanent(http::redirect_refused(
                status.as_u16(),
            )));
        }
        let retry_after = signed::retry_after(&response);
        let reason = format!("HTTP {status}");
        if status.as_u16() == 429 || status.is_server_error() {
            Err(SendError::Transient {
                reason,
                retry_after,
            })
        } else {
            Err(SendError::Permanent(reason))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_signed_request_within_the_window_passes_and_nothing_else_does() {
        let body = br#"{"chat":"c"}"#;
        let sig = sign("k", 1_000, body);
        assert_eq!(verify("k", "1000", &sig, body, 1_200), Ok(()));
        assert_eq!(
            verify("x", "1000", &sig, body, 1_200),
            Err(RequestError::BadSignature)
        );
        assert_eq!(
            verify("k", "1000", &sig, b"{}", 1_200),
            Err(RequestError::BadSignature)
        );
        assert_eq!(
            verify("k", "1001", &sig, body, 1_200),
            Err(RequestError::BadSignature)
        );
        assert_eq!(
            verify("k", "1000", &sig, body, 1_301),
            Err(RequestError::Stale)
        );
        assert_eq!(
            verify("k", "soon", &sig, body, 1_000),
            Err(RequestError::Stale)
        );
    }

    #[test]
    fn a_message_maps_to_its_chat_and_a_bad_one_is_named() {
        let body = br#"{"chat":"room1","sender":"u1","text":"hi","messageId":"m1","group":true,"thread":"t"}"#;
        let inbound = parse("crm", body).unwrap();
        assert_eq!(
            inbound.session_key("main"),
            "agent:main:webhook-crm:group:room1:thread:t"
        );
        assert_eq!(inbound.idempotency_key(), "webhook-crm:room1:m1");
        let err = parse(
            "crm",
            br#"{"chat":"","sender":"u","text":"x","messageId":"m"}"#,
        );
        assert_eq!(err, Err(RequestError::Malformed("chat is empty".into())));
        assert!(
            parse(
                "crm",
                br#"{"chat":"c","sender":"u","text":"x","messageId":"m","admin":true}"#
            )
            .is_err()
        );
    }

    #[test]
    fn names_are_subject_tokens() {
        assert!(valid_name("crm_2"));
        assert!(!valid_name(""));
        assert!(!valid_name("a.b"));
        assert!(!valid_name("A"));
        assert!(!valid_name(&"a".repeat(33)));
    }
}
