//! `[channels.<name>]`: read by the gateway (webhooks in) and by delivery (replies out).

use std::fmt;

/// A secret setting; `Debug` never shows it, so configs and errors can be logged.
#[derive(Clone, Default, PartialEq, Eq, serde::Deserialize)]
#[serde(transparent)]
pub struct Secret(String);

impl Secret {
    /// Returns the secret itself, for comparing and sending only.
    pub fn expose(&self) -> &str {
        &self.0
    }

    /// Whether it is unset.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl From<&str> for Secret {
    fn from(value: &str) -> Self {
        Self(value.to_owned())
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(if self.0.is_empty() { "\"\"" } else { "\"***\"" })
    }
}

/// `[channels]`
#[derive(Debug, Clone, Default, serde::Deserialize)]
#[serde(default)]
pub struct ChannelsConfig {
    /// `[channels.telegram]`
    pub telegram: TelegramConfig,
    /// `[channels.slack]`
    pub slack: SlackConfig,
}

/// `[channels.slack]`: a Slack app with a bot user.
#[derive(Debug, Clone, serde::Deserialize)]
#[serde(default)]
pub struct SlackConfig {
    /// The bot user's OAuth token (`xoxb-…`); replies are off without it.
    pub bot_token: Secret,
    /// The app's signing secret; the Events API endpoint refuses every request without it.
    pub signing_secret: Secret,
    /// The Web API's address (tests point it at a fake).
    pub api_base: String,
    /// The agent that answers the app's conversations.
    pub agent_id: String,
    /// Longest `Retry-After` waited out in place.
    pub max_retry_after_ms: u64,
    /// Timeout of one Web API call.
    pub request_timeout_ms: u64,
}

impl Default for SlackConfig {
    fn default() -> Self {
        Self {
            bot_token: Secret::default(),
            signing_secret: Secret::default(),
            api_base: "https://slack.com".to_owned(),
            agent_id: "main".to_owned(),
            max_retry_after_ms: 30_000,
            request_timeout_ms: 10_000,
        }
    }
}

impl SlackConfig {
    /// Whether the Events API endpoint is served (a signing secret is set).
    pub fn receives(&self) -> bool {
        !self.signing_secret.is_empty()
    }

    /// Whether replies are posted (a token is set).
    pub fn sends(&self) -> bool {
        !self.bot_token.is_empty()
    }
}

/// `[channels.telegram]`: a Telegram bot.
#[derive(Debug, Clone, serde::Deserialize)]
#[serde(default)]
pub struct TelegramConfig {
    /// The bot's token from @BotFather; replies are off without it.
    pub bot_token: Secret,
    /// What Telegram sends in `X-Telegram-Bot-Api-Secret-Token` (the `secret_token` given to
    /// `setWebhook`); the webhook refuses every request without it.
    pub webhook_secret: Secret,
    /// The Bot API's address (tests point it at a fake).
    pub api_base: String,
    /// The agent that answers the bot's chats.
    pub agent_id: String,
    /// Longest wait a `429 retry_after` is honoured in place before the reply is handed back
    /// for a later delivery.
    pub max_retry_after_ms: u64,
    /// Timeout of one Bot API call.
    pub request_timeout_ms: u64,
}

impl Default for TelegramConfig {
    fn default() -> Self {
        Self {
            bot_token: Secret::default(),
            webhook_secret: Secret::default(),
            api_base: "https://api.telegram.org".to_owned(),
            agent_id: "main".to_owned(),
            max_retry_after_ms: 30_000,
            request_timeout_ms: 10_000,
        }
    }
}

impl TelegramConfig {
    /// Whether the webhook is served (a secret is set).
    pub fn receives(&self) -> bool {
        !self.webhook_secret.is_empty()
    }

    /// Whether replies are posted (a token is set).
    pub fn sends(&self) -> bool {
        !self.bot_token.is_empty()
    }
}
