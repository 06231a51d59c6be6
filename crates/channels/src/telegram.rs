//! Telegram's Bot API: webhook updates in (`POST /channels/telegram` on the gateway, checked
//! against `X-Telegram-Bot-Api-Secret-Token`), `sendMessage` out. Replies go as plain text (no
//! `parse_mode`), so nothing a model writes is read as markup: no injected links or broken
//! formatting, and nothing to escape.

use std::time::Duration;

use serde::Deserialize;
use serde_json::json;

use crate::{Conversation, Inbound, SendError, TelegramConfig, http};

/// The channel's name on the bus (`<prefix>.inbound.telegram`).
pub const CHANNEL: &str = "telegram";

/// The header carrying the webhook's secret.
pub const SECRET_HEADER: &str = "x-telegram-bot-api-secret-token";

/// The longest message `sendMessage` takes, in UTF-16 units.
pub const MAX_MESSAGE: usize = 4096;

/// Why an update cannot be taken in.
#[derive(Debug, thiserror::Error)]
pub enum UpdateError {
    /// Not a Telegram update.
    #[error("not a Telegram update: {0}")]
    Malformed(String),
}

#[derive(Deserialize)]
struct Update {
    #[allow(dead_code)] // read so a body without it is refused as no update
    update_id: i64,
    message: Option<Message>,
}

#[derive(Deserialize)]
struct Message {
    message_id: i64,
    chat: Chat,
    from: Option<User>,
    text: Option<String>,
    message_thread_id: Option<i64>,
    #[serde(default)]
    is_topic_message: bool,
}

#[derive(Deserialize)]
struct Chat {
    id: i64,
    #[serde(rename = "type")]
    kind: String,
}

#[derive(Deserialize)]
struct User {
    id: i64,
    #[serde(default)]
    is_bot: bool,
}

/// Reads a webhook body. `Ok(None)` for an update that asks nothing of the assistant (an edit,
/// a sticker, a bot's own message, a channel post): answered 200 and left alone.
///
/// # Errors
/// [`UpdateError::Malformed`] when the body is not an update.
pub fn parse_update(body: &[u8]) -> Result<Option<Inbound>, UpdateError> {
    let update: Update =
        serde_json::from_slice(body).map_err(|err| UpdateError::Malformed(err.to_string()))?;
    let Some(message) = update.message else {
        return Ok(None);
    };
    let (Some(text), Some(from)) = (message.text, message.from) else {
        return Ok(None);
    };
    if from.is_bot || text.trim().is_empty() {
        return Ok(None);
    }
    let conversation = match message.chat.kind.as_str() {
        "private" => Conversation::Direct,
        "group" | "supergroup" => Conversation::Group,
        _ => return Ok(None),
    };
    let thread = message
        .message_thread_id
        .filter(|_| message.is_topic_message)
        .map(|id| id.to_string());
    Ok(Some(Inbound {
        channel: CHANNEL.to_owned(),
        conversation,
        chat: message.chat.id.to_string(),
        thread,
        message_id: message.message_id.to_string(),
        sender: from.id.to_string(),
        text,
    }))
}

/// Where a reply goes.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Target {
    /// `chat_id`.
    pub chat: String,
    /// `message_thread_id`.
    pub thread: Option<String>,
    /// The message quoted (in groups).
    pub reply_to: Option<String>,
}

/// Calls the Bot API of one bot.
#[derive(Clone)]
pub struct Client {
    http: reqwest::Client,
    /// `<api_base>/bot<token>`: never logged (it holds the token).
    base: String,
}

#[derive(Deserialize)]
struct Answer {
    ok: bool,
    #[serde(default)]
    result: serde_json::Value,
    #[serde(default)]
    error_code: u16,
    #[serde(default)]
    description: String,
    #[serde(default)]
    parameters: Option<Parameters>,
}

#[derive(Deserialize)]
struct Parameters {
    retry_after: Option<u64>,
}

