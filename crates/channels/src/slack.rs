//! Slack: Events API requests in (`POST /channels/slack` on the gateway, each signed with the
//! app's signing secret: `X-Slack-Signature: v0=hex(HMAC-SHA256(secret, "v0:" + timestamp +
//! ":" + body))`, refused outside a 5-minute window so a captured request cannot be replayed),
//! `chat.postMessage` out, in the thread of the message answered.

use std::time::Duration;

use serde::Deserialize;
use serde_json::json;

use crate::{Conversation, Inbound, SendError, SlackConfig, http, signed};

/// The channel's name on the bus (`<prefix>.inbound.slack`).
pub const CHANNEL: &str = "slack";

/// The header carrying the request's signature.
pub const SIGNATURE_HEADER: &str = "x-slack-signature";

/// The header carrying the request's timestamp (Unix seconds).
pub const TIMESTAMP_HEADER: &str = "x-slack-request-timestamp";

/// The longest reply piece posted (Slack truncates past 40,000 and advises 4,000).
pub const MAX_MESSAGE: usize = 4000;

/// Why a request is refused.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum RequestError {
    /// No valid signature of this app's secret.
    #[error("X-Slack-Signature does not match the request")]
    BadSignature,
    /// Signed too long ago (or in the future): a replay.
    #[error("X-Slack-Request-Timestamp is missing or outside the 5-minute window")]
    Stale,
    /// Not an Events API request.
    #[error("not a Slack Events API request: {0}")]
    Malformed(String),
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
    signed::fresh(timestamp, now).ok_or(RequestError::Stale)?;
    let parts: [&[u8]; 4] = [b"v0:", timestamp.trim().as_bytes(), b":", body];
    if signed::matches(secret, &parts, signature, "v0=") {
        Ok(())
    } else {
        Err(RequestError::BadSignature)
    }
}

/// What a verified request asks for.
#[derive(Debug, PartialEq, Eq)]
pub enum Request {
    /// `url_verification`: answer with this challenge.
    Challenge(String),
    /// A message for the assistant.
    Message(Inbound),
    /// Something that asks nothing of the assistant (a bot's message, an edit, another event).
    Ignored,
}

#[derive(Deserialize)]
struct Envelope {
    #[serde(rename = "type")]
    kind: String,
    challenge: Option<String>,
    /// Read as it comes: events other than messages carry other shapes (`team_join`'s `user`
    /// and `channel_created`'s `channel` are objects), so only a message is read further.
    event: Option<serde_json::Value>,
}

/// A `message` or `app_mention` event.
#[derive(Deserialize)]
struct Event {
    channel: Option<String>,
    user: Option<String>,
    text: Option<String>,
    ts: Option<String>,
    thread_ts: Option<String>,
    channel_type: Option<String>,
}

/// Reads a verified request body.
///
/// # Errors
/// [`RequestError::Malformed`] when it is not an Events API request.
pub fn parse(body: &[u8]) -> Result<Request, RequestError> {
    let envelope: Envelope =
        serde_json::from_slice(body).map_err(|err| RequestError::Malformed(err.to_string()))?;
    match envelope.kind.as_str() {
        "url_verification" => envelope
            .challenge
            .map(Request::Challenge)
            .ok_or_else(|| RequestError::Malformed("url_verification without a challenge".into())),
        "event_callback" => {
            let event = envelope
                .event
                .ok_or_else(|| RequestError::Malformed("event_callback without an event".into()))?;
            let field = |name: &str| event.get(name).filter(|v| !v.is_null());
            if !matches!(
                field("type").and_then(serde_json::Value::as_str),
                Some("message" | "app_mention")
            ) || field("bot_id").is_some()
                || field("subtype").is_some()
            {
                // Any other event (a member joining, a channel created...), a bot's message or
                // an edit asks nothing: a refusal would only have Slack retry it, and in the
                // end turn the app off.
                return Ok(Request::Ignored);
            }
            let event: Event = serde_json::from_value(event)
                .map_err(|err| RequestError::Malformed(format!("a message event: {err}")))?;
            Ok(message(event).map_or(Request::Ignored, Request::Message))
        }
        _ => Ok(Request::Ignored),
    }
}

fn message(event: Event) -> Option<Inbound> {
    let (channel, user, text, ts) = (event.channel?, event.user?, event.text?, event.ts?);
    if text.trim().is_empty() {
        return None;
    }
    let conversation = if event.channel_type.as_deref() == Some("im") {
        Conversation::Direct
    } else {
        Conversation::Group
    };
    Some(Inbound {
        channel: CHANNEL.to_owned(),
        conversation,
        chat: channel,
        thread: event.thread_ts,
        message_id: ts,
        sender: user,
        text,
    })
}

/// Calls Slack's Web API with one bot token.
#[derive(Clone)]
pub struct Client {
    http: reqwest::Client,
    base: String,
    token: String,
}

#[derive(Deserialize)]
struct Answer {
    ok: bool,
    #[serde(default)]
    error: String,
    #[serde(default)]
    ts: String,
}

impl Client {
    /// A client for the app of `config`.
    ///
    /// # Errors
    /// When the HTTP client cannot be built.
    pub fn new(config: &SlackConfig) -> Result<Self, reqwest::Error> {
        Ok(Self {
            http: http::client(Duration::from_millis(config.request_timeout_ms))?,
            base: config.api_base.trim_end_matches('/').to_owned(),
            token: config.bot_token.expose().to_owned(),
        })
    }

    /// Posts `text` to `channel`, in `thread` when given, with `chat.postMessage`, and returns
    /// the new message's `ts`.
    ///
    /// # Errors
    /// [`SendError`], told transient from permanent.
    pub async fn post_message(
        &self,
        channel: &str,
        thread: Option<&str>,
        text: &str,
    ) -> Result<String, SendError> {
        let mut body = json!({"channel": channel, "text": text});
        if let Some(thread) = thread {
            body["thread_ts"] = json!(thread);
        }
        let answer = self.call("chat.postMessage", &body).await?;
        Ok(answer.ts)
    }

    /// Replaces the text of the bot's message `ts` in `channel` with `chat.update`.
    ///
    /// # Errors
    /// [`SendError`], told transient from permanent.
    pub async fn update(&self, channel: &str, ts: &str, text: &str) -> Result<(), SendError> {
        let body = json!({"channel": channel, "ts": ts, "text": text});
        self.call("chat.update", &body).await.map(drop)
    }

    async fn call(&self, method: &str, body: &serde_json::Value) -> Result<Answer, SendError> {
        let response = self
            .http
            .post(format!("{}/api/{method}", self.base))
            .bearer_auth(&self.token)
            .json(body)
            .send()
            .await
            .map_err(|err| SendError::Transient {
                reason: err.without_url().to_string(),
                retry_after: None,
            })?;
        let status = response.status().as_u16();
        let retry_after = signed::retry_after(&response);
        if status == 429 {
            return Err(SendError::Transient {
                reason: "429 ratelimited".to_owned(),
                retry_after,
            });
        }
        let bytes = http::read_answer(response, status, http::SEND_ANSWER_CAP).await?;
        match serde_json::from_slice::<Answer>(&bytes) {
            Ok(answer) if answer.ok => Ok(answer),
            Ok(answer) => Err(classify(&answer.error, retry_after)),
            Err(_) if status >= 500 => Err(SendError::Transient {
                reason: format!("HTTP {status}"),
                retry_after,
            }),
            Err(_) => Err(SendError::Permanent(format!(
                "HTTP {status} without a Web API answer"
            ))),
        }
    }
}