impl Client {
    /// A client for the bot of `config`.
    ///
    /// # Errors
    /// When the HTTP client cannot be built (no TLS roots).
    pub fn new(config: &TelegramConfig) -> Result<Self, reqwest::Error> {
        Ok(Self {
            http: http::client(Duration::from_millis(config.request_timeout_ms))?,
            base: format!(
                "{}/bot{}",
                config.api_base.trim_end_matches('/'),
                config.bot_token.expose()
            ),
        })
    }

    /// Posts `text` (at most [`MAX_MESSAGE`] units) to `target` with `sendMessage` and returns
    /// the new message's id.
    ///
    /// # Errors
    /// [`SendError`], told transient from permanent.
    pub async fn send_message(&self, target: &Target, text: &str) -> Result<String, SendError> {
        let mut body = json!({"text": text, "chat_id": id_value(&target.chat)});
        if let Some(thread) = target.thread.as_deref().and_then(number) {
            body["message_thread_id"] = json!(thread);
        }
        if let Some(reply_to) = target.reply_to.as_deref().and_then(number) {
            body["reply_parameters"] =
                json!({"message_id": reply_to, "allow_sending_without_reply": true});
        }
        let result = self.call("sendMessage", &body).await?;
        Ok(result["message_id"]
            .as_i64()
            .map(|id| id.to_string())
            .unwrap_or_default())
    }

    /// Replaces the text of the bot's message `message_id` in `chat` with `editMessageText`.
    /// An unchanged text counts as done.
    ///
    /// # Errors
    /// [`SendError`], told transient from permanent.
    pub async fn edit_message_text(
        &self,
        chat: &str,
        message_id: &str,
        text: &str,
    ) -> Result<(), SendError> {
        let body =
            json!({"chat_id": id_value(chat), "message_id": id_value(message_id), "text": text});
        match self.call("editMessageText", &body).await {
            Err(SendError::Permanent(reason)) if reason.contains("message is not modified") => {
                Ok(())
            }
            other => other.map(drop),
        }
    }

    /// Long-polls `getUpdates` from `offset` (confirming every update before it), waiting up
    /// to `wait` for one; returns each update's id and its JSON, as a webhook would get it.
    ///
    /// # Errors
    /// [`SendError`]: a `409 Conflict` (a webhook is set, or another poller runs) and a bad
    /// token are lasting.
    pub async fn get_updates(
        &self,
        offset: i64,
        wait: Duration,
    ) -> Result<Vec<(i64, Vec<u8>)>, SendError> {
        let body =
            json!({"offset": offset, "timeout": wait.as_secs(), "allowed_updates": ["message"]});
        let result = self
            .call_with(
                "getUpdates",
                &body,
                Some(wait + Duration::from_secs(10)),
                http::POLL_ANSWER_CAP,
            )
            .await?;
        let updates = result.as_array().cloned().unwrap_or_default();
        Ok(updates
            .into_iter()
            .filter_map(|update| {
                let id = update["update_id"].as_i64()?;
                Some((id, serde_json::to_vec(&update).ok()?))
            })
            .collect())
    }

    /// Calls `method` and returns its `result`.
    async fn call(
        &self,
        method: &str,
        body: &serde_json::Value,
    ) -> Result<serde_json::Value, SendError> {
        self.call_with(method, body, None, http::SEND_ANSWER_CAP)
            .await
    }

    /// [`Client::call`] with its own timeout (a long poll outlasts the client's) and the
    /// largest answer it reads, in bytes.
    async fn call_with(
        &self,
        method: &str,
        body: &serde_json::Value,
        timeout: Option<Duration>,
        cap: usize,
    ) -> Result<serde_json::Value, SendError> {
        let mut request = self.http.post(format!("{}/{method}", self.base)).json(body);
        if let Some(timeout) = timeout {
            request = request.timeout(timeout);
        }
        let response = request
            .send()
            .await
            // The URL holds the token: never in an error.
            .map_err(|err| SendError::Transient {
                reason: err.without_url().to_string(),
                retry_after: None,
            })?;
        let status = response.status().as_u16();
        // A redirect is never followed: the URL holds the token.
        let bytes = http::read_answer(response, status, cap).await?;
        match serde_json::from_slice::<Answer>(&bytes) {
            Ok(answer) if answer.ok => Ok(answer.result),
            Ok(answer) => Err(classify(
                if answer.error_code == 0 {
                    status
                } else {
                    answer.error_code
                },
                answer.description,
                answer.parameters.and_then(|p| p.retry_after),
            )),
            Err(_) => Err(classify(
                status,
                format!("HTTP {status} without a Bot API answer"),
                None,
            )),
        }
    }
}

/// Ids are integers on the wire; they came from Telegram as integers.
fn number(id: &str) -> Option<i64> {
    id.parse().ok()
}

fn id_value(id: &str) -> serde_json::Value {
    number(id).map_or_else(|| json!(id), |n| json!(n))
}

/// Tells a failed call's kind from its error code: 429 and 5xx pass, the rest does not.
fn classify(code: u16, description: String, retry_after: Option<u64>) -> SendError {
    let reason = format!("{code} {description}");
    if code == 429 || code >= 500 {
        SendError::Transient {
            reason,
            retry_after: retry_after.map(Duration::from_secs),
        }
    } else {
        SendError::Permanent(reason)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_private_text_message_becomes_a_direct_inbound() {
        let body = br#"{"update_id":10,"message":{"message_id":5,"date":1,
            "from":{"id":42,"is_bot":false,"first_name":"A"},
            "chat":{"id":42,"type":"private"},"text":"hi"}}"#;
        let inbound = parse_update(body).unwrap().unwrap();
        assert_eq!(inbound.conversation, Conversation::Direct);
        assert_eq!(
            (inbound.chat.as_str(), inbound.message_id.as_str()),
            ("42", "5")
        );
        assert_eq!(inbound.text, "hi");
    }

    #[test]
    fn a_forum_topic_is_a_thread_of_its_group() {
        let body = br#"{"update_id":11,"message":{"message_id":6,"date":1,
            "from":{"id":7,"is_bot":false,"first_name":"B"},
            "chat":{"id":-100,"type":"supergroup"},"text":"hey",
            "message_thread_id":3,"is_topic_message":true}}"#;
        let inbound = parse_update(body).unwrap().unwrap();
        assert_eq!(inbound.conversation, Conversation::Group);
        assert_eq!(inbound.thread.as_deref(), Some("3"));
        assert_eq!(
            inbound.session_key("main"),
            "agent:main:telegram:group:-100:thread:3"
        );
    }

    #[test]
    fn updates_without_a_human_text_are_left_alone() {
        let edited = br#"{"update_id":1,"edited_message":{"message_id":1}}"#;
        assert!(parse_update(edited).unwrap().is_none());
        let bot = br#"{"update_id":2,"message":{"message_id":1,"date":1,
            "from":{"id":9,"is_bot":true,"first_name":"C"},"chat":{"id":9,"type":"private"},"text":"x"}}"#;
        assert!(parse_update(bot).unwrap().is_none());
        let sticker = br#"{"update_id":3,"message":{"message_id":1,"date":1,
            "from":{"id":9,"is_bot":false,"first_name":"C"},"chat":{"id":9,"type":"private"}}}"#;
        assert!(parse_update(sticker).unwrap().is_none());
        assert!(parse_update(b"not json").is_err());
        assert!(parse_update(br#"{"message":{}}"#).is_err());
    }

    #[test]
    fn rate_limits_and_server_errors_pass_the_rest_does_not() {
        assert!(matches!(
            classify(429, "Too Many Requests".into(), Some(3)),
            SendError::Transient { retry_after: Some(d), .. } if d == Duration::from_secs(3)
        ));
        assert!(matches!(
            classify(502, "Bad Gateway".into(), None),
            SendError::Transient { .. }
        ));
        assert!(matches!(
            classify(400, "chat not found".into(), None),
            SendError::Permanent(_)
        ));
        assert!(matches!(
            classify(403, "bot was blocked".into(), None),
            SendError::Permanent(_)
        ));
    }
}