/// Tells an `error` of the Web API passing from lasting.
fn classify(error: &str, retry_after: Option<Duration>) -> SendError {
    match error {
        "ratelimited"
        | "internal_error"
        | "fatal_error"
        | "service_unavailable"
        | "request_timeout" => SendError::Transient {
            reason: error.to_owned(),
            retry_after,
        },
        _ => SendError::Permanent(error.to_owned()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sign(secret: &str, ts: &str, body: &[u8]) -> String {
        use hmac::Mac as _;
        let mac = signed::mac(secret, &[format!("v0:{ts}:").as_bytes(), body]);
        format!("v0={}", hex::encode(mac.finalize().into_bytes()))
    }

    #[test]
    fn a_request_signed_with_the_secret_within_the_window_passes() {
        let body = br#"{"type":"event_callback"}"#;
        let sig = sign("s3cret", "1700000000", body);
        assert_eq!(
            verify("s3cret", "1700000000", &sig, body, 1_700_000_100),
            Ok(())
        );
        // Another secret, another body, a replay after the window, no timestamp.
        assert_eq!(
            verify("other", "1700000000", &sig, body, 1_700_000_100),
            Err(RequestError::BadSignature)
        );
        assert_eq!(
            verify("s3cret", "1700000000", &sig, b"{}", 1_700_000_100),
            Err(RequestError::BadSignature)
        );
        assert_eq!(
            verify("s3cret", "1700000000", &sig, body, 1_700_000_301),
            Err(RequestError::Stale)
        );
        assert_eq!(
            verify("s3cret", "", &sig, body, 1),
            Err(RequestError::Stale)
        );
        assert_eq!(
            verify("s3cret", "1700000000", "v0=zz", body, 1_700_000_000),
            Err(RequestError::BadSignature)
        );
    }

    #[test]
    fn events_become_messages_challenges_or_nothing() {
        let challenge = br#"{"type":"url_verification","challenge":"abc","token":"x"}"#;
        assert_eq!(parse(challenge).unwrap(), Request::Challenge("abc".into()));
        let dm = br#"{"type":"event_callback","event_id":"Ev1","event":{"type":"message",
            "channel":"D1","user":"U1","text":"hi","ts":"1.5","channel_type":"im"}}"#;
        let Request::Message(inbound) = parse(dm).unwrap() else {
            panic!("not a message")
        };
        assert_eq!(inbound.session_key("main"), "agent:main:slack:direct:D1");
        assert_eq!(inbound.idempotency_key(), "slack:D1:1.5");
        let threaded = br#"{"type":"event_callback","event":{"type":"app_mention","channel":"C1",
            "user":"U1","text":"hey","ts":"2.5","thread_ts":"1.0"}}"#;
        let Request::Message(inbound) = parse(threaded).unwrap() else {
            panic!("not a message")
        };
        assert_eq!(
            inbound.session_key("main"),
            "agent:main:slack:group:C1:thread:1.0"
        );
        let bot = br#"{"type":"event_callback","event":{"type":"message","channel":"C1",
            "bot_id":"B1","text":"loop","ts":"3.5"}}"#;
        assert_eq!(parse(bot).unwrap(), Request::Ignored);
        let edit =
            br#"{"type":"event_callback","event":{"type":"message","subtype":"message_changed",
            "channel":"C1","ts":"4.5"}}"#;
        assert_eq!(parse(edit).unwrap(), Request::Ignored);
        assert!(parse(b"[]").is_err());
    }

    #[test]
    fn events_shaped_unlike_a_message_are_ignored_not_refused() {
        // `user` an object.
        let team_join = br#"{"type":"event_callback","team_id":"T1","event_id":"Ev2",
            "event":{"type":"team_join","user":{"id":"U2","name":"new","profile":{"real_name":"N"}},
            "event_ts":"1700000000.000100"}}"#;
        assert_eq!(parse(team_join).unwrap(), Request::Ignored);
        // `channel` an object.
        let created = br#"{"type":"event_callback","event":{"type":"channel_created",
            "channel":{"id":"C9","name":"new","created":1700000000,"creator":"U1"}}}"#;
        assert_eq!(parse(created).unwrap(), Request::Ignored);
        let user_change = br#"{"type":"event_callback","event":{"type":"user_change",
            "user":{"id":"U1","deleted":false},"cache_ts":1700000000}}"#;
        assert_eq!(parse(user_change).unwrap(), Request::Ignored);
        // No type, or no object at all: nothing asked either.
        let untyped = br#"{"type":"event_callback","event":{"channel":{"id":"C1"}}}"#;
        assert_eq!(parse(untyped).unwrap(), Request::Ignored);
        let odd = br#"{"type":"event_callback","event":"x"}"#;
        assert_eq!(parse(odd).unwrap(), Request::Ignored);
        // A message that is not one is still named.
        let broken =
            br#"{"type":"event_callback","event":{"type":"message","channel":{"id":"C1"}}}"#;
        assert!(matches!(parse(broken), Err(RequestError::Malformed(_))));
        assert!(matches!(
            parse(br#"{"type":"event_callback"}"#),
            Err(RequestError::Malformed(_))
        ));
    }

    #[test]
    fn lasting_errors_are_told_from_passing_ones() {
        assert!(matches!(
            classify("ratelimited", None),
            SendError::Transient { .. }
        ));
        assert!(matches!(
            classify("channel_not_found", None),
            SendError::Permanent(_)
        ));
        assert!(matches!(
            classify("invalid_auth", None),
            SendError::Permanent(_)
        ));
    }
}
